"""The recent changes of a key set, kept as runs of consecutive keys (store format 5).

Why: a queue's ready set (ackqueue.segments.KeySet) is segmented so that opening a queue
loads few objects, but then every put and every ack rewrote the segment holding its key
(up to 2 KB) as a third record beside the message's segment and the queue's Counters.
Since format 5 the ready set keeps its recent changes in a KeyJournal stored *inside the
queue's Counters*, which every such commit writes anyway: a put or an ack writes two
records instead of three (and since format 7, when the message index keeps its own recent
changes there too, segments.MessageIndex, one).  The journal is folded into the segments (by the commit that
makes it pass JOURNAL_KEYS keys or JOURNAL_RUNS runs), so it stays small.

A FIFO or LIFO queue adds and removes neighbouring keys, so the keys added since the
last fold are one run, and so are the keys removed: the journal is stored as a handful
of (start, end) pairs, not as one integer per key.

A journal is two KeyRuns: ``added`` (keys in the set but not in its segments) and
``removed`` (keys in its segments but not in the set).  The set is then
(segments - removed) | added; the two never share a key.

A batch whose keys are one run (a FIFO or LIFO put_many, the ack_many of a get_many) is
taken as one run too, whatever its size, so a batch writes no segment of the set either
(until the journal is folded).  The journal is bounded by its runs, which is what it
stores, and by JOURNAL_KEYS keys, which is what a fold writes at once: merging two
concurrent journals (merge_states) works on the runs' ends, not on their keys, so a
journal of thousands of keys merges as fast as one of ten.
"""
from bisect import bisect_left, bisect_right
from itertools import chain

from ZODB.POSException import ConflictError

__all__ = ["KeyRuns", "KeyJournal", "JOURNAL_KEYS", "JOURNAL_RUNS", "JOURNAL_BATCH",
           "merge_states", "merge_runs",
           "ADDED", "REMOVED"]

JOURNAL_KEYS = 4096     # keys in a journal above which it is folded (16 full segments)
JOURNAL_RUNS = 16       # runs in a journal above which it is folded (mixed priorities)
JOURNAL_BATCH = 16      # keys changed at once, not one run, above which they go to the
                        # segments directly
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
        if ends and ends[-1] == key:        # extends the last run (a FIFO queue's new key)
            ends[-1] = key + 1
            self.count += 1
            return True
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

    def overlaps(self, start, end):
        """Whether any key of [start, end) is in the set."""
        i = bisect_right(self.starts, end - 1) - 1
        return i >= 0 and self.ends[i] > start

    def add_range(self, start, end):
        """Add every key of [start, end) (none of which may be in the set yet: see
        overlaps), joining the runs it touches."""
        starts, ends = self.starts, self.ends
        i = bisect_left(ends, start)          # the first run that ends at start or after
        j = bisect_right(starts, end)         # the runs from i to j touch [start, end)
        self.count += end - start
        if i < j:
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]

    def remove_range(self, start, end):
        """Remove every key of [start, end) that is in the set; return the [(start, end)]
        runs that were removed."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, start) - 1
        if i < 0 or ends[i] <= start:
            i += 1
        j = bisect_left(starts, end)          # runs i to j - 1 hold keys of [start, end)
        if i >= j:
            return []
        gone = [(max(s, start), min(e, end)) for s, e in zip(starts[i:j], ends[i:j])]
        keep_starts, keep_ends = [], []
        if starts[i] < start:                 # the part of run i before start stays
            keep_starts.append(starts[i])
            keep_ends.append(start)
        if ends[j - 1] > end:                 # the part of run j - 1 after end stays
            keep_starts.append(end)
            keep_ends.append(ends[j - 1])
        starts[i:j] = keep_starts
        ends[i:j] = keep_ends
        self.count -= sum(e - s for s, e in gone)
        return gone

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
    key it folded: the commit is then retried on the folded set).

    It works on the runs' ends: a set of runs stored flat, (start0, end0, start1, ...), is
    the sorted list of the points where membership toggles, so the keys that differ
    between two sets are the runs of the points that only one of them has."""
    merged = {}
    for name in (ADDED, REMOVED):
        points = merge_runs(old.get(name, ()), committed.get(name, ()), new.get(name, ()),
                            "ready-set entry")
        if points:
            merged[name] = points
    return merged


def merge_runs(old, committed, new, what):
    """The runs (stored flat) that merge two concurrent changes of the runs old;
    ConflictError (naming what a key is) when both changed one key.  See merge_states."""
    before = set(old)
    theirs = before.symmetric_difference(committed)   # the toggle points of keys they changed
    ours = before.symmetric_difference(new)           # and of the keys we changed
    if _runs_meet(sorted(theirs), sorted(ours)):
        raise ConflictError(f"both transactions changed the same {what}")
    return tuple(sorted(before ^ theirs ^ ours))


def _runs_meet(a, b):
    """Whether two sets of runs, each a sorted list of toggle points, share a key."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] < b[j + 1] and b[j] < a[i + 1]:
            return True
        if a[i + 1] <= b[j + 1]:
            i += 2
        else:
            j += 2
    return False
