"""Queues on one backend for the feature tests (Env: in memory or on a file; the ``env``
fixture in tests/conftest.py makes one per backend), and the small helpers and constants
those tests share: the contract's defaults and limits, counts and bodies of messages,
draining a queue, and a child process."""
import subprocess
import sys
import textwrap

import ZODB
from ZODB.MappingStorage import MappingStorage

from ackqueue import AckQueue, Empty

BOUND = 5               # failure bound for waits that should end at once
CHILD_TIMEOUT = 60      # failure bound for a child process
SHORT = 0.05            # a real timeout that is expected to expire

DAY = 86400
DEFAULT_RETENTION = 4 * DAY
MAX_RETENTION = 14 * DAY
DEFAULT_DEDUP_WINDOW = 300
COUNT_KEYS = ("ready", "in_flight", "delayed")
STATS_KEYS = COUNT_KEYS + ("put", "acked", "redelivered", "dead_lettered", "expired")


class Env:
    """Queues on one backend.

    open(...) makes a queue: on the file backend always on the test's file; on the memory
    backend an independent in-memory queue (path=None), or, with shared=True, a queue in
    the test's one in-memory ZODB.DB, so that several named queues share a storage.
    ``where`` is what ackqueue.queues() takes for that storage."""

    def __init__(self, backend, tmp_path):
        self.backend = backend
        self.path = tmp_path / "q.fs"
        self.opened = []
        self._db = None

    @property
    def is_file(self):
        return self.backend == "file"

    @property
    def db(self):
        if self._db is None:
            self._db = ZODB.DB(MappingStorage())
        return self._db

    @property
    def where(self):
        return str(self.path) if self.is_file else self.db

    def open(self, cls=AckQueue, maxsize=0, *, shared=False, **kwargs):
        if self.is_file:
            kwargs.setdefault("path", self.path)
        elif shared:
            kwargs.setdefault("db", self.db)
        q = cls(maxsize, **kwargs)
        self.opened.append(q)
        return q

    def close_all(self):
        for q in reversed(self.opened):
            q.close()
        self.opened = []

    def teardown(self):
        self.close_all()
        if self._db is not None:
            self._db.close()


def drain_messages(q):
    got = []
    while True:
        try:
            got.append(q.get_message(block=False))
        except Empty:
            return got


def bodies(messages):
    return [m.body for m in messages]


def counts_of(q):
    c = q.counts()
    return {k: c[k] for k in COUNT_KEYS}


def count(ready=0, in_flight=0, delayed=0):
    return {"ready": ready, "in_flight": in_flight, "delayed": delayed}


def run_child(script, *args):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
