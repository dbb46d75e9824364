"""litequeue's LiteQueue: SQLite without an fsync at commit, polled."""
import json
import os
import threading
import time

from benchmarks.common import Timeout
from benchmarks.contenders.base import Adapter, Contender, SharedContender, in_directory


class LiteQueueAdapter(Adapter):
    """litequeue.LiteQueue(path): put(str), pop() -> Message or None, done(message_id).

    litequeue stores TEXT, so items go through json (its own serialisation cost, as the
    others pay pickle's).  pop() never blocks: get() polls it every POLL seconds.  One
    LiteQueue shares one sqlite3 connection, whose explicit BEGIN/COMMIT pairs cannot be
    interleaved by threads, so each thread gets its own LiteQueue on the same file (the
    way litequeue is used from several processes)."""

    POLL = 0.0005
    batch_method = ("put: 100 puts in one `with lq.transaction()`; get: pop() one by one "
                    "(pop is its own BEGIN IMMEDIATE transaction and cannot nest); "
                    "ack: 100 done() in one `with lq.transaction()`")

    def __init__(self, directory):
        import litequeue
        self._cls = litequeue.LiteQueue
        self.path = os.path.join(directory, "lite.db")
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()
        self._lq()                           # create the table from this thread

    def _lq(self):
        lq = getattr(self._local, "lq", None)
        if lq is None:
            lq = self._local.lq = self._cls(self.path)
            with self._lock:
                self._all.append(lq)
        return lq

    def put(self, item):
        self._lq().put(json.dumps(item))

    def get(self, timeout):
        lq = self._lq()
        deadline = time.monotonic() + timeout
        while True:
            m = lq.pop()
            if m is not None:
                return m
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.POLL)

    def item(self, handle):
        return json.loads(handle.data)

    def ack(self, handle):
        self._lq().done(handle.message_id)

    def put_batch(self, items):
        lq = self._lq()
        with lq.transaction():
            for it in items:
                lq.put(json.dumps(it))

    def get_ack_batch(self, n, timeout):
        got = []
        for _ in range(n):
            m = self.get(timeout)
            if m is None:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            got.append(m)
        lq = self._lq()
        with lq.transaction():
            for m in got:
                lq.done(m.message_id)
        return got

    def close(self):
        for lq in self._all:
            try:
                lq.close()
            except Exception:
                pass


CONTENDER = Contender(
    "litequeue", "litequeue", LiteQueueAdapter,
    "SQLite, journal_mode=WAL, synchronous=NORMAL (set by litequeue): "
    "commits survive a process crash but are not fsync'd, so the latest "
    "ones can be lost on power loss / OS crash", family="litequeue")


def shared_contenders():
    return [SharedContender(
        "litequeue", "litequeue", "litequeue", "poll",
        "every process opens LiteQueue(FILE) on the same file (pop() is one BEGIN "
        "IMMEDIATE transaction with UPDATE ... RETURNING, so processes cannot take the "
        "same row); pop() never blocks, so get() polls it every 0.5 ms, as in one "
        "process", in_directory, lambda location, mode: LiteQueueAdapter(location))]
