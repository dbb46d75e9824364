"""The sink: rows into a queue, exactly once.

Each row is put with a dedup id made of the write's identity, the Spark partition and the
row itself: ``{write}:{partition}:{digest}:{n}``, where digest hashes the row's body,
priority and attributes and n counts the earlier rows of the same partition with the same
digest.  The write's identity is, for a stream, the query id and the batch id (both the same
when Spark replays a batch after a failure, since a query keeps its id in its checkpoint);
for a batch write, an id the driver makes for the job (a retried task writes under the same
one).  The service skips a row whose dedup id it saw within dedupWindow seconds (one day by
default) and answers how many rows it put and skipped, so a replay, even of a batch cut off
in the middle of its writes, puts each row once, whatever order the replay brings the rows
in.  A replay later than dedupWindow after the first attempt would put its rows again.
"""
import hashlib
import json
import uuid

from pyspark import TaskContext

from ackqueue.store import DEFAULT_PRIORITY
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

__all__ = ["StreamWriter", "BatchWriter", "Written", "check_sink_schema"]

_QUERY_ID = "sql.streaming.queryId"       # Spark's local properties of a streaming task
_BATCH_ID = "streaming.sql.batchId"


class Written(WriterCommitMessage):
    def __init__(self, put, duplicates):
        self.put, self.duplicates = put, duplicates


def check_sink_schema(schema):
    """(encoding of the body column, has priority, has attributes); ValueError if the
    DataFrame has no body column of string or binary type."""
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    kind = fields.get("body")
    if kind not in ("string", "binary"):
        raise ValueError("the ackqueue sink takes a column body of type string or binary "
                         f"(and optional priority, attributes); this DataFrame has {fields}")
    if "priority" in fields and fields["priority"] not in ("int", "bigint", "smallint",
                                                           "tinyint"):
        raise ValueError("the priority column must be an integer")
    if "attributes" in fields and fields["attributes"] != "map<string,string>":
        raise ValueError("the attributes column must be a map<string,string>")
    return ("str" if kind == "string" else "bytes", "priority" in fields,
            "attributes" in fields)


def _columns(layout, batches):
    """(body, priority, attributes) of each row of Arrow record batches: Spark hands the
    writer whole columns, several times cheaper than a Row object per row."""
    _, with_priority, with_attributes = layout
    for b in batches:
        names = b.schema.names
        bodies = b.column(names.index("body")).to_pylist()
        priorities = (b.column(names.index("priority")).to_pylist() if with_priority
                      else [None] * len(bodies))
        attributes = (b.column(names.index("attributes")).to_pylist() if with_attributes
                      else [None] * len(bodies))
        yield from zip(bodies, priorities, attributes)


def _write(options, layout, write_id, batches):
    """Put the rows of batches (chunks of rowsPerRequest) under dedup ids of write_id."""
    encoding = layout[0]
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    client = options.client()
    seen, chunk, put, dup = {}, [], 0, 0

    def flush():
        nonlocal put, dup
        answer = client.put_rows(options.queue, [c[0] for c in chunk],
                                 [c[1] for c in chunk], [c[2] for c in chunk],
                                 [c[3] for c in chunk], encoding, options.dedup_window)
        put += answer["put"]
        dup += answer["duplicates"]
        chunk.clear()

    for body, priority, attrs in _columns(layout, batches):
        if body is None:
            raise ValueError("the ackqueue sink got a row whose body is null")
        data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
        priority = DEFAULT_PRIORITY if priority is None else int(priority)
        attrs = dict(attrs) if attrs else None
        h = hashlib.blake2b(data, digest_size=12)
        if priority != DEFAULT_PRIORITY or attrs:
            h.update(json.dumps([priority, sorted(attrs.items()) if attrs else []]).encode())
        digest = h.hexdigest()
        n = seen[digest] = seen.get(digest, -1) + 1
        chunk.append((data, f"{write_id}:{partition}:{digest}:{n}", priority, attrs))
        if len(chunk) >= options.rows_per_request:
            flush()
    if chunk:
        flush()
    client.close()
    return Written(put, dup)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options, schema):
        self.options = options
        self.layout = check_sink_schema(schema)

    def write(self, iterator):
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(_QUERY_ID) if ctx is not None else None
        batch = ctx.getLocalProperty(_BATCH_ID) if ctx is not None else None
        if query is None or batch is None:
            raise RuntimeError("the ackqueue stream sink runs only inside a streaming query "
                               "(Spark gave the task no query id or batch id)")
        return _write(self.options, self.layout, f"{query}:{batch}", iterator)

    def commit(self, messages, batchId):
        pass                            # each row was durable when its request returned

    def abort(self, messages, batchId):
        pass                            # a replay of batchId skips what is there already


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options, schema):
        self.options = options
        self.layout = check_sink_schema(schema)
        self.write_id = uuid.uuid4().hex

    def write(self, iterator):
        return _write(self.options, self.layout, self.write_id, iterator)
