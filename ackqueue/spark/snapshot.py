"""spark.read.format("ackqueue"): a snapshot of a queue, read through the service's
browse pages (a read-only look: nothing is received, leased or counted)."""
import base64

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .options import to_row

__all__ = ["SnapshotReader"]

PAGE = 1000


class SnapshotReader(DataSourceReader):
    def __init__(self, options):
        self.options = options

    def partitions(self):
        return [InputPartition(0)]

    def read(self, partition):
        client = self.options.client()
        after = -1
        try:
            while True:
                page = client.browse(self.options.queue, after, PAGE)
                for m in page["messages"]:
                    yield to_row(m, base64.b64decode(m["body"]), m.get("state"))
                after = page.get("next_after")
                if after is None:
                    return
        finally:
            client.close()
