"""The live state of one named queue in this process: what is ready, who holds what.

Every decision (which message a get receives, whether a put must wait for room, whether an
ack is still valid) is made here, in memory, under one mutex, exactly as queue.Queue makes
them.  What must outlive the process is sent to the Committer as store operations:

- put:   Put is committed first; the message becomes visible only once it is durable, so a
         consumer never sees a message that a crash could still take away.
- get:   the choice is made in memory and a Claim is sent without waiting: if the process
         dies before it is written, the message is simply ready again on the next open.
- ack:   Ack is committed, and the caller waits for it; until then the holding is "settling"
         and no deadline can give it back.
- give-back (nack, visibility deadline, dead thread, rolled-back transaction): the message
         returns at once to its original place (its key), and a Release is sent.

The store stays the truth for what survives; this object is the truth for who holds what
right now.  On open, a storage that this process holds alone gives back everything that was
in flight (its holders died with the old process) and the ready set is loaded into memory.

Deadlines use the injectable clock (wall-clock seconds, time.time by default); a reaper
thread gives back expired holdings and holdings of threads that ended, and every get/qsize
checks too, so tests with a fake clock need no sleeping.
"""
import heapq
import itertools
import logging
import math
import pickle
import threading
import time
from queue import Empty, Full
from time import monotonic

import transaction

from BTrees.LLBTree import LLTreeSet
from ZODB.POSException import ConflictError

from . import store
from .errors import QueueKindMismatch, ShutDown, StaleAck

__all__ = ["QueueState", "Meta", "Holding"]

log = logging.getLogger(__name__)

REAP_INTERVAL = 0.25           # how often held messages of ended threads are looked for
BODY_CACHE_BYTES = 64 << 20    # bodies of freshly put messages kept in memory for get
BODY_CACHE_ITEMS = 200_000


class Meta:
    """What this process knows of a message: its pickled body and delivery history."""

    __slots__ = ("body", "priority", "sent_at", "receive_count", "first_received",
                 "last_received")

    def __init__(self, body, priority, sent_at, receive_count=0, first_received=None,
                 last_received=None):
        self.body = body
        self.priority = priority
        self.sent_at = sent_at
        self.receive_count = receive_count
        self.first_received = first_received
        self.last_received = last_received


class Holding:
    """One delivery of one message to one holder (a QueueConnection)."""

    __slots__ = ("seq", "key", "skey", "token", "holder", "deadline", "meta", "item",
                 "receive_count", "settling", "txn", "released")

    def __init__(self, seq, key, skey, token, holder, deadline, meta):
        self.seq = seq            # the message's sequence number
        self.key = key            # its place in the in-memory ready order
        self.skey = skey          # its place in the store's ready set
        self.token = token        # unique per delivery: tells a late ack from a current one
        self.holder = holder
        self.deadline = deadline  # clock() time at which it is given back, or None
        self.meta = meta
        self.receive_count = meta.receive_count
        self.item = None          # the object get() returned (for ack by identity)
        self.settling = False     # an ack is on its way: no deadline may give it back now
        self.txn = None           # the transaction block it was received in, if any
        self.released = None      # why it was given back, once it was


class _IntOrder:
    """Ready messages ordered by integer store key (FIFO, LIFO, integer priority)."""

    def __init__(self, keys=()):
        self._keys = LLTreeSet(keys)
        self._len = len(self._keys)

    def __len__(self):
        return self._len

    def push(self, key):
        if self._keys.add(key):
            self._len += 1

    def pop(self):
        key = self._keys.minKey()
        self._keys.remove(key)
        self._len -= 1
        return key


class _ValueOrder:
    """Ready messages ordered by item value, ties in put order (AckPriorityQueue).

    Keys are (item, seq).  put() refuses items that do not compare with the queue's head,
    as queue.PriorityQueue does, but a give-back must never fail: keys that cannot be
    compared fall back to (type name, seq) order."""

    class Key(tuple):
        __slots__ = ()

        def __lt__(self, other):
            try:
                return tuple.__lt__(self, other)
            except TypeError:
                return ((type(self[0]).__name__, self[1])
                        < (type(other[0]).__name__, other[1]))

    def __init__(self, entries=()):
        self._heap = [self.Key(e) for e in entries]
        heapq.heapify(self._heap)

    def __len__(self):
        return len(self._heap)

    def push(self, key):
        heapq.heappush(self._heap, self.Key(key))

    def pop(self):
        return heapq.heappop(self._heap)

    def peek(self):
        return self._heap[0]


def check_timeout(timeout, what="timeout"):
    """The stdlib's rule for timeouts, plus a clear error for NaN and non-numbers."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"'{what}' must be a number or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"'{what}' must be a non-negative number")
    return timeout


class QueueState:
    """The in-process view of one named queue (see the module docstring)."""

    def __init__(self, database, name, kind, clock=time.time):
        self.database = database
        self.committer = database.committer
        self.name = name
        self.kind = kind
        self.clock = clock
        self.mutex = threading.Lock()
        self.not_empty = threading.Condition(self.mutex)
        self.not_full = threading.Condition(self.mutex)
        self.all_tasks_done = threading.Condition(self.mutex)
        self.reaper_wake = threading.Condition(self.mutex)
        self.inflight = {}           # seq -> Holding
        self.holders = {}            # holder -> {seq: Holding}, in delivery order
        self.deadlines = []          # heap of (deadline, token, seq)
        self.delayed = []            # heap of (visible_at, seq, key)
        self.meta = {}               # seq -> Meta, for messages this process put or delivered
        self.cached_bytes = 0
        self.pending_puts = 0        # reserved by put() but not yet durable
        self.tokens = itertools.count(1)
        self.stopped = False
        self.recovered = 0
        # Whether this process acknowledges on this queue (ack, nack, task_done, join,
        # connect, transaction, visibility timeouts).  Until it does, a thread that returns
        # normally keeps what it got, as with queue.Queue; see QueueConnection.
        self.acknowledging = False
        self._load()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                        name=f"ackqueue-reaper-{name}")
        self._reaper.start()

    # -- opening -------------------------------------------------------------------------

    def _load(self):
        """Create or check the queue record, recover what was in flight, load the ready set."""
        tm = transaction.TransactionManager()
        conn = self.database.db.open(transaction_manager=tm)
        try:
            for attempt in itertools.count():
                try:
                    with tm:
                        rec = store.ensure_queue(conn.root(), self.name, self.kind)
                        self._check_kind(rec)
                        if self.database.exclusive:
                            self.recovered = rec.recover_inflight()
                    break
                except ConflictError:
                    if attempt >= 10:
                        raise
            tm.begin()
            rec = conn.root()[store.ROOT_KEY].queues[self.name]
            self.next_seq = rec.next_seq.value
            if self.kind == store.VALUE:
                self.ready = _ValueOrder(
                    self._memory_key_from_store(rec, seq) for seq in rec.ready)
            else:
                self.ready = _IntOrder(rec.ready)
            for seq, visible_at in rec.delayed.items():
                self.delayed.append((visible_at, seq, self._memory_key_from_store(rec, seq)))
            heapq.heapify(self.delayed)
            tm.abort()
        finally:
            conn.close()

    def _check_kind(self, rec):
        if rec.kind != self.kind:
            raise QueueKindMismatch(
                f"queue {self.name!r} in {self.database.description} is "
                f"{store.KIND_NAMES[rec.kind]}; open it with that class")

    def _memory_key_from_store(self, rec, seq):
        if self.kind == store.VALUE:
            return (pickle.loads(rec.body_of(seq, rec.messages[seq])), seq)
        return rec.key_of(seq)

    def memory_key(self, skey, item):
        """The key that orders a message in memory (the item itself for value order)."""
        return (item, skey) if self.kind == store.VALUE else skey

    def seq_of(self, key):
        return key[1] if self.kind == store.VALUE else store.seq_of_key(self.kind, key)

    def store_key_of(self, key):
        return key[1] if self.kind == store.VALUE else key

    # -- sizes (call with the mutex held) -------------------------------------------------

    def ready_count(self):
        return len(self.ready)

    def unfinished(self):
        """Messages put and not yet acknowledged: what join() waits for."""
        return len(self.ready) + len(self.delayed) + len(self.inflight)

    def size_for_maxsize(self):
        return len(self.ready) + len(self.delayed) + self.pending_puts

    # -- put ------------------------------------------------------------------------------

    def reserve_put(self, front, count, block, timeout):
        """Wait for room for count messages (queue.Queue's rules) and return their seqs."""
        with self.not_full:
            self._wait_for_room(front, count, block, timeout)
            self.pending_puts += count
            return self._reserve_seqs(count)

    def _wait_for_room(self, front, count, block, timeout):
        if front.is_shutdown:
            raise ShutDown
        if front.maxsize <= 0:
            return
        if not block:
            if self.size_for_maxsize() + count > front.maxsize:
                raise Full
        elif timeout is None:
            while self.size_for_maxsize() + count > front.maxsize:
                self.not_full.wait()
                if front.is_shutdown:
                    raise ShutDown
        else:
            endtime = monotonic() + timeout
            while self.size_for_maxsize() + count > front.maxsize:
                remaining = endtime - monotonic()
                if remaining <= 0.0:
                    raise Full
                self.not_full.wait(remaining)
                if front.is_shutdown:
                    raise ShutDown

    def _reserve_seqs(self, count):
        first = self.next_seq
        self.next_seq += count
        return list(range(first, first + count))

    def new_message(self, seq, item, body, now):
        """The store operation that puts a message, and what makes it visible once durable."""
        skey = store.store_key(self.kind, store.DEFAULT_PRIORITY, seq)
        meta = Meta(body, store.DEFAULT_PRIORITY, now)
        op = store.Put(self.name, seq, skey, body, store.DEFAULT_PRIORITY, now)
        return op, (seq, self.memory_key(skey, item), meta, None)

    def ack_op(self, h):
        """The store operation that acknowledges delivery h."""
        return store.Ack(self.name, h.seq, h.skey)

    def unreserve(self, count):
        """Reserved room that will not be used (a failed put, a rolled-back transaction)."""
        with self.mutex:
            self._unreserve(count)

    def _unreserve(self, count):
        self.pending_puts -= count
        self.not_full.notify(count)

    def puts_committed(self, entries):
        """Durable puts become visible: entries are (seq, key, meta, visible_at)."""
        with self.mutex:
            self._puts_visible(entries)

    def _puts_visible(self, entries):
        self.pending_puts -= len(entries)
        for seq, key, meta, visible_at in entries:
            if (self.cached_bytes + len(meta.body) <= BODY_CACHE_BYTES
                    and len(self.meta) < BODY_CACHE_ITEMS):
                self.meta[seq] = meta
                self.cached_bytes += len(meta.body)
            if visible_at:
                heapq.heappush(self.delayed, (visible_at, seq, key))
                self.reaper_wake.notify()
            else:
                self.ready.push(key)
                self.not_empty.notify()

    def check_orderable(self, items):
        """A priority queue's items must compare with each other, as heapq needs."""
        with self.mutex:
            head = self.ready.peek() if len(self.ready) else None
        for item in items:
            try:
                if head is not None:
                    item < head[0]
                item < item
            except TypeError as exc:
                raise TypeError(f"priority queue items must be orderable: {exc}") from None

    # -- get ------------------------------------------------------------------------------

    def _shut(self, front):
        """queue.Queue.get's shutdown rule: raise once nothing is ready (at once if immediate)."""
        return front.is_shutdown and (front.shutdown_immediate or not len(self.ready))

    def claim(self, front, holder, block, timeout, visibility_timeout, load_meta,
              record=True):
        """Take the next ready message for holder (waiting as queue.Queue.get does) and
        return its Holding.  With record, a Claim is sent to the store (not waited for);
        without (inside an application transaction, whose commit acknowledges it or
        whose abort gives it back) the store never sees this delivery."""
        with self.not_empty:
            self._expire()
            if self._shut(front):
                raise ShutDown
            if not block:
                if not len(self.ready):
                    raise Empty
            elif timeout is None:
                while not len(self.ready):
                    self.not_empty.wait()
                    self._expire()
                    if self._shut(front):
                        raise ShutDown
            else:
                endtime = monotonic() + timeout
                while not len(self.ready):
                    remaining = endtime - monotonic()
                    if remaining <= 0.0:
                        raise Empty
                    self.not_empty.wait(remaining)
                    self._expire()
                    if self._shut(front):
                        raise ShutDown
            key = self.ready.pop()
            seq = self.seq_of(key)
            meta = self.meta.pop(seq, None)
            if meta is None:
                try:
                    meta = load_meta(seq)
                except BaseException:
                    self.ready.push(key)
                    raise
            elif meta.receive_count == 0:          # counted in the body cache by put
                self.cached_bytes -= len(meta.body)
            now = self.clock()
            meta.receive_count += 1
            meta.last_received = now
            if meta.first_received is None:
                meta.first_received = now
            deadline = None if visibility_timeout is None else now + visibility_timeout
            holding = Holding(seq, key, self.store_key_of(key), next(self.tokens), holder,
                              deadline, meta)
            self.inflight[seq] = holding
            self.holders.setdefault(holder, {})[seq] = holding
            if deadline is not None:
                heapq.heappush(self.deadlines, (deadline, holding.token, seq))
                self.reaper_wake.notify()
            elif holder.thread_bound:
                self.reaper_wake.notify()
            if record:
                self.committer.submit([store.Claim(self.name, seq, holding.skey,
                                                   meta.receive_count, now, deadline)])
            self.not_full.notify()
            return holding

    # -- ack ------------------------------------------------------------------------------

    def check_current(self, holding):
        """Raise StaleAck unless holding is still the live delivery of its message."""
        if self.inflight.get(holding.seq) is not holding:
            why = holding.released or "it was acknowledged already"
            raise StaleAck(
                f"message {holding.seq} of queue {self.name!r} is no longer held by this "
                f"delivery (receive {holding.receive_count}): {why}. The late "
                "acknowledgement was refused and the message left as it is")
        if holding.settling:
            raise StaleAck(f"message {holding.seq} of queue {self.name!r} is being "
                           "acknowledged already")

    def begin_settle(self, holdings):
        """Mark holdings as being acknowledged; all must be current (else StaleAck)."""
        with self.mutex:
            self._expire()            # an ack after its deadline is late, reaped or not
            for h in holdings:
                self.check_current(h)
            for h in holdings:
                h.settling = True

    def cancel_settle(self, holdings):
        with self.mutex:
            for h in holdings:
                h.settling = False

    def settled(self, holdings):
        """Acks are durable: the messages are gone for good."""
        with self.mutex:
            self._settled(holdings)

    def _settled(self, holdings):
        for h in holdings:
            if self.inflight.get(h.seq) is h:
                del self.inflight[h.seq]
                self._forget_holding(h)
            h.released = "it was acknowledged already"
            h.settling = False
        if not self.unfinished():
            self.all_tasks_done.notify_all()

    def ack(self, holding):
        """Acknowledge one holding durably (the caller waits)."""
        self.ack_many([holding])

    def ack_many(self, holdings):
        self.begin_settle(holdings)
        try:
            ticket = self.committer.submit(
                [self.ack_op(h) for h in holdings],
                on_commit=lambda: self.settled(holdings),
                on_fail=lambda error: self.cancel_settle(holdings))
        except BaseException:
            self.cancel_settle(holdings)
            raise
        ticket.wait()

    # -- give back ------------------------------------------------------------------------

    def give_back(self, holding, why, delay=0.0):
        """Return a held message to its place (now, or after delay seconds)."""
        with self.mutex:
            self.check_current(holding)
            self._give_back(holding, why, delay)

    def _give_back(self, h, why, delay=0.0):
        del self.inflight[h.seq]
        self._forget_holding(h)
        h.released = why
        self.meta[h.seq] = h.meta
        visible_at = None
        if delay and delay > 0:
            visible_at = self.clock() + delay
            heapq.heappush(self.delayed, (visible_at, h.seq, h.key))
            self.reaper_wake.notify()
        else:
            self.ready.push(h.key)
            self.not_empty.notify()
        self.committer.submit([store.Release(self.name, h.seq, h.skey, visible_at)])

    def _forget_holding(self, h):
        held = self.holders.get(h.holder)
        if held is not None:
            held.pop(h.seq, None)
            if not held:
                del self.holders[h.holder]

    def give_back_all(self, holder, why):
        """Give back everything holder still holds (a proxy closing, its thread ended)."""
        with self.mutex:
            self._give_back_all(holder, why)

    def _give_back_all(self, holder, why):
        for h in list(self.holders.get(holder, {}).values()):
            if not h.settling:
                self._give_back(h, why)

    # -- transactions ---------------------------------------------------------------------

    def txn_committed(self, block):
        """A transaction block's single commit is durable."""
        with self.mutex:
            self._settled(block.got + block.acks)
            self._puts_visible(block.put_entries)

    def txn_rolled_back(self, block, why):
        """A transaction block rolled back: what it got returns, its puts never existed."""
        with self.mutex:
            for h in block.got:
                if self.inflight.get(h.seq) is h:
                    h.settling = False
                    self._give_back(h, why)
            for h in block.acks:
                h.settling = False
            self._unreserve(len(block.put_entries))

    # -- deadlines, delays, ended threads -------------------------------------------------

    def _expire(self):
        """Give back what is due (call with the mutex held)."""
        now = self.clock()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, token, seq = heapq.heappop(self.deadlines)
            h = self.inflight.get(seq)
            if h is not None and h.token == token:
                if h.settling:        # an ack is being written; look again later
                    heapq.heappush(self.deadlines, (now + 0.05, token, seq))
                    break
                self._give_back(h, "its visibility deadline passed")
        while self.delayed and self.delayed[0][0] <= now:
            _, seq, key = heapq.heappop(self.delayed)
            self.ready.push(key)
            self.not_empty.notify()
        for holder in [hd for hd in self.holders if hd.thread_bound and not hd.alive()]:
            if self.acknowledging or holder.ended_by_exception():
                self._give_back_all(holder, "the thread that received it ended")
            else:
                # Plain queue.Queue code (nothing on this queue was ever acknowledged):
                # a get is final within the process, as with queue.Queue.  What the thread
                # held comes back at its deadline or on the next open.
                holder.thread_bound = False

    def _next_wake(self):
        waits = []
        now = self.clock()
        if self.deadlines:
            waits.append(self.deadlines[0][0] - now)
        if self.delayed:
            waits.append(self.delayed[0][0] - now)
        if any(h.thread_bound for h in self.holders):
            waits.append(REAP_INTERVAL)
        if not waits:
            return None
        # Never trust a (possibly injected) clock for more than a second.
        return min(max(min(waits), 0.001), 1.0)

    def _reap_loop(self):
        with self.mutex:
            while not self.stopped:
                try:
                    self._reap_pass()
                except Exception:  # pragma: no cover - keep reaping whatever happens
                    log.exception("ackqueue: reaper pass failed")
                self.reaper_wake.wait(self._next_wake())

    def _reap_pass(self):
        self._expire()

    def stop(self):
        with self.mutex:
            self.stopped = True
            self.reaper_wake.notify_all()
        if self._reaper is not threading.current_thread():
            self._reaper.join()
