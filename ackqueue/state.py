"""The live state of one named queue in this process: the rules, written once.

This module holds the rules of ackqueue.interfaces.IQueueState; what differs between a
process that holds its storage alone and processes that share it through a server sits
behind one seam, the arbiter (ackqueue.arbiters.local.LocalArbiter, ackqueue.arbiters.shared.SharedArbiter).

- put:   the Put is committed first; the message becomes visible only once it is durable,
         so a consumer never sees a message that a crash could still take away.
- get:   the arbiter takes a ready message for the holder (try_claim, which never waits);
         a blocking get waits on the one wait loop below and tries again.  Receive rules
         (verdict): a message past its retention expires, one received max_receives times
         moves to the dead-letter queue, instead of being delivered.
- ack:   the Ack is committed, and the caller waits for it; until then the holding is
         "settling" and no deadline can give it back.
- give-back (nack, visibility deadline, dead thread, rolled-back transaction): the message
         returns to its original place (its key), ready now or after a delay, and a
         Release is written (arbiter.put_back).

Deadlines use the injectable clock (wall-clock seconds, time.time by default); a reaper
thread gives back expired holdings and holdings of threads that ended, and every get/qsize
checks too, so tests with a fake clock need no sleeping.  A thread that ends tells the
states it used (connection.watch_thread_end), so a get or qsize looks at threads only after
one has ended; the reaper looks at all of them every REAP_INTERVAL.
"""
import heapq
import itertools
import logging
import math
import threading
from queue import Empty, Full
from threading import current_thread
from time import monotonic

import transaction
from zope.interface import implementer

from . import codec, expiry, store
from .commit import CommitterClosed, notify_waiting
from .errors import CodecMismatch, QueueKindMismatch, ShutDown, StaleAck
from .pack_rereads import read_fresh
from .interfaces import IQueueState
from .segments import Msg

__all__ = ["QueueState", "Meta", "Holding", "Ask", "PutOptions", "DeadLetterPolicy",
           "MessageMissing", "check_timeout", "verdict", "EXPIRED", "DEAD"]

log = logging.getLogger(__name__)

REAP_INTERVAL = 0.25           # how often held messages of ended threads are looked for
SWEEP_INTERVAL = 60.0          # least seconds between sweeps for expired messages ...
SWEEP_COST_FACTOR = 100        # ... and at least this many times a sweep's own duration
PRUNE_STEP = 2000              # dedup ids (or put tokens) a sweep's prune reads per commit

EXPIRED, DEAD = "expired", "dead"


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

    def to_msg(self):
        """The Msg the store would keep for this message (no holder)."""
        return Msg(self.body, self.priority, self.sent_at, self.receive_count,
                   self.first_received, self.last_received, None, self.expires_at,
                   self.attributes, self.sequence, self.source)

    def expired(self, now):
        return self.expires_at is not None and self.expires_at <= now


def verdict(msg, now, policy):
    """The receive rules, in one place: why message msg (a Meta or a stored Msg) must not
    be delivered now (EXPIRED: past its retention; DEAD: received policy.max_receives
    times already), or None to deliver it."""
    if msg.expires_at is not None and msg.expires_at <= now:
        return EXPIRED
    if (policy is not None and policy.max_receives is not None
            and msg.receive_count >= policy.max_receives):
        return DEAD
    return None


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


class Ask:
    """What a get asks for: the holder (a QueueConnection), its visibility timeout, how to
    read a message this process does not have in memory, whether the store records the
    delivery (not inside an application transaction), shuffle, the dead-letter policy,
    and how many messages a shared queue may claim ahead for this process's next gets
    (prefetch; see ackqueue.arbiters.shared), and how long it may wait for them to be put
    (prefetch_wait), at the latest until the get's own end (until: monotonic time, None
    for none; claim() sets it)."""

    __slots__ = ("holder", "visibility_timeout", "load_meta", "record", "shuffle", "policy",
                 "prefetch", "prefetch_wait", "until")

    def __init__(self, holder, visibility_timeout=None, load_meta=None, record=True,
                 shuffle=False, policy=None, prefetch=1, prefetch_wait=0.0):
        self.holder = holder
        self.visibility_timeout = visibility_timeout
        self.load_meta = load_meta
        self.record = record
        self.shuffle = shuffle
        self.policy = policy
        self.prefetch = prefetch
        self.prefetch_wait = prefetch_wait
        self.until = None


class Holding:
    """One delivery of one message to one holder (a QueueConnection)."""

    __slots__ = ("seq", "key", "skey", "token", "holder", "deadline", "meta", "item",
                 "receive_count", "settling", "txn", "released", "claim_ticket", "claimed")

    def __init__(self, seq, key, skey, token, holder, deadline, meta):
        self.seq = seq            # the message's sequence number
        self.key = key            # its place in the arbiter's ready order
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


def check_timeout(timeout, what="timeout"):
    """The stdlib's rule for timeouts, plus a clear error for NaN and non-numbers."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"'{what}' must be a number or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"'{what}' must be a non-negative number")
    return timeout


def sweep_due(rec, now):
    """(seqs of the queue record's messages past their retention and not held through a
    server, {seq: store key} of those or None, the tables among "dedup" and "tokens" in
    which a dedup id's or a put token's window has passed).
    Read through the record's expiry index (O(log n + due)); a record without one (never
    migrated) is read whole."""
    found = expiry.due(rec, now)
    if found is not None:
        due, keys = found.waiting, found.keys
    else:
        due = [seq for seq, msg in rec.messages.items()
               if msg.expires_at is not None and msg.expires_at <= now and msg.holder is None]
        keys = None
    tables = []
    for table in store.PRUNE_TABLES:
        entries, until_of = store.prune_table(rec, table)
        if entries is not None and any(until_of(v) <= now for v in entries.values()):
            tables.append(table)
    return due, keys, tables


@implementer(IQueueState)
class QueueState:
    """The in-process view of one named queue (see the module docstring and
    ackqueue.interfaces.IQueueState); arbiter_class decides claims (IArbiter)."""

    def __init__(self, database, name, kind, clock, arbiter_class, codec=None, allowed=None):
        self.database = database
        self.committer = database.committer
        self.name = name
        self.kind = kind
        self.codec = codec            # how puts encode items (ackqueue.codec); set by load
        # Classes a pickled item may name when this process reads one to order a priority
        # queue (codec.allowed_set; None: any): what every front's allowed_classes allow.
        self.allowed_classes = allowed
        self.clock = clock
        self.mutex = threading.Lock()
        self.not_empty = threading.Condition(self.mutex)
        self.not_full = threading.Condition(self.mutex)
        self.all_tasks_done = threading.Condition(self.mutex)
        self.reaper_wake = threading.Condition(self.mutex)
        self.inflight = {}           # seq -> Holding
        self.holders = {}            # holder -> {seq: Holding}, in delivery order
        # Weak references to threads that told they ended (connection.watch_thread_end;
        # appended by the ending thread without the mutex: list.append is atomic).
        self.ended = []
        self.deadlines = []          # heap of (deadline, token, seq)
        self.pending_puts = 0        # reserved by put() but not yet durable
        self.tokens = itertools.count(1)
        # Threads blocked in get() for something to be ready (under the mutex; read
        # without it by a server's wake-ups, for whom a stale count only means one
        # prefetch more or less).
        self.getters_waiting = 0
        # Signals that a message may have become ready (signal_ready's counts, under the
        # mutex): a waiter that needs several messages reads the store again only once
        # enough have come to make a difference (ackqueue.arbiters.shared, prefetch_wait).
        self.ready_signals = 0
        self._listeners = ()         # callbacks told when a message may have become ready
        self._next_sweep = monotonic() + SWEEP_INTERVAL
        self._swept_at = clock()
        self._reaper_wakes_at = 0.0   # monotonic time of the reaper's next pass (a hint)
        self.stopped = False
        # Whether this process acknowledges on this queue (ack, nack, task_done, join,
        # connect, transaction, visibility timeouts).  Until it does, a thread that returns
        # normally keeps what it got, as with queue.Queue; see QueueConnection.
        self.acknowledging = False
        self.arbiter = arbiter_class(self)
        self.arbiter.load()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                        name=f"ackqueue-reaper-{name}")
        self._reaper.start()

    def check_record(self, rec):
        """Refuse a queue record of another kind, or codec, than the one asked for (in the
        transaction that opens the queue); a codec asked for is stored with a queue that
        has none yet, so that producers and consumers agree."""
        if self.kind is not None and rec.kind != self.kind:
            raise QueueKindMismatch(
                f"queue {self.name!r} in {self.database.description} is "
                f"{store.KIND_NAMES[rec.kind]}; open it with that class")
        self.kind = rec.kind
        stored = rec.codec
        if self.codec is not None and stored is not None and stored != self.codec:
            raise CodecMismatch(
                f"queue {self.name!r} in {self.database.description} stores its items with "
                f"codec {stored!r}; open it with codec={stored!r} (or without codec=)")
        if self.codec is not None and stored is None and self.codec != codec.DEFAULT:
            rec.codec = self.codec
        self.codec = self.codec or stored or codec.DEFAULT

    def record_codec(self, wanted=None):
        """(the queue's codec, whether the store records one), once wanted (a codec name;
        None: only read) is recorded if the queue records none; CodecMismatch, writing
        nothing, if it records another.  The queue's codec here follows what the store
        records (puts encode by it; gets unpickle only under "pickle")."""
        if wanted is None:
            tm, conn = self.snapshot()
            try:
                stored = conn.root()[store.ROOT_KEY].queues[self.name].codec
            finally:
                tm.abort()
                conn.close()
        else:
            op = store.RecordCodec(self.name, codec.check_codec(wanted))
            self.committer.submit([op], lead=True).wait()
            if op.conflict:
                raise CodecMismatch(
                    f"queue {self.name!r} in {self.database.description} stores its items "
                    f"with codec {op.codec!r}; open it with codec={op.codec!r} (or without "
                    "codec=)")
            stored = op.codec
        with self.mutex:
            self.codec = stored or codec.DEFAULT
        return self.codec, stored is not None

    def snapshot(self):
        """(transaction manager, ZODB connection) reading a fresh snapshot of the store;
        the caller aborts and closes them."""
        tm = transaction.TransactionManager()
        conn = self.database.db.open(transaction_manager=tm)
        tm.begin()
        return tm, conn

    # -- sizes (call with the mutex held) -------------------------------------------------

    def ready_count(self):
        return self.arbiter.ready_count()

    def unfinished(self):
        """Messages put and not yet acknowledged: what join() waits for."""
        return self.arbiter.unfinished()

    def size_for_maxsize(self):
        return self.arbiter.queued() + self.pending_puts

    # -- put ------------------------------------------------------------------------------

    def reserve_put(self, front, count, block, timeout):
        """Wait for room for count messages (queue.Queue's rules) and return their seqs."""
        with self.mutex:
            if front.maxsize > 0 or front.is_shutdown:
                self._wait_for_room(front, count, block, timeout)
            self.pending_puts += count
            return self.arbiter.reserve_seqs(count)

    def _wait_for_room(self, front, count, block, timeout):
        def full():
            if front.is_shutdown:
                raise ShutDown
            return front.maxsize > 0 and self.size_for_maxsize() + count > front.maxsize

        endtime = None if (timeout is None or not block) else monotonic() + timeout
        while full():
            if not self._wait(self.not_full, block, endtime):
                raise Full

    def _wait(self, condition, block, endtime, recheck=None):
        """The one wait of this module (mutex held): wait on condition until notified,
        endtime (monotonic) or recheck seconds; False when there is no time left."""
        if not block:
            return False
        wait = recheck
        if endtime is not None:
            remaining = endtime - monotonic()
            if remaining <= 0.0:
                return False
            wait = remaining if wait is None else min(wait, remaining)
        condition.wait(wait)
        return True

    def new_message(self, seq, item, body, now, opts=DEFAULT_PUT, dedup_id=None):
        """The store operation that puts a message, and what makes it visible once durable."""
        return self.arbiter.new_message(seq, item, body, now, opts, dedup_id)

    def new_messages(self, seqs, pairs, now, opts=DEFAULT_PUT, dedup_ids=None):
        """new_message for each seq, (item, body) and dedup id (None: none), in one pass:
        ([store operations], [entries])."""
        return self.arbiter.new_messages(seqs, pairs, now, opts, dedup_ids)

    def ack_op(self, h):
        """The store operation that acknowledges delivery h."""
        return self.arbiter.ack_op(h)

    def unreserve(self, count):
        """Reserved room that will not be used (a failed put, a rolled-back transaction)."""
        with self.mutex:
            self._unreserve(count)

    def _unreserve(self, count):
        self.pending_puts -= count
        notify_waiting(self.not_full, count)

    def puts_committed(self, entries):
        """Durable puts become visible: entries are what new_message returned."""
        with self.mutex:
            self._puts_visible(entries)

    def _puts_visible(self, entries):
        self.pending_puts -= len(entries)
        self.arbiter.arrive(entries)

    def arrivals_committed(self, entries):
        """Messages moved here from another queue (dead letters, redrives) are durable."""
        with self.mutex:
            self.arbiter.arrive(entries)

    def check_orderable(self, items):
        self.arbiter.check_orderable(items)

    # -- readiness: who is told ------------------------------------------------------------

    def signal_ready(self, count=1):
        """A message may have become ready (mutex held): wake getters and listeners."""
        self.ready_signals += count
        notify_waiting(self.not_empty, count)
        for callback in self._listeners:
            try:
                callback(self.name)
            except Exception:  # pragma: no cover - a listener must not break the queue
                log.exception("ackqueue: a readiness listener failed")

    def add_listener(self, callback):
        with self.mutex:
            self._listeners = self._listeners + (callback,)

    def remove_listener(self, callback):
        with self.mutex:
            self._listeners = tuple(c for c in self._listeners if c != callback)

    def next_ready_at(self):
        """The clock time at which the next delayed or in-flight message becomes ready by
        itself, or None."""
        with self.mutex:
            times = [self.arbiter.next_visible_at()]
            if self.deadlines:
                times.append(self.deadlines[0][0])
            times = [t for t in times if t is not None]
            return min(times) if times else None

    # -- get ------------------------------------------------------------------------------

    def try_claim(self, front, ask, n=1, moves=None):
        """Take 0 to n ready messages for ask.holder now, never waiting for one (see
        IQueueState.try_claim)."""
        if front.is_shutdown and front.shutdown_immediate:
            raise ShutDown
        got = self.arbiter.take(front, ask, n, [] if moves is None else moves)
        if not got and front.is_shutdown:
            raise ShutDown
        return got

    def claim(self, front, ask, block=True, timeout=None, n=1):
        """Take the next ready message (a random one with ask.shuffle) for ask.holder,
        waiting as queue.Queue.get does, and return its Holding; with n > 1 a list of 1 to
        n Holdings: the first waited for, the others whatever else is ready."""
        endtime = None if (timeout is None or not block) else monotonic() + timeout
        ask.until = endtime
        if not block:
            ask.prefetch_wait = 0.0       # a get that must not block waits for no batch
        moves = []
        try:
            while True:
                got = self.try_claim(front, ask, n, moves)
                if got:
                    return got[0] if n == 1 else got
                if not block or (endtime is not None and monotonic() >= endtime):
                    raise Empty
                with self.not_empty:
                    self._wait_ready(front, endtime)
        finally:
            # A get that moved messages to a dead-letter queue returns (or raises Empty)
            # once the moves are durable, so that queue is seen holding them right after.
            for ticket in moves:
                try:
                    ticket.wait()
                except Exception:     # the move failed: the message is back here
                    log.warning("ackqueue: a dead-letter move failed", exc_info=True)

    def _wait_ready(self, front, endtime):
        """Wait until a get may find a message (mutex held); raises Empty at endtime."""
        while True:
            self.expire_due()
            if front.is_shutdown or self.arbiter.has_ready():
                return
            self.getters_waiting += 1
            try:
                waited = self._wait(self.not_empty, True, endtime, self.arbiter.recheck)
            finally:
                self.getters_waiting -= 1
            if not waited:
                raise Empty

    def hold(self, seq, key, skey, meta, holder, deadline):
        """Record a delivery of message seq to holder (mutex held) and return its
        Holding."""
        holding = Holding(seq, key, skey, next(self.tokens), holder, deadline, meta)
        self.inflight[seq] = holding
        held = self.holders.get(holder)
        if held is None:                  # its first delivery
            held = self._held_by(holder)
        held[seq] = holding
        if deadline is not None:
            heapq.heappush(self.deadlines, (deadline, holding.token, seq))
            if self.deadlines[0][1] == holding.token:
                self.reaper_wake.notify()     # the earliest deadline: the reaper's next wake
        notify_waiting(self.not_full)
        return holding

    def _held_by(self, holder):
        """{seq: Holding} of what holder holds, made on its first delivery (mutex held)."""
        held = self.holders.get(holder)
        if held is None:
            held = self.holders[holder] = {}
            if holder.thread_bound and self._reaper_wakes_at > monotonic() + REAP_INTERVAL:
                self.reaper_wake.notify()     # it must now watch this thread (REAP_INTERVAL)
        return held

    def hold_many(self, seqs, keys, skeys, metas, holder, deadline):
        """hold() each message (its seq, key, store key and Meta, as columns) for one
        holder with one deadline (mutex held): a get_many's batch in one pass; returns the
        Holdings."""
        held = self._held_by(holder)
        out = list(map(Holding, seqs, keys, skeys, self.tokens, itertools.repeat(holder),
                       itertools.repeat(deadline), metas))
        self.inflight.update(zip(seqs, out))
        held.update(zip(seqs, out))
        if deadline is not None:
            first = self.deadlines[0][1] if self.deadlines else None
            for holding in out:
                heapq.heappush(self.deadlines, (deadline, holding.token, holding.seq))
            if self.deadlines[0][1] != first:
                self.reaper_wake.notify()     # the earliest deadline: the reaper's next wake
        notify_waiting(self.not_full, len(out))
        return out

    def left(self, count=1):
        """Messages left the queue without an ack (expired, dead-lettered, purged)."""
        self.arbiter.removed(count)
        notify_waiting(self.not_full, count)
        if self.all_tasks_done._waiters and not self.unfinished():
            self.all_tasks_done.notify_all()

    # -- peek, browse, counts, purge, redrive, visibility -----------------------------------

    def peek(self, load_meta):
        """(seq, Meta) of the message the next get would receive, or None; no side effect
        beyond taking out messages found past their retention or missing from the store."""
        with self.mutex:
            self.expire_due()
            # A pack may cut the arbiter's snapshot short: its candidates are read again
            # (each read of the store begins its own snapshot, nothing to end here).
            return read_fresh(lambda: self._peek_now(load_meta), lambda: None)

    def _peek_now(self, load_meta):
        now = self.clock()
        for seq, key, meta in self.arbiter.candidates(load_meta):
            if not meta.expired(now):
                return seq, meta
            self.arbiter.skip_expired(seq, key)
        return None

    def browse(self, allowed=None, after=None):
        """Every message of the queue with its state, changing nothing (ackqueue.browse);
        with after, those with a greater id, in id order (browse.browse_after)."""
        from .browse import browse, browse_after
        return browse(self, allowed) if after is None else browse_after(self, after, allowed)

    def dedup_lookup(self, dedup_id):
        """The MessageId put with dedup_id while it still refuses a put, else None."""
        from .message import MessageId
        tm, conn = self.snapshot()

        def read():
            tm.begin()
            rec = conn.root()[store.ROOT_KEY].queues[self.name]
            until, seq = rec.dedup_entry(dedup_id) or (None, None)
            if until is None or until <= self.clock() or seq is None:
                return None
            return MessageId(seq)
        try:
            return read_fresh(read, tm.abort)
        finally:
            tm.abort()
            conn.close()

    def counts(self):
        """The current sizes: {"ready", "in_flight", "delayed"}, without the ready and
        delayed messages whose retention has passed (see drop_expired).  A message in
        flight stays counted in flight after its retention, until its delivery ends: an
        ack removes it, a give-back expires it."""
        self.drop_expired()
        return self.arbiter.counts()

    def drop_expired(self):
        """Take out now the ready and delayed messages whose retention has passed, found
        through the store's expiry index (ackqueue.expiry) in O(log n + due), so that the
        sizes read next leave them out exactly (qsize(), empty(), counts()).  Call without
        the mutex: it reads the store, and only when the arbiter says something may be due
        (a lone process keeps the earliest deadline it knows; processes sharing a server
        subtract the expired in the same snapshot as their counts instead)."""
        now = self.clock()
        with self.mutex:
            if not self.arbiter.expiry_read_due(now):
                return
        tm, conn = self.snapshot()

        def read():
            tm.begin()
            return expiry.due(conn.root()[store.ROOT_KEY].queues[self.name], now)
        try:
            found = read_fresh(read, tm.abort)
        except BaseException:
            with self.mutex:
                self.arbiter.expiry_read(0.0)     # read again next time
            raise
        finally:
            tm.abort()
            conn.close()
        if found is None:
            # No index (only a record that was never migrated can lack one): the lazy path
            # of earlier versions, gets skip expired messages and the periodic sweep takes
            # them out; the counts include them until then.
            return
        taken = self.arbiter.take_out_expired(found.waiting, found.keys)
        with self.mutex:
            self.arbiter.expiry_read(found.next_at)
        if taken:
            self.committer.submit([store.Expire(self.name, seq, now) for seq in taken])

    def totals(self):
        """The queue's lifetime totals, from the store, once what this process sent is in."""
        self.committer.submit([]).wait()
        tm, conn = self.snapshot()

        def read():
            tm.begin()
            counts = conn.root()[store.ROOT_KEY].queues[self.name].counts
            return {name: counts.get(name) for name in store.Counters.TOTALS}
        try:
            return read_fresh(read, tm.abort)
        finally:
            tm.abort()
            conn.close()

    def purge(self):
        """Remove every message, ready, delayed or in flight (as SQS's PurgeQueue does: a
        later ack of a purged delivery raises StaleAck); returns how many went.  A delivery
        whose ack is being written when the purge comes is acknowledged, not purged."""
        return self.arbiter.purge()

    def purge_held(self, seqs=None):
        """End the deliveries held here (of seqs, if given) for a purge, except those being
        acknowledged (mutex held); returns their seqs."""
        ended = []
        for seq, h in list(self.inflight.items()):
            if not h.settling and (seqs is None or seq in seqs):
                self.forget(h, "the queue was purged")
                ended.append(seq)
        if ended and not self.unfinished():
            self.all_tasks_done.notify_all()
        return ended

    def redrive(self, to, load_meta):
        """Move the ready messages that came from other queues back to them (or to
        ``to``); returns how many moved."""
        return self.arbiter.redrive(to, load_meta)

    def change_visibility(self, holding, seconds):
        """A new deadline, seconds from now, for a live delivery; seconds <= 0 gives it
        back now."""
        with self.mutex:
            self.expire_due()
            self.check_current(holding)
            if seconds <= 0:
                self.give_back_held(holding, "change_visibility() gave it back")
                return
            deadline = self.clock() + seconds
            op = self.arbiter.deadline_op(holding, deadline)
            if op is None:
                self.set_deadline(holding, deadline)
                return
        self.committer.submit([op]).wait()
        with self.mutex:
            self.set_deadline(holding, deadline)

    def set_deadline(self, holding, deadline):
        """Record holding's new visibility deadline here and wake the reaper (mutex held;
        the store learned it already where it must)."""
        holding.deadline = deadline
        heapq.heappush(self.deadlines, (deadline, holding.token, holding.seq))
        self.reaper_wake.notify()

    # -- ack ------------------------------------------------------------------------------

    def check_current(self, holding):
        """Raise StaleAck unless holding is still the live delivery of its message."""
        if self.inflight.get(holding.seq) is not holding:
            why = holding.released or "it was acknowledged already"
            exc = StaleAck(
                f"message {holding.seq} of queue {self.name!r} is no longer held by this "
                f"delivery (receive {holding.receive_count}): {why}. The late "
                "acknowledgement was refused and the message left as it is")
        elif holding.settling:
            exc = StaleAck(f"message {holding.seq} of queue {self.name!r} is being "
                           "acknowledged already")
        else:
            return
        exc.queue, exc.message_id = self.name, holding.seq
        raise exc

    def begin_settle(self, holdings):
        """Mark holdings as being acknowledged; all must be current (else StaleAck)."""
        with self.mutex:
            self.expire_due()         # an ack after its deadline is late, reaped or not
            inflight = self.inflight
            for h in holdings:
                if inflight.get(h.seq) is not h or h.settling:
                    self.check_current(h)     # raises StaleAck
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
        self.arbiter.removed(len(holdings))
        inflight, holders = self.inflight, self.holders
        for h in holdings:
            if inflight.get(h.seq) is h:
                del inflight[h.seq]
                held = holders.get(h.holder)          # forget_holding, inline
                if held is not None:
                    held.pop(h.seq, None)
                    if not held:
                        del holders[h.holder]
            h.released = "it was acknowledged already"
            h.settling = False
        if self.all_tasks_done._waiters and not self.unfinished():
            self.all_tasks_done.notify_all()

    def ack(self, holding):
        """Acknowledge one holding durably (the caller waits)."""
        self.ack_many([holding])

    def ack_many(self, holdings, then=None):
        """Acknowledge holdings in one commit, all or none; returns once it is durable.
        Through a server the store may refuse the ack (StaleAck: the delivery is no longer
        the live one); a retried commit refused because its own first attempt got
        through counts as done.

        then (the non-blocking seam): return at once instead, and call then(error) from
        the committer's thread once the ack is durable (error None) or has failed (the
        exception, e.g. StaleAck).  A delivery that is not current raises StaleAck here,
        before anything is submitted."""
        self.begin_settle(holdings)
        ticket = None

        def own_first_attempt(error):
            return (isinstance(error, StaleAck) and ticket.uncertain
                    and error.reason == "acked")

        def failed(error):
            if isinstance(error, StaleAck):
                if own_first_attempt(error):
                    self.settled(holdings)    # our own first attempt got through
                else:
                    self.drop(holdings, str(error))
            else:
                self.cancel_settle(holdings)
            if then is not None:
                then(None if own_first_attempt(error) else error)

        def committed():
            self.settled(holdings)
            if then is not None:
                then(None)

        try:
            ticket = self.committer.submit(self.arbiter.ack_ops(holdings),
                                           on_commit=committed, on_fail=failed,
                                           lead=then is None)
        except BaseException:
            self.cancel_settle(holdings)
            raise
        if then is not None:
            return
        try:
            ticket.wait()
        except StaleAck as exc:
            if not own_first_attempt(exc):
                raise

    def drop(self, holdings, why):
        """Deliveries the store no longer has in flight for us: forget them here."""
        with self.mutex:
            for h in holdings:
                h.settling = False
                self.forget(h, why)

    def forget(self, h, why):
        """Forget delivery h without giving it back (mutex held): the store says it is no
        longer ours."""
        if self.inflight.get(h.seq) is h:
            del self.inflight[h.seq]
            self.forget_holding(h)
        h.released = why

    # -- give back ------------------------------------------------------------------------

    def give_back(self, holding, why, delay=0.0):
        """Return a held message to its place (now, or after delay seconds)."""
        with self.mutex:
            self.check_current(holding)
            self.give_back_held(holding, why, delay)

    def give_back_held(self, h, why, delay=0.0):
        """give_back for a delivery known to be current (mutex held): its message returns
        to its place, now or after delay seconds."""
        del self.inflight[h.seq]
        self.forget_holding(h)
        h.released = why
        now = self.clock()
        self.arbiter.put_back(h, now + delay if delay and delay > 0 else None, now)

    def forget_holding(self, h):
        """Take delivery h out of its holder's table (mutex held); the caller takes it
        out of inflight."""
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
                self.give_back_held(h, why)

    def give_back_everything(self, why):
        """Give back every delivery this process holds (it is closing the queue)."""
        with self.mutex:
            for holder in list(self.holders):
                self._give_back_all(holder, why)

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
                    self.give_back_held(h, why)
            for h in block.acks:
                h.settling = False
            self._unreserve(len(block.put_entries))

    # -- deadlines, delays, ended threads -------------------------------------------------

    def expire_due(self):
        """Give back what is due, make due delayed messages ready (mutex held)."""
        now = self.clock()
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, token, seq = heapq.heappop(self.deadlines)
            h = self.inflight.get(seq)
            if h is not None and h.token == token and h.deadline == deadline:
                if h.settling:        # an ack is being written; look again later
                    heapq.heappush(self.deadlines, (now + 0.05, token, seq))
                    break
                self.give_back_held(h, "its visibility deadline passed")
        self.arbiter.expire_due(now)
        if self.ended:
            self._reap_told()

    def thread_ended(self, thread_ref):
        """A thread that used this queue is ending (called by that thread, without the
        mutex): the next pass gives back what it held."""
        self.ended.append(thread_ref)

    def _reap_told(self):
        """Give back what threads that told they ended held (mutex held).  A thread tells a
        moment before it counts as ended: one that does not count yet (asked before the
        look, so that one ending during it is not missed) is looked at again by the next
        pass."""
        told, self.ended = self.ended, []
        for ref in told:
            thread = ref()
            if thread is not None and thread.is_alive():
                self.ended.append(ref)
        if self.holders:
            self._reap_ended_threads()

    def _reap_ended_threads(self):
        """Give back what threads that ended held (mutex held; see expire_due).  The
        calling thread is alive: its holdings (what a lone thread's ack finds here) are
        not asked."""
        me = current_thread()
        for holder in [hd for hd in self.holders if hd.thread_bound
                       and not hd.owned_by(me) and not hd.alive()]:
            if self.acknowledging or holder.ended_by_exception():
                self._give_back_all(holder, "the thread that received it ended")
            else:
                # Plain queue.Queue code (nothing on this queue was ever acknowledged):
                # a get is final within the process, as with queue.Queue.  What the thread
                # held comes back at its deadline or on the next open.
                holder.thread_bound = False

    def store_changed(self):
        """Another process (or a commit of ours) changed this queue: waiters look again."""
        with self.mutex:
            self.wake_waiters()
            self.reaper_wake.notify()

    def wake_waiters(self):
        """Every waiter looks again (mutex held)."""
        self.signal_ready()
        self.not_empty.notify_all()
        self.not_full.notify_all()
        self.all_tasks_done.notify_all()

    def _next_wake(self):
        waits = [max(self._next_sweep - monotonic(), 0.001)]
        now = self.clock()
        if self.deadlines:
            waits.append(self.deadlines[0][0] - now)
        arbiter_wait = self.arbiter.next_wake(now)
        if arbiter_wait is not None:
            waits.append(arbiter_wait)
        if any(h.thread_bound for h in self.holders):
            waits.append(REAP_INTERVAL)
        # Never trust a (possibly injected) clock for more than a second.
        return min(max(min(waits), 0.001), 1.0)

    def _reap_loop(self):
        with self.mutex:
            while not self.stopped:
                try:
                    self.expire_due()
                    if self.holders:          # threads that ended without telling
                        self._reap_ended_threads()
                    self.arbiter.reap()
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
        never deliver an expired message in between.  Returns how many expired.

        The dedup ids and put tokens are pruned in steps of PRUNE_STEP entries, one commit
        each, each step submitted once the one before has committed: no commit of the
        queue's scans a whole table (a service that dedups every put keeps one entry per
        put of the last dedup window), so puts and acks wait for one step at most."""
        began, now = monotonic(), self.clock()
        tm, conn = self.snapshot()

        def read():
            tm.begin()                  # a fresh snapshot (again, after a pack cut one short)
            return sweep_due(conn.root()[store.ROOT_KEY].queues[self.name], now)
        try:
            due, keys, prune = read_fresh(read, tm.abort)
        finally:
            tm.abort()
            conn.close()
        expired = self.arbiter.take_out_expired(due, keys)
        ops = [store.Expire(self.name, seq, now) for seq in expired]
        if ops:
            self.committer.submit(ops)
        for table in prune:
            self._prune_step(store.PruneDedup(self.name, now, table, None, PRUNE_STEP))
        self._swept_at = now
        self._next_sweep = monotonic() + max(SWEEP_INTERVAL,
                                             SWEEP_COST_FACTOR * (monotonic() - began))
        return len(expired)

    def _prune_step(self, op):
        """Commit one step of a prune (store.PruneDedup with a limit), then the next, until
        the table's end; a step that fails ends the walk (the next sweep starts again)."""
        def committed():
            if op.next_after is not None:
                self._prune_step(store.PruneDedup(op.name, op.at, op.table, op.next_after,
                                                  op.limit))
        try:
            self.committer.submit([op], on_commit=committed)
        except CommitterClosed:
            pass                      # closing: the next open's sweep prunes what is left

    def stop(self):
        self.arbiter.stop()
        with self.mutex:
            self.stopped = True
            self.reaper_wake.notify_all()
        if self._reaper is not threading.current_thread():
            self._reaper.join()
        self.arbiter.close()
