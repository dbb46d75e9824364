"""Named durable holds: deliveries that outlive the process that made them.

A *hold* is a delivery of a batch of messages to a name instead of a thread or a client:
``Holds(q).take("batch-7", 1000, 600)`` receives up to 1,000 ready messages of q, as a
get does (the queue's receive rules apply: a message past its retention expires, one
received max_receives times goes to the dead-letter queue), and writes, in the same
commit, that they are held under "batch-7" until a deadline (600 s from now).  The
messages stay in the queue, in flight: counts() shows them in flight, browse() as in
flight, nothing else receives them.  Unlike any other delivery, a hold survives the
process: when the queue is opened again (after a clean stop or a SIGKILL), the queue's
recovery of in-flight messages gives back everything in flight *except* the messages of
holds whose deadline has not passed, which come back held under their names, with their
deadline.  Then:

- ``held(name)``: the messages held under name (same ids, bodies, attributes, priority),
  in the order they were received;
- ``receive_again(name, seconds)``: the same, counted as one more receive of each (a
  replay), the deadline moved to seconds from now;
- ``ack(names)``: they leave the queue for good;
- ``release(names)`` (or some of a hold's messages, ``seqs=``): given back at their
  original place, their receive counts counted;
- ``dead_letter(name, seqs, target)``: moved to the dead-letter queue target (an AckQueue
  of the same storage, or None: dropped);
- at the deadline, the queue gives the messages back by itself, as it does with any
  delivery's visibility deadline (at their original place, receive counts counted).

Each of these is one commit; ``also=`` adds the caller's own writes to it (objects with
``check(root)`` and ``apply(root)``, as ackqueue.atomic's ``t.write``: they must
re-apply cleanly and never touch ``root["ackqueue"]``), so that a record of the caller's
changes together with the hold.  A hold's receive count: a message's count in the store
plus the hold's reads (the first read and each receive_again), so a hold is never
rewritten message by message while it lasts; the count is written into the message when
it is given back or dead-lettered.

For a storage this process holds alone (a file, an in-memory database; the queue service
holds its file so), where deliveries are decided in memory; through ZEO or the queue
service it raises NotSupported.  The service's stream leases (ackqueue/service/streams.py)
are built on it.

Store layout (ackqueue.store): the queue record's ``holds`` (an OOBTree, made by the
first hold) maps a hold's name to ``(deadline, reads, ids)``: the deadline (clock
seconds), how many reads counted, and the ids as packed 64-bit integers in the order
received.  A held message stays in the store's ready set, as every delivery of a process
that holds its storage alone does (ackqueue.arbiters.local: memory decides, the store learns of a
delivery at its ack or give-back): so taking a hold writes one small record, whatever
its size, and an ack writes what any ack writes.  At open, the ready set is loaded into
memory and the messages of live holds are taken out of it again, held.  A file written
with holds opens with ackqueue versions that do not know them: they deliver the held
messages again (a hold is lost, never a message), and what they leave in ``holds`` is
ignored here (an id counts only while its message is still ready in the store).
"""
import array
import logging
import threading
from collections import namedtuple

from BTrees.OOBTree import OOBTree

from . import store
from .errors import NotSupported
from .state import Ask, Meta

__all__ = ["Holds", "Held", "of", "recover", "adopt"]

log = logging.getLogger(__name__)

# One held message, as held() and the others return it: body is the stored bytes (with
# ackqueue.codec's mark), attributes a dict or None.
Held = namedtuple("Held", "id body priority attributes sent_at receive_count")


def pack_ids(seqs):
    return array.array("q", seqs).tobytes()


def unpack_ids(data):
    ids = array.array("q")
    ids.frombytes(data)
    return ids.tolist()


class Holder:
    """Who holds a hold's deliveries in the queue's state: a name, not a thread."""

    thread_bound = False

    def __init__(self, name):
        self.name = name
        self.reads = 0          # receives the hold counted (take, receive_again)

    def alive(self):
        return True

    def ended_by_exception(self):
        return False

    def _forget(self, holdings):
        pass

    def __repr__(self):
        return f"<ackqueue hold {self.name!r}>"


class _Registry:
    """The holders of one queue state, by name (made on first use; see of())."""

    def __init__(self):
        self.holders = {}
        self.lock = threading.Lock()

    def holder(self, name):
        with self.lock:
            h = self.holders.get(name)
            if h is None:
                h = self.holders[name] = Holder(name)
            return h


def of(state):
    """The hold registry of a queue state (one per state, made on first use)."""
    found = getattr(state, "holds", None)
    if found is None:
        with state.mutex:
            found = getattr(state, "holds", None)
            if found is None:
                found = state.holds = _Registry()
    return found


# -- store operations ---------------------------------------------------------------------

class _Op(store.Operation):
    name = None


def _table(rec, create=False):
    table = getattr(rec, "holds", None)
    if table is None and create:
        table = rec.holds = OOBTree()
    return table


class TakeHold(_Op):
    """Messages received in memory become held under hold: the hold is recorded with one
    read.  The messages stay in the store's ready set, as every delivery of a process
    that holds its storage alone does (ackqueue.arbiters.local); one the store still has delayed
    (made ready in memory only) is made ready there, so that the hold names ready ones."""

    def __init__(self, name, hold, entries, deadline):
        self.name, self.hold, self.entries, self.deadline = name, hold, entries, deadline

    def apply(self, root):
        rec = root[store.ROOT_KEY].queues[self.name]
        delayed, promoted = rec.delayed, 0
        for seq, skey in self.entries:
            if seq in delayed:
                del delayed[seq]
                rec.ready.add(skey)
                promoted += 1
        if promoted:
            rec.counts.add(delayed=-promoted, ready=promoted)
        _table(rec, create=True)[self.hold] = (
            float(self.deadline), 1, pack_ids([seq for seq, _ in self.entries]))


class RenewHold(_Op):
    """A replay of hold: one more read counted, the deadline moved."""

    def __init__(self, name, hold, deadline):
        self.name, self.hold, self.deadline = name, hold, float(deadline)

    def apply(self, root):
        rec = root[store.ROOT_KEY].queues[self.name]
        table = _table(rec)
        entry = table.get(self.hold) if table is not None else None
        if entry is None:
            return
        _, reads, ids = entry
        table[self.hold] = (self.deadline, reads + 1, ids)


class DropHold(_Op):
    """Forget holds (all their ids), or some ids of one hold (seqs)."""

    def __init__(self, name, holds, seqs=None):
        self.name, self.holds, self.seqs = name, list(holds), seqs

    def apply(self, root):
        table = _table(root[store.ROOT_KEY].queues[self.name])
        if table is None:
            return
        for hold in self.holds:
            entry = table.get(hold)
            if entry is None:
                continue
            if self.seqs is None:
                del table[hold]
                continue
            gone = set(self.seqs)
            left = [seq for seq in unpack_ids(entry[2]) if seq not in gone]
            if left:
                table[hold] = (entry[0], entry[1], pack_ids(left))
            else:
                del table[hold]


class AckHeld(_Op):
    """Held messages acknowledged: out of the in-flight index and the queue, their holds
    forgotten (one pass, as Ack.apply_run does for a run of acks)."""

    def __init__(self, name, entries, holds):
        self.name, self.entries, self.holds = name, entries, list(holds)

    def apply(self, root):
        rec = root[store.ROOT_KEY].queues[self.name]
        removed = rec.ready.discard_many([skey for _, skey, _ in self.entries])
        gone = []
        counts = {"inflight": 0, "ready": 0, "delayed": 0, "redelivered": 0}
        for seq, skey, again in self.entries:     # again: received more than once
            if skey in removed:
                counts["ready"] -= 1
            elif seq in rec.messages:
                where = rec.unindex(seq, skey)
                if where is not None:
                    counts[where] -= 1
            else:
                continue                        # acknowledged already
            gone.append(seq)
            counts["redelivered"] += again
        rec.delete_messages(sorted(gone))
        rec.counts.add(acked=len(gone), **{k: v for k, v in counts.items() if v})
        DropHold(self.name, self.holds).apply(root)


class CountReceives(_Op):
    """Write held messages' receive counts into the store (before they move away)."""

    def __init__(self, name, entries):
        self.name, self.entries = name, entries      # [(seq, receive_count, first, last)]

    def apply(self, root):
        rec = root[store.ROOT_KEY].queues[self.name]
        for seq, count, first, last in self.entries:
            msg = rec.messages.get(seq)
            if msg is not None and count > msg.receive_count:
                rec.messages[seq] = msg._replace(
                    receive_count=count, last_received=last,
                    first_received=msg.first_received or first)


def _also(ops):
    """A caller's own writes in the unit (see also= in the module docstring)."""
    return [store.OwnWrite(op) for op in ops or ()]


# -- opening: recovery and adoption (ackqueue.arbiters.local.LocalArbiter.load) --------------------

def recover(rec, now):
    """At open, in the queue's opening transaction: drop the holds whose deadline passed,
    writing their messages' receive counts (the hold's reads), so that those messages,
    ready in the store all along, are delivered again counted."""
    table = _table(rec)
    if not table:
        return
    for hold, (deadline, reads, ids) in list(table.items()):
        if deadline > now:
            continue
        for seq in unpack_ids(ids):
            msg = rec.messages.get(seq)
            if msg is not None and rec.key_of(seq) in rec.ready:
                rec.messages[seq] = msg._replace(receive_count=msg.receive_count + reads)
        del table[hold]


def adopt(state, rec, memory_key, unready):
    """At open, once the ready set is in memory: hold again the messages of rec's live
    holds (recover() dropped the others), each a delivery to its hold's holder with the
    hold's deadline and receive count, taken out of the ready set in memory (unready(key);
    the store's ready set lists them, as it lists every delivery of this process).  A
    message no longer ready in the store (acknowledged, moved) is left out.  memory_key(rec,
    seq): the arbiter's key of a message.  Returns how many."""
    table = _table(rec)
    if not table:
        return 0
    registry = of(state)
    count = 0
    with state.mutex:
        for hold, (deadline, reads, ids) in table.items():
            holder = registry.holder(hold)
            holder.reads = reads
            for seq in unpack_ids(ids):
                msg = rec.messages.get(seq)
                if msg is None or seq in state.inflight:
                    continue
                skey = rec.key_of(seq)
                if skey not in rec.ready:
                    continue
                key = memory_key(rec, seq)
                unready(key)
                meta = Meta.from_msg(msg, rec.body_of(seq, msg))
                meta.receive_count += reads
                state.hold(seq, key, skey, meta, holder, deadline)
                count += 1
    return count


# -- the front: Holds(q) ------------------------------------------------------------------

def _held(h):
    meta = h.meta
    return Held(h.seq, meta.body, meta.priority, dict(meta.attributes) if meta.attributes
                else None, meta.sent_at, h.receive_count)


class Holds:
    """The named durable holds of one queue (see the module docstring).  Blocking calls:
    each returns once its commit is durable.  Calls on one name must not overlap (the
    caller serializes them); calls on different names may."""

    def __init__(self, q):
        if not q.database.exclusive:
            raise NotSupported("durable holds need a storage this process holds alone "
                               "(a file or an in-memory database), not ZEO or the queue "
                               "service")
        self.q = q
        self.state = q.state
        self.name = q.name
        self.registry = of(self.state)
        self._reader = q.connect(thread_bound=False)      # reads bodies not in memory

    def _holdings(self, names):
        state = self.state
        out = []
        for name in names:
            holder = self.registry.holders.get(name)
            if holder is not None:
                out.extend(state.holders.get(holder, {}).values())
        return out

    def _commit(self, ops, holdings=(), on_commit=None):
        """Submit ops as one unit and wait; holdings stay settling meanwhile (no deadline
        gives them back while their fate is being written)."""
        state = self.state
        with state.mutex:
            for h in holdings:
                h.settling = True
        try:
            state.committer.submit(ops, on_commit=on_commit, lead=True).wait()
        finally:
            with state.mutex:
                for h in holdings:
                    h.settling = False

    # -- reads ----------------------------------------------------------------------------

    def take(self, name, n, visibility_timeout, policy=None, also=None):
        """Receive up to n ready messages now (not waiting) and hold them under name for
        visibility_timeout seconds, in one commit with also(messages) (a function giving
        the caller's writes, or None); the messages (Held).  policy: a
        state.DeadLetterPolicy, the receive rules of a get (q._dead_letter_policy)."""
        state = self.state
        holder = self.registry.holder(name)
        with state.mutex:
            if state.holders.get(holder):
                raise ValueError(f"hold {name!r} of queue {self.name!r} holds messages "
                                 "already")
        ask = Ask(holder, visibility_timeout, self._reader.load_meta, record=False,
                  policy=policy)
        moves = []
        try:
            got = state.try_claim(self.q, ask, n, moves) if n > 0 else []
        finally:
            for ticket in moves:        # dead-letter moves of this receive, durable first
                try:
                    ticket.wait()
                except Exception:
                    log.warning("ackqueue: a dead-letter move failed", exc_info=True)
        held = [_held(h) for h in got]
        ops = []
        if got:
            deadline = min(h.deadline for h in got)
            ops.append(TakeHold(self.name, name, [(h.seq, h.skey) for h in got], deadline))
        ops += _also(also(held) if also is not None else ())
        if not ops:
            return held
        try:
            self._commit(ops, got)
        except BaseException:
            with state.mutex:
                for h in got:
                    if state.inflight.get(h.seq) is h:
                        state.give_back_held(h, "its hold could not be written")
            raise
        holder.reads = 1
        return held

    def held(self, name):
        """The messages held under name now (Held), in the order received."""
        with self.state.mutex:
            return [_held(h) for h in self._holdings([name])]

    def receive_again(self, name, visibility_timeout, also=None):
        """The messages held under name, counted as received once more, their deadline
        moved to visibility_timeout seconds from now; one commit with also (a list of the
        caller's writes)."""
        state = self.state
        with state.mutex:
            holdings = self._holdings([name])
        now = state.clock()
        deadline = now + visibility_timeout
        ops = ([RenewHold(self.name, name, deadline)] if holdings else []) + _also(also)
        if ops:
            self._commit(ops, holdings)
        holder = self.registry.holders.get(name)
        if holder is not None and holdings:
            holder.reads += 1
        with state.mutex:
            out = []
            for h in holdings:
                if state.inflight.get(h.seq) is not h:
                    continue            # purged meanwhile
                h.receive_count += 1
                h.meta.receive_count = h.receive_count
                h.meta.last_received = now
                state.set_deadline(h, deadline)
                out.append(_held(h))
        return out

    # -- endings --------------------------------------------------------------------------

    def ack(self, names, also=None):
        """Acknowledge every message held under names (they leave the queue for good) and
        forget the holds, in one commit with also; how many messages."""
        state = self.state
        names = list(names)
        with state.mutex:
            holdings = [h for h in self._holdings(names) if not h.settling]
        ops = []
        if names:
            ops.append(AckHeld(self.name, [(h.seq, h.skey, h.receive_count > 1)
                                           for h in holdings], names))
        ops += _also(also)
        if not ops:
            return 0
        self._commit(ops, holdings, on_commit=lambda: state.settled(holdings))
        return len(holdings)

    def release(self, names, seqs=None, also=None, why="its hold was released", count=True):
        """Give back the messages held under names (only those of seqs, if given) at
        their original place, their receive counts counted, and forget them from their
        holds, in one commit with also; how many messages.  count=False: their receive
        counts go back to what they were before the hold (its reads are not theirs to
        bear: a failing batch halved, ackqueue.service.streams)."""
        state = self.state
        names = list(names)
        wanted = None if seqs is None else set(seqs)
        ops = []
        with state.mutex:
            now = state.clock()
            for h in self._holdings(names):
                if h.settling or (wanted is not None and h.seq not in wanted):
                    continue
                if not count:
                    h.receive_count -= h.holder.reads
                    h.meta.receive_count = h.receive_count
                del state.inflight[h.seq]
                state.forget_holding(h)
                h.released = why
                ops.append(state.arbiter.give_back_op(h, None, now))
        count = len(ops)
        if names:
            ops.append(DropHold(self.name, names, seqs))
        ops += _also(also)
        state.committer.submit(ops, lead=True).wait()
        return count

    def dead_letter(self, name, seqs, target, also=None):
        """Move the messages of seqs held under name to the queue target (an AckQueue of
        the same storage; None: drop them), their history and receive counts with them,
        in one commit with also; how many."""
        state = self.state
        wanted = set(seqs)
        tstate = None if target is None else target.state
        ops, arrivals, moved = [], [], []
        with state.mutex:
            now = state.clock()
            for h in self._holdings([name]):
                if h.settling or h.seq not in wanted:
                    continue
                del state.inflight[h.seq]
                state.forget_holding(h)
                h.released = "it was moved to the dead-letter queue"
                state.left()
                meta = h.meta
                ops.append(CountReceives(self.name, [(h.seq, h.receive_count,
                                                      meta.first_received,
                                                      meta.last_received)]))
                if tstate is None:
                    ops.append(store.DeadLetter(self.name, h.seq, None, None, now))
                else:
                    tseq = tstate.arbiter.reserve_seqs(1)[0]
                    moved_meta = Meta.from_msg(store.dead_lettered(
                        meta.to_msg(), h.seq, self.name, now), meta.body)
                    arrivals.append((tseq, tstate.arbiter.moved_key(meta, tseq),
                                     moved_meta, None))
                    ops.append(store.DeadLetter(self.name, h.seq, target.name, tseq, now))
                moved.append(h.seq)
        ops.append(DropHold(self.name, [name], moved))
        ops += _also(also)

        def committed():
            if arrivals:
                tstate.arrivals_committed(arrivals)
        state.committer.submit(ops, on_commit=committed, lead=True).wait()
        return len(moved)

    def close(self):
        self._reader.close()

