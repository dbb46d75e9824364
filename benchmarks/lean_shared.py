"""A lean durable ack queue shared through ZEO: the floor under ackqueue (zeo) in (g), not
a product.

It does the least that processes sharing a queue through a ZEO server must do for durable
puts, exclusive deliveries and durable acks, with ZODB's own means and nothing else:

- the queue is two BTrees in the server's database: the ready messages and the messages
  in flight, each keyed by a 64-bit key made of the put's time (microseconds) and 12
  random bits, so producers share no counter (a key taken twice at once is a conflict,
  retried);
- put(item) inserts the pickled item into the ready tree, one commit;
- get() moves the first ready message to the in-flight tree, one commit: that commit is
  what makes the delivery exclusive (two consumers that took the same message conflict,
  and the loser tries again);
- ack() deletes the message from the in-flight tree, one commit.

BTrees resolve concurrent changes to different keys of one bucket on the server
(``_p_resolveConflict``), so producers and consumers collide only on the same key or
when a bucket splits or empties.  A process learns of the others' commits from the
invalidations the server pushes; an object another process changed is loaded again, one
round trip, when it is next read.  A get that finds nothing ready polls every half
millisecond (no round trip unless something changed).

With fast=True it uses the two ways of saving round trips that ackqueue (zeo) offers:
an ack does not commit on its own but rides on the process's next claim commit (it is
durable when that commits, or when a get finds nothing and commits the waiting acks alone,
or at close), and a claim takes up to PREFETCH ready messages at once while the process
keeps up, falling back to one after a conflict (the next gets receive the others without
a round trip; close() returns those not received).

What it leaves out is everything else ackqueue promises: no give-back when a process
dies (a message in flight stays there), no visibility deadlines, counts, ordering within
a microsecond, dead letters, priorities, transactions or bad-input handling.  The suite
runs it in (g) beside ackqueue through the same kind of server, counting round trips the
same way (benchmarks.contenders.zeo.RoundTrips).
"""
import collections
import itertools
import pickle
import random
import time

import transaction
from BTrees.LOBTree import LOBTree
from ZODB import DB
from ZODB.POSException import ConflictError

__all__ = ["LeanSharedQueue"]

READY, IN_FLIGHT = "lean-shared-ready", "lean-shared-in-flight"   # root keys
PREFETCH = 8            # fast=True: messages a claim commit takes at most
POLL = 0.0005           # seconds between looks at an empty queue
BACKOFF = 0.002         # a conflict's retry waits up to this long (random)


def _new_key():
    return (time.time_ns() // 1000) << 12 | random.getrandbits(12)


class LeanSharedQueue:
    """put/get/ack on a queue shared through a ZEO ClientStorage (see the module doc)."""

    def __init__(self, storage, fast=False):
        self.db = DB(storage, pool_size=4, cache_size=20000)
        self.tm = transaction.TransactionManager(explicit=True)
        self.conn = self.db.open(transaction_manager=self.tm)
        self.fast = fast
        self.commits = 0
        self.conflicts = 0
        self.conflicts_by_class = collections.Counter()   # which objects conflicted
        self._acks = []                       # fast: acks waiting for the next commit
        self._claimed = collections.deque()   # fast: claimed, not yet received by get
        self._batch = PREFETCH if fast else 1
        self._commit(self._create)

    def _create(self, root):
        for key in (READY, IN_FLIGHT):
            if key not in root:
                root[key] = LOBTree()
        return True

    def _commit(self, change):
        """Run change(root) in a transaction and commit it if it returns true, retrying
        after conflicts; returns what change returned."""
        for attempt in itertools.count():
            self.tm.begin()
            try:
                result = change(self.conn.root())
                if result:
                    self.tm.commit()
                    self.commits += 1
                else:
                    self.tm.abort()
                return result
            except ConflictError as exc:
                self.tm.abort()
                self.conflicts += 1
                self.conflicts_by_class[exc.class_name or "?"] += 1
                self._batch = 1
                time.sleep(random.uniform(0, min(BACKOFF, 0.0002 * 2 ** attempt)))

    def put(self, item):
        data = pickle.dumps(item, protocol=4)

        def insert(root):
            while not root[READY].insert(_new_key(), data):
                pass                          # a key taken already: another one
            return True
        self._commit(insert)

    def get(self, timeout):
        """(key, item) of the next message, now in flight for this process, or None
        after timeout seconds."""
        if self._claimed:
            return self._claimed.popleft()
        end = time.monotonic() + timeout
        while True:
            claimed = []

            def claim(root):
                claimed.clear()
                ready, in_flight = root[READY], root[IN_FLIGHT]
                for key in list(itertools.islice(ready.keys(), self._batch)):
                    in_flight[key] = data = ready.pop(key)
                    claimed.append((key, data))
                for key in self._acks:
                    del in_flight[key]
                return claimed or self._acks
            if self._commit(claim):
                self._acks = []
            if claimed:
                if self.fast and len(claimed) == self._batch:
                    self._batch = min(PREFETCH, self._batch * 2)
                got = [(key, pickle.loads(data)) for key, data in claimed]
                self._claimed.extend(got[1:])
                return got[0]
            if time.monotonic() >= end:
                return None
            time.sleep(POLL)

    def ack(self, handle):
        key = handle[0]
        if self.fast:
            self._acks.append(key)
            return

        def delete(root):
            del root[IN_FLIGHT][key]
            return True
        self._commit(delete)

    def qsize(self):
        """Messages ready or in flight."""
        self.tm.begin()
        try:
            root = self.conn.root()
            return len(root[READY]) + len(root[IN_FLIGHT])
        finally:
            self.tm.abort()

    def close(self):
        """Commit the waiting acks and return the claimed messages no get received."""
        returned = list(self._claimed)
        self._claimed.clear()

        def settle(root):
            ready, in_flight = root[READY], root[IN_FLIGHT]
            for key in self._acks:
                del in_flight[key]
            for key, item in returned:
                ready[key] = in_flight.pop(key)
            return self._acks or returned
        try:
            self._commit(settle)
            self._acks = []
        finally:
            self.conn.close()
            self.db.close()
