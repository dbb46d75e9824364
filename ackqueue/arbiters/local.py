"""The arbiter of a queue whose storage this process holds alone: its memory decides.

Nothing but this process can change the queue, so the ready set and the delayed messages
live in memory, ordered as the store orders them, and a claim is decided under the state's
mutex with nothing written: if the process dies, the message is simply ready again on the
next open.  The delivery's receive count reaches the store with its ack or give-back.
(With a dead-letter policy a Claim is written, and the receiver waits for it, so that
crashes count as receives.)  On open, everything the store has in flight is given back (its
holders died with the old process) and the ready set is loaded into memory, less the
messages of live durable holds, which are held again (ackqueue.holds).
"""
import heapq
import itertools
import logging
import operator
import random
import threading

import transaction
from BTrees.LLBTree import LLTreeSet
from zope.interface import implementer

from .. import codec, holds, store
from ..interfaces import ILocalArbiter
from ..state import DEAD, EXPIRED, DEFAULT_PUT, MessageMissing, Meta, verdict

__all__ = ["LocalArbiter"]

log = logging.getLogger(__name__)

COMPACT_EVERY = 512            # messages removed between compactions of the store's indexes
BODY_CACHE_BYTES = 64 << 20    # bodies of freshly put messages kept in memory for get
BODY_CACHE_ITEMS = 200_000


class IntOrder:
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

    def pop_many(self, count):
        """The first count keys (fewer if there are fewer), taken out."""
        keys = list(itertools.islice(self._keys, count))
        remove = self._keys.remove
        for key in keys:
            remove(key)
        self._len -= len(keys)
        return keys

    def push_many(self, keys):
        self._len += self._keys.update(keys)

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

    def __contains__(self, key):
        return key in self._keys

    def in_order(self):
        return list(self._keys)


class ValueOrder:
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

    def pop_many(self, count):
        """The first count keys in order (fewer if there are fewer), taken out."""
        heap = self._heap
        return [heapq.heappop(heap) for _ in range(min(count, len(heap)))]

    def push_many(self, keys):
        for key in keys:
            heapq.heappush(self._heap, self.Key(key))

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

    def __contains__(self, key):
        return key in self._heap

    def in_order(self):
        return sorted(self._heap)


def loads_or_none(body, allowed=None, queue_codec=codec.PICKLE):
    """The item of a stored body, or None if it cannot be read here (an ordering key);
    allowed, queue_codec: the queue's allowed_classes and codec (codec.decode)."""
    try:
        return codec.decode(body, allowed, queue_codec)
    except Exception:
        return None


class _RunArrivals:
    """The entries of a PutRun (new_messages' usual batch), as columns: arrive() takes them
    whole; anything else iterates them as new_message's entries, one per message."""

    __slots__ = ("seqs", "keys", "bodies", "header")

    def __init__(self, seqs, keys, bodies, header):
        self.seqs, self.keys, self.bodies = seqs, keys, bodies
        self.header = header          # (priority, sent_at, expires_at, attributes)

    def __len__(self):
        return len(self.seqs)

    def __iter__(self):
        header = self.header
        for seq, key, body in zip(self.seqs, self.keys, self.bodies):
            yield seq, key, _fresh_meta((body, header)), None


def _fresh_meta(cached):
    """The Meta of a message cached as (body, (priority, sent_at, expires_at, attributes)):
    put here, never received."""
    body, (priority, sent_at, expires_at, attributes) = cached
    return Meta(body, priority, sent_at, 0, None, None, expires_at, attributes)


class _Opening(store.Operation):
    """LocalArbiter.load's writes, as the one operation of a committer unit: create or
    check the queue record, drop the durable holds whose deadline passed, give back what
    was in flight (its holders died with the process that opened the file last).  Applied
    again from scratch if its commit is retried."""

    __slots__ = ("name", "state", "recovered")

    def __init__(self, name, state):
        self.name, self.state, self.recovered = name, state, 0

    def apply(self, root):
        state = self.state
        rec = store.ensure_queue(root, self.name, state.kind)
        state.check_record(rec)
        holds.recover(rec, state.clock())             # durable holds
        self.recovered = rec.recover_inflight()


_seq, _skey, _receive_count = (operator.attrgetter(name)
                               for name in ("seq", "skey", "receive_count"))


def _delivery(h):
    """What the store must learn of a delivery it never saw claimed: (receive count, first
    and last receive times); None when its Claim was written."""
    if h.claimed:
        return None
    return (h.receive_count, h.meta.first_received, h.meta.last_received)


def _seqs_of_keys(kind, keys):
    """The sequence numbers of ready keys (store.seq_of_key for a whole batch at once)."""
    mask = store.SEQ_MASK
    if kind == store.FIFO:
        return [key & mask for key in keys]
    if kind == store.LIFO:
        return [mask - (key & mask) for key in keys]
    return [key[-1] for key in keys]


def _hold_run(state, ask, seqs, keys, metas, now):
    """Hold the messages a run took (seqs, their memory keys and Metas) for ask."""
    vt = ask.visibility_timeout
    return state.hold_many(seqs, keys, keys if state.kind != store.VALUE else seqs, metas,
                           ask.holder, None if vt is None else now + vt)


@implementer(ILocalArbiter)
class LocalArbiter:
    """This process holds the storage alone (see the module docstring)."""

    recheck = None        # every change is made here, and wakes the waiters itself

    def __init__(self, state):
        self.state = state
        self.name = state.name
        self.committer = state.committer
        self.ready = None            # IntOrder or ValueOrder of keys (see memory_key)
        self.delayed = []            # heap of (visible_at, seq, key)
        # seq -> Meta, for messages this process put or delivered; a message put here and
        # never received is kept as (body, (priority, sent_at, expires_at, attributes)),
        # plain data the garbage collector stops tracking, and made a Meta when taken
        # (_cached): a queue of a million waiting messages then costs each collection
        # nothing, where a million Metas were traversed by every full collection.
        self.meta = {}
        self.cached_bytes = 0
        self.next_seq = None
        # A leaf lock (never held while taking another) for sequence numbers, so that
        # another queue's state can number a message moved here while holding its own mutex.
        self.seq_lock = threading.Lock()
        self.recovered = 0
        self._removed = 0            # messages gone since the indexes were last compacted
        # No waiting message expires before this (a lower bound; one float, not one per
        # message): counts read the store's expiry index only once it has passed.
        self.next_expiry = 0.0

    # -- opening -------------------------------------------------------------------------

    def load(self):
        """Create or check the queue record, recover what was in flight, load the ready set.

        The writes go through the committer like every other write of the queue: its
        connection is then the only one that ever writes this queue (see
        segments.write_alone), even while another thread opens a queue of the same storage
        or moves a dead letter here."""
        opening = _Opening(self.name, self.state)
        self.committer.submit([opening], lead=True).wait()
        self.recovered = opening.recovered
        tm = transaction.TransactionManager()
        conn = self.state.database.db.open(transaction_manager=tm)
        try:
            tm.begin()
            rec = conn.root()[store.ROOT_KEY].queues[self.name]
            self._load_ready(rec)
            holds.adopt(self.state, rec, self._memory_key_from_store, self.ready.discard)
            tm.abort()
        finally:
            conn.close()

    def _load_ready(self, rec):
        self.next_seq = rec.next_seq.value
        if self.state.kind == store.VALUE:
            self.ready = ValueOrder(self._memory_key_from_store(rec, seq) for seq in rec.ready)
        else:
            self.ready = IntOrder(rec.ready.key_list())
        for seq, visible_at in rec.delayed.items():
            self.delayed.append((visible_at, seq, self._memory_key_from_store(rec, seq)))
        heapq.heapify(self.delayed)

    def _memory_key_from_store(self, rec, seq):
        if self.state.kind == store.VALUE:
            msg = rec.messages[seq]
            return self.memory_key(seq, loads_or_none(rec.body_of(seq, msg), self.state.allowed_classes,
                                   self.state.codec), msg.priority)
        return rec.key_of(seq)

    def memory_key(self, skey, item, priority=store.DEFAULT_PRIORITY):
        """The key that orders a message in memory (level and item for value order)."""
        if self.state.kind == store.VALUE:
            return (store.PRIORITY_MAX - priority, item, skey)
        return skey

    def seq_of(self, key):
        kind = self.state.kind
        if kind == store.FIFO:
            return key & store.SEQ_MASK   # store.seq_of_key's answer, without its call
        return key[-1] if kind == store.VALUE else store.seq_of_key(kind, key)

    def store_key_of(self, key):
        return key[-1] if self.state.kind == store.VALUE else key

    def moved_key(self, meta, seq):
        """The memory key, in this queue, of a message moved here as seq."""
        kind = self.state.kind
        return self.memory_key(store.store_key(kind, meta.priority, seq),
                               loads_or_none(meta.body, self.state.allowed_classes,
                                   self.state.codec)
                               if kind == store.VALUE else None,
                               meta.priority)

    # -- sizes (mutex held) ---------------------------------------------------------------

    def has_ready(self):
        return len(self.ready) > 0

    def ready_count(self):
        return len(self.ready)

    def queued(self):
        return len(self.ready) + len(self.delayed)

    def unfinished(self):
        return len(self.ready) + len(self.delayed) + len(self.state.inflight)

    def counts(self):
        with self.state.mutex:
            self.state.expire_due()
            return {"ready": len(self.ready), "in_flight": len(self.state.inflight),
                    "delayed": len(self.delayed)}

    def next_visible_at(self):
        return self.delayed[0][0] if self.delayed else None

    # -- put ------------------------------------------------------------------------------

    def reserve_seqs(self, count):
        with self.seq_lock:
            first = self.next_seq
            self.next_seq += count
        return list(range(first, first + count))

    def new_message(self, seq, item, body, now, opts=DEFAULT_PUT, dedup_id=None):
        priority = opts.priority
        skey = store.store_key(self.state.kind, priority, seq)
        visible_at = now + opts.delay if opts.delay else None
        expires_at = now + opts.retention
        meta = Meta(body, priority, now, expires_at=expires_at, attributes=opts.attributes)
        op = store.Put(self.name, seq, skey, body, priority, now, visible_at, expires_at,
                       opts.attributes, dedup_id,
                       None if dedup_id is None else now + opts.dedup_window)
        return op, (seq, self.memory_key(skey, item, priority), meta, visible_at)

    def new_messages(self, seqs, pairs, now, opts=DEFAULT_PUT, dedup_ids=None):
        kind = self.state.kind
        if kind == store.VALUE or opts.delay or (dedup_ids and any(dedup_ids)):
            made = [self.new_message(seq, item, body, now, opts, dedup_id) for
                    seq, (item, body), dedup_id in zip(seqs, pairs,
                                                       dedup_ids or [None] * len(pairs))]
            return [op for op, _ in made], [entry for _, entry in made]
        # The usual batch (FIFO or LIFO, one priority, no delay, no dedup ids), as columns:
        # one PutRun, whatever the batch's size.
        priority = opts.priority
        rank = (store.PRIORITY_MAX - priority) << store.SEQ_BITS
        if kind == store.LIFO:
            keys = [rank | (store.SEQ_MASK - seq) for seq in seqs]
        else:
            keys = [rank | seq for seq in seqs]
        bodies = [body for _, body in pairs]
        run = _RunArrivals(seqs, keys, bodies, (priority, now, now + opts.retention,
                                                opts.attributes))
        return [store.PutRun(self.name, seqs, keys, bodies, priority, now,
                             now + opts.retention, opts.attributes)], run

    def arrive(self, entries):
        # Getters, listeners and the reaper are told once per batch (a listener learns
        # that the queue has something ready, not how many; notify(count) wakes count
        # getters), not once per message: a put_many of 100 made 100 wake-ups.
        if type(entries) is _RunArrivals:
            self._arrive_run(entries)
            return
        ready, delayed = [], 0
        cache = self.meta
        for seq, key, meta, visible_at in entries:
            if meta.expires_at is not None and meta.expires_at < self.next_expiry:
                self.next_expiry = meta.expires_at
            if (self.cached_bytes + len(meta.body) <= BODY_CACHE_BYTES
                    and len(cache) < BODY_CACHE_ITEMS):
                cache[seq] = meta
                self.cached_bytes += len(meta.body)
            if visible_at:
                heapq.heappush(self.delayed, (visible_at, seq, key))
                delayed += 1
            else:
                ready.append(key)
        if ready:
            self.ready.push_many(ready)
        if delayed:
            self.state.reaper_wake.notify()
        if ready:
            self.state.signal_ready(len(ready))

    def _arrive_run(self, run):
        """arrive() for the entries of a PutRun: cached as plain tuples (see self.meta),
        ready at once."""
        expires_at = run.header[2]
        if expires_at is not None and expires_at < self.next_expiry:
            self.next_expiry = expires_at
        cache, bodies = self.meta, run.bodies
        size = sum(map(len, bodies))
        if (self.cached_bytes + size <= BODY_CACHE_BYTES
                and len(cache) + len(bodies) <= BODY_CACHE_ITEMS):
            cache.update(zip(run.seqs, zip(bodies, itertools.repeat(run.header))))
            self.cached_bytes += size
        else:
            for seq, body in zip(run.seqs, bodies):
                if (self.cached_bytes + len(body) <= BODY_CACHE_BYTES
                        and len(cache) < BODY_CACHE_ITEMS):
                    cache[seq] = (body, run.header)
                    self.cached_bytes += len(body)
        self.ready.push_many(run.keys)
        self.state.signal_ready(len(bodies))

    def _cached(self, seq):
        """Message seq's Meta from the body cache, left there (None if it is not there)."""
        meta = self.meta.get(seq)
        if type(meta) is tuple:
            meta = _fresh_meta(meta)
        return meta

    def check_orderable(self, items):
        """A priority queue's items must compare with each other, as heapq needs."""
        with self.state.mutex:
            head = self.ready.peek() if len(self.ready) else None
        for item in items:
            try:
                if head is not None:
                    item < head[1]
                item < item
            except TypeError as exc:
                raise TypeError(f"priority queue items must be orderable: {exc}") from None

    # -- get ------------------------------------------------------------------------------

    def take(self, front, ask, n, moves):
        """Deliver up to n ready messages to ask.holder, under one mutex."""
        got = []
        with self.state.mutex:
            try:
                self._take(front, ask, n, moves, got)
            except BaseException:
                # Interrupted (a KeyboardInterrupt while reading a message): nothing
                # reaches the caller, so what was taken goes back to its place, as a
                # batch that cannot be handed out does (connection._take_back).
                for h in got:
                    self.state.give_back_held(h, "its get was interrupted")
                raise
        return got

    def _take(self, front, ask, n, moves, got):
        self.state.expire_due()
        while not got and len(self.ready):
            h = self._take_next(ask, moves)
            if h is not None:
                got.append(h)
        if got and n > 1 and not ask.shuffle and (ask.policy is None
                                                  or ask.policy.max_receives is None):
            self._take_run(ask, n - len(got), got, front)
        while (got and len(got) < n and len(self.ready)
               and not (front.is_shutdown and front.shutdown_immediate)):
            try:
                h = self._take_next(ask, moves)
            except Exception:
                # The batch so far is delivered and must reach the caller; the
                # message that could not be read stays ready, and the next get
                # that reaches it raises.
                log.warning("ackqueue: a get_many batch stops short: a message "
                            "could not be read", exc_info=True)
                break
            if h is not None:
                got.append(h)

    def _take_run(self, ask, count, got, front):
        """The plain part of a get_many (mutex held; no shuffle, no receive limit): deliver
        up to count more ready messages in one pass, into got.  It stops at the first
        message that is not plainly deliverable (past its retention, or its record could
        not be read), which it leaves ready, with the ones after it, for _take_next's full
        rules.  Interrupted while reading a message (a BaseException that is not an
        Exception), it holds what it took before raising, for take() to give back."""
        if front.is_shutdown and front.shutdown_immediate:
            return
        state, ready, cache = self.state, self.ready, self.meta
        now = state.clock()
        kind = state.kind
        keys = ready.pop_many(count)
        seqs = _seqs_of_keys(kind, keys)
        metas, fresh_bytes, taken, interrupted = [], 0, len(keys), None
        for i, seq in enumerate(seqs):
            meta = cache.pop(seq, None)
            if type(meta) is tuple:           # put here, never received (_fresh_meta)
                body, (priority, sent_at, expires_at, attributes) = meta
                if expires_at is not None and expires_at <= now:
                    cache[seq] = meta         # back as it was, for _take_next
                    ready.push_many(keys[i:])
                    taken = i
                    break
                fresh_bytes += len(body)
                metas.append(Meta(body, priority, sent_at, 1, now, now, expires_at,
                                  attributes))
                continue
            if meta is None:
                try:
                    meta = ask.load_meta(seq)
                except BaseException as exc:
                    ready.push_many(keys[i:])     # _take_next reads it again, and decides
                    taken = i
                    if not isinstance(exc, Exception):
                        interrupted = exc         # raised once what was taken is held
                    break
            elif meta.receive_count == 0:
                self.cached_bytes -= len(meta.body)
            if meta.expires_at is not None and meta.expires_at <= now:
                cache[seq] = meta             # back as it was, for _take_next
                if meta.receive_count == 0:
                    self.cached_bytes += len(meta.body)
                ready.push_many(keys[i:])
                taken = i
                break
            meta.receive_count += 1
            meta.last_received = now
            if meta.first_received is None:
                meta.first_received = now
            metas.append(meta)
        self.cached_bytes -= fresh_bytes
        if metas:
            if taken < len(keys):
                seqs, keys = seqs[:taken], keys[:taken]
            got.extend(_hold_run(state, ask, seqs, keys, metas, now))
        if interrupted is not None:
            raise interrupted                 # take() gives back everything it got

    def _take_next(self, ask, moves):
        """Deliver the next ready message to ask.holder (mutex held, a message ready);
        None if it was taken out instead (expired, dead-lettered, or missing)."""
        key = self.ready.pop_random() if ask.shuffle else self.ready.pop()
        seq = self.seq_of(key)
        meta = self._uncache(seq)
        if meta is None:
            try:
                meta = ask.load_meta(seq)
            except MessageMissing as exc:
                self._drop_missing(seq, key, exc)
                return None
            except BaseException:
                self.ready.push(key)
                raise
        now = self.state.clock()
        why = verdict(meta, now, ask.policy)
        if why == EXPIRED:
            self.committer.submit([store.Expire(self.name, seq, now)])
            self.state.left()
            return None
        if why == DEAD:
            moves.append(self._dead_letter(seq, key, meta, ask.policy, now))
            return None
        return self._deliver(seq, key, meta, ask, now)

    def _deliver(self, seq, key, meta, ask, now):
        meta.receive_count += 1
        meta.last_received = now
        if meta.first_received is None:
            meta.first_received = now
        vt = ask.visibility_timeout
        deadline = None if vt is None else now + vt
        holding = self.state.hold(seq, key, self.store_key_of(key), meta, ask.holder,
                                  deadline)
        policy = ask.policy
        if ask.record and policy is not None and policy.max_receives is not None:
            holding.claimed = True
            holding.claim_ticket = self.committer.submit([store.Claim(
                self.name, seq, holding.skey, meta.receive_count, now, deadline)])
        return holding

    def _drop_missing(self, seq, key, exc):
        """Nothing can ever deliver a message whose record or body is gone: its entry goes
        (mutex held, key already out of the ready set), so that the messages behind it are
        delivered instead of every get that reaches it failing."""
        log.error("ackqueue: %s; it was taken out of queue %r (counted in stats() as "
                  "missing)", exc, self.name)
        self.committer.submit([store.DropMissing(self.name, seq, key)])
        self.state.left()

    def _uncache(self, seq):
        """Take message seq's Meta out of the body cache (None if it is not there),
        keeping the cache's byte count: bodies of messages never received are counted."""
        meta = self.meta.pop(seq, None)
        if type(meta) is tuple:
            meta = _fresh_meta(meta)
        if meta is not None and meta.receive_count == 0:
            self.cached_bytes -= len(meta.body)
        return meta

    def _dead_letter(self, seq, key, meta, policy, now):
        """Move a message received max_receives times to the dead-letter queue (or drop it)
        instead of delivering it again (mutex held)."""
        target = policy.target_state
        if target is None:
            self.state.left()
            return self.committer.submit([store.DeadLetter(self.name, seq, None, None, now)])
        tseq = target.arbiter.reserve_seqs(1)[0]
        moved = Meta.from_msg(store.dead_lettered(meta.to_msg(), seq, self.name, now),
                              meta.body)
        tkey = target.arbiter.moved_key(meta, tseq)

        def failed(error, key=key, seq=seq, meta=meta):
            with self.state.mutex:          # still in the store here: back to its place
                self.meta[seq] = meta
                self.ready.push(key)
                self.state.signal_ready()

        self.state.left()
        return self.committer.submit(
            [store.DeadLetter(self.name, seq, policy.target, tseq, now)],
            on_commit=lambda: target.arrivals_committed([(tseq, tkey, moved, None)]),
            on_fail=failed)

    # -- settle and give back -------------------------------------------------------------

    def ack_op(self, h):
        return store.Ack(self.name, h.seq, h.skey, delivery=_delivery(h))

    def ack_ops(self, holdings):
        # One AckRun: the store deletes the messages, so of each delivery it needs only
        # whether it was a redelivery (counted by the store at the claim for a claimed
        # one, see _deliver).  A lone ack keeps the Ack of the one-at-a-time path.
        if len(holdings) == 1:
            return [self.ack_op(holdings[0])]
        redelivered = ({h.seq for h in holdings if h.receive_count > 1 and not h.claimed}
                       if max(map(_receive_count, holdings)) > 1 else ())
        return [store.AckRun(self.name, list(map(_seq, holdings)),
                             list(map(_skey, holdings)), redelivered)]

    def put_back(self, h, visible_at, now):
        self.committer.submit([self.give_back_op(h, visible_at, now)])

    def give_back_op(self, h, visible_at, now):
        """put_back() in memory, returning the Release instead of submitting it (for a
        caller that commits it with other operations: ackqueue.holds)."""
        if h.meta.expired(now):
            self.state.left()         # past its retention: the store's Release expires it
            visible_at = None
        elif visible_at is not None:
            self.meta[h.seq] = h.meta
            heapq.heappush(self.delayed, (visible_at, h.seq, h.key))
            self.state.reaper_wake.notify()
        else:
            self.meta[h.seq] = h.meta
            self.ready.push(h.key)
            self.state.signal_ready()
        return store.Release(self.name, h.seq, h.skey, visible_at, at=now,
                             delivery=_delivery(h))

    def deadline_op(self, h, deadline):
        return None                   # a lone process's memory is the truth for deadlines

    def removed(self, count):
        # Removed messages leave empty index segments behind (kept, so that a near-empty
        # queue does not create and drop a segment per message); drop them now and then.
        self._removed += count
        if self._removed >= COMPACT_EVERY:
            self._removed = 0
            self.committer.submit([store.Compact(self.name)])

    # -- peek, browse -----------------------------------------------------------------------

    def candidates(self, load_meta):
        """The head, again and again: the caller takes each unwanted one out (skip_expired)."""
        while len(self.ready):
            key = self.ready.peek()
            seq = self.seq_of(key)
            try:
                meta = self._cached(seq) or load_meta(seq)
            except MessageMissing as exc:
                self.ready.pop()
                self._drop_missing(seq, key, exc)
                continue
            yield seq, key, meta

    def skip_expired(self, seq, key):
        self.ready.discard(key)
        self._uncache(seq)
        self.committer.submit([store.Expire(self.name, seq, self.state.clock())])
        self.state.left()

    def ready_order(self, rec):
        # Deliveries made here are not written to the store: the store's ready set still
        # lists them (browse reports them as in flight, from the state's holdings).
        if self.state.kind != store.VALUE:
            kind = self.state.kind
            return (store.seq_of_key(kind, key) for key in rec.ready)
        with self.state.mutex:
            keys = self.ready.in_order()
        return (key[-1] for key in keys)

    # -- delays, sweeps ---------------------------------------------------------------------

    def expire_due(self, now):
        while self.delayed and self.delayed[0][0] <= now:
            _, seq, key = heapq.heappop(self.delayed)
            self.ready.push(key)
            self.state.signal_ready()

    def next_wake(self, now):
        return self.delayed[0][0] - now if self.delayed else None

    def reap(self):
        pass                          # nothing can change the queue behind our back

    def expiry_read_due(self, now):
        """Whether a waiting message may have expired by now (mutex held); if so, the
        caller reads the expiry index and reports back with expiry_read."""
        if now < self.next_expiry:
            return False
        self.next_expiry = float("inf")   # arrivals during the read lower it again
        return True

    def expiry_read(self, next_at):
        """The index read says no other waiting message expires before next_at (None:
        none has a deadline)."""
        if next_at is not None and next_at < self.next_expiry:
            self.next_expiry = next_at

    def take_out_expired(self, seqs, keys=None):
        """Forget the listed messages that are ready or delayed here (not in flight).
        keys: {seq: store key}, which finds ready ones without a pass over the ready set
        (integer order; value order and a call without keys make one pass in memory)."""
        state = self.state
        seqs = set(seqs) - set(state.inflight)
        if not seqs:
            return []
        with state.mutex:
            seqs -= set(state.inflight)
            if keys is not None and isinstance(self.ready, IntOrder):
                gone = [keys[seq] for seq in seqs if keys[seq] in self.ready]
            else:
                gone = [key for key in self.ready if self.seq_of(key) in seqs]
            for key in gone:
                self.ready.discard(key)
            taken = [self.seq_of(key) for key in gone]
            if len(taken) < len(seqs):          # the others may be delayed
                delayed = [d for d in self.delayed if d[1] not in seqs]
                taken += [d[1] for d in self.delayed if d[1] in seqs]
            else:
                delayed = self.delayed
            if len(delayed) != len(self.delayed):
                self.delayed = delayed
                heapq.heapify(self.delayed)
            for seq in taken:
                self._uncache(seq)
            state.left(len(taken))
            return taken

    # -- purge, redrive ---------------------------------------------------------------------

    def purge(self):
        state = self.state
        with state.mutex:
            state.expire_due()
            seqs = [self.seq_of(key) for key in self.ready]
            seqs += [seq for _, seq, _ in self.delayed]
            self.ready = type(self.ready)()
            self.delayed = []
            for seq in seqs:
                self._uncache(seq)
            held = state.purge_held()
            state.left(len(seqs) + len(held))
            state.not_full.notify_all()
        seqs += held
        if seqs:
            self.committer.submit([store.Purge(self.name, seqs)]).wait()
        return len(seqs)

    def redrive(self, to, load_meta):
        state = self.state
        targets = {}
        with state.mutex:
            state.expire_due()
            picked = self._redrive_picks(to, load_meta)
        names = {name for _, _, _, name in picked}
        for name in names:            # not under our mutex: a state is made on first use
            targets[name] = state.database.state(name, None, state.clock)
        with state.mutex:
            moves, taken = self._redrive_take(picked, targets)
        if not moves:
            return 0
        try:
            self.committer.submit([store.Redrive(self.name, moves, state.clock())]).wait()
        except BaseException:
            with state.mutex:
                for key, seq, meta, _, _ in taken:
                    self.meta[seq] = meta
                    self.ready.push(key)
                state.wake_waiters()
            raise
        for _, _, _, target, entry in taken:
            target.arrivals_committed([entry])
        return len(moves)

    def _redrive_picks(self, to, load_meta):
        """(key, seq, meta, target name) of the ready messages that go back (mutex held)."""
        picks = []
        for key in list(self.ready):
            seq = self.seq_of(key)
            try:
                meta = self._cached(seq) or load_meta(seq)
            except MessageMissing as exc:
                self.ready.discard(key)
                self._drop_missing(seq, key, exc)
                continue
            name = to or meta.source
            if name is not None and name != self.name:
                picks.append((key, seq, meta, name))
        return picks

    def _redrive_take(self, picked, targets):
        """Take the picked messages out of the ready set (mutex held); (moves, taken)."""
        moves, taken = [], []
        now = self.state.clock()
        for key, seq, meta, name in picked:
            if key not in self.ready or self.state.inflight.get(seq) is not None:
                continue              # delivered meanwhile
            self.ready.discard(key)
            self._uncache(seq)
            target = targets[name]
            tseq = target.arbiter.reserve_seqs(1)[0]
            back = Meta.from_msg(store.redriven(meta.to_msg(), seq, now), meta.body)
            moves.append((seq, name, tseq))
            taken.append((key, seq, meta, target, (tseq, target.arbiter.moved_key(meta, tseq),
                                                   back, None)))
        self.state.left(len(moves))
        return moves, taken

    def stop(self):
        pass                          # what is held comes back on the next open

    def close(self):
        pass
