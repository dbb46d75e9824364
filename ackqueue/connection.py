"""Per-thread handles on a queue, and transaction blocks.

A QueueConnection is what q.connect() returns and what the queue object uses behind the
scenes for the calling thread.  It belongs to the thread that made it: when that thread
ends, everything it still holds is given back (the thread tells the queue's state as it
ends; the state's reaper looks too).  It has its own ZODB connection and transaction
manager, used to read message bodies that are not in memory (a backlog from an earlier run)
without touching any other thread's connection.

Transactions.  ``with conn.transaction():`` gathers every get, put and ack made inside into
one unit that the committer writes as one commit: leaving normally makes it durable; leaving
by an exception gives the received messages back and drops the puts.  When the queue lives
in the application's own database (AckQueue(db=...)) and the thread's ``transaction.manager``
has a transaction in progress, queue operations join *that* transaction instead: their
store changes are written, just before it commits, through the application's own connection
(a second connection of the same database in one transaction would deadlock, ZODB issue
258), so the application's objects and the queue commit or roll back as one.
"""
import itertools
import logging
import math
import operator
import pickle
import threading
import weakref

import transaction
from zope.interface import implementer
from ZODB.Connection import Connection as _ZODBConnection

from . import codec, deferred, store
from .errors import (AckQueueError, DuplicateMessage, ItemTooLarge, NotHeld, StaleAck,
                     UnreadableItem, unreadable_error)
from .pack_rereads import read_fresh
from .message import Message, MessageId
from .state import DEFAULT_PUT, Ask, MessageMissing, Meta, check_timeout
from .interfaces import IQueueConnection

log = logging.getLogger(__name__)

__all__ = ["QueueConnection", "TransactionBlock", "commit_blocks"]

DEFAULT = object()          # "use the queue's default visibility timeout"

# Threads whose run() raised: what they held is given back even in plain queue.Queue code.
# threading.excepthook is the application's (a logging setup or an error reporter may
# replace it at any time, before or after a queue exists), so the failure is caught one
# step earlier: every threading.Thread calls its own _invoke_excepthook (made per thread by
# threading._make_invoke_excepthook, CPython 3.8 to 3.13) when run() raises, before the
# thread counts as ended.  A thread that uses a queue gets that attribute wrapped once.
_failed_threads = weakref.WeakSet()
_watched_threads = weakref.WeakSet()


def watch_thread_failure(thread):
    """Record thread in _failed_threads if its run() raises, whatever threading.excepthook
    is by then (called in thread itself, before it holds anything)."""
    if thread in _watched_threads:
        return
    invoke = getattr(thread, "_invoke_excepthook", None)
    if invoke is None:          # not a threading.Thread we know: the global hook, below
        _install_global_hook()
        return

    def invoke_and_record(t, _invoke=invoke):
        _failed_threads.add(t)
        _invoke(t)

    thread._invoke_excepthook = invoke_and_record
    _watched_threads.add(thread)


class _ThreadEndWatch:
    """Kept in one thread's locals (_end_watches): CPython drops a thread's locals as the
    thread ends, a moment before its is_alive() turns False, and this tells every queue
    state the thread used (state.thread_ended), so that a get or an ack looks for ended
    threads' holdings only when a thread has ended, not at every call.  The states' reapers
    still look every REAP_INTERVAL, for a Python that drops locals later or never."""

    def __init__(self, thread):
        self.thread = weakref.ref(thread)
        self.states = weakref.WeakSet()

    def __del__(self):
        try:
            for state in list(self.states):
                state.thread_ended(self.thread)
        except Exception:   # noqa: BLE001 - at interpreter exit, or a state half gone
            pass


_end_watches = threading.local()


def watch_thread_end(thread, state):
    """Have state told when thread, the calling thread, ends (called in that thread).
    Foreign threads (threading's dummy threads) always count as alive, so they are not
    watched."""
    watch = getattr(_end_watches, "watch", None)
    if watch is None:
        if isinstance(thread, threading._DummyThread):
            return
        watch = _end_watches.watch = _ThreadEndWatch(thread)
    watch.states.add(state)


def _install_global_hook():
    """Fallback for a Python whose threads have no _invoke_excepthook: chain the current
    threading.excepthook (an application hook installed later replaces it)."""
    previous = threading.excepthook
    if getattr(previous, "_ackqueue", False):
        return

    def record_failed_thread(args):
        if args.thread is not None:
            _failed_threads.add(args.thread)
        previous(args)
    record_failed_thread._ackqueue = True
    log.warning("ackqueue: this Python's threads have no _invoke_excepthook; a thread "
                "that dies of an exception is noticed only while threading.excepthook "
                "stays the one ackqueue chained")
    threading.excepthook = record_failed_thread


RELEASED_KEPT = 1024        # given-back deliveries remembered to explain a late ack
UNREADABLE_DELAY = 60.0     # seconds a message whose item cannot be unpickled is set aside


def _encoded_body(body):
    """An already-encoded item for put_many(encoded=True): bytes as they will be stored."""
    if isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    if not isinstance(body, bytes):
        raise TypeError(f"an encoded item must be bytes, not {type(body).__name__}")
    return body


def check_item_sizes(pairs, limit):
    """Refuse a batch of (item, pickled body) pairs if a body is over limit bytes (None: no
    limit).  Called before anything is reserved or recorded, so a refusal changes nothing:
    not the queue, not a transaction block in progress."""
    if limit is None or max(map(len, map(_body_of, pairs)), default=0) <= limit:
        return
    for index, (item, body) in enumerate(pairs):
        if len(body) > limit:
            which, lost = (("the item", "nothing was put") if len(pairs) == 1 else
                           (f"item {index} of {len(pairs)}", "none of them was put"))
            raise ItemTooLarge(
                f"cannot queue {which}: a {type(item).__name__!r} that encodes to "
                f"{len(body)} bytes, over the queue's max_item_size of {limit} bytes; "
                f"{lost}", size=len(body), limit=limit, index=index)


def check_wait(block, timeout):
    """queue.Queue's rule for a put's or get's timeout: ignored when not blocking; a bool
    is an int (True: one second); otherwise a non-negative number or None."""
    if not block:
        return None
    if type(timeout) in _PLAIN_NUMBERS and timeout >= 0:
        return timeout        # the usual timeout, valid as it is (NaN is not >= 0)
    if isinstance(timeout, bool):
        return int(timeout)
    return check_timeout(timeout)


_PLAIN_NUMBERS = (int, float)     # exactly these types: a bool or a subclass goes the long way


def check_visibility(value):
    """A visibility timeout is None (held until acknowledged) or a positive number."""
    if value is None:
        return None
    check_timeout(value, "visibility_timeout")
    if value == 0:
        raise ValueError("'visibility_timeout' must be a positive number of seconds or None")
    return value


class TransactionBlock:
    """The operations of one transaction: what it received, put and acknowledged."""

    def __init__(self, conn):
        self.conn = conn
        self.got = []             # holdings received inside: acknowledged by the commit
        self.acks = []            # holdings acknowledged inside
        self.put_ops = []         # store.Put and PutRun operations
        self.put_entries = []     # (seq, key, meta, visible_at) made visible by the commit
        self.finished = False

    def ops(self):
        state = self.conn._state
        return [state.ack_op(h) for h in self.got + self.acks] + self.put_ops

    def holdings(self):
        return self.got + self.acks

    # Explicit blocks (with q.transaction():) commit through the committer.

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.conn._block = None
        if exc_type is None:
            self.commit_now()
        else:
            self.rollback("its transaction block raised " + exc_type.__name__)
        return False

    def commit_now(self):
        state = self.conn._state
        try:
            state.begin_settle(self.holdings())
        except StaleAck:
            self.rollback("its transaction could not commit")
            raise
        ticket = state.committer.submit(
            self.ops(), on_commit=lambda: state.txn_committed(self),
            on_fail=lambda error: state.txn_rolled_back(self, "its transaction failed"),
            lead=True)
        try:
            ticket.wait()
        finally:
            self.finished = True
            _forget(self.holdings())

    def rollback(self, why):
        if self.finished:
            return
        self.finished = True
        self.conn._state.txn_rolled_back(self, why)
        _forget(self.got)


def commit_blocks(blocks, keep=()):
    """Commit the transaction blocks of several queues of one database as one commit: all
    of it, or (an exception) none of it.  Each block must have been opened in the calling
    thread (q.transaction()) and not left yet; this ends them all.

    keep: deliveries (Holdings) that must still be live when the commit is made, without
    being acknowledged: StaleAck if one is not, and none of them can be given back while
    the commit is written (a deadline that passes meanwhile gives it back after).
    Raises ValueError (nothing done) for queues of different databases."""
    states = [b.conn._state for b in blocks]
    committer = states[0].committer
    for b in blocks:
        b.conn._block = None
    if any(state.committer is not committer for state in states):
        for b in blocks:
            b.rollback("its queues live in different databases")
        raise ValueError("one commit spans queues of one database only")
    acked = {id(h) for b in blocks for h in b.holdings()}
    kept = [(state, [h for h in hs if id(h) not in acked]) for state, hs in keep]
    _settle_all([(b.conn._state, b.holdings()) for b in blocks] + kept, blocks)

    def committed():
        for b in blocks:
            b.conn._state.txn_committed(b)
        for state, hs in kept:
            state.cancel_settle(hs)

    def failed(error):
        for b in blocks:
            b.conn._state.txn_rolled_back(b, "its transaction failed")
        for state, hs in kept:
            state.cancel_settle(hs)
    ops = [op for b in blocks for op in b.ops()]
    try:
        ticket = committer.submit(ops, on_commit=committed, on_fail=failed, lead=True)
    except BaseException:
        failed(None)
        for b in blocks:
            b.finished = True
        raise
    try:
        ticket.wait()
    finally:
        for b in blocks:
            b.finished = True
            _forget(b.holdings())


def _settle_all(groups, blocks):
    """Mark every (state, holdings) group as settling, or (StaleAck) none and roll back
    the blocks.  Only the marks made here are undone: a delivery that was being
    acknowledged by someone else keeps its mark."""
    marked = []
    try:
        for state, holdings in groups:
            state.begin_settle(holdings)
            marked.append((state, holdings))
    except BaseException:
        for state, holdings in marked:
            state.cancel_settle(holdings)
        for b in blocks:
            b.acks = []               # their marks were undone above (or never made)
            b.rollback("its transaction could not commit")
        raise


class _AppTransactionBlock(TransactionBlock):
    """Queue operations that joined an application transaction (queues on db=).

    It is joined to the transaction as a data manager (to hear of aborts) and writes its
    store changes from a before-commit hook, through a connection already in the
    transaction when there is one."""

    def __init__(self, conn, txn):
        super().__init__(conn)
        self.txn = txn
        txn.join(self)
        txn.addBeforeCommitHook(self._before_commit)
        txn.addAfterCommitHook(self._after_commit)

    def _before_commit(self):
        state = self.conn._state
        state.begin_settle(self.holdings())
        target = None
        for resource in getattr(self.txn, "_resources", ()):
            if isinstance(resource, _ZODBConnection) and resource.db() is state.database.db:
                target = resource
                break
        if target is None:
            target = self.conn._app_connection()
        store.apply_unit(target.root(), self.ops())

    def _after_commit(self, status):
        if self.finished:
            return
        if status:
            self.finished = True
            self.conn._state.txn_committed(self)
            _forget(self.holdings())
        else:
            self.rollback("the application's transaction failed to commit")

    # IDataManager: our changes travel in the application connection; we only listen.
    def abort(self, txn):
        self.rollback("the application's transaction was aborted")

    def tpc_begin(self, txn):
        pass

    def commit(self, txn):
        pass

    def tpc_vote(self, txn):
        pass

    def tpc_finish(self, txn):
        pass

    def tpc_abort(self, txn):
        self.rollback("the application's transaction failed to commit")

    def sortKey(self):
        return f"~ackqueue:{id(self)}"

    def savepoint(self):
        return _Savepoint(self)


class _Savepoint:
    """Rolling back to a savepoint undoes the queue operations made after it."""

    def __init__(self, block):
        self.block = block
        self.marks = (len(block.got), len(block.acks), len(block.put_ops),
                      len(block.put_entries))

    def rollback(self):
        block = self.block
        ngot, nacks, nputs, nentries = self.marks
        state = block.conn._state
        later = TransactionBlock(block.conn)
        later.got, block.got = block.got[ngot:], block.got[:ngot]
        later.acks, block.acks = block.acks[nacks:], block.acks[:nacks]
        later.put_ops, block.put_ops = block.put_ops[nputs:], block.put_ops[:nputs]
        later.put_entries, block.put_entries = (block.put_entries[nentries:],
                                                block.put_entries[:nentries])
        state.txn_rolled_back(later, "a savepoint was rolled back")
        _forget(later.got)


class ThreadBound:
    """What a per-thread proxy knows of its thread (self._thread: a weak reference to it,
    or None for a proxy that belongs to no thread; self.closed)."""

    def alive(self):
        if self._thread is None:
            return not self.closed
        thread = self._thread()
        return thread is not None and thread.is_alive() and not self.closed

    def ended_by_exception(self):
        thread = None if self._thread is None else self._thread()
        return thread is not None and thread in _failed_threads

    def owned_by(self, thread):
        """Whether this proxy belongs to thread (False for one bound to no thread)."""
        return self._thread is not None and self._thread() is thread


@implementer(IQueueConnection)
class QueueConnection(ThreadBound):
    """One thread's handle on a queue: get, put, ack, nack, get_message, transaction, close.

    Use it from the thread that made it.  As a context manager it gives back, on exit,
    whatever it still holds unacknowledged.

    When its thread ends while it holds messages, they are given back (by the state's
    reaper, without the thread's help) if the thread died of an uncaught exception, or if
    the program acknowledges on this queue at all (ack, nack, task_done, join, connect,
    transaction, a visibility timeout).  A program that never acknowledges uses the queue
    as plain queue.Queue code, where a get is final: what its ended threads got comes back
    only at a visibility deadline or on the next open.

    Made with thread_bound=False (q.connect(thread_bound=False)), it belongs to no thread:
    any thread may use it, one call at a time (the caller serializes), and what it holds
    comes back only at a visibility deadline, when it is closed, or when the process dies.
    A server holds deliveries this way on behalf of its remote clients."""

    thread_bound = True

    def __init__(self, front, state, thread_bound=True):
        self._front = front
        self._state = state
        if thread_bound:
            thread = threading.current_thread()
            self._thread = weakref.ref(thread)
            watch_thread_failure(thread)
            watch_thread_end(thread, state)
        else:
            self.thread_bound = False     # never given back for a thread's end
            self._thread = None
        self._holdings = {}         # token -> Holding, oldest delivery first
        # id(item got) -> its Holding in _holdings, for find; a list of them when several
        # deliveries returned one object (an item that unpickles to a shared int, None).
        self._by_item = {}
        self._prune_at = RELEASED_KEPT  # len(_holdings) above which _prune looks again
        self._block = None          # the explicit transaction block in progress
        self._app_block = None      # the application transaction block in progress
        self._tm = None             # our own transaction manager and ZODB connection
        self._zconn = None
        self._app_zconn = None      # a connection in the thread's transaction.manager
        self.closed = False

    def __repr__(self):
        if self._thread is None:
            owner = "no thread"
        else:
            thread = self._thread()
            owner = thread.name if thread is not None else "an ended thread"
        return f"<QueueConnection to {self._state.name!r} of {owner}>"

    # -- the thread it belongs to --------------------------------------------------------

    def _check_thread(self):
        if self.closed:
            raise AckQueueError("this queue connection is closed")
        if self._thread is not None and self._thread() is not threading.current_thread():
            raise AckQueueError(
                f"{self!r} belongs to another thread; call q.connect() in each thread "
                "(or use the queue object itself, which does that for you)")

    # -- put ------------------------------------------------------------------------------

    def put(self, item, block=True, timeout=None, *, opts=DEFAULT_PUT, dedup_id=None):
        """Put item; returns once it is durable (or, in a transaction, once recorded).
        opts: a state.PutOptions (priority, delay, retention, attributes)."""
        if timeout is not None or block is not True:
            timeout = check_wait(block, timeout)
        pairs = [(item, codec.encode(item, self._state.codec))]
        limit = self._front.max_item_size
        if limit is not None:
            check_item_sizes(pairs, limit)                # the bytes the store keeps
        self._put_bodies(pairs, block, timeout, opts, (dedup_id,), ids=False)

    def put_many(self, items, block=True, timeout=None, *, opts=DEFAULT_PUT,
                 dedup_ids=None, encoded=False, then=None):
        """Put items in one commit; returns their MessageIds (None for ids a server gives
        only when a transaction block commits).

        encoded=True: each item is already the bytes to store (e.g. pickle.dumps(x) sent
        by a remote client); it is stored as given, never pickled nor unpickled here, and
        a get returns what unpickling those bytes gives (or, with raw=True, the bytes).

        then (the non-blocking seam, for an event loop): never wait, neither for room
        (queue.Full at once, as put_nowait) nor for the commit; return the MessageIds at
        once and call then(error) from the committer's thread once the put is durable
        (error None: the messages are visible by then) or has failed (the exception,
        e.g. DuplicateMessage).  Not inside a transaction block."""
        if then is not None:
            if self._transaction_block() is not None:
                raise AckQueueError("put_many(then=...) cannot be part of a transaction "
                                    "block: it commits on its own")
            block, timeout = False, None
        timeout = check_wait(block, timeout)
        if encoded:
            pairs = [(body, body) for body in map(_encoded_body, items)]
            codec.check_admitted(self._state.codec, [b for b, _ in pairs], self._state.name)
            if self._state.kind == store.VALUE:
                raise ValueError("a priority queue ordered by item value must unpickle its "
                                 "items to order them; put encoded bodies in a FIFO or "
                                 "LIFO queue")
        else:
            pairs = codec.encode_many(items, self._state.codec)
        check_item_sizes(pairs, self._front.max_item_size)    # the bytes the store keeps
        if dedup_ids is None:
            dedup_ids = [None] * len(pairs)
        seen = set()
        for dedup_id in dedup_ids:
            if dedup_id is not None:
                if dedup_id in seen:
                    raise DuplicateMessage(f"dedup_id {dedup_id!r} appears twice in one "
                                           "put_many(); nothing was put")
                seen.add(dedup_id)
        if not pairs:
            if then is not None:
                then(None)
            return []
        return self._put_bodies(pairs, block, timeout, opts, dedup_ids, then)

    def _put_bodies(self, pairs, block, timeout, opts=DEFAULT_PUT, dedup_ids=None,
                    then=None, ids=True):
        """Put (item, body) pairs; their MessageIds (ids=False: None, for put())."""
        state = self._state
        if state.kind == store.VALUE:
            pairs = [(codec.decode(body, self._front.allowed_classes, state.codec), body)
                     for _, body in pairs]   # a private copy
            state.check_orderable([item for item, _ in pairs])
        seqs = state.reserve_put(self._front, len(pairs), block, timeout)
        now = state.clock()
        if len(pairs) == 1:
            op, entry = state.new_message(seqs[0], pairs[0][0], pairs[0][1], now, opts,
                                          dedup_ids[0] if dedup_ids else None)
            ops, entries = [op], [entry]
        else:
            ops, entries = state.new_messages(seqs, pairs, now, opts, dedup_ids)
        txn = self._transaction_block()
        if txn is not None:
            txn.put_ops.extend(ops)
            txn.put_entries.extend(entries)
            return _message_ids(ops)
        def committed():
            state.puts_committed(entries)
            if then is not None:
                then(None)

        def failed(error):
            state.unreserve(len(entries))
            if then is not None:
                then(error)

        try:
            ticket = state.committer.submit(ops, on_commit=committed, on_fail=failed,
                                            lead=then is None)
        except BaseException:
            state.unreserve(len(entries))
            raise
        if then is None:
            ticket.wait()
        return _message_ids(ops) if ids else None

    # -- get ------------------------------------------------------------------------------

    def get(self, block=True, timeout=None, *, visibility_timeout=DEFAULT, shuffle=False,
            policy=None):
        """Receive the next item; it stays in flight until acknowledged."""
        return self._receive(block, timeout, visibility_timeout, shuffle, policy).item

    def get_message(self, block=True, timeout=None, *, visibility_timeout=DEFAULT,
                    shuffle=False, policy=None, raw=False):
        """Like get(), but return a Message (id, body, receive_count, sent_at, deadline).
        raw=True: the Message's body is the stored bytes, not unpickled."""
        return self._message(self._receive(block, timeout, visibility_timeout, shuffle,
                                           policy, raw=raw))

    def get_many(self, n, block=True, timeout=None, *, visibility_timeout=DEFAULT,
                 shuffle=False, policy=None, messages=False, raw=False):
        """Receive 1 to n items: waits (as get does) for the first, then takes what else
        is ready, up to n.  Their claims share one commit.  raw=True: each item (or
        Message body) is the stored bytes, never unpickled (a server that hands bodies to
        remote clients as opaque bytes)."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 1:
            raise ValueError("n must be at least 1")
        got = self._receive(block, timeout, visibility_timeout, shuffle, policy, n, raw=raw)
        return [self._message(h) for h in got] if messages else [h.item for h in got]

    def _message(self, h):
        meta = h.meta
        return Message(MessageId(h.seq), h.item, h.receive_count, meta.sent_at, h.deadline,
                       meta.priority, self._state.name, dict(meta.attributes or ()),
                       meta.first_received, meta.last_received, meta.sequence or h.seq,
                       meta.source, _holding=h)

    def peek(self):
        """The Message the next get would receive, without receiving it; None if none."""
        self._check_thread()
        found = self._state.peek(self.load_meta)
        if found is None:
            return None
        seq, meta = found
        return Message(MessageId(seq), codec.decode(meta.body, self._front.allowed_classes,
                                                    self._state.codec),
                       meta.receive_count,
                       meta.sent_at, None, meta.priority, self._state.name,
                       dict(meta.attributes or ()), meta.first_received, meta.last_received,
                       meta.sequence or seq, meta.source)

    def _receive(self, block, timeout, visibility_timeout, shuffle=False, policy=None, n=None,
                 raw=False):
        """One Holding (n None), or a list of 1 to n (all claimed under one mutex)."""
        self._check_thread()
        if timeout is not None or block is not True:
            timeout = check_wait(block, timeout)
        front = self._front
        if visibility_timeout is DEFAULT:
            visibility_timeout = front.visibility_timeout
        if visibility_timeout is not None:
            visibility_timeout = check_visibility(visibility_timeout)
            self._state.acknowledging = True
        txn = self._transaction_block()
        # Ask's arguments by position: a class called with keywords builds a dict of them.
        ask = Ask(self, visibility_timeout, self.load_meta,
                  not isinstance(txn, _AppTransactionBlock), shuffle, policy,
                  front.prefetch, front.prefetch_wait)
        claimed = self._state.claim(self._front, ask, block, timeout, n=n or 1)
        if n is None:
            return self._hand_out(claimed, txn, raw)
        if not isinstance(claimed, list):   # the state returns a lone Holding for n == 1
            claimed = [claimed]
        if txn is None and self._hand_out_plain_batch(claimed, raw):
            return claimed
        got, unreadable = [], None
        decode, allowed = codec.decode, self._front.allowed_classes
        queue_codec = self._state.codec
        holdings, by_item = self._holdings, self._by_item
        for i, h in enumerate(claimed):
            if h.claim_ticket is None and txn is None:
                # _hand_out's plain case, inline (a batch of 100 makes 100 of them); an
                # item that cannot be read takes the full path below.
                try:
                    h.item = (h.meta.body if raw
                              else decode(h.meta.body, allowed, queue_codec))
                except Exception:
                    pass
                else:
                    holdings[h.token] = h
                    same = by_item.setdefault(id(h.item), h)    # _index, inline
                    if same is not h:
                        _index_again(by_item, id(h.item), same, h)
                    got.append(h)
                    continue
            try:
                got.append(self._hand_out(h, txn, raw))
            except UnreadableItem as exc:    # set aside already; the batch goes on without it
                log.warning("ackqueue: %s", exc)
                unreadable = exc
            except BaseException:
                # Nothing of this batch reaches the caller: all of it goes back.
                for other in got + claimed[i + 1:]:
                    self._take_back(other, "its batch could not be handed out")
                raise
        if not got:
            raise unreadable
        return got

    def _hand_out_plain_batch(self, claimed, raw):
        """_hand_out for each of a batch in one pass, when every one is plain: no claim to
        wait for, every body a pickle (or raw) that unpickles without allowed_classes,
        and each item a distinct object not held here already.  False, having changed
        nothing, when one is not: the caller then takes them one by one."""
        if len(claimed) < 2 or any(map(_claim_ticket, claimed)):
            return False
        bodies = [h.meta.body for h in claimed]
        if raw:
            items = bodies
        else:
            if self._front.allowed_classes is not None or self._state.codec != codec.PICKLE:
                return False
            try:
                if not _CODEC_MARKS.isdisjoint(map(_first_byte, bodies)):
                    return False          # text, bytes or JSON: codec.decode's marks
                items = list(map(pickle.loads, bodies))
            except Exception:
                return False              # an unreadable one: set aside, one by one
        ids = list(map(id, items))
        by_item = self._by_item
        if len(set(ids)) < len(ids) or not by_item.keys().isdisjoint(ids):
            return False                  # shared objects (small ints, None): a list each
        for h, item in zip(claimed, items):
            h.item = item
        self._holdings.update(zip(map(_token, claimed), claimed))
        by_item.update(zip(ids, claimed))
        return True

    def _hand_out(self, h, txn, raw=False):
        """Make a claimed Holding the caller's: its claim durable if a policy needs it, its
        item unpickled (else UnreadableItem, with the message set aside; raw: the stored bytes
        as they are), and remembered for the ack."""
        state = self._state
        if h.claim_ticket is not None:
            # A dead-letter policy counts crashes too: the receive is durable first.
            try:
                h.claim_ticket.wait()
            except BaseException:
                state.give_back(h, "its receive could not be recorded")
                raise
        try:
            h.item = (h.meta.body if raw
                      else codec.decode(h.meta.body, self._front.allowed_classes, state.codec))
        except Exception as exc:
            # Set aside for a while, so that the messages behind it are still delivered
            # (a process that has the item's class may read it later), and counted as a
            # receive, so that a dead-letter rule moves it in the end.
            state.give_back(h, "its body could not be read", UNREADABLE_DELAY)
            raise _unreadable(h.seq, state.name, exc) from exc
        self._holdings[h.token] = h
        same = self._by_item.setdefault(id(h.item), h)
        if same is not h:
            _index_again(self._by_item, id(h.item), same, h)
        if txn is not None:
            h.txn = txn
            txn.got.append(h)
        return h

    def _take_back(self, h, why):
        """Undo a delivery that never reached the caller: it goes back to its place."""
        if h.txn is not None and h in h.txn.got:
            h.txn.got.remove(h)
        try:
            self._state.give_back(h, why)
        except StaleAck:
            pass                          # its deadline gave it back meanwhile
        finally:
            self._forget([h])

    def load_meta(self, seq):
        """Read a message that is not in memory (called with the state's mutex held)."""
        if self._zconn is None:
            self._load_meta_connection()
        def read():
            self._tm.begin()
            rec = self._zconn.root()[store.ROOT_KEY].queues[self._state.name]
            m = rec.messages.get(seq)
            try:
                return m, None if m is None else rec.body_of(seq, m)
            except KeyError:          # its Body record is gone (POSKeyError is a KeyError)
                return m, None
        try:
            m, body = read_fresh(read, self._tm.abort)  # a pack may cut a snapshot short
            if body is None:
                raise MessageMissing(
                    f"message {seq} of queue {self._state.name!r} cannot be delivered: its "
                    f"{'record' if m is None else 'body'} is missing from the store (changed "
                    "outside ackqueue, or damaged)")
            return Meta.from_msg(m, body)
        finally:
            self._tm.abort()

    def _load_meta_connection(self):
        self._tm = transaction.TransactionManager()
        self._zconn = self._state.database.db.open(transaction_manager=self._tm)

    # -- ack, nack, task_done -------------------------------------------------------------

    def find(self, x):
        """The live-or-recent holding that x names (a Message, an item got, a MessageId)."""
        if isinstance(x, Message):
            return x.holding if x.queue == self._state.name else None
        same = self._by_item.get(id(x))
        if same is not None:
            if type(same) is not list:
                return same
            # Live deliveries first: an item that unpickles to a shared object (a small
            # int, None) may name an older, given-back delivery of the same message too.
            for h in same:
                if h.released is None:
                    return h
            return same[0]
        if isinstance(x, MessageId):
            for h in reversed(list(self._holdings.values())):
                if h.seq == x:
                    return h
        return None

    def find_many(self, items):
        """[find(x) for x in items], in one pass for the items got here (ack_many)."""
        # The usual case, inline: the item got here, in one delivery (an item is alive
        # while held, so no other object shares its id; a Message is found by find).
        by_item, find = self._by_item, self.find
        return [same if (same := by_item.get(id(x))) is not None and type(same) is not list
                else find(x) for x in items]

    def ack(self, x):
        """Acknowledge: the message leaves the queue for good (durable when this returns)."""
        self.ack_holding(self._require(x))

    def ack_many_holdings(self, holdings, then=None):
        """Acknowledge many deliveries in one commit: all, or (StaleAck) none.

        then (the non-blocking seam): return at once and call then(error) from the
        committer's thread once the ack is durable (error None) or has failed; a delivery
        that is not current raises StaleAck here.  The deliveries leave this connection's
        view at once (as deferred acks do); after a failure other than StaleAck they stay
        in flight, and their Messages can be acknowledged again."""
        self._state.acknowledging = True
        txn = self._transaction_block()
        if then is not None:
            if txn is not None:
                raise AckQueueError("ack_many(then=...) cannot be part of a transaction "
                                    "block: it commits on its own")
            if self._front.acks == "deferred":
                deferred.of(self._state).ack(holdings, self._front.ack_window)
                _forget(holdings)
                then(None)
                return
            try:
                self._state.ack_many(holdings, then=then)
            finally:
                _forget(holdings)
            return
        if txn is not None:
            with self._state.mutex:
                for h in holdings:
                    self._state.check_current(h)
            for h in holdings:
                if h not in txn.got and h not in txn.acks:
                    txn.acks.append(h)
            return
        try:
            if self._front.acks == "deferred":
                deferred.of(self._state).ack(holdings, self._front.ack_window)
                _forget(holdings)         # gone from this process's view at once
            else:
                self._state.ack_many(holdings)
        finally:
            _forget(list(itertools.compress(holdings, map(_released, holdings))))

    def change_visibility_holding(self, h, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
        if math.isnan(seconds) or math.isinf(seconds):
            raise ValueError(f"seconds must be a finite number (0 or less gives the item "
                             f"back now), not {seconds!r}")
        self._state.acknowledging = True
        if seconds <= 0 and h.txn is not None and h in h.txn.got:
            h.txn.got.remove(h)
        self._state.change_visibility(h, seconds)

    def ack_holding(self, h):
        """Acknowledge h (which may be another connection's), in this thread's transaction
        if one is in progress."""
        self._state.acknowledging = True
        txn = self._transaction_block()
        try:
            if txn is not None:
                with self._state.mutex:
                    self._state.check_current(h)
                if h not in txn.got and h not in txn.acks:
                    txn.acks.append(h)
                return
            if self._front.acks == "deferred":
                deferred.of(self._state).ack([h], self._front.ack_window)
            else:
                self._state.ack(h)
        except StaleAck:
            h.holder._forget((h,))
            raise
        h.holder._forget((h,))

    def nack(self, x, delay=0):
        """Give a message back now (or after delay seconds), at its original place."""
        self.nack_holding(self._require(x), delay)

    def nack_holding(self, h, delay=0):
        check_timeout(delay, "delay")
        self._state.acknowledging = True
        if h.txn is not None and h in h.txn.got:
            h.txn.got.remove(h)
        try:
            self._state.give_back(h, "it was given back with nack()", delay)
        finally:
            _forget([h])

    def oldest_unacked(self):
        """The oldest delivery this connection holds and has not acknowledged, or None."""
        for h in list(self._holdings.values()):
            if h.released is None and not h.settling:
                return h
        return None

    def _require(self, x):
        h = self.find(x)
        if h is None:
            raise NotHeld(f"{x!r} is not an item this thread received from queue "
                          f"{self._state.name!r} and has not acknowledged")
        return h

    def _forget(self, holdings):
        pop, by_item = self._holdings.pop, self._by_item
        for h in holdings:
            if pop(h.token, None) is not None:
                if by_item[id(h.item)] is h:          # _unindex, inline
                    del by_item[id(h.item)]
                else:
                    self._unindex(h)
        if len(self._holdings) > self._prune_at:
            self._prune()

    def _unindex(self, h):
        key = id(h.item)
        same = self._by_item[key]
        if same is h:
            del self._by_item[key]
            return
        same.remove(h)
        if len(same) == 1:
            self._by_item[key] = same[0]

    def _prune(self):
        # Given-back deliveries are kept a while so that a late ack says why it is late.
        released = [h for h in self._holdings.values() if h.released is not None]
        for h in released[:max(0, len(released) - RELEASED_KEPT)]:
            del self._holdings[h.token]
            self._unindex(h)
        # Scan again once the holdings have doubled: amortized O(1) per delivery.
        self._prune_at = max(RELEASED_KEPT, 2 * len(self._holdings))

    # -- dead letters ---------------------------------------------------------------------

    def redrive(self, to=None):
        """Move the queue's ready dead letters back to their queues (or to ``to``)."""
        self._check_thread()
        return self._state.redrive(to, self.load_meta)

    # -- transactions ---------------------------------------------------------------------

    def transaction(self):
        """``with conn.transaction():`` makes the gets, puts and acks inside one commit."""
        self._check_thread()
        self._state.acknowledging = True
        if self._block is not None or self._app_block_active():
            raise AckQueueError("a queue transaction is already in progress in this thread "
                                "(transaction blocks do not nest)")
        self._block = TransactionBlock(self)
        return self._block

    def _transaction_block(self):
        if self._block is not None:
            return self._block
        if self._state.database.owned or self._thread is None:
            return None     # only queues on an application's own db=, in its thread
        txn = _active_app_transaction()
        if txn is None:
            return None
        if self._app_block is None or self._app_block.txn is not txn or \
                self._app_block.finished:
            self._app_block = _AppTransactionBlock(self, txn)
        return self._app_block

    def _app_block_active(self):
        block = self._app_block
        return (block is not None and not block.finished
                and block.txn is _active_app_transaction())

    def _app_connection(self):
        """A connection of the queue's db in this thread's transaction.manager."""
        if self._app_zconn is None:
            self._app_zconn = self._state.database.db.open()
        return self._app_zconn

    # -- closing --------------------------------------------------------------------------

    def close(self):
        """Give back everything still held, and release the ZODB connection."""
        if self.closed:
            return
        self._state.give_back_all(self, "its queue connection was closed")
        self._holdings.clear()
        self._by_item.clear()
        self.closed = True
        for conn in (self._zconn, self._app_zconn):
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass      # a connection joined to an unfinished transaction; GC frees it
        self._zconn = self._app_zconn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _message_ids(ops):
    """The MessageIds of the messages that put operations put, in order (None for a
    message that the store numbers when a transaction block commits)."""
    ids = []
    for op in ops:
        if type(op) is store.PutRun:
            ids.extend(map(MessageId, op.seqs))
        else:
            ids.append(None if op.seq is None else MessageId(op.seq))
    return ids


def _unreadable(seq, name, exc):
    """The error get() raises for message seq of queue name, set aside because reading
    its body raised exc: PickleRefused for a pickle in a queue that never unpickles,
    UnreadableItem otherwise."""
    return unreadable_error(int(seq), name, exc, UNREADABLE_DELAY)


def _index_again(by_item, key, same, h):
    """Index h under key, where same (a Holding, or a list of them) is already."""
    if type(same) is list:
        same.append(h)
    else:
        by_item[key] = [same, h]


def _forget(holdings):
    """Drop settled deliveries from the connections that received them."""
    holders = set(map(_holder_of, holdings))
    if len(holders) == 1:             # the usual case: one thread's own deliveries
        holders.pop()._forget(holdings)
        return
    by_holder = {}
    for h in holdings:
        by_holder.setdefault(h.holder, []).append(h)
    for holder, some in by_holder.items():
        holder._forget(some)


_holder_of = operator.attrgetter("holder")
_body_of = operator.itemgetter(1)
_released = operator.attrgetter("released")
_claim_ticket = operator.attrgetter("claim_ticket")
_token = operator.attrgetter("token")
_first_byte = operator.itemgetter(0)
_CODEC_MARKS = frozenset(codec.MARKS)


def _active_app_transaction():
    """The thread's transaction.manager transaction, if one is in progress."""
    manager = getattr(transaction.manager, "manager", transaction.manager)
    txn = getattr(manager, "_txn", None)
    if txn is None or txn.status != "Active":
        return None
    return txn
