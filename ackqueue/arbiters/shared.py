"""The arbiter of a queue that several processes share through a server (ZEO): the store
decides.

Other processes put, claim and acknowledge too, so the store is the truth and the state
only keeps what is this process's own: the deliveries its threads hold, their deadlines,
the threads waiting.

- put:    the Put is committed; the store numbers the message at commit (sequence numbers
          are taken from the store, so they grow in commit order across processes).  Its
          token, which lets the store apply a retried commit once, ascends within this
          process (PutTokens), so producers add to separate buckets of the token table.
- get:    a ready message is chosen from a fresh snapshot of the store's ready set and a
          Claim naming this process's lease is committed, and waited for, before the item
          is handed out.  Two processes that choose the same message conflict; the loser's
          claim is retried by the committer, refused (ClaimLost), and it chooses again.
          After a lost race a process spreads its choices over the first few ready
          messages, so that consumers do not keep colliding at the head of the queue, and
          narrows them back one message per SPREAD_DECAY claims won in a row;
          uncontended, it takes the head (FIFO).
- prefetch (AckQueue(..., prefetch=N), FIFO queues): while this process's gets keep up,
          one claim commit takes up to N ready messages (one unit each, so a message another
          process won is left out alone): the get receives the first, and the others wait
          here, claimed under this process's lease, for the next gets, which then make no
          round trip.  The batch doubles (1, 2, 4, ... N) each time the previous one was
          all received, and is back to 1 when another process won part of one (consumers
          racing for a short queue; to 2 with prefetch_wait, whose wait keeps the loser
          from claiming each new put alone).  A message no get here receives within
          PREFETCH_IDLE seconds (or a tenth of its visibility timeout) goes back to its
          place with an Unclaim, which also undoes its receive count, and the batch
          starts again at 1.
          With prefetch_wait=S, a get that finds fewer ready than its batch waits up to S
          seconds (never past its own timeout; a get that must not block, not at all) for
          more to be put, as Kafka's fetch.max.wait.ms does: a consumer that keeps up,
          woken by every put, otherwise claims one message per commit.  While it waits it
          reads the store again only once as many puts (or other changes) as it lacks
          have been signalled, and at the end: each read is a round trip once another
          process changed the queue.
- ack, give-back: Ack and Release name the receive count of their delivery, and the store
          refuses them (StaleAck) unless it is still the live one: a process that was paused
          past its deadline or its lease cannot remove a message delivered again meanwhile.
- wake-ups: the server's invalidations tell this process that a queue's counters changed
          (ackqueue.database); waiting getters and putters look at the store again then.
- what other processes leave behind: the reaper scans the store about once a second, gives
          back messages whose visibility deadline passed, and makes delayed messages ready.
          Messages held without a deadline by a process that died come back when its lease
          expires (ackqueue.lease).
"""
import itertools
import logging
import os
import random
from bisect import insort
from time import monotonic

import transaction
from ZODB.POSException import ConflictError
from zope.interface import implementer

from .. import expiry, store
from ..pack_rereads import fresh_reads
from ..interfaces import ISharedArbiter
from .local import ValueOrder, loads_or_none
from ..state import DEAD, EXPIRED, DEFAULT_PUT, Meta, verdict

__all__ = ["SharedArbiter"]

log = logging.getLogger(__name__)

SCAN_INTERVAL = 1.0         # how often the store is scanned for others' expired deliveries
WAIT_RECHECK = 1.0          # a waiting get looks at the store at least this often
SPREAD_MAX = 32             # how many ready messages a contended claim may choose among
SPREAD_DECAY = 8            # claims won in a row that narrow the choice by one message
NONBLOCKING_TRIES = 16      # lost races after which a try gives up (get(block=False): Empty)
SHUFFLE_AMONG = 1000        # get(shuffle=True) chooses among this many ready messages
PREFETCH_IDLE = 1.0         # seconds a message claimed ahead waits for a get here, at most
PREFETCH_VT_SHARE = 0.1     # ... and at most this share of its visibility timeout


class _Ahead:
    """The holder of the messages claimed ahead for this process's next gets: no thread's,
    so no thread's end gives them back (see the module docstring, prefetch)."""

    thread_bound = False

    def __repr__(self):
        return "<messages claimed ahead>"


class _AheadInfo:
    """How a message claimed ahead was claimed, and what its Unclaim restores."""

    __slots__ = ("terms", "claimed_at", "first_received", "last_received")

    def __init__(self, terms, claimed_at, first_received, last_received):
        self.terms = terms                  # (visibility timeout, dead-letter policy)
        self.claimed_at = claimed_at        # the queue clock's time of the claim
        self.first_received = first_received
        self.last_received = last_received


class PutTokens:
    """The tokens of this process's puts (store.Put.token: a commit retried after it
    reached the server is applied once).  Unique across processes: a random prefix per
    process, made again after a fork.  Ascending within a process, so that each
    producer's tokens sit together in the store's token table (an OOBTree,
    QueueRecord.put_tokens): a producer then adds to buckets of its own, and does not
    load one another producer just changed, as random tokens made it do (about one
    put in five in 2 producer processes)."""

    def __init__(self):
        self._pid, self._pair = None, None

    def next(self):
        # A prefix and its counter are made, read and replaced together (one tuple), so
        # that two threads that both make a pair at once (the first puts, or the first
        # after a fork) each number from their own prefix: a token is never made twice,
        # which would make the store take the second put for a retry of the first.
        pid, pair = os.getpid(), self._pair
        if pid != self._pid or pair is None:
            pair = (os.urandom(8), itertools.count())
            self._pair, self._pid = pair, pid
        prefix, count = pair
        return prefix + next(count).to_bytes(8, "big")


def _patience(info):
    """Seconds a message claimed ahead may wait for a get here."""
    vt = info.terms[0]
    return PREFETCH_IDLE if vt is None else min(PREFETCH_IDLE, vt * PREFETCH_VT_SHARE)


def _terms(ask):
    """What a message claimed ahead for one get must share with the get that receives it."""
    policy = ask.policy
    return (ask.visibility_timeout,
            None if policy is None else (policy.max_receives, policy.target))


@implementer(ISharedArbiter)
class SharedArbiter:
    """One named queue shared through a server (see the module docstring)."""

    recheck = WAIT_RECHECK

    def __init__(self, state):
        self.state = state
        self.name = state.name
        self.committer = state.committer
        self.database = state.database
        self._claiming = set()      # seqs whose Claim this process is committing
        self._expiring = set()      # seqs whose Expire this process is committing
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
        self._ahead_holder = _Ahead()
        self._ahead = {}            # seq -> _AheadInfo of the messages claimed ahead
        self._window = 1            # how many messages the next claim takes (prefetch)
        self._tokens = PutTokens()
        self._rtm = transaction.TransactionManager()
        self._rconn = self.database.db.open(transaction_manager=self._rtm)
        self.watch_oid = None

    def abort_reads(self):
        """End the read connection's snapshot: the next read sees a fresh one (what
        ackqueue.pack_rereads does when a pack removed a revision a read needed)."""
        self._rtm.abort()

    # -- opening and reading --------------------------------------------------------------

    def load(self):
        for attempt in range(20):
            try:
                with self._rtm:
                    root = self._rconn.root()
                    rec = store.ensure_queue(root, self.name, self.state.kind)
                    self.state.check_record(rec)
                    store.ensure_leases(root)
                break
            except ConflictError:
                if attempt == 19:
                    raise
        self.watch_oid = self.record().counts._p_oid
        self._rtm.abort()
        self.database.watch(self.watch_oid, self.state)

    def record(self):
        """The queue's record in a fresh snapshot (mutex held)."""
        self._rtm.begin()     # sees every transaction this client has heard of
        return self._rconn.root()[store.ROOT_KEY].queues[self.name]

    # -- sizes: the store's, shared by every process (mutex held) ---------------------------

    def has_ready(self):
        return (bool(self._ahead) or self._pick() is not None or self._promote_due())

    # The store's counters still count waiting messages whose retention has passed until
    # an Expire is committed; the sizes subtract those found through the expiry index in
    # the same snapshot (ackqueue.expiry), so they are exact at the time they are read.

    def _sizes(self):
        """(ready, delayed, in flight) of a fresh snapshot, without the expired (whose
        Expire is then written, once, so that the totals and the store follow)."""
        rec = self.record()
        counts = rec.counts
        now = self.state.clock()
        due = expiry.due(rec, now)
        ready, delayed = counts.get("ready"), counts.get("delayed")
        if due is not None:
            ready, delayed = ready - len(due.ready), delayed - len(due.delayed)
            self._expire(due.waiting, now)
        return ready, delayed, counts.get("inflight")

    def _expire(self, seqs, now):
        """Write the Expire of messages found expired, unless already being written."""
        fresh = [seq for seq in seqs if seq not in self._expiring]
        if not fresh:
            return
        self._expiring.update(fresh)

        def done(error=None):
            with self.state.mutex:
                self._expiring.difference_update(fresh)
        self.committer.submit([store.Expire(self.name, seq, now) for seq in fresh],
                              on_commit=done, on_fail=done)

    def ready_count(self):
        """The store's ready messages, and those claimed ahead for gets here."""
        return self._store_ready() + len(self._ahead)

    @fresh_reads
    def _store_ready(self):
        return self._sizes()[0]

    @fresh_reads
    def queued(self):
        ready, delayed, _ = self._sizes()
        return ready + delayed

    @fresh_reads
    def unfinished(self):
        return sum(self._sizes())

    def counts(self):
        state = self.state
        with state.mutex:
            # Due delayed messages count as ready; and this process's own give-backs are
            # waited for (read your writes: a message nacked here is not in flight).
            self._promote_due()
            self._await_returns()
            return self._counts_now()

    @fresh_reads
    def _counts_now(self):
        ready, delayed, inflight = self._sizes()
        return {"ready": ready, "in_flight": inflight, "delayed": delayed}

    def next_visible_at(self):
        return self._next_promote

    # -- put ------------------------------------------------------------------------------

    def reserve_seqs(self, count):
        return [None] * count           # the store numbers them at commit

    def new_message(self, seq, item, body, now, opts=DEFAULT_PUT, dedup_id=None):
        self.database.last_put_at = monotonic()     # keeps its objects warm (ackqueue.database)
        op = store.Put(self.name, None, None, body, opts.priority, now,
                       now + opts.delay if opts.delay else None, now + opts.retention,
                       opts.attributes, dedup_id,
                       None if dedup_id is None else now + opts.dedup_window,
                       token=self._tokens.next())     # a retried commit is applied once
        return op, None

    def new_messages(self, seqs, pairs, now, opts=DEFAULT_PUT, dedup_ids=None):
        made = [self.new_message(seq, item, body, now, opts, dedup_id) for
                seq, (item, body), dedup_id in zip(seqs, pairs, dedup_ids or [None] * len(pairs))]
        return [op for op, _ in made], [entry for _, entry in made]

    def arrive(self, entries):
        self.state.signal_ready(len(entries))

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

    def take(self, front, ask, n, moves):
        """Claim the next ready message, then up to n - 1 of the messages ready at that
        moment, whose claims share commits (one that another process won is left out).
        Each claim, and so its receive count, is durable before this returns.  Messages
        claimed ahead (prefetch) are received first, without a commit."""
        if ask.record and not ask.shuffle:
            if self._ahead:
                got = self._from_ahead(ask, n)
                if got:
                    return got
            if ask.prefetch > 1 and n == 1:
                got = self._claim_ahead(front, ask)
                if got is not None:
                    return got
        first = self._claim_one(ask)
        if first is None:
            return []
        if n == 1:
            return [first]
        return [first] + self._claim_more(front, ask, n - 1)

    def _claim_one(self, ask):
        """Claim one message; None when none is ready or NONBLOCKING_TRIES races were lost."""
        state = self.state
        lost, promoted = 0, False
        while lost < NONBLOCKING_TRIES:
            with state.mutex:
                state.expire_due()
                found = self._pick_now(ask.shuffle)
                if found is None:
                    if promoted or not self._promote_due():
                        return None
                    promoted = True   # due delayed messages are being made ready: look again
                    continue
                seq, skey, msg = found
                self._claiming.add(seq)
            now = state.clock()
            vt = ask.visibility_timeout
            deadline = None if vt is None else now + vt
            op = self._receive_op(seq, skey, msg, now, deadline, ask.policy)
            try:
                self.committer.submit([op]).wait()
            except store.ClaimLost:
                lost += 1
                self._lost_race(seq)
                continue
            except BaseException:
                with state.mutex:
                    self._claiming.discard(seq)
                raise
            with state.mutex:
                self._claiming.discard(seq)
                if isinstance(op, store.Claim):      # else taken out instead of delivered
                    self._won_race()
                    return self._held(seq, skey, ask.holder, deadline, op)
        return None

    # -- prefetch: messages claimed ahead for the next gets here ----------------------------

    def _from_ahead(self, ask, n):
        """Up to n messages claimed ahead, oldest claim first, now ask.holder's; those that
        waited too long, or were claimed on other terms, go back (Unclaim)."""
        state = self.state
        with state.mutex:
            held = state.holders.get(self._ahead_holder)
            if not held:
                self._ahead.clear()
                return []
            terms, now, got = _terms(ask), state.clock(), []
            for seq, h in list(held.items()):
                info = self._ahead.get(seq)
                if info is None:
                    continue
                if info.terms != terms or self._waited_too_long(info, now):
                    self._unclaim(h)
                elif len(got) < n:
                    got.append(self._hand_over(h, ask.holder))
            return got

    def _waited_too_long(self, info, now):
        return now - info.claimed_at > _patience(info)

    def _hand_over(self, h, holder):
        """Make message h, claimed ahead, holder's delivery (mutex held): the store's
        claim stays as it is (it names this process's lease, not a thread)."""
        state = self.state
        del self._ahead[h.seq]
        del state.inflight[h.seq]
        state.forget_holding(h)
        mine = state.hold(h.seq, h.key, h.skey, h.meta, holder, h.deadline)
        mine.claimed = h.claimed
        return mine

    def _unclaim(self, h, why="no get here received it in time"):
        """Send message h, claimed ahead and never received, back to its place with its
        receive count as before (mutex held); the next batch starts small again."""
        state = self.state
        if state.inflight.get(h.seq) is h:
            del state.inflight[h.seq]
        state.forget_holding(h)
        h.released = why
        self._ahead_back(h)

    def _claim_ahead(self, front, ask):
        """One commit claiming this batch's window of ready messages, the first for ask,
        the rest ahead; None when the window is 1, or fewer than two are ready, or every
        claim was lost (then the one-message path decides)."""
        state = self.state
        with state.mutex:
            count = self._window
            if count <= 1:
                self._window = min(2, ask.prefetch)
                return None
            state.expire_due()
            if front.is_shutdown and front.shutdown_immediate:
                return None
            self._await_returns()
            picks = self._picks_spread(count)
            if len(picks) < count and ask.prefetch_wait:
                picks = self._wait_for_batch(front, ask, count, picks)
            if len(picks) < 2:
                return None
            self._claiming.update(seq for seq, _, _ in picks)
        now = state.clock()
        won = self._claim_picks(picks, ask, self._ahead_holder, now)
        before = {seq: msg for seq, _, msg in picks}
        with state.mutex:
            if len(won) < len(picks):
                self._spread = min(self._spread * 2, SPREAD_MAX)
                self._won_in_row = 0
            else:
                self._won_race()
            if not won:
                self._window = 1
                return None
            terms = _terms(ask)
            for h in won:
                msg = before[h.seq]
                first = None if h.receive_count <= 1 else h.meta.first_received
                self._ahead[h.seq] = _AheadInfo(terms, now, first, msg.last_received)
            # Another process took some of the batch: consumers are racing for a short
            # queue, where batches only collide; claim one at a time until a batch of one
            # was received in full again.  With prefetch_wait, two at a time, with the
            # wait: a loser that went back to one message per commit claimed each new put
            # at once, alone, and raced the winner's next batch for it (two consumer
            # processes, ten interleaved pairs of runs: 2.64 -> 2.40 round trips per item
            # in the consumers, medians).
            if len(won) == len(picks):
                self._window = min(count * 2, ask.prefetch)
            else:
                self._window = 2 if ask.prefetch_wait else 1
            return [self._hand_over(won[0], ask.holder)]

    def _wait_for_batch(self, front, ask, count, picks):
        """Wait (mutex held) until count messages are ready to claim, ask.prefetch_wait
        seconds have passed or the get's own time is up, whichever comes first; the picks
        then.  A consumer that keeps up then claims a batch in one commit instead of one
        message per commit, at the price of that wait (prefetch_wait).

        Each look at the store is a round trip when another process changed the queue
        (every put and claim does), so the store is read again only once as many signals
        as messages are missing have come (a put here or a change by another process,
        each at most one more message for the usual one-message put; a put_many elsewhere
        is then only seen at the end of the wait), and once at the end if any came."""
        state = self.state
        end = monotonic() + ask.prefetch_wait
        if ask.until is not None:
            end = min(end, ask.until)
        seen = state.ready_signals
        while len(picks) < count and not front.is_shutdown:
            remaining = end - monotonic()
            if remaining > 0.0:
                state.not_empty.wait(remaining)     # woken by puts here and other processes'
            last = monotonic() >= end or front.is_shutdown
            if not last and state.ready_signals - seen < count - len(picks):
                continue                            # too few signals to fill the batch yet
            if state.ready_signals != seen:         # something came since the last look
                seen = state.ready_signals
                state.expire_due()
                self._await_returns()               # read this process's own give-backs
                picks = self._picks_spread(count)
            if last:
                break
        return picks

    def _picks_spread(self, count):
        """count ready messages to claim together: the first ones, or after lost races
        one of the next few runs of count (so that two processes that raced for the same
        run go on to different ones), or what is ready before it (mutex held)."""
        skip = count * random.randrange(self._spread) if self._spread > 1 else 0
        picks = self._picks(skip + count, False)
        return picks[-count:] if len(picks) > count else picks

    def _lost_race(self, seq):
        with self.state.mutex:
            self._claiming.discard(seq)
            self.claims_lost += 1
            self._spread = min(self._spread * 2, SPREAD_MAX)
            self._won_in_row = 0

    def _won_race(self):
        # Narrow back to the head slowly: consumers that raced once keep racing while they
        # stay busy, and narrowing after every win put them back at the head together (2
        # consumer processes lost a claim for about every fourth item they got; narrowing
        # once per SPREAD_DECAY wins: one in 25).
        self._won_in_row += 1
        if self._spread > 1 and self._won_in_row >= SPREAD_DECAY:
            self._spread -= 1
            self._won_in_row = 0

    def _claim_more(self, front, ask, count):
        """Claim up to count more ready messages at once, without waiting: one unit each,
        submitted together so that they share a commit (a unit refused because another
        process took its message fails alone).  Returns the Holdings of those claimed."""
        state = self.state
        with state.mutex:
            state.expire_due()
            if front.is_shutdown and front.shutdown_immediate:
                return []
            picks = self._picks(count, ask.shuffle)
            self._claiming.update(seq for seq, _, _ in picks)
        return self._claim_picks(picks, ask, ask.holder, state.clock())

    def _claim_picks(self, picks, ask, holder, now):
        """Submit a unit for each pick (marked as being claimed), so that they share a
        commit, and return the Holdings, for holder, of those whose Claim won; the picks
        are no longer being claimed once this returns."""
        vt = ask.visibility_timeout
        deadline = None if vt is None else now + vt
        try:
            pending = []
            for seq, skey, msg in picks:
                op = self._receive_op(seq, skey, msg, now, deadline, ask.policy)
                pending.append((seq, skey, op, self.committer.submit([op])))
            return self._collect(pending, holder, deadline)
        finally:
            with self.state.mutex:
                self._claiming.difference_update(seq for seq, _, _ in picks)

    @fresh_reads
    def _picks(self, count, shuffle):
        """Up to count ready messages to claim at once (mutex held)."""
        picks = []
        for candidate in self._candidates(self.record()):
            picks.append(candidate)
            if len(picks) >= (SHUFFLE_AMONG if shuffle else count):
                break
        if shuffle and len(picks) > count:
            picks = random.sample(picks, count)
        return picks

    def _collect(self, pending, holder, deadline):
        """The Holdings of the submitted claims that won."""
        got = []
        for seq, skey, op, ticket in pending:
            try:
                ticket.wait()
            except store.ClaimLost:
                with self.state.mutex:
                    self.claims_lost += 1
                continue
            except Exception:
                log.warning("ackqueue: a claim of a batch failed", exc_info=True)
                continue
            if isinstance(op, store.Claim):         # else taken out, not delivered
                with self.state.mutex:
                    got.append(self._held(seq, skey, holder, deadline, op))
        return got

    def _receive_op(self, seq, skey, msg, now, deadline, policy):
        """The store operation that receives message seq: its Claim, or its Expire or
        DeadLetter by the receive rules (state.verdict)."""
        why = verdict(msg, now, policy)
        if why == EXPIRED:
            return store.Expire(self.name, seq, now)
        if why == DEAD:
            return store.DeadLetter(self.name, seq, policy.target, None, now,
                                    expect=msg.receive_count)
        return store.Claim(self.name, seq, skey, None, now, deadline,
                           lease=self.database.lease_id)

    def _held(self, seq, skey, holder, deadline, op):
        """Record a committed Claim as holder's Holding (mutex held)."""
        meta = Meta.from_msg(op.result, op.result.body)
        return self.state.hold(seq, skey, skey, meta, holder, deadline)

    def _pick_now(self, shuffle):
        """A message to claim now (mutex held), once this process's own give-backs are in
        the store: a message given back here must be seen at its place by the next get here
        (read your writes)."""
        self._await_returns()
        return self._pick(shuffle)

    def _await_returns(self):
        """Wait (mutex held, WAIT_RECHECK at most) until this process's own give-backs
        are in the store."""
        end = monotonic() + WAIT_RECHECK
        while self._returning and monotonic() < end:
            self.state.not_empty.wait(end - monotonic())

    @fresh_reads
    def _promote_due(self):
        """Promote delayed messages whose time has come (a getter found nothing ready);
        True if it did (the promotion is then being committed, see _return)."""
        rec = self.record()
        now = self.state.clock()
        due = [seq for seq, visible_at in rec.delayed.items() if visible_at <= now]
        if not due:
            return False
        self._return([store.Promote(self.name, seq, now) for seq in due])
        return True

    @fresh_reads
    def _pick(self, shuffle=False):
        """(seq, store key, Msg) of a ready message nobody in this process is claiming, or
        None.  The first one, or after lost races one of the first few, chosen at random;
        with shuffle, one of the first SHUFFLE_AMONG."""
        spread = SHUFFLE_AMONG if shuffle else self._spread
        choice = random.randrange(spread) if spread > 1 else 0
        chosen = None
        for n, candidate in enumerate(self._candidates(self.record())):
            chosen = candidate
            if n >= choice:
                break
        return chosen

    def _candidates(self, rec):
        """(seq, store key, Msg) of the ready messages in delivery order, skipping those
        this process is claiming (and taking out those whose record, or large item's Body
        record, is gone)."""
        if self.state.kind == store.VALUE:
            yield from self._candidates_by_value(rec)
            return
        for skey in rec.ready:
            seq = store.seq_of_key(self.state.kind, skey)
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

    def _candidates_by_value(self, rec):
        for key in list(self._learn_values(rec)):
            seq = key[-1]
            msg = rec.messages.get(seq)
            if msg is None:
                self._gone.add(seq)
            elif seq in rec.ready and seq not in self._claiming:
                yield seq, seq, msg

    def _learn_values(self, rec):
        """Priority by item value: the store keeps seqs; the order by value is kept here,
        learning new messages as they appear (seqs only grow) and forgetting gone ones.
        Returns the keys (rank, item, seq) in value order."""
        if self._gone:
            self._by_value = [k for k in self._by_value if k[-1] not in self._gone]
            self._gone.clear()
        for seq in rec.messages.keys(self._known_seq + 1):
            msg = rec.messages[seq]
            item = loads_or_none(rec.body_of(seq, msg), self.state.allowed_classes,
                                 self.state.codec)
            insort(self._by_value, ValueOrder.Key(
                (store.PRIORITY_MAX - msg.priority, item, seq)))
            self._known_seq = seq
        return self._by_value

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

    def ack_ops(self, holdings):
        return [self.ack_op(h) for h in holdings]

    def put_back(self, h, visible_at, now):
        if h.holder is self._ahead_holder and h.seq in self._ahead:
            self._ahead_back(h)           # claimed ahead, never received: undo the claim
            return
        if visible_at is not None and (self._next_promote is None
                                       or visible_at < self._next_promote):
            self._next_promote = visible_at
            self.state.reaper_wake.notify()
        self._return([store.Release(self.name, h.seq, h.skey, visible_at,
                                    expect=h.receive_count, at=now)])

    def deadline_op(self, h, deadline):
        return store.SetDeadline(self.name, h.seq, deadline, self.database.lease_id,
                                 h.receive_count)

    def removed(self, count):
        pass                          # compaction is decided by the scan (needs_compaction)

    def _return(self, ops):
        """Commit operations that make messages ready again (mutex held); until they are
        durable, a get in this process waits for them."""
        self._returning += 1
        self.committer.submit(ops, on_commit=self._returned, on_fail=self._returned)

    def _returned(self, error=None):
        with self.state.mutex:
            self._returning -= 1
        self.state.store_changed()

    # -- peek, browse, purge, redrive -------------------------------------------------------

    def candidates(self, load_meta):
        rec = self.record()
        for seq, skey, msg in self._candidates(rec):
            yield seq, skey, Meta.from_msg(msg, rec.body_of(seq, msg))

    def skip_expired(self, seq, key):
        pass                          # the sweep or a claim takes it out

    def ready_order(self, rec):
        if self.state.kind != store.VALUE:
            kind = self.state.kind
            return (store.seq_of_key(kind, key) for key in rec.ready)
        with self.state.mutex:
            keys = list(self._learn_values(self.record()))
        return (key[-1] for key in keys if key[-1] in rec.ready)

    def purge(self):
        op = store.Purge(self.name)
        self.committer.submit([op]).wait()
        with self.state.mutex:
            self.state.purge_held(set(op.removed))
        self.state.store_changed()
        return op.count

    def redrive(self, to, load_meta):
        op = store.Redrive(self.name, None, self.state.clock(), to)
        self.committer.submit([op]).wait()
        return len(op.moved)

    def take_out_expired(self, seqs, keys=None):
        return list(seqs)             # the store decides which are neither held nor gone

    def expiry_read_due(self, now):
        return False                  # the sizes subtract the expired themselves (_sizes)

    def expiry_read(self, next_at):
        pass

    # -- what others left behind (mutex held) ---------------------------------------------

    def _ahead_back(self, h):
        """_unclaim for a holding the state already let go of (mutex held)."""
        info = self._ahead.pop(h.seq)
        self._window = 1
        self._return([store.Unclaim(self.name, h.seq, h.skey, h.receive_count,
                                    info.first_received, info.last_received)])

    def _ahead_idle(self, now):
        """Messages claimed ahead that no get received in time go back (mutex held)."""
        held = self.state.holders.get(self._ahead_holder) or {}
        for seq, info in list(self._ahead.items()):
            h = held.get(seq)
            if h is None or self.state.inflight.get(seq) is not h:
                del self._ahead[seq]          # purged, or the lease was lost meanwhile
            elif self._waited_too_long(info, now):
                self._unclaim(h)

    def expire_due(self, now):
        if self._ahead:
            self._ahead_idle(now)
        if self._next_promote is not None and self._next_promote <= now:
            self._next_promote = None
            self._scan_store()

    def reap(self):
        now = monotonic()
        if now >= self._next_scan:
            self._next_scan = now + SCAN_INTERVAL
            self._scan_store()

    def next_wake(self, now):
        waits = [max(self._next_scan - monotonic(), 0.001)]
        if self._next_promote is not None:
            waits.append(max(self._next_promote - now, 0.001))
        if self._ahead:               # when the oldest message claimed ahead goes back
            due = min(info.claimed_at + _patience(info) for info in self._ahead.values())
            waits.append(max(due - now, 0.001))
        return min(waits)

    def _scan_store(self):
        """Give back others' deliveries whose deadline passed, make due delayed messages
        ready, and wake waiters if the counters moved (for storages without wake-ups)."""
        now = self.state.clock()
        counts, delayed, compact, releases = self._scan_read(now)
        if counts != self._seen_counts:
            if self._seen_counts is not None:
                self.state.wake_waiters()
            self._seen_counts = counts
        self._schedule_promotions(delayed, now)
        if compact:
            self.committer.submit([store.Compact(self.name)])
        for op in releases:             # one unit each: a stale one is refused alone
            self._return([op])

    @fresh_reads
    def _scan_read(self, now):
        """What a scan acts on, all read from one snapshot before anything is submitted
        (so that a read cut short by a pack is simply read again)."""
        rec = self.record()
        counts = dict(rec.counts.values)
        delayed = list(rec.delayed.items())
        releases = [self._release_op(rec, seq) for _lease, seq, deadline in rec.leased_items()
                    if deadline is not None and deadline <= now
                    and seq not in self.state.inflight]
        return (counts, delayed, store.needs_compaction(rec),
                [op for op in releases if op is not None])

    def _schedule_promotions(self, delayed, now):
        """Promote the due delayed messages; remember when the next one is due."""
        due, later = [], []
        for seq, visible_at in delayed:
            (due if visible_at <= now else later).append((visible_at, seq))
        soonest = min(later)[0] if later else None
        pending = self._next_promote          # a delayed give-back of ours, not yet durable
        if pending is not None and pending > now and (soonest is None or pending < soonest):
            soonest = pending
        self._next_promote = soonest
        if due:
            self._return([store.Promote(self.name, seq, now) for _, seq in due])

    def _release_op(self, rec, seq):
        """The Release that gives back a delivery no thread here holds, as the store saw
        it in rec (None if its message is gone)."""
        msg = rec.messages.get(seq)
        if msg is None:
            return None
        return store.Release(self.name, seq, rec.key_of(seq), None, expect=msg.receive_count)

    def sweep_orphans(self, lease_id):
        """Give back deliveries the store says this process holds but no thread here does
        (a claim whose outcome a lost connection hid)."""
        with self.state.mutex:
            if self.state.stopped:
                return
            for op in self._orphans_read(lease_id):    # one unit each, as in a scan
                self._return([op])

    @fresh_reads
    def _orphans_read(self, lease_id):
        rec = self.record()
        releases = [self._release_op(rec, seq) for seq in list(rec.leased_by(lease_id) or ())
                    if seq not in self.state.inflight and seq not in self._claiming]
        return [op for op in releases if op is not None]

    def lease_lost(self, why):
        """Others expired this process's lease: forget deliveries they gave back."""
        state = self.state
        with state.mutex:
            if state.stopped:
                return
            for h in self._lost_read():
                state.forget(h, why)

    @fresh_reads
    def _lost_read(self):
        """The deliveries held here that the store no longer gives this process."""
        rec = self.record()
        lost = []
        for seq, h in list(self.state.inflight.items()):
            msg = rec.messages.get(seq)
            if msg is None or msg.holder is None or msg.receive_count != h.receive_count:
                lost.append(h)
        return lost

    def stop(self):
        self.state.give_back_everything("its process closed the queue")

    def close(self):
        """After the state stopped: the reading connection goes."""
        with self.state.mutex:
            self._rtm.abort()
            self._rconn.close()

