"""The lean ZODB queue (benchmarks/lean.py): what ZODB allows, a reference, not a product."""
import os

from benchmarks.common import LEAN, Timeout
from benchmarks.contenders.base import Adapter, Contender


class LeanDelegate(Adapter):
    """put, get and ack handed to self.q, a lean queue whose get(timeout) returns a handle
    (key, item) or None: the one-at-a-time calls of both lean queues (benchmarks/lean.py
    and benchmarks/lean_shared.py)."""

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        return self.q.get(timeout)

    def item(self, handle):
        return handle[1]

    def ack(self, handle):
        self.q.ack(handle)


class LeanZodbAdapter(LeanDelegate):
    """benchmarks/lean.py's LeanZodbQueue on a FileStorage (every commit fsync'd): the
    least a durable ack queue on ZODB does, as a reference for ackqueue."""

    batch_method = "put_many(items) (one commit), get_many(100), ack_many(items) (one commit)"
    options = {}            # LeanZodbQueue's keywords (the floors below set theirs)

    def __init__(self, directory):
        from benchmarks import lean
        self.q = lean.LeanZodbQueue(os.path.join(directory, "lean.fs"), **self.options)

    def put_batch(self, items):
        self.q.put_many(items)

    def get_ack_batch(self, n, timeout):
        got = []
        while len(got) < n:
            more = self.q.get_many(n - len(got), timeout)
            if not more:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            got.extend(more)
        self.q.ack_many(got)
        return got

    def diagnostics(self):
        return {"commits": self.q.commits, "units": self.q.units}

    def close(self):
        self.q.close()


CONTENDER = Contender(
    "lean", LEAN, LeanZodbAdapter,
    "ZODB FileStorage: every commit fsync'd; benchmarks/lean.py, the least a "
    "durable ack queue on ZODB does (no ready index, counters, deadlines, "
    "give-back, ...): a reference for what ZODB allows, not a product",
    family="lean")


class LeanCountedAdapter(LeanZodbAdapter):
    """The lean queue with ackqueue's Counters written in every commit (lean.py,
    counted=True): a floor for two records per commit at the lean queue's Python (ackqueue
    writes the Counters beside a batch's segments; a put or an ack of one message writes
    the Counters alone, one record)."""

    options = {"counted": True}


LEAN_COUNTED = "ZODB lean + Counters (floor)"

COUNTED = Contender(
    "lean-counted", LEAN_COUNTED, LeanCountedAdapter,
    "a floor, not a product: the lean ZODB queue that also writes ackqueue's Counters "
    "(counts and the ready set's journal, a second record) in every commit, as ackqueue's "
    "batches do (a put or an ack of one message writes the Counters alone); every commit "
    "fsync'd",
    family="lean")


class LeanGuardedAdapter(LeanZodbAdapter):
    """The lean queue doing the least that ackqueue's guarantees add per message (lean.py,
    guarded=True: each message stored with its put time, priority and expiry; each
    delivery recorded by seq, by thread and by the item; acks by the item): how close
    to the lean queue a queue that keeps them can come."""

    options = {"guarded": True}


GUARDED = Contender(
    "lean-guarded", "ZODB lean + delivery records (floor)", LeanGuardedAdapter,
    "a floor, not a product: the lean ZODB queue that also stores each message with its "
    "put time, priority and expiry (as ackqueue's message index does) and records each "
    "delivery by seq, by thread and by the item, acked by the item (what ackqueue's "
    "deadlines, give-back, ack(item) and task_done need at the least); no counts; every "
    "commit fsync'd",
    family="lean")


class LeanSyncedAdapter(LeanZodbAdapter):
    """The lean queue on ackqueue's storage for durability="fsync" (lean.py, synced=True:
    storage.SyncedFileStorage, commits into zeros written ahead, fdatasync): ackqueue's
    own cost measured on the same storage as ackqueue."""

    options = {"synced": True}


SYNCED = Contender(
    "lean-synced", "ZODB lean, synced storage", LeanSyncedAdapter,
    "the lean ZODB queue on ackqueue's synced FileStorage (each commit written into zeros "
    "written ahead of it and fdatasync'd): the reference for ackqueue's own cost on the "
    "storage ackqueue uses; every commit synced",
    family="lean")


class LeanGuaranteesAdapter(LeanZodbAdapter):
    """The lean queue keeping both floors' work at once, on ackqueue's synced storage
    (lean.py, guarded=True, counted=True, synced=True): each message stored as ackqueue's
    message index stores it, each delivery recorded by seq, by thread and by the item,
    ackqueue's Counters in every commit, each commit written and synced as ackqueue's.
    What a queue that keeps ackqueue's per-message guarantees and counts
    can do at the lean queue's Python, with one record per delivery, on the same storage
    as ackqueue (fsync): the floor under scenario (d)'s 0.9x target."""

    options = {"guarded": True, "counted": True, "synced": True}


GUARANTEES = Contender(
    "lean-guarantees", "ZODB lean + records + Counters, synced (floor)", LeanGuaranteesAdapter,
    "a floor, not a product: the lean ZODB queue doing both floors' work (each message "
    "stored with its put time, priority and expiry; each delivery recorded by seq, by "
    "thread and by the item; ackqueue's Counters in every commit) on ackqueue's synced "
    "storage: the least ackqueue's per-message guarantees and counts cost at the lean "
    "queue's Python; every commit synced",
    family="lean")
