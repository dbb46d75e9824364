"""The remote drop-in: ``AckQueue(path="http://HOST:PORT", name=...)`` through ``ackqueue serve``.

The front (ackqueue.queue.AckQueue) stays the same class; with an http:// or https:// path
it opens a ``RemoteDatabase`` instead of a ZODB database.  The pieces here play the parts
the front expects:

- ``RemoteConnection``: the per-thread proxy (what QueueConnection is for a ZODB queue):
  put/put_many/get/get_message/get_many/ack_holding/nack_holding/change_visibility_holding/
  peek/oldest_unacked/find/close, each one HTTP request to the service's native API (/v1);
- ``RemoteState``: what the front asks of its state (the mutex and conditions named as
  queue.Queue names them, counts, unfinished, ready_count, size_for_maxsize, purge);
- ``RemoteDatabase``: the service address, this process's client id and its lease, and a
  background thread that renews the lease, gives back what ended threads held, and makes
  deferred acks durable (ack_with_next_get).

HTTP: one persistent connection per thread (ackqueue.remote.http), reopened by itself.  An operation
waits up to wait_timeout seconds (30 by default, ``?wait_timeout=`` in the URL) for the
service, retrying refused or cut-off requests, then raises ServerUnavailable.  Every put
carries an Idempotency-Key, so a put retried after a cut-off request is stored once.

Items are encoded here with ackqueue.codec (a str as text, bytes as bytes, anything else
pickled; the service stores the bytes and never unpickles them) and decoded here on
receive (allowed_classes applies here).

Deliveries are held by this process's client id (host:pid:random), whose lease a background
thread renews every lease/3 seconds: when the process dies, the service gives back what it
held once the lease ends (``ackqueue serve --lease-timeout``, 30 s by default).  A thread
of a live process that ends holding items gives them back (nack) within about a second, by
the embedded queue's rule (the program acknowledges on this queue, or the thread died of an
exception).
"""
import base64
import json
import logging
import queue as _stdlib_queue
import re
import threading
import time
import urllib.parse
import uuid
import weakref

from zope.interface import implementer
from .. import codec, store
from ..connection import (ThreadBound, check_item_sizes, check_visibility, check_wait,
                          watch_thread_failure)
from ..errors import AckQueueError, NotHeld, ShutDown, StaleAck, unreadable_error
from ..frames import FRAMES, decode_frames, encode_frames
from ..message import Message, MessageId
from ..state import check_timeout
from .block import RemoteBlock, not_in_block
from .http import Interrupted, raise_for, unsupported
from ..interfaces import IRemoteConnection

__all__ = ["RemoteConnection", "RemoteHolding"]

log = logging.getLogger(__name__)

LONG_POLL_SLICE = 20.0        # the longest one receive request waits on the service
POLL_INTERVAL = 0.05          # put() waiting for room under maxsize, join(): counts polled
TICK = 0.05                   # the background thread's period (deferred acks: 50 ms)
REAP_INTERVAL = 0.2           # ended threads' holdings looked for
UNREADABLE_DELAY = 60.0       # a received body that cannot be decoded is set aside so long
_DEFAULT = object()           # connection.DEFAULT's role: the queue's visibility timeout

_CONTENT_TYPES = {codec.PICKLE: "application/x-python-pickle", codec.TEXT: "text/plain",
                  codec.BYTES: "application/octet-stream", codec.JSON: "application/json"}
_MARKS = {codec.TEXT: b"\x01", codec.BYTES: b"\x02", codec.JSON: b"\x03"}
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,80}\Z")


def _restore(encoding, payload):
    """The stored body (codec's marked bytes) for a payload the service returned."""
    mark = _MARKS.get(encoding)
    return payload if mark is None else mark + payload


def _put_options(opts, dedup_id):
    """(query parameters, headers) of a put's options; a put without a dedup id carries an
    Idempotency-Key, so that a retry after a cut-off request is stored once."""
    query, headers = [], {}
    if opts is not None:
        if opts.priority != store.DEFAULT_PRIORITY:
            query.append(f"priority={opts.priority}")
        if opts.delay:
            query.append(f"delay={opts.delay!r}")
        if opts.retention != store.DEFAULT_RETENTION:
            query.append(f"retention={opts.retention!r}")
        if opts.attributes:
            headers["X-Attributes"] = json.dumps(dict(opts.attributes))
    if dedup_id is not None:
        query.append("dedup_id=" + urllib.parse.quote(dedup_id, safe=""))
        if opts is not None and opts.dedup_window != store.DEFAULT_DEDUP_WINDOW:
            query.append(f"dedup_window={opts.dedup_window!r}")
    else:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    return query, headers


def _receive_query(n, wait, visibility_timeout, policy):
    """A receive's query parameters; the dead-letter policy (max_receives, dead_letter)
    travels with each receive, as the embedded queue applies it at each get."""
    query = [f"max={n}", f"wait={wait:.3f}"]
    if visibility_timeout is not None:
        query.append(f"visibility_timeout={visibility_timeout!r}")
    if policy is not None:
        query.append(f"max_receives={policy.max_receives}")
        if policy.target is not None:
            query.append("dead_letter=" + urllib.parse.quote(policy.target, safe=""))
    return query


def _put_request(bodies, query, headers):
    """(path, request body) of a put: one message as itself with its Content-Type, a batch
    as frames of one encoding (a mixed batch travels as pickles); adds to query/headers."""
    kinds = {codec.kind(b) for b in bodies}
    if len(bodies) == 1:
        headers["Content-Type"] = _CONTENT_TYPES[kinds.pop()]
        return "/messages", codec.payload(bodies[0])
    if len(kinds) == 1:
        kind = kinds.pop()
        payloads = [codec.payload(b) for b in bodies]
    else:
        kind = codec.PICKLE
        payloads = [b if codec.kind(b) == codec.PICKLE else _pickled(codec.decode(b))
                    for b in bodies]
    query.append(f"encoding={kind}")
    headers["Content-Type"] = "application/vnd.ackqueue.frames"
    return "/batch", encode_frames(payloads)


class RemoteHolding:
    """One delivery held by this process (the service's receipt handle names it)."""

    __slots__ = ("receipt", "seq", "item", "meta", "holder", "deadline", "released",
                 "token", "__weakref__")

    def __init__(self, receipt, seq, item, meta, holder):
        self.receipt = receipt
        self.token = receipt
        self.seq = seq
        self.item = item
        self.meta = meta
        self.holder = holder
        self.deadline = meta.get("deadline")
        self.released = None


@implementer(IRemoteConnection)
class RemoteConnection(ThreadBound):
    """One thread's handle on a remote queue: the front's proxy (see QueueConnection)."""

    thread_bound = True
    shuffles = False              # get(shuffle=True): the service delivers in queue order

    def __init__(self, front, state, thread_bound=True):
        self._front = front
        self.state = state
        self.database = state.database
        if thread_bound:
            self._thread = weakref.ref(threading.current_thread())
            watch_thread_failure(threading.current_thread())
        else:
            self.thread_bound = False
            self._thread = None
        self.holdings = {}           # receipt -> RemoteHolding, oldest delivery first
        self.by_item = {}            # id(item) -> [RemoteHolding]
        self._pending = []            # receipts acknowledged, riding on the next receive
        self._pending_since = None
        self._lock = threading.Lock()  # _pending, shared with the background thread
        self._block = None            # the transaction block in progress (ackqueue.remote.block)
        self.closed = False
        state.conns.add(self)

    def __repr__(self):
        return f"<RemoteConnection to {self.state.name!r} at {self.database.description}>"

    def _check_thread(self):
        if self.closed:
            raise AckQueueError("this queue connection is closed")
        if self._thread is not None and self._thread() is not threading.current_thread():
            raise AckQueueError(f"{self!r} belongs to another thread")

    def _path(self, what):
        return self.database.queue_path(self.state.name, what)

    # -- put -------------------------------------------------------------------------------

    def put(self, item, block=True, timeout=None, *, opts=None, dedup_id=None):
        self.put_many([item], block, timeout, opts=opts, dedup_ids=[dedup_id])

    def put_many(self, items, block=True, timeout=None, *, opts=None, dedup_ids=None,
                 encoded=False, then=None):
        if then is not None:
            raise unsupported("put_many(then=...), the non-blocking seam,",
                               "it serves an event loop inside the process that holds "
                               "the storage; call put_many() from a thread instead")
        timeout = check_wait(block, timeout)
        if self._front.is_shutdown:
            raise ShutDown
        pairs = self._pairs(items, encoded)
        check_item_sizes(pairs, self._front.max_item_size)
        if not pairs:
            return []
        dedup_ids = dedup_ids or [None] * len(pairs)
        if len(pairs) > 1 and any(d is not None for d in dedup_ids):
            raise unsupported("put_many(dedup_ids=...)", "the service's batch put takes "
                               "one idempotency key for the whole batch; put() each item "
                               "with its dedup_id")
        self._wait_for_room(len(pairs), block, timeout)
        bodies = [body for _, body in pairs]
        if self._block is not None:
            return self._block.put(bodies, opts, dedup_ids)
        return self._send_put(bodies, opts, dedup_ids)

    def _send_put(self, bodies, opts, dedup_ids):
        """The put request of stored bodies; their MessageIds (None: a retried put with a
        dedup id, which its cut-off first attempt stored)."""
        query, headers = _put_options(opts, dedup_ids[0])
        path, data = _put_request(bodies, query, headers)
        url = self._path(path) + ("?" + "&".join(query) if query else "")
        status, doc, attempt = self.database.call("POST", url, data, headers)
        if status == 409 and attempt and dedup_ids[0] is not None:
            # A retried put with a dedup id: the cut-off attempt stored it.
            return [None] * len(bodies)
        raise_for(status, doc)
        if "ids" in doc:
            return [MessageId(i) for i in doc["ids"]]
        return [MessageId(doc["id"])]

    def _pairs(self, items, encoded):
        """(item, stored body) of each item: encoded by the queue's codec, or already
        bytes (encoded=True)."""
        if not encoded:
            return [(item, codec.encode(item, self.state.codec)) for item in items]
        pairs = []
        for b in items:
            if isinstance(b, (bytearray, memoryview)):
                b = bytes(b)
            if not isinstance(b, bytes):
                raise TypeError(f"an encoded item must be bytes, not {type(b).__name__}")
            pairs.append((b, b))
        return pairs

    def _wait_for_room(self, count, block, timeout):
        maxsize = self._front.maxsize
        if maxsize <= 0:
            return
        end = None if timeout is None else time.monotonic() + timeout
        state = self.state
        while True:
            if self._front.is_shutdown:
                raise ShutDown
            if state.size_for_maxsize() + count <= max(maxsize, count):
                return
            if not block:
                raise _stdlib_queue.Full
            wait = POLL_INTERVAL
            if end is not None:
                wait = min(wait, end - time.monotonic())
                if wait <= 0:
                    raise _stdlib_queue.Full
            with state.mutex:
                if not self._front.is_shutdown:
                    state.not_full.wait(wait)

    # -- get -------------------------------------------------------------------------------

    def get(self, block=True, timeout=None, *, visibility_timeout=_DEFAULT, shuffle=False,
            policy=None):
        return self._receive(block, timeout, visibility_timeout, shuffle, policy)[0].item

    def get_message(self, block=True, timeout=None, *, visibility_timeout=_DEFAULT,
                    shuffle=False, policy=None, raw=False):
        return self._message(self._receive(block, timeout, visibility_timeout, shuffle,
                                           policy, raw=raw)[0])

    def get_many(self, n, block=True, timeout=None, *, visibility_timeout=_DEFAULT,
                 shuffle=False, policy=None, messages=False, raw=False):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 1:
            raise ValueError("n must be at least 1")
        got = []
        while n > 0:     # the service hands out at most 100 per receive
            try:
                more = self._receive(block and not got, timeout if not got else None,
                                     visibility_timeout, shuffle, policy, min(n, 100), raw)
            except _stdlib_queue.Empty:
                if got:
                    break
                raise
            got += more
            n -= len(more)
            if len(more) < 100:
                break
        return [self._message(h) for h in got] if messages else [h.item for h in got]

    def _message(self, h):
        m = h.meta
        return Message(MessageId(h.seq), h.item, m.get("receive_count", 1),
                       m.get("sent_at"), m.get("deadline"), m.get("priority"),
                       self.state.name, dict(m.get("attributes") or {}), None, None,
                       h.seq, None, _holding=h)

    def _receive(self, block, timeout, visibility_timeout, shuffle=False, policy=None,
                 n=1, raw=False):
        self._check_thread()
        if shuffle and not self.shuffles:
            raise unsupported("get(shuffle=True)", "the service delivers in queue order")
        timeout = check_wait(block, timeout)
        if visibility_timeout is _DEFAULT or visibility_timeout is ...:
            visibility_timeout = self._front.visibility_timeout
        visibility_timeout = check_visibility(visibility_timeout)
        if visibility_timeout is not None:
            self.state.acknowledging = True
        end = None if timeout is None else time.monotonic() + timeout
        front, state = self._front, self.state
        while True:
            if front.shutdown_immediate:
                raise ShutDown
            if not block or front.is_shutdown:
                wait = 0.0
            else:
                wait = LONG_POLL_SLICE
                if end is not None:
                    wait = max(0.0, min(wait, end - time.monotonic()))
            with self._lock:
                acks, self._pending, self._pending_since = self._pending, [], None
            h = self.database.http()
            with state.polls_lock:
                state.polls[threading.get_ident()] = h
            try:
                if front.is_shutdown and wait:     # a shutdown came in meanwhile
                    if acks:
                        self._ack_now(acks)
                    continue
                pairs = self._poll(n, wait, visibility_timeout, policy, shuffle, acks)
            except Interrupted:
                if acks:
                    self._ack_now(acks)
                continue
            finally:
                with state.polls_lock:
                    state.polls.pop(threading.get_ident(), None)
            if pairs is None:
                # A deferred ack was stale: the receive was not made; settle the acks
                # one by one (a stale one is logged: its item is delivered again).
                self._ack_now(acks)
                continue
            got = self._hand_out(pairs, raw)
            if got:
                return got
            if front.is_shutdown:
                raise ShutDown
            if not block or (end is not None and time.monotonic() >= end):
                raise _stdlib_queue.Empty

    def _poll(self, n, wait, visibility_timeout, policy, shuffle, acks):
        """One receive request, waiting up to wait seconds, with the deferred acks acks
        riding on it: [(metadata, stored body)] (none: nothing came), or None when one of
        acks was stale and the receive was not made."""
        query = _receive_query(n, wait, visibility_timeout, policy)
        if acks:
            query.append("ack=" + ",".join(acks))
        url = self._path("/receive?" + "&".join(query))
        status, doc, _ = self.database.call("POST", url, headers={"Accept": FRAMES},
                                            read_timeout=wait + self.database.target.wait_timeout)
        if status in (409, 410) and acks:
            return None
        raise_for(status, doc)
        if isinstance(doc, dict):          # a JSON answer (a service without frames)
            pairs = [(m, base64.b64decode(m["body"])) for m in doc.get("messages", ())]
        else:
            parts = decode_frames(doc)
            pairs = [(json.loads(parts[i]), parts[i + 1]) for i in range(0, len(parts), 2)]
        return [(meta, _restore(meta.get("encoding"), bytes(payload)))
                for meta, payload in pairs]

    def _decode(self, body):
        """The item of a received body: a pickle only in a queue whose codec is "pickle"
        (the queue's codec is asked of the service once, at the first pickle)."""
        if codec.kind(body) != codec.PICKLE:
            return codec.decode(body)
        return codec.decode(body, self._front.allowed_classes, self.state.codec)

    def _hand_out(self, pairs, raw):
        got, unreadable = [], None
        for meta, body in pairs:
            try:
                item = body if raw else self._decode(body)
            except Exception as exc:
                self.nack_receipts([meta["receipt"]], UNREADABLE_DELAY)
                unreadable = unreadable_error(meta["id"], self.state.name, exc,
                                              UNREADABLE_DELAY)
                log.warning("ackqueue: %s", unreadable)
                continue
            h = RemoteHolding(meta["receipt"], meta["id"], item, meta, self)
            self.holdings[h.receipt] = h
            self.by_item.setdefault(id(item), []).append(h)
            got.append(h)
        if pairs and not got:
            raise unreadable
        return got

    def peek(self):
        """The Message the next get() would receive (highest priority, then oldest ready),
        read with the service's browse pages; None if none is ready."""
        self._check_thread()
        best = body = None
        for m, stored in self.state.browse_rows():
            if m["state"] == "ready" and (best is None or (-m["priority"], m["id"]) <
                                          (-best["priority"], best["id"])):
                best, body = m, stored
        if best is None:
            return None
        return Message(MessageId(best["id"]), self._decode(body),
                       best["receive_count"], best["sent_at"], None, best["priority"],
                       self.state.name, dict(best.get("attributes") or {}), None, None,
                       best["id"], None)

    # -- ack, nack, visibility ------------------------------------------------------------

    def find(self, x):
        if isinstance(x, Message):
            return x.holding if x.queue == self.state.name else None
        same = self.by_item.get(id(x))
        if same:
            return same[0]
        if isinstance(x, MessageId):
            for h in reversed(list(self.holdings.values())):
                if h.seq == x:
                    return h
        return None

    def find_many(self, items):
        return [self.find(x) for x in items]

    def oldest_unacked(self):
        for h in self.holdings.values():
            return h
        return None

    def forget(self, h):
        """Stop tracking delivery h here (acknowledged or given back on the service)."""
        if self.holdings.pop(h.receipt, None) is not None:
            same = self.by_item.get(id(h.item))
            if same is not None:
                if h in same:
                    same.remove(h)
                if not same:
                    del self.by_item[id(h.item)]

    def ack_holding(self, h):
        self.state.acknowledging = True
        if h.receipt not in h.holder.holdings:
            if h.released is not None:
                raise StaleAck(f"{h.item!r} was given back before this ack "
                               f"({h.released}); it may be held by someone else now")
            raise NotHeld(f"{h.item!r} was acknowledged already")
        if self._block is not None:
            return self._block.ack(h)
        if (self.database.ack_with_next_get and h.holder is self and self._thread is not None
                and not self.closed):
            # Deferred: durable with this thread's next receive, a flush within 50 ms,
            # or close() (see README "ack_with_next_get").
            self.forget(h)
            with self._lock:
                if not self._pending:
                    self._pending_since = time.monotonic()
                self._pending.append(h.receipt)
            return
        try:
            self._ack_receipts([h.receipt])
        finally:
            h.holder.forget(h)

    def ack_many_holdings(self, holdings, then=None):
        if then is not None:
            raise unsupported("ack_many(then=...), the non-blocking seam,",
                               "it serves an event loop inside the process that holds "
                               "the storage; call ack_many() from a thread instead")
        self.state.acknowledging = True
        if self._block is not None:
            for h in holdings:
                self._block.ack(h)
            return
        try:
            self._ack_receipts([h.receipt for h in holdings])
        finally:
            for h in holdings:
                h.holder.forget(h)

    def _ack_receipts(self, receipts):
        status, doc, attempt = self.database.call(
            "POST", self._path("/ack"), json.dumps({"receipts": receipts}).encode(),
            {"Content-Type": "application/json"})
        if status in (409, 410) and attempt:
            raise StaleAck("the ack's first request was cut off and the service no longer "
                           "knows the delivery: it was either acknowledged by that request "
                           "or given back (then it is delivered again)")
        raise_for(status, doc)

    def _ack_now(self, receipts):
        """Deferred acks settled one by one; a stale one is logged, not raised."""
        for r in receipts:
            try:
                self._ack_receipts([r])
            except StaleAck as exc:
                log.warning("ackqueue: a deferred ack (ack_with_next_get) came too late; "
                            "its item will be delivered again: %s", exc)

    def flush_acks(self, older_than=None):
        """Make deferred acks durable now (older_than: only once the oldest waited so
        long)."""
        with self._lock:
            if not self._pending:
                return
            if older_than is not None and \
                    time.monotonic() - self._pending_since < older_than:
                return
            acks, self._pending, self._pending_since = self._pending, [], None
        try:
            self._ack_now(acks)
        except AckQueueError:
            with self._lock:          # the service away: keep them for the next try
                self._pending[:0] = acks
                self._pending_since = self._pending_since or time.monotonic()
            raise

    def nack_holding(self, h, delay=0):
        check_timeout(delay, "delay")
        if self._block is not None:
            raise not_in_block("nack()")
        self.state.acknowledging = True
        try:
            self.nack_receipts([h.receipt], delay)
        finally:
            h.released = "given back with nack()"
            h.holder.forget(h)

    def nack_receipts(self, receipts, delay=0):
        """Give back the deliveries named by receipts on the service, visible again after
        delay seconds (raises for an error answer)."""
        status, doc, _ = self.database.call(
            "POST", self._path(f"/nack?delay={float(delay)!r}"),
            json.dumps({"receipts": receipts}).encode(), {"Content-Type": "application/json"})
        raise_for(status, doc)

    def change_visibility_holding(self, h, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            raise ValueError(f"seconds must be a finite number, not {seconds!r}")
        if self._block is not None:
            raise not_in_block("change_visibility()")
        self.state.acknowledging = True
        seconds = max(-1e9, min(float(seconds), 43200.0))
        try:
            self._send_visibility(h.receipt, seconds)
        except StaleAck:
            h.holder.forget(h)
            raise
        if seconds <= 0:
            h.released = "given back by change_visibility()"
            h.holder.forget(h)

    def _send_visibility(self, receipt, seconds):
        status, doc, _ = self.database.call(
            "POST", self._path(f"/visibility?receipt={receipt}"
                               f"&visibility_timeout={seconds!r}"))
        raise_for(status, doc)

    def give_back_all(self, why):
        held = list(self.holdings.values())
        if held:
            log.info("ackqueue: giving back %d item(s) of queue %r: %s", len(held),
                     self.state.name, why)
            for h in held:
                try:
                    self.nack_receipts([h.receipt])
                except StaleAck:
                    pass
                h.released = why
                self.forget(h)

    # -- what the service cannot do ---------------------------------------------------------

    def transaction(self):
        """``with conn.transaction():``: the block's puts and acks travel as one atomic
        batch request when it ends; its gets are made at once (see ackqueue.remote.block)."""
        self._check_thread()
        self.state.acknowledging = True
        if self._block is not None:
            raise AckQueueError("a queue transaction is already in progress in this thread "
                                "(transaction blocks do not nest)")
        self.flush_acks()             # acks riding on the next get are not the block's
        self._block = RemoteBlock(self)
        return self._block

    def redrive(self, to=None):
        """POST /v1/queues/NAME/redrive[?to=]: the service moves the ready dead letters."""
        self._check_thread()
        return self._send_redrive(to)

    def _send_redrive(self, to):
        what = "/redrive" + ("" if to is None else "?to=" + urllib.parse.quote(to, safe=""))
        status, doc, _ = self.database.call("POST", self._path(what))
        raise_for(status, doc)
        return doc["moved"]

    def close(self):
        if self.closed:
            return
        try:
            self.flush_acks()
            self.give_back_all("its queue was closed")
        except AckQueueError as exc:
            log.warning("ackqueue: closing %r: %s (the service gives back what this "
                        "process held when its lease ends)", self, exc)
        self.closed = True


def _pickled(item):
    return codec.pickle_item(item)
