"""Deferred acknowledgements: ``AckQueue(..., acks="deferred")``.

In this mode ``ack``, ``ack_many`` and ``task_done`` return as soon as the acknowledgement
is handed to the committer, without waiting for its commit.  The acknowledgement rides on
the next commit anyone in this process makes (a put, another ack, a claim), and if none
comes within the committer's ``defer_delay`` (a few ms) the committer commits it by
itself.  ``q.flush()`` waits until every deferred ack of the queue is durable; ``close()``
flushes.

What it changes, and only that: the message leaves this process's view at once (the
delivery is *settling*: no deadline, thread end or close gives it back, so this process
never delivers it again), but until the commit a crash of the process (or a power loss)
forgets the ack, and the message is delivered again after the next open.  At-least-once
delivery already allows that.  An ack inside ``with q.transaction():`` stays part of the
transaction's one commit.  If the commit of a deferred ack fails (a storage error), the
message is given back, so it is delivered again, and the next ``flush()`` raises the error.

Through a server (ZEO) it works the same: the committer is the same.  There
``ack_with_next_get=True`` is this mode with a longer window: an ack waits up to
NEXT_GET_WINDOW for the process's next commit, so that a consumer that keeps up (its next
get waits for the next put, often longer than a few ms) sends it with that get's claim
instead of a commit of its own, as the queue service's drop-in sends it with the next get
request.  A queue reached through the queue service (``path="http://..."``) has its own
way to save requests (``ack_with_next_get=True``), and refuses this option.
"""
import collections
import logging
import threading

from .errors import StaleAck

__all__ = ["ACK_MODES", "NEXT_GET_WINDOW", "check_acks", "DeferredAcks", "of"]

log = logging.getLogger(__name__)

ACK_MODES = ("durable", "deferred")
NEXT_GET_WINDOW = 0.05      # seconds an ack_with_next_get ack waits for a commit to ride on
                            # through a server (the queue service's drop-in waits as long)


def check_acks(value, remote_url, ack_with_next_get=False):
    """Validate AckQueue's acks= option (None: "durable", the default) and return the
    mode; remote_url: the queue is reached over http; ack_with_next_get: that option's
    (checked) value, which an explicit "durable" contradicts."""
    if value == "durable" and ack_with_next_get:
        raise ValueError(
            "acks='durable' (an ack returns once it is durable) contradicts "
            "ack_with_next_get=True (an ack returns at once and travels with the next "
            "get): pass one or the other")
    if value is None:
        return "durable"
    if value not in ACK_MODES:
        raise ValueError(f"acks must be 'durable' (the default: an ack returns once it is "
                         f"durable) or 'deferred' (an ack returns at once and is durable "
                         f"within a few ms, or after flush()), not {value!r}")
    if value == "deferred" and remote_url:
        from .errors import NotSupported
        raise NotSupported(
            "acks='deferred' is for an embedded queue (a file, or ZEO); a queue reached "
            "through the queue service saves its ack requests with ack_with_next_get=True "
            "instead (the ack travels with the thread's next get)")
    return value


def of(state):
    """The DeferredAcks of a queue state (made on first use; one per state, shared by
    every front of the queue in this process)."""
    found = getattr(state, "deferred_acks", None)
    if found is None:
        with state.mutex:
            found = getattr(state, "deferred_acks", None)
            if found is None:
                found = state.deferred_acks = DeferredAcks(state)
    return found


class DeferredAcks:
    """The deferred acknowledgements of one queue in this process, until durable."""

    def __init__(self, state):
        self._state = state
        self._lock = threading.Lock()
        self._tickets = collections.deque()   # committer tickets, oldest first

    def ack(self, holdings, window=None):
        """Acknowledge holdings (all current, else StaleAck and nothing changes) in one
        unit that the next commit carries, within window seconds (None: the committer's
        defer_delay); return without waiting for it."""
        state = self._state
        state.begin_settle(holdings)
        ticket = None

        def failed(error):
            if isinstance(error, StaleAck):
                if ticket.uncertain and error.reason == "acked":
                    state.settled(holdings)      # our own first attempt got through
                else:
                    state.drop(holdings, str(error))
                return
            log.warning("ackqueue: a deferred ack of queue %r failed to commit (%r); "
                        "its message(s) are given back", state.name, error)
            state.cancel_settle(holdings)
            for h in holdings:
                try:
                    state.give_back(h, f"its deferred ack failed to commit: {error!r}")
                except StaleAck:
                    pass                          # gone meanwhile (purged)

        ops = state.arbiter.ack_ops(holdings)
        try:
            ticket = state.committer.defer(ops, on_commit=lambda: state.settled(holdings),
                                           on_fail=failed, delay=window)
        except BaseException:
            state.cancel_settle(holdings)
            raise
        with self._lock:
            while self._tickets and self._tickets[0].finished() \
                    and self._tickets[0].error is None:
                self._tickets.popleft()          # durable: nothing left to report
            self._tickets.append(ticket)

    def flush(self):
        """Return once every ack deferred before this call is durable; raise the first
        error a deferred ack met since the last flush (its message was given back)."""
        with self._lock:
            tickets = list(self._tickets)
        if not tickets:
            return
        self._state.committer.flush()
        first = None
        for ticket in tickets:
            ticket.wait_finished()
            error = ticket.error
            if error is not None and not (isinstance(error, StaleAck) and ticket.uncertain
                                          and error.reason == "acked"):
                first = first or error
        flushed = set(map(id, tickets))
        with self._lock:                         # they are the oldest (or pruned already)
            while self._tickets and id(self._tickets[0]) in flushed:
                self._tickets.popleft()
        if first is not None:
            raise first
