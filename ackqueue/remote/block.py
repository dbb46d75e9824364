"""``with q.transaction():`` on a queue reached through the queue service: one batch request.

A transaction block of an embedded queue makes its gets, puts and acks one ZODB commit.
Through ``ackqueue serve`` the same promise is kept with the service's atomic batch
(``POST /v1/batch``, ackqueue/service/atomic_batch.py), which the service writes as one commit:

- a get inside the block is a real receive, made at once (the code needs the item): the
  message is in flight, held for this client as any delivery is;
- puts and acks inside the block are kept here, and nothing of them reaches the service
  until the block ends;
- when the block ends without an exception, one batch request carries every put, every
  ack, and a lease check naming the messages got in the block and still held: the service
  commits all of it or none of it.  The block's ``with`` statement returns only once that
  commit is durable;
- when the block raises, or the batch is refused (a stale receipt, a lapsed lease), nothing
  is put, nothing is acknowledged, and the messages got in the block are given back at once
  (nack), as an embedded rollback returns its claims.  Messages got before the block and
  acknowledged inside it stay held by this thread.

A batch cut off on its way is retried with the same idempotency key, so its puts are stored
once (the service answers a retry with the original ids).  What a block cannot do through
the service, and says so: nack, change_visibility, and a put with its own dedup window.
"""
import json
import logging
import uuid

from .. import codec, store
from ..errors import AckQueueError, NotSupported, StaleAck
from ..frames import FRAMES, encode_frames
from .http import raise_for

__all__ = ["RemoteBlock", "commit_together", "not_in_block"]

log = logging.getLogger(__name__)


class RemoteBlock:
    """The transaction block of one RemoteConnection (see the module docstring)."""

    def __init__(self, conn):
        self.conn = conn
        self.puts = []              # (body, opts, dedup_id)
        self.acks = []              # RemoteHolding acknowledged inside the block
        self.before = set(conn.holdings)   # receipts held when the block began

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.rollback("its transaction block raised " + exc_type.__name__)
            return False
        commit_together([self])
        return False

    # -- what the block keeps until it ends --------------------------------------------------

    def put(self, bodies, opts, dedup_ids):
        if opts is not None and opts.dedup_window != store.DEFAULT_DEDUP_WINDOW:
            raise not_in_block("put(dedup_window=...)")
        self.puts.extend((body, opts, d) for body, d in zip(bodies, dedup_ids))
        return [None] * len(bodies)

    def ack(self, h):
        if any(a is h for a in self.acks):
            raise AckQueueError(f"{h.item!r} was acknowledged already in this transaction")
        self.acks.append(h)

    def got_here(self):
        """The deliveries received inside the block and still held."""
        return [h for r, h in self.conn.holdings.items() if r not in self.before]

    def rollback(self, why):
        """End the block: drop its puts and acks, give back at once what it received."""
        self.conn._block = None
        got = self.got_here()
        self.puts, self.acks = [], []
        if not got:
            return
        try:
            self.conn.nack_receipts([h.receipt for h in got])
        except StaleAck:                # one of them is over already: the others one by one
            for h in got:
                self._give_back(h)
        except AckQueueError as exc:
            log.warning("ackqueue: giving back %d item(s) got in a transaction block "
                        "that did not commit: %s (they come back at their visibility "
                        "deadline or when this client's lease ends)", len(got), exc)
        for h in got:
            h.released = f"given back: {why}"
            h.holder.forget(h)


    def _give_back(self, h):
        try:
            self.conn.nack_receipts([h.receipt])
        except AckQueueError:
            pass                        # over already, or comes back at its deadline


def commit_together(blocks, keep=()):
    """End the blocks (queues of one service, opened in this thread) with one atomic batch
    request: their puts and acks, and a lease check on what they received and still hold
    and on keep (RemoteHoldings that must still be held, not acknowledged).  Returns once
    the service's commit is durable; on any failure nothing is written, every block is
    rolled back, and the error propagates (StaleAck for a delivery that was over)."""
    for b in blocks:
        b.conn._block = None
    try:
        _check_one_service(blocks)
        _send(blocks, keep)
    except BaseException as exc:
        for b in blocks:
            b.rollback(f"its transaction's batch failed ({type(exc).__name__})")
        raise


def _check_one_service(blocks):
    services = {(b.conn.database.target.netloc, b.conn.database.client) for b in blocks}
    if len(services) > 1:
        raise ValueError("one batch spans queues of one queue service only")


def _send(blocks, keep):
    puts = [(b.conn.state.name, put) for b in blocks for put in b.puts]
    acks = [(b.conn.state.name, h) for b in blocks for h in b.acks]
    if not puts and not acks and not keep:
        return                          # gets only: already held, nothing to commit
    acked = {h.receipt for _, h in acks}
    held = [(b.conn.state.name, h) for b in blocks for h in b.got_here()] + [
        (h.holder.state.name, h) for h in keep]
    doc = {"acks": [{"queue": name, "receipt": h.receipt} for name, h in acks],
           "lease": {"client": blocks[0].conn.database.client, "receipts": [
               {"queue": name, "receipt": h.receipt} for name, h in held
               if h.receipt not in acked]},
           "idempotency_key": uuid.uuid4().hex,
           "puts": [_put_entry(name, body, opts, d) for name, (body, opts, d) in puts]}
    data = encode_frames([json.dumps(doc).encode()] +
                         [codec.payload(body) for _, (body, _, _) in puts])
    status, answer, attempt = blocks[0].conn.database.call("POST", "/v1/batch", data,
                                                      {"Content-Type": FRAMES})
    if status in (409, 410) and attempt and not puts:
        status, answer = 409, {"error": {"code": "StaleReceipt", "message": (
            "the transaction's batch was cut off and retried, and the service no longer "
            "knows its deliveries: the first attempt either committed it or they were "
            "given back")}}
    raise_for(status, answer)          # (the caller rolls the blocks back)
    for b in blocks:
        for h in b.acks:
            h.holder.forget(h)
        b.acks = []


def not_in_block(what):
    return NotSupported(f"{what} cannot be part of a transaction block on a queue reached "
                        f"through the queue service: the block is one batch request of "
                        f"puts and acks; do it before or after the block")


def _put_entry(name, body, opts, dedup_id):
    entry = {"queue": name, "encoding": codec.kind(body)}
    if opts is not None:
        if opts.priority != store.DEFAULT_PRIORITY:
            entry["priority"] = opts.priority
        if opts.delay:
            entry["delay"] = opts.delay
        if opts.retention != store.DEFAULT_RETENTION:
            entry["retention"] = opts.retention
        if opts.attributes:
            entry["attributes"] = dict(opts.attributes)
    if dedup_id is not None:
        entry["dedup_id"] = dedup_id
    return entry
