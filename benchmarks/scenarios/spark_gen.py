"""A Python streaming data source that only generates rows (a floor for (spark)): n rows
in micro-batches of `batch`, no I/O, the same row shape as the ackqueue source, handed to
Spark the same way (one Arrow RecordBatch per partition)."""
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

class GenSource(DataSource):
    @classmethod
    def name(cls):
        return "bench_gen"

    def schema(self):
        from ackqueue.spark.options import SCHEMA
        return SCHEMA

    def streamReader(self, schema):
        return GenReader(int(self.options["n"]), int(self.options["batch"]))


class GenReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, n, batch):
        self.n, self.batch = n, batch

    def prepareForTriggerAvailableNow(self):
        pass

    def initialOffset(self):
        return {"at": 0}

    def latestOffset(self, start, limit):
        return {"at": min(self.n, start["at"] + self.batch)}

    def partitions(self, start, end):
        mid = (start["at"] + end["at"]) // 2
        return [InputPartition((start["at"], mid)), InputPartition((mid, end["at"]))]

    def read(self, partition):
        from ackqueue.spark.options import to_arrow
        lo, hi = partition.value
        body = b'{"n": 0, "payload": "' + b"x" * 70 + b'"}'
        head = {"encoding": "str", "attributes": {}, "receive_count": 1, "sent_at": 0.0,
                "priority": 100}
        got = [(dict(head, id=i), body) for i in range(lo, hi)]
        return iter([to_arrow(got, "in_flight")] if got else [])
