"""The expiry index of a queue: which of its messages are past their retention, kept in
the store.

Why: qsize(), counts() and empty() must leave out messages whose retention has passed,
exactly, at the moment they are called, without reading every message (a sweep) and
without keeping anything per message in memory.

Ordered messages need no entry.  Messages put with the queue's usual retention expire
in put order: expires_at = sent_at + retention does not decrease with seq (as long as
the retention and the clock do not go back).  The queue's Counters (written with every
put already) keep one marker, (expires_at, seq) of the last *ordered* message.  A
message is stored ordered when both its deadline and its seq are at least the marker's
(then the marker moves to it); otherwise (a shorter retention, a clock stepped back, a
message moved in with an older seq, no deadline) it gets an entry in the index below.
So the ordered messages, in seq order, have non-decreasing deadlines, and the expired
ones among them are a prefix of them in seq order: due() walks the message BTree from
its smallest seq, skipping what has an index entry, and stops at the first ordered
message whose deadline is still ahead.  Acks and deletes of ordered messages touch no
index (there is no entry to remove): a put and an ack write nothing more than without
expiry.  The walk costs O(messages before the first unexpired ordered one): the expired
ones (which the sweep then takes out) and indexed ones among them.

Exactness: (1) every ordered message before the walk's stop is examined one by one;
(2) every ordered message after it has seq above the stop's and so, by the invariant,
a deadline at least the stop's, which is after now; (3) every other message has an
index entry, read below; a message is counted once, by the walk only if it has no
entry.  The invariant holds under concurrency because the marker cannot be merged:
two commits that both moved it conflict (Counters), one is retried and re-decides
against the other's marker (through a server, two puts conflict on the sequence
counter anyway).  Files whose index holds an entry for every message (this branch's
first format 4) stay exact: those messages are read through the index only.

The index: an LOBTree from slot (expires_at rounded up to the second) to a KeySet of
the sequence numbers that expire in that second, written in the same commit as the
change it follows.  A put or an ack of neighbouring indexed messages writes one
KeySegment of their slot, whose conflict resolution merges concurrent changes to
different messages; the slot tree changes once per second of puts (a new slot) and
when a slot empties.  Everything in slots below the current second is due; the
entries of the current second are compared with their message's expires_at.

Persistent classes here are named in every file by their module path: they never move.
"""
import itertools
import math

from BTrees.LOBTree import LOBTree
from persistent import Persistent

from .order import store_key
from .segments import KeySet, MessageIndex, Msg

_EXPIRES_AT = Msg._fields.index("expires_at")

__all__ = ["ExpiryIndex", "slot_of", "due", "Due", "build", "NO_ORDER", "split_ordered"]


NO_ORDER = (float("-inf"), 0)    # the marker before any ordered message: (expires_at, seq)


def split_ordered(pairs, marker):
    """(the (seq, expires_at) pairs that need an index entry, the new marker): a pair
    whose deadline and seq are both at least the marker's is ordered (no entry) and
    becomes the marker; a pair without a deadline never expires (no entry either)."""
    last_at, last_seq = marker
    indexed = []
    for seq, expires_at in pairs:
        if expires_at is None:
            continue
        if expires_at >= last_at and seq > last_seq:
            last_at, last_seq = expires_at, seq
        else:
            indexed.append((seq, expires_at))
    return indexed, (last_at, last_seq)


def slot_of(expires_at):
    """The slot of a deadline: the whole second at or after it."""
    return math.ceil(expires_at)


class ExpiryIndex(Persistent):
    """slot -> KeySet of seqs expiring in that second (see the module docstring)."""

    def __init__(self):
        self.slots = LOBTree()

    def add_many(self, pairs):
        """Index each (seq, expires_at); a None deadline is not indexed (never expires)."""
        slots = self.slots
        for slot, seqs in _by_slot(pairs).items():
            keys = slots.get(slot)
            if keys is None:
                keys = slots[slot] = KeySet()
                self._drop_if_empty(slots.maxKey(slot - 1) if slot > slots.minKey() else None)
            elif keys._p_jar is not None:
                # A concurrent commit that empties this slot unlinks it (and writes it):
                # this commit must then conflict and retry, or its entries would be added
                # to a set nothing refers to any more.
                keys._p_jar.readCurrent(keys)
            keys.add_many(seqs)

    def discard_many(self, pairs):
        """Forget each (seq, expires_at) that is indexed.  As in the ready set, the last
        segment of a slot and the last slot stay when emptied (the next puts land there:
        with a near-empty queue, a put and an ack each write one segment, nothing else);
        other emptied segments and slots are unlinked at once, and the last slot when
        the next one is made, so the index holds no more than the messages stored."""
        slots = self.slots
        for slot, seqs in _by_slot(pairs).items():
            keys = slots.get(slot)
            if keys is None:
                continue
            keys.discard_many(seqs)
            segments = keys.segments
            last = segments.maxKey() if segments else None
            for number in {seq >> keys.bits for seq in seqs}:
                segment = segments.get(number)
                if number != last and segment is not None and not segment.data:
                    keys._unlink(number, segment)
            if slot != slots.maxKey():
                self._drop_if_empty(slot)

    def _drop_if_empty(self, slot):
        if slot is None:
            return
        keys = self.slots[slot]
        if not keys:
            self._unlink(slot, keys)

    def _unlink(self, slot, keys):
        keys._p_changed = True          # written: a concurrent add conflicts (add_many)
        del self.slots[slot]

    def compact(self, limit=100):
        """Drop empty slots among the first limit (two commits that each removed the
        other's last entry leave one behind); returns how many were dropped."""
        empty = [(slot, keys) for slot, keys in itertools.islice(self.slots.items(), limit)
                 if not keys]
        for slot, keys in empty:
            self._unlink(slot, keys)
        return len(empty)

    def entries(self, until):
        """(slot, seq) of every entry whose slot is at most until, in slot order."""
        for slot, keys in self.slots.items(max=until):
            for seq in keys.key_list():
                yield slot, seq

    def has(self, seq, expires_at):
        """Whether message seq (with this deadline) has an entry."""
        keys = self.slots.get(slot_of(expires_at))
        return keys is not None and seq in keys

    def first_slot_after(self, slot):
        """The first slot above slot, or None."""
        try:
            return self.slots.minKey(slot + 1)
        except ValueError:
            return None

    def __len__(self):
        """Every entry (for tests and checks, not for hot paths)."""
        return sum(len(keys) for keys in self.slots.values())


def _by_slot(pairs):
    """{slot: [seq]} of (seq, expires_at) pairs.  Messages of one put_many (or of an ack of
    neighbours) mostly share their deadline, so a slot is computed once per run of equal
    deadlines: this runs in every commit."""
    groups = {}
    last, seqs = _UNSET, None
    for seq, expires_at in pairs:
        if expires_at != last:
            last = expires_at
            seqs = None if expires_at is None else groups.setdefault(
                math.ceil(expires_at), [])
        if seqs is not None:
            seqs.append(seq)
    return groups


_UNSET = object()


class Due:
    """What the index says is past its retention at a time, as the store sees it.

    ready, delayed: seqs of expired messages waiting in the ready set or the delayed
    index (these are what the counts leave out); held: how many expired messages are
    in flight (they stay counted in flight, and expire when given back); next_at: no
    message that is not listed here expires before this time (a lower bound; None: no
    other message has a deadline)."""

    __slots__ = ("ready", "delayed", "held", "next_at", "keys")

    def __init__(self):
        self.ready, self.delayed, self.held, self.next_at = [], [], 0, None
        self.keys = {}                # seq -> store key, of the ready and delayed ones

    @property
    def waiting(self):
        return self.ready + self.delayed


def due(rec, now):
    """The Due of queue record rec at time now: the ordered messages walked from the
    smallest seq, then the index's entries up to now (see the module docstring), in
    O(log n + what is walked + due).  None if rec has no index (a record made before
    the index existed and not migrated: the caller falls back to a sweep)."""
    index = getattr(rec, "expiry", None)
    if index is None:
        return None
    result, until = Due(), slot_of(now)
    # The stored tuples are read as they are (a Msg is made only for an expired one), so
    # that a damaged record at the head (too short to be a message) is passed over here.
    messages = rec.messages
    walk = messages.stored_items() if isinstance(messages, MessageIndex) else ()
    for seq, stored in walk:        # (() for ackqueue 0.1's BTree: no deadlines in it)
        expires_at = stored[_EXPIRES_AT] if len(stored) > _EXPIRES_AT else None
        if expires_at is None or index.has(seq, expires_at):
            continue                  # never expires, or read through the index below
        if expires_at > now:
            result.next_at = expires_at       # no later ordered message is due before
            break
        _classify(result, rec, seq, Msg(*stored))
    for slot, seq in index.entries(until):
        msg = rec.messages.get(seq)
        if msg is None:
            continue                  # deleted without the index (a damaged file's repair)
        if msg.expires_at is None or msg.expires_at > now:
            result.next_at = _earlier(result.next_at, msg.expires_at)
            continue
        _classify(result, rec, seq, msg)
    later = index.first_slot_after(until)
    if later is not None:
        result.next_at = _earlier(result.next_at, later - 1)
    return result


def _classify(result, rec, seq, msg):
    """Count expired message seq (its Msg msg) as held, ready or delayed in result."""
    key = store_key(rec.kind, msg.priority, seq)
    if msg.holder is not None or seq in rec.inflight:
        result.held += 1
    elif key in rec.ready:
        result.ready.append(seq)
        result.keys[seq] = key
    elif seq in rec.delayed:
        result.delayed.append(seq)
        result.keys[seq] = key


def _earlier(a, b):
    if b is None:
        return a
    return b if a is None or b < a else a


def build(rec):
    """(a new ExpiryIndex of rec's messages that are out of order, the marker) for a
    record written before the index: the format 3 to 4 migration, once, in the
    transaction that opens the file."""
    index = ExpiryIndex()
    indexed, marker = split_ordered(
        ((seq, getattr(msg, "expires_at", None)) for seq, msg in rec.messages.items()),
        NO_ORDER)
    index.add_many(indexed)
    return index, marker
