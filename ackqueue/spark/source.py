"""The streaming source: micro-batches leased from the queue, acknowledged on commit.

Offsets are ``{"stream": id, "seq": n, "max": m, "parts": p}``: the stream id is made
once by initialOffset() and lives on in the query's checkpoint; seq counts the planned
micro-batches; m and p say how many messages batch n may take, in how many parts.  Part
i of batch n reads the service's leased record (stream, n, i) (service/leased_batches.py): the
first read receives and leases up to ceil(m/p) messages, every later read (a replay)
returns the same ones.  A batch is acknowledged when Spark commits it: commit(end), and,
because that call never comes for the last batch of a run and is not retried after a
crash, again at every latestOffset(start), which acknowledges everything up to start
(Spark plans a batch only after committing the one before).  Both are cumulative and
idempotent in the service.
"""
import math
import uuid

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from .options import columns_to_arrow

__all__ = ["StreamReader", "BatchPart"]

MAX_PART = 10000          # the service's largest leased part (service/leased_batches.py)


class BatchPart(InputPartition):
    def __init__(self, stream, seq, part, n):
        super().__init__((stream, seq, part, n))
        self.stream, self.seq, self.part, self.n = stream, seq, part, n


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):

    def __init__(self, options):
        self.options = options
        self.client = options.client()
        self.target = None              # messages left to read under Trigger.AvailableNow

    def initialOffset(self):
        return {"stream": uuid.uuid4().hex, "seq": 0, "max": 0, "parts": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self):
        self.target = self.client.counts(self.options.queue)["ready"]

    def latestOffset(self, start, limit):
        o = self.options
        if start["seq"] > 0:
            self.client.commit(o.queue, start["stream"], start["seq"])
        ready = self.client.counts(o.queue)["ready"]
        budget = ready if isinstance(limit, ReadAllAvailable) else min(
            ready, getattr(limit, "max_rows", o.max_per_batch))
        if self.target is not None:
            budget = min(budget, self.target)
        if budget <= 0:
            return start
        if self.target is not None:
            self.target -= budget
        parts = max(min(o.partitions, budget), math.ceil(budget / MAX_PART))
        return {"stream": start["stream"], "seq": start["seq"] + 1, "max": budget,
                "parts": parts}

    def partitions(self, start, end):
        per = math.ceil(end["max"] / end["parts"]) if end["parts"] else 0
        return [BatchPart(end["stream"], seq, i, per)
                for seq in range(start["seq"] + 1, end["seq"] + 1)
                for i in range(end["parts"])]

    def read(self, partition):
        o = self.options
        if partition.n <= 0:
            return iter(())
        head, offsets, data = self.client.read_columns(
            o.queue, partition.stream, partition.seq, partition.part, partition.n,
            o.visibility_timeout, o.max_receives, o.dead_letter)
        if not head["ids"]:
            return iter(())
        return iter([columns_to_arrow(head, offsets, data, "in_flight")])

    def commit(self, end):
        self.client.commit(self.options.queue, end["stream"], end["seq"])

    def stop(self):
        # The leases stay: a restart from the checkpoint replays the batch they hold.
        self.client.close()
