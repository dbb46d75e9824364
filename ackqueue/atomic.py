"""One commit across several queues of one storage.

``with ackqueue.atomic.transaction(q_pages, q_links):`` opens a transaction block
(``q.transaction()``) on each queue for the calling thread; the puts, gets and acks made
inside, on any of them, are written by one commit when the block ends normally (all durable
together), and none of them when it ends by an exception (what was received is given back,
the puts never existed).  The queues must share one database (one Committer): queues opened
on the same file, the same ``db=`` or the same in-memory database; or be queues of one queue
service (``path="http://..."``), whose blocks travel as one atomic batch request
(ackqueue.remote.block); others raise ValueError.

``keep=`` names received messages (``Message`` objects, from ``get_message`` /
``get_messages``) that must still be held by their delivery when the commit is made, and
are not acknowledged by it: if one was given back meanwhile (deadline, nack, lease),
StaleAck is raised and nothing is written.  The queue service's batch endpoint uses this
for its lease checks.

``t.write(op)`` inside the block adds a write to a record of the caller's own in the same
commit (op: an object with ``check(root)`` and ``apply(root)``, as ackqueue.store's
operations, applied to the database root; it must re-apply cleanly, as a commit retried
after a conflict applies it again, and never touch ``root["ackqueue"]``).  The service's
durable stream leases (ackqueue/service/streams.py) write their record with the messages
they take this way.
"""
from . import store
from .connection import commit_blocks
from .errors import NotHeld
from .remote.block import RemoteBlock, commit_together

__all__ = ["transaction"]


class transaction:
    """Context manager: the operations of several queues' transaction blocks, one commit."""

    def __init__(self, *queues, keep=()):
        if not queues:
            raise TypeError("transaction() needs one queue or more")
        unique = {}
        for q in queues:
            unique.setdefault(id(q), q)
        self.queues = list(unique.values())
        by_name = {q.name: q for q in self.queues}
        self.keep = {}
        for m in keep:
            holding = getattr(m, "_holding", None)
            if holding is None or m.queue not in by_name:
                raise NotHeld(f"{m!r} is not a message received from one of these queues")
            self.keep.setdefault(m.queue, []).append(holding)
        self._by_name = by_name
        self.blocks = []
        self.writes = []

    def write(self, op):
        """Commit op (a write of the caller's own record) with the block (see above)."""
        self.writes.append(store.OwnWrite(op))

    def __enter__(self):
        try:
            for q in self.queues:
                self.blocks.append(q.transaction())
        except BaseException:
            self._rollback("a queue transaction could not begin")
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._rollback("its transaction block raised " + exc_type.__name__)
            return False
        remote = [isinstance(b, RemoteBlock) for b in self.blocks]
        if any(remote):
            if not all(remote) or self.writes:
                self._rollback("its queues live in different places")
                raise ValueError("one commit spans queues of one database or of one queue "
                                 "service, not both; write() needs the queues' database")
            commit_together(self.blocks, [h for hs in self.keep.values() for h in hs])
            return False
        keep = [(self._by_name[name].state, holdings)
                for name, holdings in self.keep.items()]
        # The writes travel as the first block's last operations: one unit, one commit.
        self.blocks[0].put_ops.extend(self.writes)
        commit_blocks(self.blocks, keep)
        return False

    def _rollback(self, why):
        for block in self.blocks:
            block.conn._block = None
            block.rollback(why)
