"""A persistent integer-keyed index whose concurrent changes merge: the queue's hot indexes.

Why not a BTree: a queue takes messages from the head, so every claim and every ack
removes the *first* key of the first bucket, and BTrees refuse to merge a concurrent change
to a bucket whose first key was deleted ("Delete of first key").  Consumers in different
processes would then conflict on every commit, and retry in step.

A SegmentedIndex splits its keys into segments of 2**bits consecutive keys (keys are
sequence numbers, or store keys that keep them in their low bits, so a segment is a run of
neighbouring messages).  A segment is a small persistent dict whose _p_resolveConflict
merges any two concurrent changes to *different* keys; two changes of the same key (two
processes claiming one message) remain a conflict, which is what makes a claim exclusive.  The segments live in an LOBTree keyed by segment number, which changes
only when a segment is created or emptied: once per 2**bits messages.

Conflict resolution runs where the commit lands: in the process for a FileStorage, on the
server under ZEO (which is why the server needs ackqueue importable).
"""
import heapq
import pickle
from bisect import bisect_left
import struct
import weakref
from collections import namedtuple
from itertools import repeat

from BTrees.LOBTree import LOBTree
from persistent import Persistent
from ZODB.POSException import ConflictError

from .journal import JOURNAL_BATCH, KeyJournal, KeyRuns

__all__ = ["SegmentedIndex", "Segment", "KeySet", "KeySegment", "MessageIndex", "Msg",
           "merge_entries", "write_alone"]

_MISSING = object()
_PROTOCOL = 4
RETIRED = b"retired"       # the state of a segment that was emptied and unlinked

# The ZODB connections that are the only writer of the indexes they change (a lone
# process's committer, see commit.Committer).  An index segment emptied by such a
# connection, and unlinked (SegmentedIndex.discard_sorted), is not written at all: the
# retired mark that _unlink writes is there for a concurrent transaction that still sees
# the segment linked and changes it, and there is none.  An ack_many of 100 neighbouring
# messages then writes the tree's bucket instead of six or seven retired segments.
_writing_alone = weakref.WeakSet()


def write_alone(connection):
    """Declare connection the only one that will ever write the indexes it changes: no
    other transaction, in this process or another, may change them while it lives."""
    _writing_alone.add(connection)


# A message index's journal (MessageIndex, store format 7) is folded into its segments
# once it holds more than INBOX_KEYS new messages (a segment's worth), or more than
# INBOX_BYTES of their bodies (every put rewrites the inbox with the queue's Counters),
# or more than GONE_KEYS deleted seqs or GONE_RUNS runs of them (a fold deletes them
# from their segments: GONE_KEYS is 16 segments).
INBOX_KEYS = 16
INBOX_BYTES = 8192
GONE_KEYS = 256
GONE_RUNS = 16


class Segment(Persistent):
    """Up to 2**bits entries key -> plain value (None for set members).

    Its state is one bytes object (the entries pickled with the standard pickle): ZODB's
    pickler then sees a single object instead of calling back into Python for every key
    and value, which is most of what a commit costs.  Values must therefore be plain data
    (no persistent objects).  Concurrent changes merge key by key (see _p_resolveConflict)."""

    retired = False

    def __init__(self):
        self.data = {}

    def retire(self):
        """Mark the segment as unlinked from its index (see SegmentedIndex._unlink)."""
        self.data = {}
        self.retired = True
        self._p_changed = True

    def __getstate__(self):
        if self.retired:
            # Its state says so, and a merge with a concurrent change must not revive it.
            return RETIRED
        return pickle.dumps(self.data, protocol=_PROTOCOL)

    def __setstate__(self, state):
        self.retired = state == RETIRED
        if self.retired:
            self.data = {}
        else:
            self.data = pickle.loads(state) if isinstance(state, bytes) else dict(state)

    def _p_resolveConflict(self, old, committed, new):
        if RETIRED in (committed, new):
            raise ConflictError("a queue index segment was retired by a concurrent commit")
        old, committed, new = ({} if s == RETIRED else
                               pickle.loads(s) if isinstance(s, bytes) else s
                               for s in (old, committed, new))
        return pickle.dumps(merge_entries(old, committed, new), protocol=_PROTOCOL)


def merge_entries(old, committed, new, what="queue entry"):
    """The dict that merges two concurrent changes (committed, new) of the dict old, key
    by key; ConflictError (naming what an entry is) when both changed one key: two claims
    of one message, two acks, or a fold that moved a message beside a change of it."""
    merged = {}
    for key in old.keys() | committed.keys() | new.keys():
        before = old.get(key, _MISSING)
        theirs = committed.get(key, _MISSING)
        ours = new.get(key, _MISSING)
        if theirs == before:
            value = ours
        elif ours == before:
            value = theirs
        else:
            raise ConflictError(f"both transactions changed the same {what}")
        if value is not _MISSING:
            merged[key] = value
    return merged


class KeySegment(Segment):
    """A Segment of a key set (every value None) whose state is its keys packed as signed
    64-bit integers.  Loading one is an array copy instead of unpickling a dict, and a
    merge is a few set operations, so a KeySet can use segments several times larger:
    opening a queue loads its whole ready set, and ZODB's cost per object loaded is what
    made that slow with a million messages waiting."""

    def __getstate__(self):
        if self.retired:
            return RETIRED
        return _pack_keys(self.data)

    def __setstate__(self, state):
        self.retired = state == RETIRED
        self.data = {} if self.retired else dict.fromkeys(_unpack_keys(state))

    def _p_resolveConflict(self, old, committed, new):
        if RETIRED in (committed, new):
            raise ConflictError("a queue index segment was retired by a concurrent commit")
        old = set() if old == RETIRED else set(_unpack_keys(old))
        theirs, ours = set(_unpack_keys(committed)), set(_unpack_keys(new))
        if (theirs - old) & (ours - old) or (old - theirs) & (old - ours):
            # Both added or both removed one key (two claims of one message, ...).
            raise ConflictError("both transactions changed the same queue entry")
        merged = (old & theirs & ours) | (theirs - old) | (ours - old)
        return _pack_keys(merged)


def _pack_keys(keys):
    """Keys as little-endian signed 64-bit integers (the same bytes on every machine that
    shares the storage)."""
    return struct.pack(f"<{len(keys)}q", *keys)


def _unpack_keys(state):
    return struct.unpack(f"<{len(state) // 8}q", state)


class SegmentedIndex(Persistent):
    """A sorted int -> value map (or int set, with add/remove) that merges concurrent
    changes to different keys.  The subset of the BTree API the queue uses."""

    segment_class = Segment
    # Whether a segment emptied by a discard, other than the last one, is unlinked at
    # once: for an index whose new keys are always above its old ones (sequence numbers).
    unlink_emptied = False

    def __init__(self, bits=6):
        self.bits = bits
        self.segments = LOBTree()

    def _segment(self, key, create=False):
        number = key >> self.bits
        segment = self.segments.get(number)
        if segment is None and create:
            segment = self.segments[number] = self.segment_class()
        return segment

    # -- mapping --------------------------------------------------------------------------

    # get and __contains__ find the segment themselves: they run several times with every
    # put, get and ack, and a call of _segment (a method looked up on a persistent object)
    # costs more than the lookup.
    def get(self, key, default=None):
        segment = self.segments.get(key >> self.bits)
        if segment is None:
            return default
        return segment.data.get(key, default)

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key):
        segment = self.segments.get(key >> self.bits)
        return segment is not None and key in segment.data

    def __setitem__(self, key, value):
        segment = self._segment(key, create=True)
        data = segment.data               # (loads a ghost before it is marked changed)
        segment._p_changed = True         # changed in place: a copy per write cost more
        data[key] = value

    def __delitem__(self, key):
        if not self.discard(key):
            raise KeyError(key)

    def set_many(self, pairs):
        """self[key] = value for each (key, value): what __setitem__ does, with one segment
        lookup per run of neighbouring keys instead of one per key (batches of puts)."""
        self._set_many(pairs)

    def _set_many(self, pairs):
        bits, segments = self.bits, self.segments
        number = data = None
        for key, value in pairs:
            if key >> bits != number:
                number = key >> bits
                segment = segments.get(number)
                if segment is None:
                    segment = segments[number] = self.segment_class()
                data = segment.data       # (loads a ghost before it is marked changed)
                segment._p_changed = True
            data[key] = value

    def discard_many(self, keys):
        """discard() each key, looking up one segment per run of neighbouring keys; return
        the set of keys that were there."""
        bits, segments = self.bits, self.segments
        removed = set()
        number = segment = data = None
        touched = []
        for key in keys:
            if key >> bits != number:
                number = key >> bits
                segment = segments.get(number)
                data = segment.data if segment is not None else None
                touched.append((number, segment))
            if data is not None and key in data:
                segment._p_changed = True
                del data[key]
                removed.add(key)
        if self.unlink_emptied and removed:
            last = segments.maxKey()
            for number, segment in touched:
                if (segment is not None and not segment.data and number != last
                        and not segment.retired):
                    self._unlink(number, segment)
        return removed

    def discard_sorted(self, keys):
        """discard_many() of ascending keys, without its report: a segment whose every key
        goes is emptied in one step (the ack_many of neighbouring messages), the others
        key by key."""
        segments = self.segments
        touched = []
        # Writing alone (see write_alone), a segment whose every key goes, below the last
        # one, leaves the tree unwritten: nothing can see it linked any more.  Unless this
        # transaction changed it already (then it is written anyway, and retired below).
        last = None
        if self.unlink_emptied and keys and self._p_jar in _writing_alone:
            try:
                last = segments.maxKey()
            except ValueError:            # no segments: nothing to empty
                pass
        for number, i, j in _segment_spans(keys, self.bits):
            segment = segments.get(number)
            if segment is not None:
                data = segment.data       # (loads a ghost before it is marked changed)
                if j - i >= len(data) and data.keys() <= set(keys[i:j]):
                    if last is not None and number < last and not segment._p_changed:
                        del segments[number]
                        # Its data is garbage from now on: a ghost frees it, and if this
                        # commit is retried the segment, linked again, loads as stored.
                        segment._p_deactivate()
                        continue
                    if data:
                        data.clear()
                        segment._p_changed = True
                else:
                    pop, hit = data.pop, False
                    for key in keys[i:j]:
                        if pop(key, _MISSING) is not _MISSING:
                            hit = True
                    if hit:
                        segment._p_changed = True
                touched.append((number, segment))
        if self.unlink_emptied and touched:
            last = segments.maxKey()
            for number, segment in touched:
                if not segment.data and number != last and not segment.retired:
                    self._unlink(number, segment)

    def add_many(self, keys):
        """add() each key, looking up one segment per run of neighbouring keys."""
        self._set_many(zip(keys, repeat(None)))

    def _unlink(self, number, segment):
        # The segment is written too, as retired: a concurrent transaction that adds to it
        # (it still sees it linked) then conflicts with this one instead of adding a key
        # to a segment nothing refers to any more.  (Where no such transaction can exist,
        # discard_sorted leaves the segment unwritten: see write_alone.)
        segment.retire()
        del self.segments[number]

    # -- set ------------------------------------------------------------------------------

    def add(self, key):
        """Add key as a set member; True if it was not there."""
        segment = self._segment(key, create=True)
        data = segment.data
        if key in data:
            return False
        segment._p_changed = True
        data[key] = None
        return True

    def remove(self, key):
        del self[key]

    def discard(self, key):
        """Remove key if present; True if it was there."""
        segment = self._segment(key)
        if segment is None:
            return False
        data = segment.data
        if key not in data:
            return False
        segment._p_changed = True
        # An emptied segment stays linked (the next keys of its run land in it, writing
        # one object instead of a new segment and the tree); compact() drops it later.
        # Unless no key can land in it any more (unlink_emptied): it is unlinked now,
        # in the commit that writes it anyway, instead of being written again later.
        del data[key]
        if not data and self.unlink_emptied:
            number = key >> self.bits
            if number != self.segments.maxKey():
                self._unlink(number, segment)
        return True

    # -- ordered iteration ----------------------------------------------------------------

    def keys(self, min=None):
        start = None if min is None else min >> self.bits
        for segment in self.segments.values(start):
            for key in sorted(segment.data):
                if min is None or key >= min:
                    yield key

    __iter__ = keys

    def key_list(self):
        """Every key, in order, as a list: what a queue loads at open, one segment at a time
        instead of one key at a time (a million keys open measurably faster)."""
        out = []
        for segment in self.segments.values():
            out.extend(sorted(segment.data))
        return out

    def items(self):
        for segment in self.segments.values():
            data = segment.data
            for key in sorted(data):
                yield key, data[key]

    def values(self):
        for _, value in self.items():
            yield value

    def __len__(self):
        """Counts every segment (not for hot paths: the queue keeps Counters for sizes)."""
        return sum(len(segment.data) for segment in self.segments.values())

    def __bool__(self):
        return any(segment.data for segment in self.segments.values())

    def compact(self, limit=100):
        """Drop empty segments among the first limit, except the last segment (where the
        next keys of a FIFO queue go); returns how many were dropped."""
        empty = []
        last = self.segments.maxKey() if self.segments else None
        for n, (number, segment) in enumerate(self.segments.items()):
            if n >= limit:
                break
            if not segment.data and number != last:
                empty.append(number)
        for number in empty:
            self._unlink(number, self.segments[number])
        return len(empty)

    def has_empty_head(self):
        """Whether the first segment is empty and not the only one (compact() would act)."""
        for number, segment in self.segments.items():
            return not segment.data and number != self.segments.maxKey()
        return False


class KeySet(SegmentedIndex):
    """A SegmentedIndex used only as a set of integers below 2**63 (add, discard, in),
    stored in KeySegments of 256 keys: the queue's ready set.  Its segments are 4 times
    as large as a plain index's, so that opening a queue loads 4 times fewer objects (a
    million ready messages: about 3,900 instead of 15,600; that open measured 0.5-0.7 s
    instead of 1.2-1.9 s).

    A queue's ready set keeps its recent changes in a journal (ackqueue.journal, store
    format 5) held by journal_holder, the queue's Counters, which every commit that
    changes the set writes anyway: a put or an ack then writes no segment of the set,
    only the journal's few runs of keys, and the commit that makes the journal pass its
    bound folds it into the segments (JOURNAL_KEYS keys: at most a segment or two per 256
    changes).  Every method here reads and changes the set with its journal: the
    segments alone are not the set.  A KeySet without a holder (the expiry index's, a
    ready set not yet migrated) keeps every change in its segments at once."""

    segment_class = KeySegment

    journal_holder = None   # an object whose .journal (a KeyJournal) holds recent changes

    def __init__(self, bits=8, journal_holder=None):
        super().__init__(bits)
        if journal_holder is not None:
            self.journal_holder = journal_holder

    def keep_journal_in(self, holder):
        """From now on keep recent changes in holder.journal (the format 5 migration)."""
        self.journal_holder = holder

    # -- changes --------------------------------------------------------------------------

    def add(self, key):
        """Add key; True if it was not there."""
        holder = self.journal_holder
        if holder is None:
            return SegmentedIndex.add(self, key)
        journal = holder.journal
        if not journal.removed.discard(key):
            # Not removed: in the set if in its segments, else if in added (never both),
            # which add() tells while it adds.
            if SegmentedIndex.__contains__(self, key) or not journal.added.add(key):
                return False
        self._journal_changed(holder, journal)
        return True

    def discard(self, key):
        """Remove key if present; True if it was there."""
        holder = self.journal_holder
        if holder is None:
            return SegmentedIndex.discard(self, key)
        journal = holder.journal
        if not journal.added.discard(key):
            if key in journal.removed or not SegmentedIndex.__contains__(self, key):
                return False
            journal.removed.add(key)
        self._journal_changed(holder, journal)
        return True

    def add_many(self, keys):
        holder = self.journal_holder
        if holder is not None and len(keys) > 1:
            run = _one_run(keys)
            if run is not None and self._add_run(holder, *run):
                return
        if not self._journal_takes(keys):
            self._set_many(zip(keys, repeat(None)))
            return
        for key in keys:
            self.add(key)

    def discard_many(self, keys):
        """discard() each key; return the set of keys that were there."""
        holder = self.journal_holder
        if holder is not None and len(keys) > 1:
            run = _one_run(keys)
            if run is not None:
                return self._discard_run(holder, *run)
        if not self._journal_takes(keys):
            return SegmentedIndex.discard_many(self, keys)
        discard = self.discard
        return {key for key in keys if discard(key)}

    def _journal_takes(self, keys):
        """Whether a batch of changes that is not one run goes through the journal: not
        without one, and not a batch of more than JOURNAL_BATCH keys, which writes a
        segment of the set anyway: the journal is folded and the batch written to the
        segments at once (one segment lookup per run of neighbours, instead of one journal
        change per key)."""
        if self.journal_holder is None:
            return False
        if len(keys) <= JOURNAL_BATCH:
            return True
        self.fold()
        return False

    def _add_run(self, holder, start, end):
        """Add the keys [start, end) to the journal as one run, when none of them is in
        the set or in the journal's removals (new messages' keys); False to leave the
        batch to the key-by-key rules."""
        journal = holder.journal
        if (journal.added.overlaps(start, end) or journal.removed.overlaps(start, end)
                or self._segments_hold(start, end)):
            return False
        journal.added.add_range(start, end)
        self._journal_changed(holder, journal)
        return True

    def _discard_run(self, holder, start, end):
        """discard_many of the keys [start, end): those in the journal's additions leave
        them, those in the segments join its removals, as runs; returns the keys that were
        in the set."""
        journal = holder.journal
        was = set()
        for low, high in journal.added.remove_range(start, end):
            was.update(range(low, high))
        if len(was) < end - start:
            found = self._segments_hold(start, end, collect=True)
            if found and journal.removed.overlaps(start, end):
                found = {key for key in found if key not in journal.removed}
            if found:
                low, high = min(found), max(found) + 1
                if high - low == len(found):
                    journal.removed.add_range(low, high)
                else:
                    for key in sorted(found):
                        journal.removed.add(key)
                was |= found
        if was:
            self._journal_changed(holder, journal)
        return was

    def _segments_hold(self, start, end, collect=False):
        """Whether the segments (without the journal) hold a key of [start, end); with
        collect, the set of those keys."""
        bits, segments = self.bits, self.segments
        found = set()
        for number in range(start >> bits, ((end - 1) >> bits) + 1):
            segment = segments.get(number)
            if segment is None:
                continue
            keys = range(max(start, number << bits), min(end, (number + 1) << bits))
            data = segment.data
            if not collect:
                if not data.keys().isdisjoint(keys):
                    return True
            elif data:
                found |= data.keys() & keys
        return found if collect else False

    def __setitem__(self, key, value):
        if value is not None:
            raise TypeError("a KeySet holds keys only (use add)")
        self.add(key)

    def set_many(self, pairs):
        pairs = list(pairs)
        if any(value is not None for _, value in pairs):
            raise TypeError("a KeySet holds keys only (use add_many)")
        self.add_many([key for key, _ in pairs])

    def _journal_changed(self, holder, journal):
        holder._p_changed = True
        if journal.full():
            self.fold()

    def fold(self):
        """Write the journal's changes into the segments and empty it."""
        holder = self.journal_holder
        if holder is None or not holder.journal:
            return
        journal = holder.journal
        self._set_many(zip(journal.added, repeat(None)))
        SegmentedIndex.discard_many(self, journal.removed)
        holder.journal = KeyJournal()

    # -- reading --------------------------------------------------------------------------

    def __contains__(self, key):
        holder = self.journal_holder
        if holder is None:
            return SegmentedIndex.__contains__(self, key)
        journal = holder.journal
        if key in journal.added:
            return True
        return key not in journal.removed and SegmentedIndex.__contains__(self, key)

    def get(self, key, default=None):
        return None if key in self else default

    def keys(self, min=None):
        journal = self._journal()
        if journal is None:
            yield from SegmentedIndex.keys(self, min)
            return
        removed = set(journal.removed)
        added = [key for key in journal.added if min is None or key >= min]
        base = SegmentedIndex.keys(self, min)
        if removed:
            base = (key for key in base if key not in removed)
        yield from heapq.merge(base, added) if added else base

    __iter__ = keys

    def key_list(self):
        out = SegmentedIndex.key_list(self)
        journal = self._journal()
        if journal is None:
            return out
        if journal.removed:
            removed = set(journal.removed)
            out = [key for key in out if key not in removed]
        if journal.added:
            out.extend(journal.added)
            out.sort()                # two sorted runs: timsort merges them in one pass
        return out

    def items(self):
        for key in self.keys():
            yield key, None

    def __len__(self):
        journal = self._journal()
        base = SegmentedIndex.__len__(self)
        return base if journal is None else base - len(journal.removed) + len(journal.added)

    def __bool__(self):
        journal = self._journal()
        if journal is None or not journal.removed:
            return bool(journal and journal.added) or SegmentedIndex.__bool__(self)
        return len(self) > 0

    def _journal(self):
        """The journal (None without a holder, or when it is empty)."""
        holder = self.journal_holder
        if holder is None:
            return None
        return holder.journal or None


def _segment_spans(keys, bits):
    """(segment number, i, j) for each stretch keys[i:j] of ascending keys that falls in
    one segment of 2**bits keys."""
    i, end = 0, len(keys)
    while i < end:
        number = keys[i] >> bits
        j = bisect_left(keys, (number + 1) << bits, i)
        yield number, i, j
        i = j


def _one_run(keys):
    """(start, end) when keys are the integers of [start, end), each once, in any order
    (a FIFO or LIFO batch's keys); else None."""
    low, high = min(keys), max(keys) + 1
    if high - low != len(keys) or len(set(keys)) != len(keys):
        return None
    return low, high


Msg = namedtuple("Msg", "body priority sent_at receive_count first_received last_received "
                        "holder expires_at attributes sequence source",
                 defaults=(None, None, None, None))
Msg.__doc__ = """One queued message as the store keeps it: the pickled item (bytes), its
priority and put time, its delivery history, the lease holding it (shared queues), when it
expires unprocessed, its attributes (a tuple of (key, value) pairs or None), and for a
message that came from another queue (a dead letter) its first sequence number and that
queue's name.  Messages written by earlier versions have only the first seven fields."""


_MSG_CORE = 7          # the fields every stored message has


class MessageIndex(SegmentedIndex):
    """seq -> Msg, kept inline in the segments (a message is a few hundred bytes of plain
    data, so no persistent object of its own): a put writes one segment, not a record
    plus a bucket of references to its neighbours.

    Its segments are smaller than the ready index's (16 messages, not 64) because every
    put, ack and give-back rewrites a whole segment: with 16, a one-message commit of a
    100-byte item wrote 2.1 KB instead of 5.4 KB (measured), which a fsync'd commit feels.  The index's bits are
    stored with it, so files made with 64 keep working.

    Since store format 7 a queue's message index keeps its recent changes in its
    journal_holder, the queue's Counters, which every put and ack writes anyway (as the
    ready set keeps its journal there): the messages put since the last fold
    (``holder.inbox``, seq -> stored tuple) and the seqs deleted since then that its
    segments still hold (``holder.gone``, KeyRuns).  A put or an ack of one message then
    writes one record, the Counters, instead of the Counters and a segment; the commit
    that makes the inbox pass INBOX_KEYS messages (or INBOX_BYTES of bodies), or gone pass
    GONE_KEYS seqs (or GONE_RUNS runs), folds them into the segments.  A batch of more
    than JOURNAL_BATCH messages goes to the segments directly, as before.  Every method
    here reads and changes the index with its journal: the segments alone are not the
    index.  Invariants: a seq is in at most one of the inbox and the segments, and every
    seq in gone is in the segments.  Concurrent commits merge in the Counters' conflict
    resolution (store.Counters): changes of different messages merge, two changes of one
    message conflict, and a write of new messages to the segments (a fold, a batch)
    conflicts with any concurrent new message in the inbox, which a merge of the inboxes
    alone could not tell from a second message with the same seq."""

    # New messages always get new, higher sequence numbers: a segment below the last one
    # that an ack or a delete empties is unlinked in that commit (see discard).  A put
    # committed after a higher one (several threads, one commit each) may still find its
    # segment gone: it makes it again.
    unlink_emptied = True

    journal_holder = None   # an object whose .inbox and .gone hold recent changes

    def __init__(self, bits=4, journal_holder=None):
        super().__init__(bits)
        if journal_holder is not None:
            self.journal_holder = journal_holder

    def keep_journal_in(self, holder):
        """From now on keep recent changes in holder.inbox and holder.gone (the format 7
        migration)."""
        self.journal_holder = holder

    # -- reading --------------------------------------------------------------------------

    def stored(self, key, default=None):
        """Message key as stored (a plain tuple, see _stored), or default."""
        holder = self.journal_holder
        if holder is not None:
            value = holder.inbox.get(key)
            if value is not None:
                return value
            gone = holder.gone
            if gone.count and key in gone:
                return default
        return SegmentedIndex.get(self, key, default)

    def get(self, key, default=None):
        value = self.stored(key, _MISSING)
        return default if value is _MISSING else Msg(*value)

    def __contains__(self, key):
        return self.stored(key, _MISSING) is not _MISSING

    def stored_items(self, min=None):
        """(seq, stored tuple) of every message with seq >= min, in seq order."""
        start = None if min is None else min >> self.bits
        base = ((key, value) for segment in self.segments.values(start)
                for key, value in sorted(segment.data.items())
                if min is None or key >= min)
        holder = self.journal_holder
        if holder is None:
            return base
        gone = holder.gone
        if gone.count:
            base = ((key, value) for key, value in base if key not in gone)
        inbox = holder.inbox
        if not inbox:
            return base
        recent = sorted(item for item in inbox.items() if min is None or item[0] >= min)
        return heapq.merge(base, recent, key=_first)

    def keys(self, min=None):
        for key, _ in self.stored_items(min):
            yield key

    __iter__ = keys

    def items(self):
        for key, value in self.stored_items():
            yield key, Msg(*value)

    def values(self):
        for _, value in self.items():
            yield value

    def __len__(self):
        """Counts every segment (not for hot paths: the queue keeps Counters for sizes)."""
        base = SegmentedIndex.__len__(self)
        holder = self.journal_holder
        return base if holder is None else base - holder.gone.count + len(holder.inbox)

    def __bool__(self):
        return any(True for _ in self.stored_items())

    def key_list(self):
        return list(self.keys())

    # -- changes --------------------------------------------------------------------------

    def __setitem__(self, key, value):
        self._put(key, _stored(value))

    def set_stored_one(self, key, value):
        """self[key] = value for a value already as stored (see _stored)."""
        self._put(key, value)

    def _put(self, key, value):
        holder = self.journal_holder
        if holder is None:
            SegmentedIndex.__setitem__(self, key, value)
            return
        inbox = holder.inbox
        old = inbox.get(key)
        if old is not None:
            size = _inbox_bytes(holder) - len(old[0] or b"") + len(value[0] or b"")
            inbox[key] = value
            holder._p_changed = True
            self._inbox_grew(holder, size)
            return
        if holder.gone.count and holder.gone.discard(key):
            # A deleted seq written again (not something a queue does; kept exact): the
            # segments' copy is its place again.
            holder._p_changed = True
            SegmentedIndex.__setitem__(self, key, value)
            return
        if SegmentedIndex.__contains__(self, key):
            SegmentedIndex.__setitem__(self, key, value)      # a change of an older one
            return
        size = _inbox_bytes(holder) + len(value[0] or b"")
        inbox[key] = value                                    # a new message
        holder._p_changed = True
        self._inbox_grew(holder, size)

    def _inbox_grew(self, holder, size):
        """The inbox now holds size bytes of bodies: fold it past its bounds."""
        holder._v_inbox_bytes = size
        if size > INBOX_BYTES:
            self.fold()
        elif len(holder.inbox) > INBOX_KEYS:
            self._fold_below_last(holder)

    def _fold_below_last(self, holder):
        """Fold the inbox's messages below its highest segment into their segments, and
        keep that segment's in the inbox (all of it, if the inbox holds no other).

        Why: new messages take ascending seqs, so the INBOX_KEYS + 1 messages of a full
        inbox span two segments, the last one barely begun.  Folding them all wrote both,
        and the next fold wrote the second again; keeping the last segment's messages
        until the following fold writes each segment once, whole.  gone is left to its
        own bound."""
        inbox, bits = holder.inbox, self.bits
        last = max(inbox) >> bits
        keep = {key: value for key, value in inbox.items() if key >> bits == last}
        if len(keep) == len(inbox):
            self.fold()
            return
        self._inbox_to_segments(holder, [item for item in inbox.items()
                                         if item[0] >> bits != last], keep)

    def _inbox_to_segments(self, holder, items, keep):
        """Write items, (seq, stored) pairs of the inbox, into their segments and leave
        keep, the rest of it, as the inbox."""
        holder.inbox = keep
        holder._v_inbox_bytes = sum(len(value[0] or b"") for value in keep.values())
        holder._p_changed = True
        if items:
            self._new_in_segments()
            self._set_many(sorted(items))

    def set_many(self, pairs):
        self.set_stored([(key, _stored(value)) for key, value in pairs])

    def set_stored(self, pairs):
        """set_many of (seq, message) whose message is already as stored (see _stored: a
        tuple without trailing None fields)."""
        pairs = list(pairs)
        if self.journal_holder is not None:
            if len(pairs) <= JOURNAL_BATCH:
                for key, value in pairs:
                    self._put(key, value)
                return
            pairs = self._to_segments(pairs)
            self._new_in_segments()
        self._set_many(pairs)

    def set_run(self, seqs, messages):
        """set_stored of ascending seqs and their messages (as stored), one segment at a
        time: a batch of puts fills each segment with one dict update."""
        if self.journal_holder is not None:
            if len(seqs) <= JOURNAL_BATCH or not self._clear_of_journal(seqs):
                self.set_stored(zip(seqs, messages))
                return
            self._new_in_segments()
        segments = self.segments
        for number, i, j in _segment_spans(seqs, self.bits):
            segment = segments.get(number)
            if segment is None:
                segment = segments[number] = self.segment_class()
            data = segment.data           # (loads a ghost before it is marked changed)
            segment._p_changed = True
            data.update(zip(seqs[i:j], messages[i:j]))

    def _new_in_segments(self):
        """Count a write of new messages to the segments in the holder (Counters.folds):
        a concurrent commit that puts a new message in the inbox then conflicts with this
        one, as it would have on a segment (see store._merge_folds)."""
        holder = self.journal_holder
        holder.folds += 1
        holder._p_changed = True

    def _clear_of_journal(self, seqs):
        """Whether none of ascending seqs is in the inbox or gone (new messages' seqs)."""
        holder = self.journal_holder
        if holder.inbox and not holder.inbox.keys().isdisjoint(seqs):
            return False
        return not (holder.gone.count and holder.gone.overlaps(seqs[0], seqs[-1] + 1))

    def _to_segments(self, pairs):
        """pairs about to be written to the segments directly, less the journal's claims
        on them: a seq in the inbox leaves it (its segment is its place now), and so does
        a seq in gone (written again: see _put)."""
        holder = self.journal_holder
        if not holder.inbox and not holder.gone.count:
            return pairs
        for key, _ in pairs:
            if not self._take_from_inbox(holder, key) and holder.gone.count:
                if holder.gone.discard(key):
                    holder._p_changed = True
        return pairs

    def _take_from_inbox(self, holder, key):
        """Take message key out of the inbox; False if it is not there."""
        value = holder.inbox.get(key)
        if value is None:
            return False
        holder._v_inbox_bytes = _inbox_bytes(holder) - len(value[0] or b"")
        del holder.inbox[key]
        holder._p_changed = True
        return True

    def discard(self, key):
        """Remove key if present; True if it was there."""
        holder = self.journal_holder
        if holder is None:
            return SegmentedIndex.discard(self, key)
        if key in holder.inbox and self._take_from_inbox(holder, key):
            return True               # (most seqs acknowledged are in no inbox: no call)
        if not SegmentedIndex.__contains__(self, key):
            return False
        gone = holder.gone
        if not gone.add(key):         # deleted already (every seq in gone is in a segment)
            return False
        self._gone_changed(holder, gone)
        return True

    def discard_many(self, keys):
        """discard() each key; return the set of keys that were there."""
        if self.journal_holder is None:
            return SegmentedIndex.discard_many(self, keys)
        keys = list(keys)
        if len(keys) <= JOURNAL_BATCH:
            discard = self.discard
            return {key for key in keys if discard(key)}
        removed, rest = self._leave_journal(keys)
        return removed | SegmentedIndex.discard_many(self, rest)

    def discard_sorted(self, keys):
        """discard_many() of ascending keys, without its report: a segment whose every key
        goes is emptied in one step (the ack_many of neighbouring messages), the others
        key by key."""
        holder = self.journal_holder
        if holder is None:
            SegmentedIndex.discard_sorted(self, keys)
            return
        if len(keys) <= JOURNAL_BATCH:
            for key in keys:
                self.discard(key)
            return
        _, rest = self._leave_journal(keys)
        SegmentedIndex.discard_sorted(self, rest)

    def _leave_journal(self, keys):
        """(the keys taken out of the inbox, the others that are not in gone, in order):
        the part of a large discard that the journal takes, and what is left for the
        segments."""
        holder = self.journal_holder
        inbox, gone = holder.inbox, holder.gone
        if not inbox and not gone.count:
            return set(), keys
        removed, rest = set(), []
        for key in keys:
            if key in inbox and self._take_from_inbox(holder, key):
                removed.add(key)
            elif not (gone.count and key in gone):
                rest.append(key)
        return removed, rest

    def _gone_changed(self, holder, gone):
        holder._p_changed = True
        if gone.count > GONE_KEYS or len(gone.starts) > GONE_RUNS:
            self.fold()

    def fold(self):
        """Write the inbox and gone into the segments and empty them."""
        holder = self.journal_holder
        if holder is None or not (holder.inbox or holder.gone.count):
            return
        inbox, gone = holder.inbox, holder.gone
        holder.gone = KeyRuns()
        self._inbox_to_segments(holder, inbox.items(), {})
        if gone.count:
            SegmentedIndex.discard_sorted(self, list(gone))


def _first(item):
    return item[0]


def _inbox_bytes(holder):
    """The bytes of the bodies in holder's inbox: counted once per load of the holder
    (kept in a volatile attribute, which a ghost or an abort drops), then kept by the
    changes here (read before the change)."""
    size = getattr(holder, "_v_inbox_bytes", None)
    if size is None:
        size = sum(len(value[0] or b"") for value in holder.inbox.values())
    return size


def _stored(msg):
    """A Msg as a MessageIndex stores it: a plain tuple without trailing default fields, so
    that messages that use none of the later fields stay as small as old-size ones."""
    if type(msg) is not tuple:
        msg = tuple(msg)
    size = len(msg)
    while size > _MSG_CORE and msg[size - 1] is None:
        size -= 1
    return msg if size == len(msg) else msg[:size]
