"""The options of the ackqueue data source, named as Spark's own sources name theirs, and
the rows it reads."""
import datetime

from .client import Client

__all__ = ["SCHEMA", "Options", "to_row", "to_arrow", "columns_to_arrow"]

SCHEMA = ("id LONG, body BINARY, text STRING, encoding STRING, "
          "attributes MAP<STRING, STRING>, receive_count INT, sent_at TIMESTAMP, "
          "priority INT, state STRING")

_UTC = datetime.timezone.utc


def _number(options, key, default, cast, lo, hi=None):
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = cast(raw)
    except (TypeError, ValueError):
        raise ValueError(f"option {key} must be a number, not {raw!r}") from None
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"option {key} must be between {lo} and {hi or 'any'}, not {raw}")
    return value


class Options:
    """The options given to spark.read/readStream/write/writeStream .option(...):

    url                  the queue service (``ackqueue serve``), http(s)://host:port
    queue                the queue's name
    token                a bearer token, when the service has --auth
    maxMessagesPerBatch  at most this many messages a micro-batch (admission control;
                         default 10000)
    numPartitions        Spark partitions a micro-batch is read in (default 2)
    visibilityTimeout    seconds a micro-batch's messages stay leased to it (default 600):
                         the time within which a failed query must restart to replay the
                         very same messages; after it they go back to the queue
    maxReceives          a message read by this many micro-batch attempts without being
                         committed goes to deadLetterQueue (or is dropped) (default: never)
    deadLetterQueue      where such a message goes
    dedupWindow          (sink) seconds during which a replayed row is recognised and not
                         put again (default 86400)
    rowsPerRequest       (sink) rows a put request carries (default 1000, at most 1000)
    """

    def __init__(self, options):
        options = {k.lower(): v for k, v in dict(options).items()}
        self.url = options.get("url") or options.get("path")
        if not self.url:
            raise ValueError('option url is required: .option("url", "http://127.0.0.1:8080")')
        self.queue = options.get("queue")
        if not self.queue:
            raise ValueError('option queue (the queue\'s name) is required')
        self.token = options.get("token")
        self.max_per_batch = _number(options, "maxmessagesperbatch", 10000, int, 1)
        self.partitions = _number(options, "numpartitions", 2, int, 1, 1000)
        self.visibility_timeout = _number(options, "visibilitytimeout", 600.0, float, 0.001,
                                          43200)
        self.max_receives = _number(options, "maxreceives", None, int, 1, 1000)
        self.dead_letter = options.get("deadletterqueue")
        self.dedup_window = _number(options, "dedupwindow", 86400.0, float, 1, 14 * 86400)
        self.rows_per_request = _number(options, "rowsperrequest", 1000, int, 1, 1000)

    def client(self):
        return Client(self.url, self.token)


def _text(encoding, payload):
    if encoding in ("str", "json"):
        return payload.decode("utf-8", "surrogatepass")
    return None


def to_row(head, payload, state):
    """A row of SCHEMA from a message's header (the service's JSON) and payload."""
    enc = head.get("encoding")
    return (head["id"], payload, _text(enc, payload), enc, head.get("attributes") or {},
            head.get("receive_count"),
            datetime.datetime.fromtimestamp(head["sent_at"], _UTC), head.get("priority"),
            state)


def to_arrow(got, state):
    """The messages got ([(header, payload)]) as one pyarrow RecordBatch of SCHEMA: Spark
    takes it without converting row by row (several times faster than tuples)."""
    import pyarrow as pa
    heads = [h for h, _ in got]
    payloads = [p for _, p in got]
    encodings = [h.get("encoding") for h in heads]
    columns = [
        pa.array([h["id"] for h in heads], pa.int64()),
        pa.array(payloads, pa.binary()),
        pa.array([_text(e, p) for e, p in zip(encodings, payloads)], pa.string()),
        pa.array(encodings, pa.string()),
        pa.array([list((h.get("attributes") or {}).items()) for h in heads],
                 pa.map_(pa.string(), pa.string())),
        pa.array([h.get("receive_count") for h in heads], pa.int32()),
        pa.array([round(h["sent_at"] * 1e6) for h in heads], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
        pa.array([h.get("priority") for h in heads], pa.int32()),
        pa.array([state] * len(heads), pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, names=[
        "id", "body", "text", "encoding", "attributes", "receive_count", "sent_at",
        "priority", "state"])


_TEXT_KINDS = ("str", "json")


def _text_column(pa, encodings, binary, offsets, data):
    """The text column: the payloads read as UTF-8 where the queue holds text (the same
    buffers, checked, when every message is text), else None."""
    n = len(encodings)
    if all(e in _TEXT_KINDS for e in encodings):
        text = pa.Array.from_buffers(pa.large_string(), n, [None, offsets, data])
        try:
            text.validate(full=True)
            return text.cast(pa.string())
        except pa.ArrowInvalid:         # not UTF-8 (a lone surrogate): row by row below
            pass
    return pa.array([_text(e, p.as_py()) if e in _TEXT_KINDS else None
                     for e, p in zip(encodings, binary)], pa.string())


def columns_to_arrow(head, offsets, data, state):
    """A leased part in the service's columnar answer (Client.read_columns) as one pyarrow
    RecordBatch of SCHEMA: the payloads become the body column without a copy per row."""
    import pyarrow as pa
    import pyarrow.compute as pc
    n = len(head["ids"])
    offsets, data = pa.py_buffer(offsets), pa.py_buffer(data)
    body = pa.Array.from_buffers(pa.large_binary(), n, [None, offsets, data])
    encodings = head["encodings"]
    attributes = head.get("attributes")
    if attributes is None:
        attrs = pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()),
                                        pa.array([], pa.string()), pa.array([], pa.string()))
    else:
        attrs = pa.array([list(a.items()) for a in attributes],
                         pa.map_(pa.string(), pa.string()))
    sent = pc.cast(pc.round(pc.multiply(pa.array(head["sent_at"], pa.float64()), 1e6)),
                   pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    columns = [
        pa.array(head["ids"], pa.int64()),
        body.cast(pa.binary()),
        _text_column(pa, encodings, body, offsets, data),
        pa.array(encodings, pa.string()),
        attrs,
        pa.array(head["receive_counts"], pa.int32()),
        sent,
        pa.array(head["priorities"], pa.int32()),
        pa.array([state] * n, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, names=[
        "id", "body", "text", "encoding", "attributes", "receive_count", "sent_at",
        "priority", "state"])
