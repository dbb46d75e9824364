"""A Python streaming data source that only generates rows (a floor for (spark)): n rows
in micro-batches of `batch`, no I/O, the same row shape as the ackqueue source, handed to
Spark the same way (one Arrow RecordBatch per partition, made from the same columnar form
as the service's answer)."""
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
        import array
        from ackqueue.spark.options import columns_to_arrow
        lo, hi = partition.value
        n = hi - lo
        if n <= 0:
            return iter(())
        body = b'{"n": 0, "payload": "' + b"x" * 70 + b'"}'
        # The columnar form the service answers the source with (service/leased_batches.py).
        head = {"ids": list(range(lo, hi)), "receive_counts": [1] * n,
                "sent_at": [0.0] * n, "priorities": [100] * n, "encodings": ["str"] * n,
                "attributes": None}
        offsets = array.array("q", range(0, (n + 1) * len(body), len(body))).tobytes()
        return iter([columns_to_arrow(head, offsets, body * n, "in_flight")])
