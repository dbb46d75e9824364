"""ackqueue.AckQueue on a file (fsync, or durability="os" once it exists) and in memory."""
import inspect
import os
import queue as stdlib_queue

from benchmarks.common import SHARED_QUEUE_NAME, Timeout, make_item
from benchmarks.contenders.base import Adapter, Contender, ScaleSupport


class AckQueueAdapter(Adapter):
    """ackqueue.AckQueue: put, get, ack(item).  Batches use put_many/get_many/ack_many when
    the queue has them, else `with q.transaction():` around 100 puts and around 100
    get+acks (one commit each)."""

    def __init__(self, directory, *, memory=False, url=None, **options):
        from ackqueue import AckQueue
        if memory:
            self.q = AckQueue(**options)
        elif url is not None:
            self.q = AckQueue(path=url, name=SHARED_QUEUE_NAME, **options)
        else:
            self.q = AckQueue(path=os.path.join(directory, "queue.fs"), **options)
        self.has_batch = all(hasattr(self.q, n) for n in ("put_many", "get_many", "ack_many"))
        self.batch_method = (
            "q.put_many(items), q.get_many(100, timeout=...), q.ack_many(items)"
            if self.has_batch else
            "`with q.transaction():` around 100 puts, and around 100 get + ack; "
            "put_many/get_many/ack_many not present")

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None

    def ack(self, handle):
        self.q.ack(handle)

    def put_batch(self, items):
        if self.has_batch:
            self.q.put_many(items)
            return
        with self.q.transaction():
            for it in items:
                self.q.put(it)

    def get_ack_batch(self, n, timeout):
        if self.has_batch:
            got = []
            while len(got) < n:                       # get_many may return fewer than asked
                more = self.q.get_many(n - len(got), timeout=timeout)
                if not more:
                    raise Timeout(f"batch get: queue empty after {timeout}s")
                got.extend(more)
            self.q.ack_many(got)
            return got
        with self.q.transaction():
            got = []
            for _ in range(n):
                h = self.get(timeout)
                if h is None:
                    raise Timeout(f"batch get: queue empty after {timeout}s")
                got.append(h)
            for h in got:
                self.q.ack(h)
        return got

    def qsize(self):
        return self.q.qsize()

    def diagnostics(self):
        """This process's commit counters (shared by its queues on the same storage) and,
        for a shared queue, the claims it lost to other processes."""
        try:
            c = self.q._database.committer
            out = {"commits": c.commits, "units": c.units, "conflicts": c.conflicts,
                   "conflicts_by_class": dict(c.conflicts_by_class)}
            lost = getattr(self.q._state.arbiter, "claims_lost", None)   # private: diagnostics only
            if lost is not None:
                out["claims_lost"] = lost
            return out
        except AttributeError as exc:     # the private counters moved: say so, go on
            return {"unavailable": repr(exc)}

    def close(self):
        self.q.close()


def index_info(path):
    """What FileStorage's .index for path covers: a SIGKILLed process leaves the one
    written when the file was created (or last closed), so the next open re-reads every
    transaction after that position."""
    if not os.path.exists(path + ".index"):
        return {"exists": False}
    from ZODB.fsIndex import fsIndex
    try:
        pos = fsIndex.load(path + ".index")["pos"]
    except Exception as exc:   # noqa: BLE001
        return {"exists": True, "error": repr(exc)}
    return {"exists": True, "covers_bytes": pos, "file_bytes": os.path.getsize(path)}


class AckQueueScale(ScaleSupport):
    """(f): filled through the public API in `with q.transaction():` blocks of 1,000 puts
    (every block returns only after its fsync'd commit)."""

    file_name = "queue.fs"

    def fill(self, path, count):
        from ackqueue import AckQueue
        q = AckQueue(path=path)
        chunk = 1000
        for start in range(0, count, chunk):
            with q.transaction():
                for i in range(start, min(count, start + chunk)):
                    q.put(make_item(i))
        return q

    def opener(self, path):
        from ackqueue import AckQueue
        return lambda: AckQueue(path=path)

    def index(self, path):
        return index_info(path)

    def after_kill(self, path):
        return {"index_after_kill": index_info(path)}


def has_durability_option():
    """Whether AckQueue takes durability=: then "ackqueue (os)" is measured."""
    try:
        from ackqueue import AckQueue
        params = inspect.signature(AckQueue.__init__).parameters
    except (ImportError, TypeError, ValueError):
        params = {}
    return "durability" in params


FSYNC = Contender(
    "ackqueue", "ackqueue (fsync)", AckQueueAdapter,
    "ZODB FileStorage: every commit synced (fdatasync, into space written ahead); put and "
    "ack return once durable", family="ackqueue", scale=AckQueueScale())
MEMORY = Contender(
    "ackqueue-memory", "ackqueue (memory)", lambda d: AckQueueAdapter(d, memory=True),
    "ZODB MappingStorage: in memory, nothing survives the process "
    "(same code path and commits, no disk)", fast=False, family="ackqueue")
OS = Contender(
    "ackqueue-os", "ackqueue (os)", lambda d: AckQueueAdapter(d, durability="os"),
    "ZODB FileStorage, durability='os': written to the OS, no fsync; survives a "
    "process crash, not a power loss", family="ackqueue", available=has_durability_option)


def has_deferred_acks():
    """Whether AckQueue takes acks=: then "ackqueue (deferred acks)" is measured."""
    try:
        from ackqueue import AckQueue
        return "acks" in inspect.signature(AckQueue.__init__).parameters
    except (ImportError, TypeError, ValueError):
        return False


DEFERRED = Contender(
    "ackqueue-deferred", "ackqueue (deferred acks)",
    lambda d: AckQueueAdapter(d, acks="deferred"),
    "ZODB FileStorage, acks='deferred': put returns once durable (fsync'd); ack returns at "
    "once and is durable with the next commit (a few ms at most); a crash may redeliver "
    "what was acked just before it", family="ackqueue", available=has_deferred_acks)
