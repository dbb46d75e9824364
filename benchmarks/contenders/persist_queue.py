"""persist-queue's SQLiteAckQueue: the reference the ×pq ratios are taken against."""
import os
import sqlite3
import time

from benchmarks.common import GET_TIMEOUT, REFERENCE, make_item
from benchmarks.contenders.base import (Adapter, Contender, ScaleSupport, SharedContender,
                                        in_directory)

PQ_TABLE = "`ack_queue_default`"     # persist-queue's table for name="default"


class PersistQueueAdapter(Adapter):
    """persist-queue's SQLiteAckQueue(path, multithreading=True): put, get, ack(item).

    It has no batch API, and SQLiteAckQueue refuses auto_commit=False (it warns "disable
    auto commit is not supported in ack queue" and keeps auto_commit=True), so batches are
    per-item calls, one SQLite commit each."""

    batch_method = ("per-item put/get/ack: SQLiteAckQueue has no bulk put and refuses "
                    "auto_commit=False")
    POLL = 0.0005

    def __init__(self, directory, *, poll=False):
        import persistqueue
        self._empty = persistqueue.Empty
        self.poll = poll             # across processes: get(block=False) every POLL seconds
        self.q = persistqueue.SQLiteAckQueue(os.path.join(directory, "pq"),
                                             multithreading=True)

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        if self.poll:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return self.q.get(block=False)
                except self._empty:
                    if time.monotonic() >= deadline:
                        return None
                    time.sleep(self.POLL)
        try:
            return self.q.get(block=True, timeout=timeout)
        except self._empty:
            return None

    def ack(self, handle):
        self.q.ack(handle)

    def close(self):
        self.q.close()


class PersistQueueScale(ScaleSupport):
    """(f): filled by a direct SQL INSERT of rows in persist-queue's own format (pickled
    item, timestamp, status 0) into the table it created (its public API has one fsync'd
    commit per put); then opened and used only through its public API."""

    file_name = "pq"

    def fill(self, path, count):
        import persistqueue
        from persistqueue.serializers import pickle as pq_pickle
        q = persistqueue.SQLiteAckQueue(path, multithreading=True)
        conn = sqlite3.connect(os.path.join(path, "data.db"))
        chunk = 10000
        for start in range(0, count, chunk):
            now = time.time()
            rows = [(pq_pickle.dumps(make_item(i)), now, 0)      # status 0: "inited"
                    for i in range(start, min(count, start + chunk))]
            with conn:
                conn.executemany(f"INSERT INTO {PQ_TABLE} (data, timestamp, status) "
                                 "VALUES (?, ?, ?)", rows)
        return q

    def opener(self, path):
        import persistqueue
        return lambda: persistqueue.SQLiteAckQueue(path, multithreading=True)

    def after_kill(self, path):
        wal = os.path.join(path, "data.db-wal")
        return {"wal_bytes_after_kill": os.path.getsize(wal) if os.path.exists(wal) else 0}


def persist_queue_tick():
    """persist-queue's blocking get() re-reads its database this often (seconds) when no put
    in its own process sets its in-process threading.Event (read from the installed code)."""
    try:
        from persistqueue import sqlbase
        return sqlbase.TICK_FOR_WAIT
    except (ImportError, AttributeError):
        return None


def open_shared(location, mode):
    return PersistQueueAdapter(location, poll=(mode == "poll"))


CONTENDER = Contender(
    "persist-queue", REFERENCE, PersistQueueAdapter,
    "SQLite, journal_mode=WAL, synchronous=FULL (SQLite's default; "
    "persist-queue sets only journal_mode): every commit fsyncs the WAL, "
    "one commit per put, per get and per ack", family="persist-queue",
    scale=PersistQueueScale())


def shared_contenders():
    """The two ways (e) across processes and (g) use it: polling, and its blocking get()."""
    tick = persist_queue_tick()          # reads the installed package, if there is one
    return [
        SharedContender(
            "persist-queue", REFERENCE, "persist-queue", "poll",
            "every process opens SQLiteAckQueue(DIR, multithreading=True) on the same "
            "directory (persist-queue's documentation says several processes are not "
            "supported); its blocking get() waits on an in-process threading.Event that "
            f"another process's put never sets and re-reads the database only every {tick} "
            "s, so across processes the adapter polls get(block=False) every 0.5 ms",
            in_directory, open_shared),
        SharedContender(
            "persist-queue-blocking", "persist-queue (blocking get)", "persist-queue",
            "blocking",
            "as persist-queue, but the consumer waits in its own blocking "
            f"get(timeout={GET_TIMEOUT:g}), as in one process; each sample waits for "
            f"persist-queue's {tick}-s re-read, so this row gets few samples and one "
            "repetition", in_directory, open_shared, scenarios=("e_xproc",), samples=3,
            repeat=1),
    ]
