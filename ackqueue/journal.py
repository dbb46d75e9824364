"""The recent changes of a key set, kept as runs of consecutive keys (store format 5).

Why: a queue's ready set (ackqueue.segments.KeySet) is segmented so that opening a queue
loads few objects, but then every put and every ack rewrote the segment holding its key
(up to 2 KB) as a third record beside the message's segment and the queue's Counters.
Since format 5 the ready set keeps its recent changes in a KeyJournal stored *inside the
queue's Counters*, which every such commit writes anyway: a put or an ack writes two
records instead of three.  The journal is folded into the segments (by the commit that
makes it pass JOURNAL_KEYS keys or JOURNAL_RUNS runs), so it stays small.

A FIFO or LIFO queue adds and removes neighbouring keys, so the keys added since the
last fold are one run, and so are the keys removed: the journal is stored as a handful
of (start, end) pairs, not as one integer per key.

A journal is two KeyRuns: ``added`` (keys in the set but not in its segments) and
``removed`` (keys in its segments but not in the set).  The set is then
(segments - removed) | added; the two never share a key.
"""
from bisect import bisect_right
from itertools import chain

from ZODB.POSException import ConflictError

__all__ = ["KeyRuns", "KeyJournal", "JOURNAL_KEYS", "JOURNAL_RUNS", "JOURNAL_BATCH",
           "merge_states",
           "ADDED", "REMOVED"]

JOURNAL_KEYS = 256      # keys in a journal above which it is folded (one full segment)
JOURNAL_RUNS = 16       # runs in a journal above which it is folded (mixed priorities)
JOURNAL_BATCH = 16      # keys changed at once above which they go to the segments directly
ADDED, REMOVED = "ready+", "ready-"     # the names a journal is stored under (Counters)


class KeyRuns:
    """A set of integers kept as sorted, disjoint, non-touching runs [start, end)."""

    __slots__ = ("starts", "ends", "count")

    def __init__(self, flat=()):
        self.starts = list(flat[0::2])
        self.ends = list(flat[1::2])
        self.count = sum(e - s for s, e in zip(self.starts, self.ends))

    @classmethod
    def of(cls, keys):
        """The runs of an iterable of integers."""
        runs = cls()
        for key in sorted(keys):
            runs.add(key)
        return runs

    def flat(self):
        """(start0, end0, start1, end1, ...): how the runs are stored."""
        starts, ends = self.starts, self.ends
        if len(starts) == 1:                  # a FIFO or LIFO queue's journal
            return (starts[0], ends[0])
        return tuple(chain.from_iterable(zip(starts, ends)))

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    def runs(self):
        return len(self.starts)

    def __contains__(self, key):
        i = bisect_right(self.starts, key) - 1
        return i >= 0 and key < self.ends[i]

    def __iter__(self):
        for start, end in zip(self.starts, self.ends):
            yield from range(start, end)

    def add(self, key):
        """Add key; True if it was not there."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, key) - 1
        if i >= 0 and key < ends[i]:
            return False
        self.count += 1
        if i >= 0 and ends[i] == key:                   # extends run i
            ends[i] = key + 1
            if i + 1 < len(starts) and starts[i + 1] == key + 1:   # and touches run i + 1
                ends[i] = ends[i + 1]
                del starts[i + 1], ends[i + 1]
        elif i + 1 < len(starts) and starts[i + 1] == key + 1:     # starts run i + 1 earlier
            starts[i + 1] = key
        else:
            starts.insert(i + 1, key)
            ends.insert(i + 1, key + 1)
        return True

    def discard(self, key):
        """Remove key; True if it was there."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, key) - 1
        if i < 0 or key >= ends[i]:
            return False
        self.count -= 1
        start, end = starts[i], ends[i]
        if end - start == 1:
            del starts[i], ends[i]
        elif key == start:
            starts[i] = key + 1
        elif key == end - 1:
            ends[i] = key
        else:                                           # splits run i in two
            ends[i] = key
            starts.insert(i + 1, key + 1)
            ends.insert(i + 1, end)
        return True


class KeyJournal:
    """The keys added to and removed from a key set since its last fold (see the module
    docstring)."""

    __slots__ = ("added", "removed")

    def __init__(self, added=(), removed=()):
        self.added = KeyRuns(added)
        self.removed = KeyRuns(removed)

    def __bool__(self):
        return bool(self.added.count or self.removed.count)

    def full(self):
        """Whether it is due to be folded into the set's segments."""
        return (self.added.count + self.removed.count > JOURNAL_KEYS
                or len(self.added.starts) + len(self.removed.starts) > JOURNAL_RUNS)

    def stored(self):
        """{name: runs} to store it under (nothing when it is empty)."""
        out = {}
        if self.added.count:
            out[ADDED] = self.added.flat()
        if self.removed.count:
            out[REMOVED] = self.removed.flat()
        return out

    @classmethod
    def take_from(cls, values):
        """The journal stored in a dict of values (stored()), popped from it."""
        return cls(values.pop(ADDED, ()), values.pop(REMOVED, ()))


def merge_states(old, committed, new):
    """The journal that merges two concurrent changes of old (all three as dicts from
    stored(), popped from the values they came in), as a dict to store; ConflictError
    when both changed one key (two claims of one message, or a fold beside a change of a
    key it folded: the commit is then retried on the folded set)."""
    merged = {}
    for name in (ADDED, REMOVED):
        before = set(KeyRuns(old.get(name, ())))
        theirs = before ^ set(KeyRuns(committed.get(name, ())))
        ours = before ^ set(KeyRuns(new.get(name, ())))
        if theirs & ours:
            raise ConflictError("both transactions changed the same ready-set entry")
        keys = before ^ theirs ^ ours
        if keys:
            merged[name] = KeyRuns.of(keys).flat()
    return merged
