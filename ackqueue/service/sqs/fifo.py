"""SQS FIFO delivery (queues named ``*.fifo``) over one library queue: message groups.

The library queue delivers in put order; SQS's FIFO queue delivers each message group in
order with at most one receive of a group in flight, while other groups go on.  So this
front stages messages: it takes them from the library queue in order, held by its own
connection with no deadline (so they stay in flight in the library until deleted, and a
crash gives them back on the next open), keeps them in ``pending`` in queue order, and
hands them to SQS receivers group by group, with its own visibility deadlines and receive
counts.  A delete releases the delivery from the staging (``release``) and the front
acknowledges it through the connection that received it; a deadline passing, a visibility
change to 0 or a 0 visibility timeout put the message back in ``pending`` at its place
(the receive and visibility change schedule a wake-up of long polls at the deadline).

What differs from SQS, said here and in docs/sqs.md: a staged message is in flight for the
other fronts (native, Sasquatch, Python) until SQS deletes it; a message moved to a FIFO
dead-letter queue is copied there and then deleted (two commits: a crash between them
leaves it in both queues, never in neither).

Every method runs in a pool thread, except ``holds``, ``take_now`` and ``release(...,
block=False)`` (the event loop's, never waiting for a lock); ``take`` takes the queue's
ClientConn lock.
"""
import queue as _stdlib_queue
import secrets
import threading

from ackqueue.errors import NotHeld, StaleAck
from ackqueue.state import PutOptions
from ackqueue import store

from . import msgattrs

__all__ = ["FifoState"]

STAGE = 100                 # the most messages staged per queue


class _Flight:
    __slots__ = ("message", "group", "deadline")

    def __init__(self, message, group, deadline):
        self.message, self.group, self.deadline = message, group, deadline


def group_of(m):
    return dict(m.attributes or {}).get(msgattrs.RESERVED + "group", "")


class FifoState:
    def __init__(self, clock):
        self.clock = clock
        self.lock = threading.Lock()
        self.pending = []           # staged library Messages, in queue (id) order
        self.out = {}               # receipt -> _Flight
        self.busy = {}              # group -> deliveries in flight
        self.receives = {}          # message id -> SQS receives while staged

    # -- staging -----------------------------------------------------------------------------

    def _back(self, m):
        self.pending.append(m)
        self.pending.sort(key=lambda x: int(x.id))

    def _land(self, receipt):
        f = self.out.pop(receipt)
        left = self.busy.get(f.group, 1) - 1
        if left <= 0:
            self.busy.pop(f.group, None)
        else:
            self.busy[f.group] = left
        return f

    def _expire(self):
        now = self.clock()
        for r in [r for r, f in self.out.items() if f.deadline <= now]:
            self._back(self._land(r).message)

    def _fill(self, cc):
        want = STAGE - len(self.pending) - len(self.out)
        if want <= 0:
            return
        try:
            got = cc.conn.get_many(want, block=False, messages=True, raw=True,
                                   visibility_timeout=None)
        except _stdlib_queue.Empty:
            return
        self.pending.extend(got)
        self.pending.sort(key=lambda x: int(x.id))

    # -- the SQS actions -------------------------------------------------------------------

    def take(self, cc, n, vt, max_receives=None, dead_letter=None):
        """Up to n messages for one receive: [(receipt, Message, SQS receive count)]; a
        group with a delivery in flight is skipped whole, so it stays in order.  A message
        received more than max_receives times moves to dead_letter (an AckQueue)."""
        with cc.lock, self.lock:
            if cc.conn.closed:
                return []
            out, dead = self._choose(cc, n, vt, max_receives, dead_letter)
        if dead:
            self._dead_letter(cc, dead, dead_letter)
        return out

    def take_now(self, cc, n, vt, max_receives=None, dead_letter=None):
        """take() for the event loop's own thread: None where it would wait (cc's lock or
        the staging's busy in a pool thread) or where it may move dead letters (their put
        and ack wait for commits), so the caller takes in the pool instead."""
        if max_receives is not None and dead_letter:
            return None
        if not cc.lock.acquire(blocking=False):
            return None
        try:
            if not self.lock.acquire(blocking=False):
                return None
            try:
                if cc.conn.closed:
                    return []
                return self._choose(cc, n, vt, max_receives, None)[0]
            finally:
                self.lock.release()
        finally:
            cc.lock.release()

    def _choose(self, cc, n, vt, max_receives, dead_letter):
        """(deliveries out, messages to dead-letter) of one take (both locks held)."""
        self._expire()
        self._fill(cc)
        chosen, dead = [], []
        for m in list(self.pending):
            g = group_of(m)
            if g in self.busy:
                continue
            count = self.receives.get(int(m.id), 0) + m.receive_count
            if max_receives is not None and count > max_receives and dead_letter:
                dead.append(m)
                self.pending.remove(m)
                continue
            if len(chosen) == n:
                continue
            chosen.append((m, g, count))
        out = []
        for m, g, count in chosen:
            self.receives[int(m.id)] = self.receives.get(int(m.id), 0) + 1
            receipt = f"{int(m.id)}.{secrets.token_urlsafe(18)}"
            if vt > 0:
                self.pending.remove(m)
                self.out[receipt] = _Flight(m, g, self.clock() + vt)
                self.busy[g] = self.busy.get(g, 0) + 1
            out.append((receipt, m, count))
        return out, dead

    def _dead_letter(self, cc, messages, target):
        """Copy messages to the dead-letter queue (an AckQueue), then delete them here."""
        for m in messages:
            opts = PutOptions(store.DEFAULT_PRIORITY, 0.0, store.DEAD_LETTER_RETENTION,
                              tuple(sorted(dict(m.attributes or {}).items())) or None)
            target.put_many([m.body], False, None, options=opts, encoded=True)
            with cc.lock:
                try:
                    cc.conn.ack_many_holdings([cc.holding(m)])
                except (StaleAck, NotHeld):
                    pass
            self.receives.pop(int(m.id), None)

    def release(self, receipts, block=True):
        """The library Messages of the deliveries receipts name (those out to an SQS
        receiver; the others name none), no longer staged: the caller acknowledges them
        (a delete).  block=False (the event loop's thread): None when a pool thread holds
        the staging, and nothing is released."""
        if not self.lock.acquire(blocking=block):
            return None
        try:
            out = []
            for receipt in receipts:
                if receipt in self.out:
                    f = self._land(receipt)
                    self.receives.pop(int(f.message.id), None)
                    out.append(f.message)
            return out
        finally:
            self.lock.release()

    def change(self, receipt, seconds):
        """A new deadline for receipt's delivery (0: back now); False if it is not out."""
        with self.lock:
            self._expire()
            f = self.out.get(receipt)
            if f is None:
                return False
            if seconds <= 0:
                self._back(self._land(receipt).message)
            else:
                f.deadline = self.clock() + seconds
            return True

    def holds(self, receipt):
        """Whether receipt names a delivery of this queue out to an SQS receiver (from the
        event loop: one dict lookup, atomic, without the lock a staging read may hold)."""
        return receipt in self.out

    def staged(self):
        """(messages staged and visible, messages out to SQS receivers)."""
        with self.lock:
            self._expire()
            return len(self.pending), len(self.out)

    def reset(self):
        """After a purge: the library ended every delivery; forget them."""
        with self.lock:
            self.pending.clear()
            self.out.clear()
            self.busy.clear()
            self.receives.clear()
