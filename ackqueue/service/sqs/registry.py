"""What SQS says about a queue beyond its messages (its attributes, tags, creation and
modification times, whether DeleteQueue deleted it), kept durably in the queue file: one
service-owned record, ``root["ackqueue.sqs"]``, an OOBTree of queue name -> a plain dict,
replaced whole on every change, committed (and fsync'd as the storage does) before the
request that changed it is answered.

The service holds the storage alone (LocalArbiter), so this process is the only writer;
the queues' own records live under ``root["ackqueue"]`` and are never touched here.
Calls are blocking (a commit): make them from the service's thread pool."""
import threading
import time

import transaction
from BTrees.OOBTree import OOBTree
from ZODB.POSException import ConflictError

__all__ = ["Registry"]

ROOT_KEY = "ackqueue.sqs"


class Registry:
    def __init__(self, db, clock=time.time):
        self.db = db
        self.clock = clock
        self.lock = threading.Lock()
        self.tm = transaction.TransactionManager()
        self.conn = None
        self.cache = None              # name -> record (dict), as committed

    def _tree(self):
        """The OOBTree, made on first use (pool thread, lock held)."""
        if self.conn is None:
            self.conn = self.db.open(transaction_manager=self.tm)
        root = self.conn.root()
        tree = root.get(ROOT_KEY)
        if tree is None:
            for attempt in range(5):
                try:
                    self.tm.begin()
                    root[ROOT_KEY] = OOBTree()
                    self.tm.commit()
                    break
                except ConflictError:
                    self.tm.abort()
                    if attempt == 4:
                        raise
            tree = root[ROOT_KEY]
        return tree

    def load(self):
        """Every record (read once, then served from memory)."""
        with self.lock:
            if self.cache is None:
                self.tm.begin()
                self.cache = {k: dict(v) for k, v in self._tree().items()}
                self.tm.abort()
            return self.cache

    def get(self, name):
        return self.load().get(name)

    def put(self, name, record):
        """Replace name's record durably; the record gets a "modified" time."""
        self.load()
        record = dict(record, modified=self.clock())
        with self.lock:
            self.tm.begin()
            tree = self._tree()
            tree[name] = record
            self.tm.commit()
            self.cache[name] = record
        return record

    def close(self):
        with self.lock:
            if self.conn is not None:
                self.tm.abort()
                self.conn.close()
                self.conn = None
