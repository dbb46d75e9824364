"""The ZODB layout of ackqueue, and the operations that change it.

Layout, under the database root::

    root["ackqueue"]            Catalog
      .queues[name]             QueueRecord (one per named queue)
        .messages[seq]          MessageRecord: the pickled item and its delivery history
        .ready                  LLTreeSet of store keys: what can be delivered, in delivery order
        .inflight[seq]          deadline (a time.time() float, or 0.0 for none) of what is out
        .delayed[seq]           time at which a given-back or delayed message becomes ready
        .next_seq               SeqCounter: the next sequence number (never reused)
        .counts                 Counters: ready/inflight/delayed sizes and lifetime totals

Why this shape:
- Each message is its own persistent record, written once by put: a commit writes the new
  record plus a few small index buckets, never the bodies of its neighbours.
- The indexes hold integers only (LOBTree/LLTreeSet buckets, small and C-fast) and BTrees
  resolve concurrent changes to different keys of one bucket, so writers that touch
  different messages (the committer, an application's own connection, later other processes
  through ZEO) do not conflict.  Sizes and totals live in Counters, which resolves
  conflicts by adding deltas (like BTrees.Length); SeqCounter resolves by taking the larger.
- A store key orders the ready set: priority first (higher first), then the sequence number
  (FIFO) or its complement (LIFO).  Priority queues ordered by item value use the sequence
  number as store key and order by value in memory (see ackqueue.state).

Operations (Put, Claim, Release, Ack) are small picklable-free value objects with one method,
``apply(catalog)``.  They are written so that applying them is tolerant: an ack of a message
whose claim has not been applied yet, or a claim of a message already acknowledged, does the
right thing.  That lets the same operations be applied by the committer (ackqueue.commit) or
by an application's own connection inside its transaction (ackqueue.connection).
"""
import time

from BTrees.LLBTree import LLTreeSet
from BTrees.LOBTree import LOBTree
from BTrees.OOBTree import OOBTree
from persistent import Persistent

__all__ = [
    "ROOT_KEY", "FORMAT", "KINDS", "PRIORITY_MAX", "DEFAULT_PRIORITY",
    "store_key", "seq_of_key", "Catalog", "QueueRecord", "MessageRecord",
    "Counters", "SeqCounter", "Put", "Claim", "Release", "Ack",
    "ensure_queue",
]

ROOT_KEY = "ackqueue"
FORMAT = 1

FIFO, LIFO, VALUE = "fifo", "lifo", "value"
KINDS = (FIFO, LIFO, VALUE)
KIND_NAMES = {FIFO: "a FIFO queue (AckQueue)", LIFO: "a LIFO queue (AckLifoQueue)",
              VALUE: "a priority queue (AckPriorityQueue)"}

PRIORITY_MAX = 1000
DEFAULT_PRIORITY = 100
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1


def store_key(kind, priority, seq):
    """The integer that orders a ready message: higher priority first, then FIFO or LIFO."""
    if kind == VALUE:
        return seq
    rank = (PRIORITY_MAX - priority) << SEQ_BITS
    return rank | ((SEQ_MASK - seq) if kind == LIFO else seq)


def seq_of_key(kind, key):
    """Inverse of store_key for the sequence number."""
    if kind == VALUE:
        return key
    low = key & SEQ_MASK
    return (SEQ_MASK - low) if kind == LIFO else low


class Counters(Persistent):
    """Named integer counters that resolve write conflicts by adding both sides' deltas."""

    FIELDS = ("ready", "inflight", "delayed", "put", "acked", "redelivered",
              "given_back", "recovered", "expired", "dead_lettered")

    def __init__(self):
        self.values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **deltas):
        values = dict(self.values)
        for name, delta in deltas.items():
            values[name] = values.get(name, 0) + delta
        self.values = values

    def get(self, name):
        return self.values.get(name, 0)

    def __getstate__(self):
        return dict(self.values)

    def __setstate__(self, state):
        self.values = dict(state)

    def _p_resolveConflict(self, old, committed, new):
        names = set(old) | set(committed) | set(new)
        return {n: committed.get(n, 0) + new.get(n, 0) - old.get(n, 0) for n in names}


class SeqCounter(Persistent):
    """The next sequence number of a queue; concurrent advances resolve to the larger value."""

    def __init__(self, value=1):
        self.value = value

    def advance_past(self, seq):
        if seq >= self.value:
            self.value = seq + 1

    def __getstate__(self):
        return self.value

    def __setstate__(self, state):
        self.value = state

    def _p_resolveConflict(self, old, committed, new):
        return max(committed, new)


class MessageRecord(Persistent):
    """One queued message: the pickled item and what happened to it so far."""

    def __init__(self, seq, body, priority, sent_at):
        self.seq = seq
        self.body = body                  # bytes: pickle of the item
        self.priority = priority
        self.sent_at = sent_at
        self.receive_count = 0
        self.first_received = None
        self.last_received = None


class QueueRecord(Persistent):
    """One named queue: its messages, the indexes of where each one is, and its counters."""

    def __init__(self, name, kind):
        if kind not in KINDS:
            raise ValueError(f"unknown queue kind {kind!r}")
        self.name = name
        self.kind = kind
        self.created = time.time()
        self.messages = LOBTree()
        self.ready = LLTreeSet()
        self.inflight = LOBTree()
        self.delayed = LOBTree()
        self.next_seq = SeqCounter()
        self.counts = Counters()

    def key_of(self, seq):
        """The store key of a message (its ready-set position)."""
        return store_key(self.kind, self.messages[seq].priority, seq)

    def detach(self, seq, key):
        """Take a message out of whichever index holds it; return where it was (or None)."""
        if key in self.ready:
            self.ready.remove(key)
            self.counts.add(ready=-1)
            return "ready"
        if seq in self.inflight:
            del self.inflight[seq]
            self.counts.add(inflight=-1)
            return "inflight"
        if seq in self.delayed:
            del self.delayed[seq]
            self.counts.add(delayed=-1)
            return "delayed"
        return None

    def make_ready(self, seq, key, visible_at=None):
        """Put a message in the ready set, or in the delayed index until visible_at."""
        if visible_at:
            self.delayed[seq] = float(visible_at)
            self.counts.add(delayed=1)
        else:
            self.ready.add(key)
            self.counts.add(ready=1)

    def recover_inflight(self):
        """Give back every message in flight (the process that held them is gone).

        Only for a storage this process holds alone: under a shared server other processes'
        messages are in flight legitimately.  Returns how many were given back."""
        seqs = list(self.inflight.keys())
        for seq in seqs:
            key = self.key_of(seq)
            del self.inflight[seq]
            self.ready.add(key)
        if seqs:
            self.counts.add(inflight=-len(seqs), ready=len(seqs), recovered=len(seqs),
                            given_back=len(seqs))
        return len(seqs)


class Catalog(Persistent):
    """The root of ackqueue's data: named queues in one storage."""

    def __init__(self):
        self.format = FORMAT
        self.queues = OOBTree()


def ensure_queue(root, name, kind):
    """The QueueRecord called name, created with kind if missing (the caller commits)."""
    catalog = root.get(ROOT_KEY)
    if catalog is None:
        catalog = root[ROOT_KEY] = Catalog()
    record = catalog.queues.get(name)
    if record is None:
        record = catalog.queues[name] = QueueRecord(name, kind)
    return record


def _queue(root, name):
    return root[ROOT_KEY].queues[name]


class Put:
    """A new message, ready at once or at visible_at."""

    __slots__ = ("name", "seq", "key", "body", "priority", "sent_at", "visible_at")

    def __init__(self, name, seq, key, body, priority, sent_at, visible_at=None):
        self.name, self.seq, self.key, self.body = name, seq, key, body
        self.priority, self.sent_at, self.visible_at = priority, sent_at, visible_at

    def apply(self, root):
        rec = _queue(root, self.name)
        rec.messages[self.seq] = MessageRecord(self.seq, self.body, self.priority, self.sent_at)
        rec.make_ready(self.seq, self.key, self.visible_at)
        rec.next_seq.advance_past(self.seq)
        rec.counts.add(put=1)


class Claim:
    """A delivery: the message goes in flight, with its receive count and deadline."""

    __slots__ = ("name", "seq", "key", "receive_count", "at", "deadline")

    def __init__(self, name, seq, key, receive_count, at, deadline):
        self.name, self.seq, self.key = name, seq, key
        self.receive_count, self.at, self.deadline = receive_count, at, deadline

    def apply(self, root):
        rec = _queue(root, self.name)
        msg = rec.messages.get(self.seq)
        if msg is None:          # acknowledged before this claim reached the store
            return
        rec.detach(self.seq, self.key)
        rec.inflight[self.seq] = float(self.deadline or 0.0)
        rec.counts.add(inflight=1)
        if self.receive_count > msg.receive_count:
            msg.receive_count = self.receive_count
            if msg.first_received is None:
                msg.first_received = self.at
            msg.last_received = self.at
            if self.receive_count > 1:
                rec.counts.add(redelivered=1)


class Release:
    """A give-back: an in-flight message returns to its place, now or at visible_at."""

    __slots__ = ("name", "seq", "key", "visible_at")

    def __init__(self, name, seq, key, visible_at=None):
        self.name, self.seq, self.key, self.visible_at = name, seq, key, visible_at

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.seq not in rec.messages:
            return
        rec.detach(self.seq, self.key)
        rec.make_ready(self.seq, self.key, self.visible_at)
        rec.counts.add(given_back=1)


class Ack:
    """An acknowledgement: the message leaves the queue for good."""

    __slots__ = ("name", "seq", "key")

    def __init__(self, name, seq, key):
        self.name, self.seq, self.key = name, seq, key

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.seq not in rec.messages:
            return
        rec.detach(self.seq, self.key)
        del rec.messages[self.seq]
        rec.counts.add(acked=1)
