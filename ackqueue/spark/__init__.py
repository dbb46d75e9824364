"""Spark Structured Streaming and batch I/O for ackqueue queues, through ``ackqueue serve``.

    import ackqueue.spark
    ackqueue.spark.register(spark)
    stream = (spark.readStream.format("ackqueue").option("url", "http://127.0.0.1:8080")
              .option("queue", "events").load())
    (df.writeStream.format("ackqueue").option("url", ...).option("queue", "out")
       .option("checkpointLocation", ...).start())
    spark.read.format("ackqueue").option("url", ...).option("queue", "events").load()
    df.write.format("ackqueue").option("url", ...).option("queue", "out").mode("append").save()

Rows read carry id, body (binary), text (the body as a string when the queue holds text or
JSON, else null), encoding, attributes, receive_count, sent_at, priority and state; the sink
takes a body column (string or binary) and optional priority and attributes columns.
The options are listed in ackqueue.spark.options.Options.

Why through the service: Spark runs the reader's and writer's methods in Python worker
processes it starts itself, which cannot open a FileStorage file that another process
holds; the service owns the file, and the workers send it batched requests over HTTP.

Design of the streaming source (at least once, no loss, exact replay):

- Offsets.  ``{"stream", "seq", "max", "parts"}``.  initialOffset() draws a random stream
  id, which from then on lives in the query's checkpoint (every offset carries it), so a
  restarted query speaks for the same stream.  latestOffset() plans batch seq+1 when the
  queue has ready messages, and writes into the offset how many it may take (``max``: the
  ready count, capped by maxMessagesPerBatch / the read limit, and by the target of
  Trigger.AvailableNow) and in how many parts.  It receives nothing itself.
- Durable leases keyed by batch offsets.  Part i of batch n is read in a worker through
  ``POST /v1/queues/{q}/streams/{stream}/batches/{n}/{i}`` (ackqueue/service/leased_batches.py).
  The first read receives up to ceil(max/parts) ready messages and holds them in the
  queue, in flight, under a durable hold (ackqueue.holds) for visibilityTimeout seconds,
  with the record (stream, n, i) that names their ids, in one commit
  (ackqueue/service/streams.py); a later read of the same record (Spark replaying the
  batch after a task, executor or driver failure, or after the service was killed and
  restarted) returns exactly those messages (same ids, bodies, attributes) and renews
  their lease.  Hold and record are in the queue file, not in the Spark driver nor in the
  service's memory, so they survive the SIGKILL of either.  The answer is columnar
  (format=columns: the payloads in Arrow's layout), so a part becomes one Arrow batch
  without a step per row.
- Acknowledgement on commit only, cumulative and idempotent.  commit(end) acknowledges
  every record of the stream up to end's seq.  Spark calls it only when it plans the next
  batch, never for the last batch of a run, and does not retry it after a crash; so
  latestOffset(start) acknowledges everything up to start as well (Spark plans a batch only
  once the previous one is in its commit log).  The service forgets a committed record, and
  a read of a committed batch returns nothing.
- Leases of a query that never comes back run out after visibilityTimeout and their
  messages go back into the queue for other consumers (at least once), at their original
  place, with their receive counts counted, as at any delivery's visibility deadline; a
  query restarted after that reads those batches afresh.
- Poison messages.  Spark fails a whole micro-batch when one row fails, and nothing says
  which row it was.  Every read of a record counts as one receive (receive_count grows on
  each replay).  With maxReceives, a batch part read more than maxReceives times is
  isolating its culprit: a part of one message goes to deadLetterQueue (or is dropped) and
  the batch goes on without it; a larger part keeps its first half (under a fresh count)
  and gives the second half back to the queue (at its place, with the receive counts it
  had before the part), where later batches receive it.  So a
  poison message reaches the dead-letter queue after about maxReceives * log2(n) failed
  attempts and its batch-mates are processed; replays stay exact until maxReceives
  attempts have failed.  A job that reads one micro-batch twice (two actions on it in
  foreachBatch without a cache) counts two receives.

The sink (exactly once) is described in ackqueue.spark.sink, the snapshot read in
ackqueue.spark.snapshot.
"""
import os
import sys

__all__ = ["register", "AckQueueDataSource"]

if not os.environ.get("PYSPARK_PYTHON"):
    # Spark starts its Python workers with PYSPARK_PYTHON (else "python3", which may lack
    # ackqueue and pyarrow): make it the interpreter that imported us.
    os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql.datasource import DataSource  # noqa: E402

from .options import SCHEMA, Options  # noqa: E402


class AckQueueDataSource(DataSource):
    """The data source named "ackqueue" (see the module's docstring)."""

    @classmethod
    def name(cls):
        return "ackqueue"

    def schema(self):
        return SCHEMA

    def _options(self):
        return Options(self.options)

    def reader(self, schema):
        from .snapshot import SnapshotReader
        return SnapshotReader(self._options())

    def streamReader(self, schema):
        from .source import StreamReader
        return StreamReader(self._options())

    def writer(self, schema, overwrite):
        from .sink import BatchWriter
        if overwrite:
            raise ValueError("the ackqueue sink appends; mode('overwrite') is not supported")
        return BatchWriter(self._options(), schema)

    def streamWriter(self, schema, overwrite):
        from .sink import StreamWriter
        return StreamWriter(self._options(), schema)


def register(spark):
    """Register the "ackqueue" data source with a SparkSession."""
    spark.dataSource.register(AckQueueDataSource)
    return spark
