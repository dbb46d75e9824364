"""The live state of a queue that several processes share through a server (ZEO).

A process that holds its storage alone decides everything in memory (ackqueue.state).  Here
other processes put, claim and acknowledge too, so the store is the truth and this object
only keeps what is this process's own: the deliveries its threads hold, their deadlines,
the threads waiting.

- put:    Put is committed; the store numbers the message at commit (sequence numbers are
          taken from the store, so they grow in commit order across processes).
- get:    a ready message is chosen from a fresh snapshot of the store's ready set and a
          Claim naming this process's lease is committed, and waited for, before the item
          is handed out.  Two processes that choose the same message conflict; the loser's
          claim is retried by the committer, refused (ClaimLost), and it chooses again.
          After a lost race a process spreads its choices over the first few ready
          messages, so that consumers do not keep colliding at the head of the queue, and
          narrows them back one message per SPREAD_DECAY claims won in a row;
          uncontended, it takes the head (FIFO).
- ack, give-back: Ack and Release name the receive count of their delivery, and the store
          refuses them (StaleAck) unless it is still the live one: a process that was paused
          past its deadline or its lease cannot remove a message delivered again meanwhile.
- wake-ups: the server's invalidations tell this process that a queue's counters changed
          (ackqueue.storage); waiting getters and putters re-read the store then.
- what other processes leave behind: the reaper scans the store about once a second, gives
          back messages whose visibility deadline passed, and makes delayed messages ready.
          Messages held without a deadline by a process that died come back when its lease
          expires (ackqueue.lease).
"""
import heapq
import logging
import random
import time
from bisect import insort
from queue import Empty
from time import monotonic

import transaction
from ZODB.POSException import ConflictError

from . import store
from .errors import ShutDown, StaleAck
from .state import (DEFAULT_PUT, _sweep_due, Holding, Meta,
                    QueueState, _loads_or_none, _ValueOrder)

__all__ = ["SharedQueueState"]

log = logging.getLogger(__name__)

SCAN_INTERVAL = 1.0         # how often the store is scanned for others' expired deliveries
WAIT_RECHECK = 1.0          # a waiting get looks at the store at least this often
SPREAD_MAX = 32             # how many ready messages a contended claim may choose among
SPREAD_DECAY = 8            # claims won in a row that narrow the choice by one message
NONBLOCKING_TRIES = 16      # lost races after which get(block=False) gives up (Empty)
SHUFFLE_AMONG = 1000        # get(shuffle=True) chooses among this many ready messages


class SharedQueueState(QueueState):
    """One named queue shared through a server (see the module docstring)."""

    def __init__(self, database, name, kind, clock=time.time):
        self._claiming = set()      # seqs whose Claim this process is committing
        # Threads blocked in get() for something to be ready (under mutex; read without it
        # by the wake-ups, for whom a stale count only means one prefetch more or less).
        self.getters_waiting = 0
        self._spread = 1            # choose among this many ready messages (grows on lost races)
        self._won_in_row = 0        # claims won since the last lost race or narrowing
        self.claims_lost = 0        # races lost to other processes (for benchmarks and tests)
        self._by_value = []         # AckPriorityQueue: known live messages, in value order
        self._known_seq = 0
        self._gone = set()
        self._seen_counts = None
        self._next_scan = 0.0
        self._next_promote = None   # when the earliest delayed message becomes ready
        self._returning = 0         # give-backs and promotions this process is committing
        self._rtm = transaction.TransactionManager()
        self._rconn = database.db.open(transaction_manager=self._rtm)
        super().__init__(database, name, kind, clock)
        database.watch(self.watch_oid, self)

    # -- opening and reading --------------------------------------------------------------

    def _load(self):
        for attempt in range(20):
            try:
                with self._rtm:
                    root = self._rconn.root()
                    rec = store.ensure_queue(root, self.name, self.kind)
                    self._check_kind(rec)
                    store.ensure_leases(root)
                break
            except ConflictError:
                if attempt == 19:
                    raise
        self.watch_oid = self._record().counts._p_oid
        self._rtm.abort()
        self.ready = self.next_seq = None

    def _record(self):
        """The queue's record in a fresh snapshot (call with the mutex held)."""
        self._rtm.begin()     # sees every transaction this client has heard of
        return self._rconn.root()[store.ROOT_KEY].queues[self.name]

    def _counts(self):
        return self._record().counts

    # -- sizes: the store's, shared by every process (call with the mutex held) ------------

    def ready_count(self):
        return self._counts().get("ready")

    def unfinished(self):
        counts = self._counts()
        return counts.get("ready") + counts.get("delayed") + counts.get("inflight")

    def size_for_maxsize(self):
        counts = self._counts()
        return counts.get("ready") + counts.get("delayed") + self.pending_puts

    def _shut(self, front):
        return front.is_shutdown and (front.shutdown_immediate or not self.ready_count())

    # -- put ------------------------------------------------------------------------------

    def _reserve_seqs(self, count):
        return [None] * count           # the store numbers them at commit

    def new_message(self, seq, item, body, now, opts=DEFAULT_PUT, dedup_id=None):
        self.database.last_put_at = monotonic()     # keeps its objects warm (storage.py)
        op = store.Put(self.name, None, None, body, opts.priority, now,
                       now + opts.delay if opts.delay else None, now + opts.retention,
                       opts.attributes, dedup_id,
                       None if dedup_id is None else now + opts.dedup_window)
        return op, None

    def _puts_visible(self, entries):
        self.pending_puts -= len(entries)
        self.not_empty.notify(len(entries))

    def check_orderable(self, items):
        """Items must at least compare with their own kind.  Unlike in memory, the queue's
        head is not at hand (other processes take it), and messages of different kinds
        that are ready at once are kept in (type name, seq) order rather than refused."""
        for item in items:
            try:
                item < item
            except TypeError as exc:
                raise TypeError(f"priority queue items must be orderable: {exc}") from None

    # -- get ------------------------------------------------------------------------------

    def claim(self, front, holder, block, timeout, visibility_timeout, load_meta,
              record=True, shuffle=False, policy=None, n=1):
        """Claim the next ready message (a random one with shuffle) for holder in the
        store, waiting as queue.Queue.get does, and return its Holding; with n > 1 a list
        of 1 to n Holdings: the first waited for, then up to n - 1 of the messages ready
        at that moment, whose claims share commits (one that another process won is left
        out).  Each claim, and so its receive count, is durable before this returns.
        Messages past their retention or received policy.max_receives times are taken
        out on the way."""
        first = self._claim_one(front, holder, block, timeout, visibility_timeout, shuffle,
                                policy)
        if n == 1:
            return first
        return [first] + self._claim_more(front, holder, n - 1, visibility_timeout,
                                          shuffle, policy)

    def _claim_more(self, front, holder, count, visibility_timeout, shuffle, policy):
        """Claim up to count more ready messages at once, without waiting: one unit each,
        submitted together so that they share a commit (a unit refused because another
        process took its message fails alone).  Returns the Holdings of those claimed."""
        with self.mutex:
            self._expire()
            if front.is_shutdown and front.shutdown_immediate:
                return []
            rec = self._record()
            picks = []
            for candidate in self._candidates(rec):
                picks.append(candidate)
                if len(picks) >= (SHUFFLE_AMONG if shuffle else count):
                    break
            if shuffle and len(picks) > count:
                picks = random.sample(picks, count)
            self._claiming.update(seq for seq, _, _ in picks)
        now = self.clock()
        deadline = None if visibility_timeout is None else now + visibility_timeout
        got = []
        try:
            pending = []
            for seq, skey, msg in picks:
                op = self._receive_op(seq, skey, msg, now, deadline, policy)
                pending.append((seq, skey, op, self.committer.submit([op])))
            for seq, skey, op, ticket in pending:
                try:
                    ticket.wait()
                except store.ClaimLost:
                    with self.mutex:
                        self.claims_lost += 1
                    continue
                except Exception:
                    log.warning("ackqueue: a claim of a batch failed", exc_info=True)
                    continue
                if isinstance(op, store.Claim):         # else taken out, not delivered
                    with self.mutex:
                        got.append(self._held(seq, skey, holder, deadline, op))
        finally:
            with self.mutex:
                self._claiming.difference_update(seq for seq, _, _ in picks)
        return got

    def _receive_op(self, seq, skey, msg, now, deadline, policy):
        """The store operation that receives message seq: its Claim, or its Expire or
        DeadLetter if it is past its retention or its receives."""
        if msg.expires_at is not None and msg.expires_at <= now:
            return store.Expire(self.name, seq, now)
        if (policy is not None and policy.max_receives is not None
                and msg.receive_count >= policy.max_receives):
            return store.DeadLetter(self.name, seq, policy.target, None, now,
                                    expect=msg.receive_count)
        return store.Claim(self.name, seq, skey, None, now, deadline,
                           lease=self.database.lease_id)

    def _held(self, seq, skey, holder, deadline, op):
        """Record a committed Claim as holder's Holding (call with the mutex held)."""
        meta = Meta.from_msg(op.result, op.result.body)
        holding = Holding(seq, skey, skey, next(self.tokens), holder, deadline, meta)
        self.inflight[seq] = holding
        self.holders.setdefault(holder, {})[seq] = holding
        if deadline is not None:
            heapq.heappush(self.deadlines, (deadline, holding.token, seq))
        self.reaper_wake.notify()
        self.not_full.notify()
        return holding

    def _claim_one(self, front, holder, block, timeout, visibility_timeout, shuffle, policy):
        endtime = None if (timeout is None or not block) else monotonic() + timeout
        lost = 0
        while True:
            with self.not_empty:
                self._expire()
                seq, skey, msg = self._wait_for_candidate(front, block, endtime, shuffle)
                self._claiming.add(seq)
            now = self.clock()
            deadline = None if visibility_timeout is None else now + visibility_timeout
            op = self._receive_op(seq, skey, msg, now, deadline, policy)
            try:
                self.committer.submit([op]).wait()
                if not isinstance(op, store.Claim):      # taken out instead of delivered
                    with self.mutex:
                        self._claiming.discard(seq)
                    continue
            except store.ClaimLost:
                with self.mutex:
                    self._claiming.discard(seq)
                    self.claims_lost += 1
                    lost += 1
                    self._spread = min(self._spread * 2, SPREAD_MAX)
                    self._won_in_row = 0
                # Lost races count against the caller's timeout like waiting does.
                if (endtime is not None and monotonic() >= endtime) or (
                        not block and lost >= NONBLOCKING_TRIES):
                    raise Empty
                continue
            except BaseException:
                with self.mutex:
                    self._claiming.discard(seq)
                raise
            with self.mutex:
                self._claiming.discard(seq)
                # Narrow back to the head slowly: consumers that raced once keep racing
                # while they stay busy, and narrowing after every win put them back at
                # the head together (2 consumer processes lost a claim for about every
                # fourth item they got; narrowing once per SPREAD_DECAY wins: one in 25).
                self._won_in_row += 1
                if self._spread > 1 and self._won_in_row >= SPREAD_DECAY:
                    self._spread -= 1
                    self._won_in_row = 0
                return self._held(seq, skey, holder, deadline, op)

    def _wait_for_candidate(self, front, block, endtime, shuffle=False):
        while True:
            if front.is_shutdown and front.shutdown_immediate:
                raise ShutDown
            if self._returning:
                # Our own give-backs are being committed: a message given back here must be
                # seen at its place by the next get here (read your writes).
                self.not_empty.wait(WAIT_RECHECK)
                continue
            found = self._pick(shuffle)
            if found is not None:
                return found
            if self._promote_due():
                continue              # a delayed message is due: wait for its promotion
            if front.is_shutdown:
                raise ShutDown
            if not block:
                raise Empty
            if endtime is None:
                wait = WAIT_RECHECK
            else:
                remaining = endtime - monotonic()
                if remaining <= 0.0:
                    raise Empty
                wait = min(remaining, WAIT_RECHECK)
            self.getters_waiting += 1
            try:
                self.not_empty.wait(wait)
            finally:
                self.getters_waiting -= 1
            self._expire()

    def _promote_due(self):
        """Promote delayed messages whose time has come (a getter found nothing ready);
        True if it did (the promotion is then being committed, see _return)."""
        rec = self._record()
        now = self.clock()
        due = [seq for seq, visible_at in rec.delayed.items() if visible_at <= now]
        if not due:
            return False
        self._return([store.Promote(self.name, seq, now) for seq in due])
        return True

    def _pick(self, shuffle=False):
        """(seq, store key, Msg) of a ready message nobody in this process is claiming, or
        None.  The first one, or after lost races one of the first few, chosen at random;
        with shuffle, one of the first SHUFFLE_AMONG."""
        rec = self._record()
        spread = SHUFFLE_AMONG if shuffle else self._spread
        choice = random.randrange(spread) if spread > 1 else 0
        chosen = None
        for n, candidate in enumerate(self._candidates(rec)):
            chosen = candidate
            if n >= choice:
                break
        return chosen

    def _candidates(self, rec):
        """(seq, store key, Msg) of the ready messages in delivery order, skipping those
        this process is claiming (and taking out those whose record, or large item's Body
        record, is gone)."""
        if self.kind != store.VALUE:
            for skey in rec.ready:
                seq = store.seq_of_key(self.kind, skey)
                if seq in self._claiming:
                    continue
                msg = rec.messages.get(seq)
                if msg is None:
                    self._drop_missing(seq, skey, "record")
                    continue
                if not rec.has_body(seq, msg):
                    self._drop_missing(seq, skey, "body")    # a large item's Body record
                    continue
                yield seq, skey, msg
            return
        # Priority by item value: the store keeps seqs; the order by value is kept here,
        # learning new messages as they appear (seqs only grow) and forgetting gone ones.
        if self._gone:
            self._by_value = [k for k in self._by_value if k[-1] not in self._gone]
            self._gone.clear()
        for seq in rec.messages.keys(self._known_seq + 1):
            msg = rec.messages[seq]
            insort(self._by_value, _ValueOrder.Key(self.memory_key(
                seq, _loads_or_none(rec.body_of(seq, msg)), msg.priority)))
            self._known_seq = seq
        for key in list(self._by_value):
            seq = key[-1]
            msg = rec.messages.get(seq)
            if msg is None:
                self._gone.add(seq)
            elif seq in rec.ready and seq not in self._claiming:
                yield seq, seq, msg

    def _drop_missing(self, seq, skey, what):
        """The ready set names a message whose record (or large item's body) is gone: it
        can never be delivered, so its entry goes (the gets here wait for that, as for a
        give-back)."""
        log.error("ackqueue: message %d of queue %r cannot be delivered: its %s is "
                  "missing from the store (changed outside ackqueue, or damaged); it was "
                  "taken out of the queue (counted in stats() as missing)", seq, self.name,
                  what)
        self._return([store.DropMissing(self.name, seq, skey)])

    # -- ack and give back ----------------------------------------------------------------

    def ack_op(self, h):
        return store.Ack(self.name, h.seq, h.skey, expect=h.receive_count)

    def ack_many(self, holdings):
        self.begin_settle(holdings)
        ticket = None

        def failed(error):
            if isinstance(error, StaleAck):
                if ticket.uncertain and error.reason == "acked":
                    self.settled(holdings)    # our own first attempt got through
                else:
                    self._drop(holdings, str(error))
            else:
                self.cancel_settle(holdings)

        try:
            ticket = self.committer.submit([self.ack_op(h) for h in holdings],
                                           on_commit=lambda: self.settled(holdings),
                                           on_fail=failed, lead=True)
        except BaseException:
            self.cancel_settle(holdings)
            raise
        try:
            ticket.wait()
        except StaleAck as exc:
            if not (ticket.uncertain and exc.reason == "acked"):
                raise

    def _drop(self, holdings, why):
        """Deliveries the store no longer has in flight for us: forget them locally."""
        with self.mutex:
            for h in holdings:
                h.settling = False
                if self.inflight.get(h.seq) is h:
                    del self.inflight[h.seq]
                    self._forget_holding(h)
                h.released = why

    def _give_back(self, h, why, delay=0.0):
        del self.inflight[h.seq]
        self._forget_holding(h)
        h.released = why
        visible_at = self.clock() + delay if delay and delay > 0 else None
        if visible_at is not None and (self._next_promote is None
                                       or visible_at < self._next_promote):
            self._next_promote = visible_at
            self.reaper_wake.notify()
        self._return([store.Release(self.name, h.seq, h.skey, visible_at,
                                    expect=h.receive_count, at=self.clock())])

    def _return(self, ops):
        """Commit operations that make messages ready again (call with the mutex held);
        until they are durable, a get in this process waits for them."""
        self._returning += 1
        self.committer.submit(ops, on_commit=self._returned, on_fail=self._returned)

    def _returned(self, error=None):
        with self.mutex:
            self._returning -= 1
        self.store_changed()

    def give_back_everything(self, why):
        """Give back every delivery this process holds (the process is closing the queue)."""
        with self.mutex:
            for holder in list(self.holders):
                self._give_back_all(holder, why)

    # -- peek, counts, purge, redrive, visibility -------------------------------------------

    def peek(self, load_meta):
        with self.mutex:
            rec = self._record()
            now = self.clock()
            for seq, _skey, msg in self._candidates(rec):
                if msg.expires_at is None or msg.expires_at > now:
                    return seq, Meta.from_msg(msg, rec.body_of(seq, msg))
            return None

    def counts(self):
        with self.mutex:
            if self._promote_due():           # due delayed messages count as ready
                end = monotonic() + WAIT_RECHECK
                while self._returning and monotonic() < end:
                    self.not_empty.wait(0.05)
            counts = self._counts()
            return {"ready": counts.get("ready"), "in_flight": counts.get("inflight"),
                    "delayed": counts.get("delayed")}

    def purge(self):
        op = store.Purge(self.name)
        self.committer.submit([op]).wait()
        self.store_changed()
        return op.count

    def redrive(self, targets, to, load_meta):
        op = store.Redrive(self.name, None, self.clock(), to)
        self.committer.submit([op]).wait()
        return len(op.moved)

    def change_visibility(self, holding, seconds):
        with self.mutex:
            self.check_current(holding)
            if seconds <= 0:
                self._give_back(holding, "change_visibility() gave it back")
                return
            deadline = self.clock() + seconds
        self.committer.submit([store.SetDeadline(self.name, holding.seq, deadline,
                                                 self.database.lease_id,
                                                 holding.receive_count)]).wait()
        with self.mutex:
            holding.deadline = deadline
            heapq.heappush(self.deadlines, (deadline, holding.token, holding.seq))
            self.reaper_wake.notify()

    def sweep(self):
        """Take out ready and delayed messages past their retention (the store decides
        which are still neither in flight nor gone), and forget passed dedup ids."""
        began, now = monotonic(), self.clock()
        with self.mutex:
            due, dedup_due = _sweep_due(self._record(), now)
        return self._finish_sweep(due, dedup_due, now, began)

    # -- what others left behind ----------------------------------------------------------

    def store_changed(self):
        """Another process (or our own committer) changed this queue: waiters look again."""
        with self.mutex:
            self._wake_waiters()
            self.reaper_wake.notify()

    def _wake_waiters(self):
        self.not_empty.notify_all()
        self.not_full.notify_all()
        self.all_tasks_done.notify_all()

    def _expire(self):
        super()._expire()
        if self._next_promote is not None and self._next_promote <= self.clock():
            self._next_promote = None
            self._scan_store()

    def _reap_pass(self):
        self._expire()
        now = monotonic()
        if now >= self._next_scan:
            self._next_scan = now + SCAN_INTERVAL
            self._scan_store()

    def _next_wake(self):
        waits = [max(self._next_scan - monotonic(), 0.001)]
        base = super()._next_wake()
        if base is not None:
            waits.append(base)
        if self._next_promote is not None:
            waits.append(max(self._next_promote - self.clock(), 0.001))
        return min(waits)

    def _scan_store(self):
        """Give back others' deliveries whose deadline passed, make due delayed messages
        ready, and wake waiters if the counters moved (for storages without wake-ups)."""
        rec = self._record()
        now = self.clock()
        counts = dict(rec.counts.values)
        if counts != self._seen_counts:
            if self._seen_counts is not None:
                self._wake_waiters()
            self._seen_counts = counts
        due, later = [], []
        for seq, visible_at in rec.delayed.items():
            (due if visible_at <= now else later).append((visible_at, seq))
        soonest = min(later)[0] if later else None
        pending = self._next_promote          # a delayed give-back of ours, not yet durable
        if pending is not None and pending > now and (soonest is None or pending < soonest):
            soonest = pending
        self._next_promote = soonest
        if due:
            self._return([store.Promote(self.name, seq, now) for _, seq in due])
        if store.needs_compaction(rec):
            self.committer.submit([store.Compact(self.name)])
        for _lease, seq, deadline in rec.leased_items():
            if deadline is None or deadline > now or seq in self.inflight:
                continue
            self._release_stored(rec, seq)

    def _release_stored(self, rec, seq):
        """Give back a delivery that no thread here holds, as the store last saw it."""
        msg = rec.messages.get(seq)
        if msg is not None:
            self._return([store.Release(self.name, seq, rec.key_of(seq), None,
                                        expect=msg.receive_count)])

    def sweep_orphans(self, lease_id):
        """Give back deliveries the store says this process holds but no thread here does
        (a claim whose outcome a lost connection hid)."""
        with self.mutex:
            if self.stopped:
                return
            rec = self._record()
            for seq in list(rec.leased_by(lease_id) or ()):
                if seq not in self.inflight and seq not in self._claiming:
                    self._release_stored(rec, seq)

    def lease_lost(self, why):
        """Others expired this process's lease: forget deliveries they gave back."""
        with self.mutex:
            if self.stopped:
                return
            rec = self._record()
            for seq, h in list(self.inflight.items()):
                msg = rec.messages.get(seq)
                if (msg is None or msg.holder is None
                        or msg.receive_count != h.receive_count):
                    del self.inflight[seq]
                    self._forget_holding(h)
                    h.released = why

    def stop(self):
        self.give_back_everything("its process closed the queue")
        super().stop()
        with self.mutex:
            self._rtm.abort()
            self._rconn.close()

