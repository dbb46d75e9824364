"""A lean durable ack queue on ZODB: a measuring stick for the targets, not a product.

It does the least that a queue with durable puts and acks must do on a ZODB FileStorage
(every commit fsync'd), with the same tricks ackqueue uses to be fast, and nothing else:

- put(item) pickles the item and stores it in a segment of 16 neighbouring messages (a
  persistent object whose state is one bytes object, as ackqueue.segments does), and
  returns once that is committed;
- get() takes the next item from an in-memory deque and writes nothing;
- ack() deletes the message from its segment and returns once that is committed;
- group commit: one committer thread commits every unit waiting, in one commit; a caller
  that works alone (no other thread submitted in the last LEAD_QUIET seconds and no commit
  is under way) commits its own unit in its own thread, saving two thread switches.

What it leaves out is everything else ackqueue promises: no ready index, counters or
sequence counter in the store (so reopening a file would need a full scan, and it never
reopens one), no visibility deadlines, no give-back when a thread or process dies, no
priorities, transactions, sharing, dead letters or bad-input handling.  The suite
measures it side by side with the others in (a)-(e) as "ZODB lean (reference)": where even
this misses a target, ZODB under CPython on this machine is what stands in the way, not
ackqueue's features.

With counted=True it also keeps, in every commit, ackqueue's own ``Counters`` object
(ackqueue.store: the queue's counts and the journal of its ready set, a second record per
commit, which is what lets ackqueue reopen a queue without a scan and keep its counts exact
after a crash): the cost of that second record at the lean queue's Python.  ackqueue
keeps a one-at-a-time put or ack in that record alone (the message index's journal), so
it writes one record where this writes two; a batch writes its segments and the Counters
in both.  A batch whose keys are one run goes to the journal as one run, as ackqueue's
does.  Where ackqueue writes the ready set's segments (a full
journal folded, a batch of more than JOURNAL_BATCH keys that is not one run) it writes
nothing: it is, if anything, faster than that layout allows.

With guarded=True it does, at the lean queue's Python, the least that ackqueue's
guarantees add to each message in (a)-(d), and nothing else (the question it answers: is 0.9x the
lean queue within reach of a queue that keeps them?):
- each message is stored with what a get reports and expiry needs, as ackqueue's message
  index stores it (segments.Msg): (body, priority, put time, receive count 0, None, None,
  None, expiry time at the default retention), not the body alone;
- a get records the delivery (a _Delivery: seq, token, holding thread, receive count, the
  item) where ackqueue finds it again: by seq (in flight), by thread (given back when the
  thread ends) and by the item's identity (ack(item) and task_done() take the item, not a
  handle);
- an ack finds the delivery by the item's identity and removes it from all three.
It keeps no counts (counted=True measures those), no deadlines (none by default), no
ready index, and gives nothing back: the bookkeeping is kept, not used.
"""
import collections
import itertools
import pickle
import threading
import time

import transaction
from BTrees.LOBTree import LOBTree
from persistent import Persistent
from ZODB import DB
from ZODB.FileStorage import FileStorage

__all__ = ["LeanZodbQueue"]

SEGMENT_BITS = 4            # 16 messages per segment, as ackqueue's message index
LEAD_QUIET = 0.001          # as ackqueue.commit: lead only if alone for this long


class _Segment(Persistent):
    """Up to 16 messages, seq -> pickled item; its state is one bytes object."""

    def __init__(self):
        self.data = {}

    def __getstate__(self):
        return pickle.dumps(self.data, protocol=4)

    def __setstate__(self, state):
        self.data = pickle.loads(state)


class _Delivery:
    """guarded=True: one delivery of one message (ackqueue.state.Holding's least)."""
    __slots__ = ("seq", "token", "holder", "receive_count", "item")

    def __init__(self, seq, token, holder, item):
        self.seq, self.token, self.holder, self.item = seq, token, holder, item
        self.receive_count = 1


class _Unit:
    __slots__ = ("puts", "acks", "done")

    def __init__(self, puts=(), acks=()):
        self.puts, self.acks = puts, acks
        self.done = threading.Event()


class LeanZodbQueue:
    """put / get(timeout) / ack(handle) / put_many / ack_many over one FileStorage file."""

    def __init__(self, path, counted=False, guarded=False, synced=False):
        if synced:      # on ackqueue's storage for durability="fsync"
            from ackqueue.filestorage import SyncedFileStorage
            storage = SyncedFileStorage(path)
        else:
            storage = FileStorage(path)
        self._db = DB(storage)
        self._tm = transaction.TransactionManager(explicit=True)
        self._conn = self._db.open(transaction_manager=self._tm)
        with self._tm:
            self._segments = self._conn.root()["lean"] = LOBTree()
            self._counters = None
            if counted:
                from ackqueue.journal import JOURNAL_BATCH
                from ackqueue.store import Counters
                self._counters = self._conn.root()["lean.counters"] = Counters()
                self._journal_batch = JOURNAL_BATCH
        self._guarded = guarded
        if guarded:                             # a message's defaults, as ackqueue's
            from ackqueue.store import DEFAULT_PRIORITY, DEFAULT_RETENTION
            self._priority, self._retention = DEFAULT_PRIORITY, DEFAULT_RETENTION
        self._inflight = {}                     # guarded: seq -> _Delivery
        self._held_by = {}                      # guarded: thread id -> {seq: _Delivery}
        self._by_item = {}                      # guarded: id(item) -> _Delivery
        self._tokens = itertools.count()
        self._mutex = threading.Lock()
        self._not_empty = threading.Condition(self._mutex)
        self._ready = collections.deque()       # (seq, pickled item), committed puts
                                                # (guarded: (seq, the stored tuple))
        self._next_seq = 1
        self._cond = threading.Condition()      # guards _pending and the lead rule
        self._pending = []
        self._baton = threading.Lock()          # held by whoever commits
        self._last_submitter = None
        self._others_until = 0.0
        self._closing = False
        self.commits = 0
        self.units = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    # -- the queue -------------------------------------------------------------------------

    def put(self, item):
        self.put_many([item])

    def put_many(self, items):
        bodies = [pickle.dumps(item, protocol=4) for item in items]
        if self._guarded:
            now = time.time()
            tail = (self._priority, now, 0, None, None, None, now + self._retention)
            bodies = [(body,) + tail for body in bodies]
        with self._mutex:
            first = self._next_seq
            self._next_seq += len(bodies)
        self._commit_and_wait(_Unit(puts=list(zip(range(first, first + len(bodies)),
                                                  bodies))))

    def get(self, timeout):
        """(seq, item) of the next committed put, or None after timeout seconds."""
        with self._not_empty:
            if not self._not_empty.wait_for(lambda: self._ready, timeout):
                return None
            seq, body = self._ready.popleft()
            if self._guarded:
                return self._deliver(seq, body)
        return seq, pickle.loads(body)

    def get_many(self, n, timeout):
        """Up to n (seq, item): the first waited for, then what is ready."""
        first = self.get(timeout)
        if first is None:
            return []
        with self._mutex:
            more = [self._ready.popleft() for _ in range(min(n - 1, len(self._ready)))]
            if self._guarded:
                return [first] + [self._deliver(seq, body) for seq, body in more]
        return [first] + [(seq, pickle.loads(body)) for seq, body in more]

    def _deliver(self, seq, stored):
        """guarded: record the delivery of message seq (mutex held); its handle."""
        item = pickle.loads(stored[0])
        holder = threading.get_ident()
        delivery = _Delivery(seq, next(self._tokens), holder, item)
        self._inflight[seq] = delivery
        held = self._held_by.get(holder)
        if held is None:
            held = self._held_by[holder] = {}
        held[seq] = delivery
        self._by_item[id(item)] = delivery
        return seq, item

    def ack(self, handle):
        self.ack_many([handle])

    def ack_many(self, handles):
        if self._guarded:
            # By the item's identity, as ackqueue's ack(item): the handle's seq unused.
            with self._mutex:
                deliveries = [self._by_item.pop(id(item)) for _, item in handles]
                for delivery in deliveries:
                    del self._inflight[delivery.seq]
                    del self._held_by[delivery.holder][delivery.seq]
            self._commit_and_wait(_Unit(acks=[d.seq for d in deliveries]))
            return
        self._commit_and_wait(_Unit(acks=[seq for seq, _ in handles]))

    def close(self):
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self._conn.close()
        self._db.close()

    # -- group commit ------------------------------------------------------------------------

    def _commit_and_wait(self, unit):
        me, now = threading.get_ident(), time.monotonic()
        with self._cond:
            self._pending.append(unit)
            if me != self._last_submitter:
                if self._last_submitter is not None:
                    self._others_until = now + LEAD_QUIET
                self._last_submitter = me
            lead = len(self._pending) == 1 and now >= self._others_until
        if lead and self._baton.acquire(blocking=False):
            try:
                self._commit_pending()
            finally:
                self._baton.release()
            with self._cond:
                if self._pending:       # units that arrived meanwhile: the thread takes them
                    self._cond.notify()
        else:                           # not alone, or a commit is under way: the thread
            with self._cond:
                self._cond.notify()
        unit.done.wait()

    def _count(self, batch):
        """counted=True: what the batch changes in the queue's counts and ready set, in
        ackqueue's Counters (written by this commit)."""
        counters, most = self._counters, self._journal_batch
        journal = counters.journal
        puts = acks = 0
        for unit in batch:
            # As ackqueue's KeySet: a batch whose keys are one run goes to the journal as
            # one run; another batch of more than JOURNAL_BATCH keys goes to the ready
            # set's segments, not through the journal (here: nowhere at all).
            if unit.puts:
                first, last = unit.puts[0][0], unit.puts[-1][0]
                if len(unit.puts) > 1 and last - first + 1 == len(unit.puts):
                    journal.added.add_range(first, last + 1)
                elif len(unit.puts) <= most:
                    for seq, _ in unit.puts:
                        journal.added.add(seq)
            if unit.acks:
                low, high = min(unit.acks), max(unit.acks) + 1
                if len(unit.acks) > 1 and high - low == len(unit.acks):
                    start = low               # keys not in the journal's additions were
                    for s, e in journal.added.remove_range(low, high) + [(high, high)]:
                        if start < s:         # folded: they join its removals, as runs
                            journal.removed.add_range(start, s)
                        start = e
                elif len(unit.acks) <= most:
                    for seq in unit.acks:
                        if not journal.added.discard(seq):
                            journal.removed.add(seq)
            puts += len(unit.puts)
            acks += len(unit.acks)
        counters.add(ready=puts - acks, put=puts, acked=acks)
        if journal.full():
            counters.journal = type(journal)()   # emptied, where KeySet.fold writes segments

    def _run(self):
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if self._closing and not self._pending:
                    return
            with self._baton:
                self._commit_pending()

    def _commit_pending(self):
        with self._cond:
            batch, self._pending = self._pending, []
        if not batch:
            return
        segments = self._segments
        self._tm.begin()
        for unit in batch:
            for seq, body in unit.puts:
                segment = segments.get(seq >> SEGMENT_BITS)
                if segment is None:
                    segment = segments[seq >> SEGMENT_BITS] = _Segment()
                segment.data[seq] = body
                segment._p_changed = True
            for seq in unit.acks:
                segment = segments[seq >> SEGMENT_BITS]
                del segment.data[seq]
                if segment.data:
                    segment._p_changed = True
                else:
                    del segments[seq >> SEGMENT_BITS]
        if self._counters is not None:
            self._count(batch)
        self._tm.commit()
        self.commits += 1
        self.units += len(batch)
        with self._mutex:
            for unit in batch:
                self._ready.extend(unit.puts)
            arrived = sum(len(unit.puts) for unit in batch)
            if arrived:
                self._not_empty.notify(arrived)
        for unit in batch:
            unit.done.set()
