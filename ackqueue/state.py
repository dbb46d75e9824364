"""The live state of one named queue in this process: what is ready, who holds what.

Every decision (which message a get receives, whether a put must wait for room, whether an
ack is still valid) is made here, in memory, under one mutex, exactly as queue.Queue makes
them.  What must outlive the process is sent to the Committer as store operations:

- put:   Put is committed first; the message becomes visible only once it is durable, so a
         consumer never sees a message that a crash could still take away.
- get:   the choice is made in memory and nothing is written: if the process dies, the
         message is simply ready again on the next open.  The delivery's receive count
         reaches the store with its ack or give-back.  (With a dead-letter policy a Claim
         is written, and waited for, so that crashes count as receives.)
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
import random
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
COMPACT_EVERY = 512            # messages removed between compactions of the store's indexes
SWEEP_INTERVAL = 60.0          # least seconds between sweeps for expired messages ...
SWEEP_COST_FACTOR = 100        # ... and at least this many times a sweep's own duration
BODY_CACHE_BYTES = 64 << 20    # bodies of freshly put messages kept in memory for get
BODY_CACHE_ITEMS = 200_000


class MessageMissing(Exception):
    """A ready message's record or body is not in the store (raised by a load_meta)."""


class Meta:
    """What this process knows of a message: its pickled body, delivery history, when it
    expires, its attributes, and where it came from (see ackqueue.segments.Msg)."""

    __slots__ = ("body", "priority", "sent_at", "receive_count", "first_received",
                 "last_received", "expires_at", "attributes", "sequence", "source")

    def __init__(self, body, priority, sent_at, receive_count=0, first_received=None,
                 last_received=None, expires_at=None, attributes=None, sequence=None,
                 source=None):
        self.body = body
        self.priority = priority
        self.sent_at = sent_at
        self.receive_count = receive_count
        self.first_received = first_received
        self.last_received = last_received
        self.expires_at = expires_at
        self.attributes = attributes
        self.sequence = sequence
        self.source = source

    @classmethod
    def from_msg(cls, msg, body):
        """The Meta of a stored Msg (body: its pickled item, wherever it is kept)."""
        return cls(body, msg.priority, msg.sent_at, msg.receive_count, msg.first_received,
                   msg.last_received, msg.expires_at, msg.attributes, msg.sequence,
                   msg.source)

    def expired(self, now):
        return self.expires_at is not None and self.expires_at <= now


class PutOptions:
    """The validated keyword options of put()/put_many() (see AckQueue.put)."""

    __slots__ = ("priority", "delay", "retention", "attributes", "dedup_window")

    def __init__(self, priority=store.DEFAULT_PRIORITY, delay=0.0,
                 retention=store.DEFAULT_RETENTION, attributes=None,
                 dedup_window=store.DEFAULT_DEDUP_WINDOW):
        self.priority = priority
        self.delay = delay
        self.retention = retention
        self.attributes = attributes      # a tuple of (key, value) pairs, or None
        self.dedup_window = dedup_window


DEFAULT_PUT = PutOptions()


class DeadLetterPolicy:
    """max_receives, and the queue that takes messages received that often (None: drop
    them); target_state is that queue's live state when this process holds the storage."""

    __slots__ = ("max_receives", "target", "target_state")

    def __init__(self, max_receives, target, target_state=None):
        self.max_receives = max_receives
        self.target = target
        self.target_state = target_state


class Holding:
    """One delivery of one message to one holder (a QueueConnection)."""

    __slots__ = ("seq", "key", "skey", "token", "holder", "deadline", "meta", "item",
                 "receive_count", "settling", "txn", "released", "claim_ticket", "claimed")

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
        self.claim_ticket = None  # a Claim the receiver waits for (dead-letter policies)
        self.claimed = False      # a Claim was sent to the store for this delivery


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

    def peek(self):
        return self._keys.minKey()

    def pop_random(self):
        """A ready message chosen at random (get(shuffle=True)): the first key at or after
        a random point between the smallest and the largest."""
        low, high = self._keys.minKey(), self._keys.maxKey()
        key = self._keys.minKey(random.randint(low, high))
        self._keys.remove(key)
        self._len -= 1
        return key

    def discard(self, key):
        if key in self._keys:
            self._keys.remove(key)
            self._len -= 1

    def __iter__(self):
        return iter(self._keys)


class _ValueOrder:
    """Ready messages ordered by priority level, then item value, ties in put order
    (AckPriorityQueue).

    Keys are (rank, item, seq), rank being PRIORITY_MAX - priority.  put() refuses items
    that do not compare with the queue's head, as queue.PriorityQueue does, but a give-back
    must never fail: keys that cannot be compared fall back to (rank, type name, seq)."""

    class Key(tuple):
        __slots__ = ()

        def __lt__(self, other):
            try:
                return tuple.__lt__(self, other)
            except TypeError:
                return ((self[0], type(self[1]).__name__, self[2])
                        < (other[0], type(other[1]).__name__, other[2]))

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

    def pop_random(self):
        i = random.randrange(len(self._heap))
        key = self._heap[i]
        self._heap[i] = self._heap[-1]
        self._heap.pop()
        heapq.heapify(self._heap)
        return key

    def discard(self, key):
        try:
            self._heap.remove(key)
        except ValueError:
            return
        heapq.heapify(self._heap)

    def __iter__(self):
        return iter(self._heap)


def check_timeout(timeout, what="timeout"):
    """The stdlib's rule for timeouts, plus a clear error for NaN and non-numbers."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"'{what}' must be a number or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"'{what}' must be a non-negative number")
    return timeout


def _sweep_due(rec, now):
    """(seqs of the queue record's messages past their retention and not held through a
    server, whether any dedup id's window has passed)."""
    due = [seq for seq, msg in rec.messages.items()
           if msg.expires_at is not None and msg.expires_at <= now and msg.holder is None]
    dedup_due = rec.dedup is not None and any(until <= now for until in rec.dedup.values())
    return due, dedup_due


def _delivery(h):
    """What the store must learn of a delivery it never saw claimed: (receive count, first
    and last receive times); None when its Claim was written."""
    if h.claimed:
        return None
    return (h.receive_count, h.meta.first_received, h.meta.last_received)


def _loads_or_none(body):
    """The item of a pickled body, or None if it cannot be read here (an ordering key)."""
    try:
        return pickle.loads(body)
    except Exception:
        return None


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
        # A leaf lock (never held while taking another) for sequence numbers, so that
        # another queue's state can number a message moved here while holding its own mutex.
        self.seq_lock = threading.Lock()
        self._next_sweep = monotonic() + SWEEP_INTERVAL
        self._swept_at = clock()
        self._removed = 0             # messages gone since the indexes were last compacted
        self._reaper_wakes_at = 0.0   # monotonic time of the reaper's next pass (a hint)
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
                        self.kind = rec.kind
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
                self.ready = _IntOrder(rec.ready.key_list())
            for seq, visible_at in rec.delayed.items():
                self.delayed.append((visible_at, seq, self._memory_key_from_store(rec, seq)))
            heapq.heapify(self.delayed)
            tm.abort()
        finally:
            conn.close()

    def _check_kind(self, rec):
        if self.kind is not None and rec.kind != self.kind:
            raise QueueKindMismatch(
                f"queue {self.name!r} in {self.database.description} is "
                f"{store.KIND_NAMES[rec.kind]}; open it with that class")

    def _memory_key_from_store(self, rec, seq):
        if self.kind == store.VALUE:
            msg = rec.messages[seq]
            return self.memory_key(seq, _loads_or_none(rec.body_of(seq, msg)), msg.priority)
        return rec.key_of(seq)

    def memory_key(self, skey, item, priority=store.DEFAULT_PRIORITY):
        """The key that orders a message in memory (level and item for value order)."""
        if self.kind == store.VALUE:
            return (store.PRIORITY_MAX - priority, item, skey)
        return skey

    def seq_of(self, key):
        return key[-1] if self.kind == store.VALUE else store.seq_of_key(self.kind, key)

    def store_key_of(self, key):
        return key[-1] if self.kind == store.VALUE else key

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
        with self.seq_lock:
            first = self.next_seq
            self.next_seq += count
        return list(range(first, first + count))

    def new_message(self, seq, item, body, now, opts=DEFAULT_PUT, dedup_id=None):
        """The store operation that puts a message, and what makes it visible once durable."""
        priority = opts.priority
        skey = store.store_key(self.kind, priority, seq)
        visible_at = now + opts.delay if opts.delay else None
        expires_at = now + opts.retention
        meta = Meta(body, priority, now, expires_at=expires_at, attributes=opts.attributes)
        op = store.Put(self.name, seq, skey, body, priority, now, visible_at, expires_at,
                       opts.attributes, dedup_id,
                       None if dedup_id is None else now + opts.dedup_window)
        return op, (seq, self.memory_key(skey, item, priority), meta, visible_at)

    def ack_op(self, h):
        """The store operation that acknowledges delivery h."""
        return store.Ack(self.name, h.seq, h.skey, delivery=_delivery(h))

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
        self._arrive(entries)

    def arrivals_committed(self, entries):
        """Messages moved here from another queue (dead letters, redrives) are durable."""
        with self.mutex:
            self._arrive(entries)

    def _arrive(self, entries):
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
                    item < head[1]
                item < item
            except TypeError as exc:
                raise TypeError(f"priority queue items must be orderable: {exc}") from None

    # -- get ------------------------------------------------------------------------------

    def _shut(self, front):
        """queue.Queue.get's shutdown rule: raise once nothing is ready (at once if immediate)."""
        return front.is_shutdown and (front.shutdown_immediate or not len(self.ready))

    def claim(self, front, holder, block, timeout, visibility_timeout, load_meta,
              record=True, shuffle=False, policy=None, n=1):
        """Take the next ready message (a random one with shuffle) for holder, waiting as
        queue.Queue.get does, and return its Holding; with n > 1 a list of 1 to n Holdings:
        the first waited for, the others whatever else is ready (one pass, one mutex).
        With record, a Claim is sent to the store: not waited for, unless a dead-letter
        policy needs the receive count durable before the item is handed out (the caller
        then waits on holding.claim_ticket); without record (inside an application
        transaction, whose commit acknowledges it or whose abort gives it back) the store
        never sees this delivery.  Messages past their retention, and messages already
        received policy.max_receives times, are taken out on the way instead of being
        delivered."""
        endtime = None if (timeout is None or not block) else monotonic() + timeout
        moves = []
        take = (holder, visibility_timeout, load_meta, record, shuffle, policy, moves)
        try:
            with self.not_empty:
                while True:
                    self._wait_ready(front, block, endtime)
                    first = self._take_next(*take)
                    if first is not None:
                        break
                if n == 1:
                    return first
                got = [first]
                while len(got) < n and len(self.ready) and not self._shut(front):
                    try:
                        h = self._take_next(*take)
                    except Exception:
                        # The batch so far is delivered and must reach the caller; the
                        # message that could not be read stays ready, and the next get
                        # that reaches it raises.
                        log.warning("ackqueue: a get_many batch stops short: a message "
                                    "could not be read", exc_info=True)
                        break
                    if h is not None:
                        got.append(h)
                return got
        finally:
            # A get that moved messages to a dead-letter queue returns (or raises Empty)
            # once the moves are durable, so that queue is seen holding them right after.
            for ticket in moves:
                try:
                    ticket.wait()
                except Exception:     # the move failed: the message is back here
                    log.warning("ackqueue: a dead-letter move failed", exc_info=True)

    def _take_next(self, holder, visibility_timeout, load_meta, record, shuffle, policy,
                   moves):
        """Deliver the next ready message to holder (call with the mutex, with a message
        ready); None if it was taken out instead (expired, dead-lettered, or missing from
        the store)."""
        key = self.ready.pop_random() if shuffle else self.ready.pop()
        seq = self.seq_of(key)
        meta = self._uncache(seq)
        if meta is None:
            try:
                meta = load_meta(seq)
            except MessageMissing as exc:
                self._drop_missing(seq, key, exc)
                return None
            except BaseException:
                self.ready.push(key)
                raise
        now = self.clock()
        if meta.expired(now):
            self.committer.submit([store.Expire(self.name, seq, now)])
            self._left()
            return None
        if (policy is not None and policy.max_receives is not None
                and meta.receive_count >= policy.max_receives):
            moves.append(self._dead_letter(seq, key, meta, policy, now))
            return None
        return self._deliver(seq, key, meta, holder, now, visibility_timeout, record, policy)

    def _drop_missing(self, seq, key, exc):
        """Nothing can ever deliver a message whose record or body is gone: its entry goes
        (call with the mutex, key already out of the ready set), so that the messages behind
        it are delivered instead of every get that reaches it failing."""
        log.error("ackqueue: %s; it was taken out of queue %r (counted in stats() as "
                  "missing)", exc, self.name)
        self.committer.submit([store.DropMissing(self.name, seq, key)])
        self._left()

    def _uncache(self, seq):
        """Take message seq's Meta out of the body cache (None if it is not there),
        keeping the cache's byte count: bodies of messages never received are counted."""
        meta = self.meta.pop(seq, None)
        if meta is not None and meta.receive_count == 0:
            self.cached_bytes -= len(meta.body)
        return meta

    def _wait_ready(self, front, block, endtime):
        """Wait until a message is ready (queue.Queue.get's rules; call with the mutex)."""
        self._expire()
        if self._shut(front):
            raise ShutDown
        while not len(self.ready):
            if not block:
                raise Empty
            if endtime is None:
                self.not_empty.wait()
            else:
                remaining = endtime - monotonic()
                if remaining <= 0.0:
                    raise Empty
                self.not_empty.wait(remaining)
            self._expire()
            if self._shut(front):
                raise ShutDown

    def _deliver(self, seq, key, meta, holder, now, visibility_timeout, record, policy):
        meta.receive_count += 1
        meta.last_received = now
        if meta.first_received is None:
            meta.first_received = now
        deadline = None if visibility_timeout is None else now + visibility_timeout
        holding = Holding(seq, key, self.store_key_of(key), next(self.tokens), holder,
                          deadline, meta)
        self.inflight[seq] = holding
        held = self.holders.get(holder)
        if held is None:
            held = self.holders[holder] = {}
            if holder.thread_bound and self._reaper_wakes_at > monotonic() + REAP_INTERVAL:
                self.reaper_wake.notify()     # it must now watch this thread (REAP_INTERVAL)
        held[seq] = holding
        if deadline is not None:
            heapq.heappush(self.deadlines, (deadline, holding.token, seq))
            if self.deadlines[0][1] == holding.token:
                self.reaper_wake.notify()     # the earliest deadline: the reaper's next wake
        if record and policy is not None and policy.max_receives is not None:
            holding.claimed = True
            holding.claim_ticket = self.committer.submit([store.Claim(
                self.name, seq, holding.skey, meta.receive_count, now, deadline)])
        self.not_full.notify()
        return holding

    def _left(self, count=1):
        """A message left the queue without an ack (expired, dead-lettered, purged)."""
        self._count_removed(count)
        self.not_full.notify()
        if not self.unfinished():
            self.all_tasks_done.notify_all()

    def _dead_letter(self, seq, key, meta, policy, now):
        """Move a message received max_receives times to the dead-letter queue (or drop it)
        instead of delivering it again (call with the mutex held)."""
        target = policy.target_state
        if target is None:
            self._left()
            return self.committer.submit([store.DeadLetter(self.name, seq, None, None, now)])
        tseq = target._reserve_seqs(1)[0]
        moved = Meta(meta.body, meta.priority, meta.sent_at, meta.receive_count,
                     meta.first_received, meta.last_received,
                     now + store.DEAD_LETTER_RETENTION, meta.attributes,
                     meta.sequence or seq, self.name)
        tkey = target.memory_key(store.store_key(target.kind, meta.priority, tseq),
                                 _loads_or_none(meta.body) if target.kind == store.VALUE
                                 else None, meta.priority)

        def failed(error, key=key, seq=seq, meta=meta):
            with self.mutex:          # still in the store here: back to its place
                self.meta[seq] = meta
                self.ready.push(key)
                self.not_empty.notify()

        self._left()
        return self.committer.submit(
            [store.DeadLetter(self.name, seq, policy.target, tseq, now)],
            on_commit=lambda: target.arrivals_committed([(tseq, tkey, moved, None)]),
            on_fail=failed)

    # -- peek, counts, purge, redrive, visibility -------------------------------------------

    def peek(self, load_meta):
        """(seq, Meta) of the message the next get would receive, or None; no side effect
        (beyond taking out messages found past their retention, or missing from the
        store)."""
        with self.mutex:
            self._expire()
            while len(self.ready):
                key = self.ready.peek()
                seq = self.seq_of(key)
                try:
                    meta = self.meta.get(seq) or load_meta(seq)
                except MessageMissing as exc:
                    self.ready.pop()
                    self._drop_missing(seq, key, exc)
                    continue
                now = self.clock()
                if not meta.expired(now):
                    return seq, meta
                self.ready.pop()
                self._uncache(seq)
                self.committer.submit([store.Expire(self.name, seq, now)])
                self._left()
            return None

    def counts(self):
        """The current sizes, as this process holds them (the truth for a lone process)."""
        with self.mutex:
            self._expire()
            return {"ready": len(self.ready), "in_flight": len(self.inflight),
                    "delayed": len(self.delayed)}

    def totals(self):
        """The queue's lifetime totals, from the store, once what this process sent is in."""
        self.committer.submit([]).wait()
        tm = transaction.TransactionManager()
        conn = self.database.db.open(transaction_manager=tm)
        try:
            tm.begin()
            counts = conn.root()[store.ROOT_KEY].queues[self.name].counts
            result = {name: counts.get(name) for name in store.Counters.TOTALS}
            tm.abort()
            return result
        finally:
            conn.close()

    def purge(self):
        """Remove every ready and delayed message (in-flight ones stay); returns how many."""
        with self.mutex:
            self._expire()
            seqs = [self.seq_of(key) for key in self.ready]
            seqs += [seq for _, seq, _ in self.delayed]
            self.ready = type(self.ready)()
            self.delayed = []
            for seq in seqs:
                self._uncache(seq)
            self._left(len(seqs))
            self.not_full.notify_all()
        if seqs:
            self.committer.submit([store.Purge(self.name, seqs)]).wait()
        return len(seqs)

    def redrive(self, targets, to, load_meta):
        """Move the ready messages that came from other queues back to them (or to ``to``);
        targets: queue name -> live state, for every queue they may go to."""
        with self.mutex:
            self._expire()
            moves, taken = [], []
            for key in list(self.ready):
                seq = self.seq_of(key)
                try:
                    meta = self.meta.get(seq) or load_meta(seq)
                except MessageMissing as exc:
                    self.ready.discard(key)
                    self._drop_missing(seq, key, exc)
                    continue
                name = to or meta.source
                if name is None or name not in targets:
                    continue
                self.ready.discard(key)
                self._uncache(seq)
                target = targets[name]
                tseq = target._reserve_seqs(1)[0]
                back = Meta(meta.body, meta.priority, meta.sent_at, 0, None, None,
                            self.clock() + store.DEFAULT_RETENTION, meta.attributes,
                            meta.sequence or seq, None)
                tkey = target.memory_key(
                    store.store_key(target.kind, meta.priority, tseq),
                    _loads_or_none(meta.body) if target.kind == store.VALUE else None,
                    meta.priority)
                moves.append((seq, name, tseq))
                taken.append((key, seq, meta, target, (tseq, tkey, back, None)))
            self._left(len(moves))
        if not moves:
            return 0
        try:
            self.committer.submit([store.Redrive(self.name, moves, self.clock())]).wait()
        except BaseException:
            with self.mutex:
                for key, seq, meta, _, _ in taken:
                    self.meta[seq] = meta
                    self.ready.push(key)
                self.not_empty.notify_all()
            raise
        for _, _, _, target, entry in taken:
            target.arrivals_committed([entry])
        return len(moves)

    def change_visibility(self, holding, seconds):
        """A new deadline, seconds from now, for a live delivery; seconds <= 0 gives it
        back now."""
        with self.mutex:
            self._expire()
            self.check_current(holding)
            if seconds <= 0:
                self._give_back(holding, "change_visibility() gave it back")
                return
            holding.deadline = self.clock() + seconds
            heapq.heappush(self.deadlines, (holding.deadline, holding.token, holding.seq))
            self.reaper_wake.notify()

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

    def _count_removed(self, count):
        # Removed messages leave empty index segments behind (kept, so that a near-empty
        # queue does not create and drop a segment per message); drop them now and then.
        self._removed += count
        if self._removed >= COMPACT_EVERY:
            self._removed = 0
            self.committer.submit([store.Compact(self.name)])

    def _settled(self, holdings):
        self._count_removed(len(holdings))
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
                on_fail=lambda error: self.cancel_settle(holdings), lead=True)
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
        now = self.clock()
        visible_at = None
        if h.meta.expired(now):
            self._left()              # past its retention: the store's Release expires it
        elif delay and delay > 0:
            self.meta[h.seq] = h.meta
            visible_at = now + delay
            heapq.heappush(self.delayed, (visible_at, h.seq, h.key))
            self.reaper_wake.notify()
        else:
            self.meta[h.seq] = h.meta
            self.ready.push(h.key)
            self.not_empty.notify()
        self.committer.submit([store.Release(self.name, h.seq, h.skey, visible_at, at=now,
                                             delivery=_delivery(h))])

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
            deadline, token, seq = heapq.heappop(self.deadlines)
            h = self.inflight.get(seq)
            if h is not None and h.token == token and h.deadline == deadline:
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
        waits = [max(self._next_sweep - monotonic(), 0.001)]
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
                    if self._sweep_due():
                        self.mutex.release()      # a sweep reads the store: not under the mutex
                        try:
                            self.sweep()
                        finally:
                            self.mutex.acquire()
                except Exception:  # pragma: no cover - keep reaping whatever happens
                    log.exception("ackqueue: reaper pass failed")
                if not self.stopped:
                    wait = self._next_wake()
                    self._reaper_wakes_at = monotonic() + wait
                    self.reaper_wake.wait(wait)

    def _sweep_due(self):
        # Due by the monotonic clock, or when the queue's own clock jumped (an injected one).
        return (monotonic() >= self._next_sweep
                or self.clock() - self._swept_at >= SWEEP_INTERVAL)

    def sweep(self):
        """Take out ready and delayed messages past their retention, and forget dedup ids
        whose window has passed.  Reads the whole queue from the store, so it runs at most
        every SWEEP_INTERVAL seconds and at most 1/SWEEP_COST_FACTOR of the time; gets
        never deliver an expired message in between.  Returns how many expired."""
        began, now = monotonic(), self.clock()
        tm = transaction.TransactionManager()
        conn = self.database.db.open(transaction_manager=tm)
        try:
            tm.begin()
            rec = conn.root()[store.ROOT_KEY].queues[self.name]
            due, dedup_due = _sweep_due(rec, now)
            tm.abort()
        finally:
            conn.close()
        return self._finish_sweep(self._take_out_expired(due, now), dedup_due, now, began)

    def _finish_sweep(self, expired, dedup_due, now, began):
        """Commit the sweep's removals and schedule the next one; returns how many expired."""
        ops = [store.Expire(self.name, seq, now) for seq in expired]
        if dedup_due:
            ops.append(store.PruneDedup(self.name, now))
        if ops:
            self.committer.submit(ops)
        self._swept_at = now
        self._next_sweep = monotonic() + max(SWEEP_INTERVAL,
                                             SWEEP_COST_FACTOR * (monotonic() - began))
        return len(expired)

    def _take_out_expired(self, seqs, now):
        """Forget the listed messages that are ready or delayed here (not in flight)."""
        seqs = set(seqs) - set(self.inflight)
        if not seqs:
            return []
        with self.mutex:
            seqs -= set(self.inflight)
            gone = [key for key in self.ready if self.seq_of(key) in seqs]
            for key in gone:
                self.ready.discard(key)
            delayed = [d for d in self.delayed if d[1] not in seqs]
            taken = [self.seq_of(key) for key in gone]
            taken += [d[1] for d in self.delayed if d[1] in seqs]
            if len(delayed) != len(self.delayed):
                self.delayed = delayed
                heapq.heapify(self.delayed)
            for seq in taken:
                self._uncache(seq)
            self._left(len(taken))
            return taken

    def _reap_pass(self):
        self._expire()

    def stop(self):
        with self.mutex:
            self.stopped = True
            self.reaper_wake.notify_all()
        if self._reaper is not threading.current_thread():
            self._reaper.join()
