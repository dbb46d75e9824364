"""Browse a queue: every message with its state, read-only.

``AckQueue.browse()`` (and ``QueueState.browse()`` for the service and the command line)
iterates the messages of one queue from one consistent snapshot of the store, changing
nothing: no receive is counted, nothing is claimed, expired or taken out.  Messages come in
three groups, each in the order it leaves that state:

1. ready, in delivery order (what successive gets would receive, as far as this snapshot
   and this process know);
2. delayed, by the time they become ready;
3. in flight, by visibility deadline (held without one: last), with the deadline and the
   receive count of the live delivery.

It reads the store lazily, one message at a time, and lets ZODB's cache shed what it
read, so browsing a queue of a million messages does not load them all into memory.  (For
an AckPriorityQueue ordered by item value the order lives in memory already, and a
snapshot of those keys is taken.)  In a process that holds its storage alone, deliveries
are decided in memory and not written to the store, so the state's own holdings say what
is in flight; through a server, the store's in-flight indexes say it for every process.
"""
from dataclasses import dataclass, field

from . import codec, store
from .message import MessageId

__all__ = ["BrowsedMessage", "browse", "browse_after", "READY", "DELAYED", "IN_FLIGHT"]

READY, DELAYED, IN_FLIGHT = "ready", "delayed", "in_flight"
GC_EVERY = 1024          # messages read between two trims of the snapshot's object cache


@dataclass(frozen=True)
class BrowsedMessage:
    """One message as browse() found it.  ``body`` is the stored bytes (marked with their
    encoding, see ackqueue.codec), ``item`` decodes them on demand; ``state`` is READY,
    DELAYED or IN_FLIGHT; ``visible_at`` (delayed) and ``deadline`` (in flight; None without a visibility
    timeout) are clock times; ``age`` is seconds since the put."""

    id: MessageId
    state: str
    body: bytes = field(repr=False)
    priority: int
    receive_count: int
    sent_at: float
    age: float
    queue: str
    attributes: dict = field(default_factory=dict)
    visible_at: object = None
    deadline: object = None
    expires_at: object = None
    first_received: object = None
    last_received: object = None
    sequence_number: int = None
    dead_letter_source: object = None
    allowed_classes: object = field(default=None, repr=False, compare=False)
    codec: str = field(default=codec.PICKLE, repr=False, compare=False)

    @property
    def item(self):
        """The decoded item (a pickle only in a queue whose codec is "pickle")."""
        return codec.decode(self.body, self.allowed_classes, self.codec)


def browse(state, allowed=None):
    """Yield a BrowsedMessage for every message of state's queue (see the module
    docstring).  The snapshot stays open until the iterator is exhausted or closed.
    allowed: the classes an item may name when it is read (codec.decode)."""
    return _from_snapshot(state, _in_delivery_order, allowed)


def browse_after(state, after, allowed=None):
    """Yield a BrowsedMessage for every message of state's queue whose id is greater than
    after, in id order (not delivery order), each with its current state.  Finding the
    start costs O(log n) (a start key into the message index), and each message yielded
    reads only itself: a page of a large queue costs its own size, so paging through a
    queue is linear overall.  Not one snapshot across pages: each call opens its own."""
    def in_id_order(state, rec):
        for seq in rec.messages.keys(min=int(after) + 1):
            msg = rec.messages.get(seq)
            if msg is not None:
                yield (seq, msg) + _state_of(state, rec, seq, msg)

    return _from_snapshot(state, in_id_order, allowed)


def _from_snapshot(state, pick, allowed):
    """Open a snapshot, yield a BrowsedMessage for each (seq, msg, state, when, receive
    count) that pick(state, rec) yields, and close the snapshot when done or closed."""
    tm, conn = state.snapshot()
    try:
        rec = conn.root()[store.ROOT_KEY].queues[state.name]
        now = state.clock()
        for count, (seq, msg, what, when, receive_count) in enumerate(pick(state, rec), 1):
            yield _browsed(state.name, rec, seq, msg, what, when, receive_count, now,
                           allowed, state.codec)
            if count % GC_EVERY == 0:
                conn.cacheGC()        # one message at a time: keep the cache small
    finally:
        tm.abort()
        conn.close()


def _in_delivery_order(state, rec):
    """Ready in delivery order, then delayed, then in flight, as one snapshot saw them."""
    with state.mutex:
        held = {seq: (h.deadline, h.receive_count) for seq, h in state.inflight.items()}
    inflight = _in_flight(rec, held)
    for group in (_ready(state, rec, inflight), _delayed(rec, inflight), _held(inflight)):
        for seq, what, when, receive_count in group:
            msg = rec.messages.get(seq)
            if msg is not None:       # else acknowledged or moved since the index was read
                yield seq, msg, what, when, receive_count


def _state_of(state, rec, seq, msg):
    """(state, visible_at or deadline, receive count or None) of one message."""
    with state.mutex:
        h = state.inflight.get(seq)
        if h is not None:
            return IN_FLIGHT, h.deadline, h.receive_count
    if msg.holder is not None:
        leased = rec.leased.get(msg.holder) if rec.leased is not None else None
        deadline = leased.get(seq) if leased is not None else None
        return IN_FLIGHT, deadline or None, None
    deadline = rec.inflight.get(seq)
    if deadline is not None:
        return IN_FLIGHT, deadline or None, None
    visible_at = rec.delayed.get(seq)
    if visible_at is not None:
        return DELAYED, visible_at, None
    return READY, None, None


def _in_flight(rec, held):
    """seq -> (deadline or None, receive count or None) of every message in flight: this
    process's holdings, and what the store has in flight (claims written by a dead-letter
    policy here, every process's claims through a server)."""
    found = {seq: (deadline or None, None) for seq, deadline in rec.inflight.items()}
    for _lease, seq, deadline in rec.leased_items():
        found[seq] = (deadline, None)
    found.update(held)
    return found


def _ready(state, rec, inflight):
    for seq in state.arbiter.ready_order(rec):
        if seq not in inflight:
            yield seq, READY, None, None


def _delayed(rec, inflight):
    for visible_at, seq in sorted((t, seq) for seq, t in rec.delayed.items()):
        if seq not in inflight:
            yield seq, DELAYED, visible_at, None


def _held(inflight):
    def order(entry):
        seq, (deadline, _) = entry
        return (deadline is None, deadline or 0.0, seq)

    for seq, (deadline, receive_count) in sorted(inflight.items(), key=order):
        yield seq, IN_FLIGHT, deadline, receive_count


def _browsed(name, rec, seq, msg, what, when, receive_count, now, allowed, queue_codec):
    return BrowsedMessage(
        MessageId(seq), what, rec.body_of(seq, msg), msg.priority,
        msg.receive_count if receive_count is None else receive_count, msg.sent_at,
        max(0.0, now - msg.sent_at), name, dict(msg.attributes or ()),
        visible_at=when if what == DELAYED else None,
        deadline=when if what == IN_FLIGHT else None, expires_at=msg.expires_at,
        first_received=msg.first_received, last_received=msg.last_received,
        sequence_number=msg.sequence or seq, dead_letter_source=msg.source,
        allowed_classes=allowed, codec=queue_codec)
