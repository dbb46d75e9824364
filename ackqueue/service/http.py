"""The native HTTP API (/v1) on aiohttp: handlers, errors, long polls.

Puts and acks hold no thread while their commit is on its way: the loop submits them
through the library's non-blocking seam (``put_many(then=)``, ``ack_many(then=)``) and
awaits their outcome (bridge.py), so the commits of concurrent requests gather into the
library's group commit with no thread hop on either side; a request that changes a queue
is answered once its commit is durable.  Other blocking library calls (opening a queue,
counts, browse, purge, a claim that waits for a commit) run in a thread pool.  A long
poll holds no thread: it tries a non-blocking get (the native receive's try on the loop's
own thread when the client's connection is free, core.Service.receive_now; else in the
pool), then awaits a Waker that the queue's ready listener sets (through
loop.call_soon_threadsafe) or the time at which q.next_ready_at() says something becomes
ready by itself.
"""
import asyncio
import base64
import itertools
import json
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ackqueue import codec, jsontext, store
from ackqueue.frames import FRAMES, decode_frames, encode_frames  # noqa: F401 (re-exported)
from ackqueue.errors import DuplicateMessage, EncodingRefused, NotHeld, StaleAck
from ackqueue.queue import MAX_ATTRIBUTES, MAX_DEDUP_ID

from . import codecs, storagefull
from .bridge import Bridge
from .core import check_client, check_name
from .listener import RateLimitedLog
from .waker import Waker

__all__ = ["make_app", "API", "FRAMES", "encode_frames", "decode_frames"]

log = logging.getLogger("ackqueue.service")

MAX_BATCH = 1000
MAX_RECEIVE = 100
MAX_WAIT = 60.0


class ApiError(Exception):
    """An error answer: status, code and message, extra fields of the error object, and
    headers of the response (Retry-After, say)."""

    def __init__(self, status, code, message, *, headers=None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
        self.headers = headers


def error_response(status, code, message, *, headers=None, **extra):
    body = {"error": {"code": code, "message": message}}
    body["error"].update(extra)
    return web.json_response(body, status=status, headers=headers)


# -- framing ------------------------------------------------------------------------------



# -- argument parsing ---------------------------------------------------------------------

def _number(request, key, default, *, lo=0.0, hi=None, integer=False):
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ApiError(400, "InvalidRequest", f"{key} must be a number, not {raw!r}") from None
    if (not integer and not math.isfinite(value)) or value < lo or (hi is not None and value > hi):
        raise ApiError(400, "ValidationError",
                       f"{key} must be between {lo:g} and {hi if hi is not None else 'inf'}")
    return value


def _name(request):
    try:
        return check_name(request.match_info["name"])
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc)) from None


def _client(request, required):
    client = request.headers.get("X-Client-Id") or request.query.get("client")
    if client is None:
        if required:
            raise ApiError(400, "InvalidRequest",
                           "this request needs a client id (header X-Client-Id): the "
                           "deliveries it receives are held for that client's lease")
        return None
    try:
        return check_client(client)
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc)) from None


def _put_options(request):
    opts = {"priority": _number(request, "priority", store.DEFAULT_PRIORITY,
                                hi=store.PRIORITY_MAX, integer=True),
            "delay": _number(request, "delay", 0.0, hi=store.MAX_RETENTION)}
    retention = _number(request, "retention", None, lo=0.001, hi=store.MAX_RETENTION)
    if retention is not None:
        opts["retention"] = retention
    window = _number(request, "dedup_window", None, hi=store.MAX_RETENTION)
    if window is not None:                  # how long the put's dedup id is remembered
        opts["dedup_window"] = window
    raw = request.headers.get("X-Attributes")
    if raw is not None:
        try:
            attributes = jsontext.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "InvalidRequest",
                           f"X-Attributes must be a JSON object{jsontext.why(exc)}") from None
        if not isinstance(attributes, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()):
            raise ApiError(400, "ValidationError",
                           "X-Attributes must be a JSON object of strings to strings")
        if len(attributes) > MAX_ATTRIBUTES:
            raise ApiError(400, "ValidationError",
                           f"at most {MAX_ATTRIBUTES} attributes")
        opts["attributes"] = attributes
    return opts


_TOO_LARGE = (413, "MessageSizeExceeded", "the request body is over the limit")


def _closing(status, code, message, **extra):
    """An error answer that also closes the connection: the rest of a body over the limit,
    or of a stalled one, is never read."""
    resp = error_response(status, code, message, **extra)
    resp.force_close()
    return resp


def _dead_letter_options(request, name):
    """A receive's dead-letter policy (AckQueue's max_receives= and dead_letter=)."""
    opts = {}
    max_receives = _number(request, "max_receives", None, lo=1, hi=1 << 31, integer=True)
    dead_letter = request.query.get("dead_letter")
    if dead_letter is not None:
        if max_receives is None:
            raise ApiError(400, "InvalidRequest", "dead_letter needs max_receives")
        try:
            check_name(dead_letter)
        except ValueError as exc:
            raise ApiError(400, "ValidationError", f"dead_letter: {exc}") from None
        if dead_letter == name:
            raise ApiError(400, "ValidationError",
                           "a queue cannot be its own dead-letter queue")
        opts["dead_letter"] = dead_letter
    if max_receives is not None:
        opts["max_receives"] = max_receives
    return opts


def _dedup(request):
    """(dedup id to store, whether it is an idempotency key)."""
    dedup_id = request.query.get("dedup_id")
    key = request.headers.get("Idempotency-Key")
    if dedup_id is not None and key is not None:
        raise ApiError(400, "InvalidRequest", "give a dedup_id or an Idempotency-Key, not both")
    if key is not None:
        if not 0 < len(key) <= 100:
            raise ApiError(400, "ValidationError", "Idempotency-Key has 1 to 100 characters")
        return "idempotency:" + key, True
    if dedup_id is not None and not 0 < len(dedup_id) <= MAX_DEDUP_ID:
        raise ApiError(400, "ValidationError",
                       f"dedup_id has 1 to {MAX_DEDUP_ID} characters")
    return dedup_id, False


_ENCODINGS = {"text/plain": codec.TEXT, "application/json": codec.JSON,
              "application/x-python-pickle": codec.PICKLE,
              "application/octet-stream": codec.BYTES}


def _encoding(request):
    """How the client says its body is encoded: ?encoding=str|bytes|json|pickle, else the
    Content-Type (text/plain, application/json, application/x-python-pickle), else bytes.
    The service marks the stored body with it (ackqueue.codec) and never unpickles."""
    what = request.query.get("encoding")
    if what is None:
        what = _ENCODINGS.get(request.content_type, codec.BYTES)
    if what not in codec.CODECS:
        raise ApiError(400, "ValidationError",
                       f"encoding must be one of {', '.join(codec.CODECS)}")
    return what


def _marked(what, body, index=None):
    try:
        return codec.mark(what, body)
    except ValueError as exc:
        where = "" if index is None else f"message {index}: "
        raise ApiError(400, "ValidationError",
                       f"{where}the body is not {what} as its encoding says ({exc})") from None


def _message_meta(receipt, m):
    return {"id": int(m.id), "receipt": receipt, "receive_count": m.receive_count,
            "sent_at": m.sent_at, "deadline": m.deadline, "priority": m.priority,
            "attributes": m.attributes, "encoding": codec.kind(m.body)}


def _message_json(receipt, m):
    meta = _message_meta(receipt, m)
    meta["body"] = base64.b64encode(codec.payload(m.body)).decode("ascii")
    return meta


_META = json.JSONEncoder(separators=(",", ":")).encode


def _frames_response(delivered, extra_headers=None):
    parts = []
    for receipt, m in delivered:
        parts.append(_META(_message_meta(receipt, m)).encode())
        parts.append(codec.payload(m.body))
    return web.Response(body=encode_frames(parts), content_type=FRAMES,
                        headers=extra_headers)


# -- the application ----------------------------------------------------------------------

class Api:
    def __init__(self, service, *, pool_size=64, max_body=1 << 20, max_batch_body=16 << 20,
                 client_timeout=60.0):
        self.service = service
        self.client_timeout = client_timeout
        self.client_max_size = max(max_body, max_batch_body) + 65536
        self.pool = ThreadPoolExecutor(pool_size, thread_name_prefix="ackqueue-service")
        self.max_body = max_body
        self.max_batch_body = max_batch_body
        self.route_limits = {}          # path -> its body limit (Sasquatch's routes)
        self.loop = None
        self.bridge = None              # bridge.Bridge: the committer's outcomes, awaited
        self.waiters = {}               # queue name -> set of asyncio.Event
        self.listening = set()          # queue names with a ready listener
        self.reaper = None
        self.stopping = False
        self.started = time.time()
        self.full_log = None            # listener.RateLimitedLog, made on startup

    async def run(self, fn, *args):
        return await self.loop.run_in_executor(self.pool, fn, *args)

    async def put_many(self, q, bodies, **kwargs):
        """q.put_many(bodies, encoded=True, **kwargs) from the loop, returned once durable:
        no thread waits for the commit (the seam's then=, bridge.py)."""
        return await self.bridge.durable(
            lambda then: q.put_many(bodies, encoded=True, then=then, **kwargs))

    async def ack_many(self, cc, messages):
        """Acknowledge messages held by client connection cc in one commit, returned once
        durable: all, or (StaleAck) none.  Submitted on the loop when cc is free; when a
        pool thread uses cc (a claim that waits for its commit), submitted from the pool
        under cc's lock; either way no thread waits for the commit."""
        future, then = self.bridge.pending()
        if cc.lock.acquire(blocking=False):
            try:
                cc.submit_acks(messages, then)
            finally:
                cc.lock.release()
        else:
            await self.run(self.service.ack_submit, cc, messages, then)
        error = await future
        if error is not None:
            raise error

    async def queue(self, name):
        q = self.service.queues.get(name)
        if q is None:
            q = await self.run(self.service.queue, name)
        if name not in self.listening:
            self.listening.add(name)
            q.add_ready_listener(self._listener)
        return q

    def _listener(self, name):
        # Called from any thread with the queue's lock held: hand over to the loop, in
        # the same wake-up as the outcomes of the commit that made the message ready.
        self.bridge.call_soon(self._wake, name)

    def _wake(self, name):
        for ev in self.waiters.get(name, ()):
            ev.set()

    wake = _wake                    # wake(name): every long poll on queue name tries again

    def session(self, client):
        return self.service.leases.touch(client)

    def storage_full(self, exc):
        """The ApiError (503 StorageFull, Retry-After) for a request that exc failed
        because the storage is full, logged once per interval with a count
        (listener.RateLimitedLog); None when exc is something else."""
        full = storagefull.full_error(exc)
        if full is None:
            return None
        if self.full_log is not None:   # (None before the application starts)
            self.full_log.note(storagefull.log_line(full, self.service.path),
                               level=logging.ERROR)
        return ApiError(503, "StorageFull", storagefull.message(full),
                        headers={"Retry-After": str(storagefull.RETRY_AFTER)})

    # -- middleware and lifecycle --------------------------------------------------------

    @web.middleware
    async def errors(self, request, handler):
        client = request.headers.get("X-Client-Id")
        session = None
        if client is not None:
            try:
                session = self.session(check_client(client))
                session.active += 1
            except ValueError:
                session = None
        try:
            if request.body_exists:
                await self._read_body(request)
            return await handler(request)
        except ApiError as exc:
            if exc.status in (408, 413):
                return _closing(exc.status, exc.code, exc.message, **exc.extra)
            return error_response(exc.status, exc.code, exc.message, headers=exc.headers,
                                  **exc.extra)
        except EncodingRefused as exc:      # a front that put without codecs.check_bodies
            exc = codecs.refused(exc)
            return error_response(exc.status, exc.code, exc.message, **exc.extra)
        except web.HTTPRequestEntityTooLarge:
            return _closing(*_TOO_LARGE)
        except web.HTTPException as exc:
            if exc.status == 404:
                return error_response(404, "NotFound", f"no route {request.path}")
            if exc.status == 405:
                return error_response(405, "MethodNotAllowed",
                                      f"{request.method} is not allowed on {request.path}")
            return error_response(exc.status, "InvalidRequest", exc.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            full = self.storage_full(exc)
            if full is not None:            # no traceback: one line per interval
                return error_response(full.status, full.code, full.message,
                                      headers=full.headers)
            log.exception("ackqueue service: internal error on %s %s", request.method,
                          request.path)
            return error_response(500, "InternalError", "internal error")
        finally:
            if session is not None:
                session.active -= 1
                session.last_seen = self.service.leases.clock()

    @web.middleware
    async def body_limits(self, request, handler):
        """With --auth, outermost: a body past the limit gets its 413 (connection closed)
        and a stalled one its 408 before the auth middleware reads it for queue names."""
        if request.body_exists:
            try:
                await self._read_body(request)
            except ApiError as exc:
                return _closing(exc.status, exc.code, exc.message)
            except web.HTTPRequestEntityTooLarge:
                return _closing(*_TOO_LARGE)
        return await handler(request)

    async def _read_body(self, request):
        """Refuse a body over the limit before reading it (413, connection closed, so
        its unread bytes are never parsed as a request), and read the body under the
        client timeout: a client that stalls in the middle of its body is answered 408
        and disconnected rather than holding the request open."""
        limit = self.client_max_size
        if request.method == "POST" and request.path.endswith("/messages"):
            limit = self.max_body               # a put's body is the message
        limit = self.route_limits.get(request.path, limit)
        if (request.content_length or 0) > limit:
            raise ApiError(413, "MessageSizeExceeded",
                           f"the request body is over the limit ({limit} bytes)")
        if request.content.is_eof():
            await request.read()        # all of it arrived already: it cannot stall
            return
        try:
            await asyncio.wait_for(request.read(), self.client_timeout)
        except asyncio.TimeoutError:
            raise ApiError(408, "RequestTimeout",
                           f"no complete body within {self.client_timeout:g} s") from None

    async def on_startup(self, app):
        self.loop = asyncio.get_running_loop()
        self.bridge = Bridge(self.loop)
        self.bridge.attach(self.service.committer())
        self.full_log = RateLimitedLog(log, storagefull.LOG_INTERVAL,
                                       call_later=self.loop.call_later)
        self.reaper = asyncio.ensure_future(self._reap())

    async def on_shutdown(self, app):
        # Long polls end now (answered with what they have: nothing); other requests in
        # progress finish before the queues close.
        self.stopping = True
        for name in list(self.waiters):
            self._wake(name)
        if self.reaper is not None:
            self.reaper.cancel()

    async def on_cleanup(self, app):
        if self.full_log is not None:
            self.full_log.close()           # the count not written yet
        for name in list(self.listening):
            q = self.service.queues.get(name)
            if q is not None:
                q.remove_ready_listener(self._listener)
        await self.run(self.service.close)
        self.pool.shutdown(wait=True)

    async def _reap(self):
        leases = self.service.leases
        period = min(1.0, leases.timeout / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await self.expire_leases()
            except Exception:
                log.exception("ackqueue service: lease reaper")

    async def expire_leases(self):
        for s in self.service.leases.expired():
            log.info("ackqueue service: lease of client %r ended; giving back what it held",
                     s.client)
            await self.close_session(s)

    async def close_session(self, s):
        await self.run(self.service.close_session_conns, s)
        self.service.forget(list(s.receipts))

    # -- handlers ------------------------------------------------------------------------

    async def health(self, request):
        from .sasquatch import VERSION
        return web.json_response({"status": "ok", "version": VERSION,
                                  "threads": threading.active_count(),
                                  "queues_open": len(self.service.queues),
                                  "clients": len(self.service.leases.sessions),
                                  "long_polls": sum(len(w) for w in self.waiters.values()),
                                  "uptime": time.time() - self.started})

    async def openapi(self, request):
        from .openapi import document
        return web.json_response(document())

    async def list_queues(self, request):
        return web.json_response({"queues": await self.run(self.service.list_queues)})

    async def queue_info(self, request):
        name = _name(request)
        q = await self.queue(name)
        stats = await self.run(q.stats)
        return web.json_response({"name": name, "stats": stats})

    async def put(self, request):
        name = _name(request)
        opts = _put_options(request)
        dedup_id, idempotent = _dedup(request)
        if (request.content_length or 0) > self.max_body:
            raise ApiError(413, "MessageSizeExceeded",
                           f"a message body is at most {self.max_body} bytes")
        body = await request.read()
        if len(body) > self.max_body:
            raise ApiError(413, "MessageSizeExceeded",
                           f"a message body is at most {self.max_body} bytes")
        body = _marked(_encoding(request), body)
        q = await self.queue(name)
        codecs.check_bodies(q, [body])
        try:
            [mid] = await self.put_many(q, [body], dedup_ids=[dedup_id], **opts)
        except DuplicateMessage as exc:
            if idempotent and exc.original_id is not None:
                return web.json_response({"id": int(exc.original_id), "duplicate": True})
            raise ApiError(409, "DuplicateMessage", str(exc)) from None
        return web.json_response({"id": int(mid)})

    async def put_batch(self, request):
        name = _name(request)
        opts = _put_options(request)
        dedup_id, idempotent = _dedup(request)
        data = await request.read()
        try:
            bodies = decode_frames(data)
        except ValueError as exc:
            raise ApiError(400, "InvalidRequest", f"bad framing: {exc}") from None
        if not bodies:
            raise ApiError(400, "ValidationError", "a batch has 1 or more messages")
        if len(bodies) > MAX_BATCH:
            raise ApiError(400, "ValidationError", f"a batch has at most {MAX_BATCH} messages")
        for i, b in enumerate(bodies):
            if len(b) > self.max_body:
                raise ApiError(413, "MessageSizeExceeded",
                               f"message {i} is over {self.max_body} bytes", index=i)
        what = _encoding(request)
        bodies = [_marked(what, b, i) for i, b in enumerate(bodies)]
        dedup_ids = None
        if dedup_id is not None:
            dedup_ids = [dedup_id] + [None] * (len(bodies) - 1)
        q = await self.queue(name)
        codecs.check_bodies(q, bodies[:1])      # (one encoding for the whole batch)
        try:
            ids = await self.put_many(q, bodies, dedup_ids=dedup_ids, **opts)
        except DuplicateMessage as exc:
            if idempotent and exc.original_id is not None:
                # One process numbers a batch's messages consecutively (one reservation).
                first = int(exc.original_id)
                return web.json_response({"ids": list(range(first, first + len(bodies))),
                                          "duplicate": True})
            raise ApiError(409, "DuplicateMessage", str(exc)) from None
        return web.json_response({"ids": [int(i) for i in ids]})

    def _deliveries(self, name, receipts):
        found, missing = [], []
        for r in receipts:
            d = self.service.receipts.get(r)
            if d is None or d.queue != name:
                missing.append(r)
            else:
                found.append((r, d))
        if missing:
            raise ApiError(410, "UnknownReceipt",
                           "no delivery held under this receipt (acknowledged already, its "
                           "client's lease ended, or it never existed)", receipts=missing)
        return found

    async def _ack(self, name, receipts):
        found = self._deliveries(name, receipts)
        by_conn = {}
        for r, d in found:
            by_conn.setdefault(d.cconn, []).append((r, d.message))
        for cc, pairs in by_conn.items():
            try:
                await self.ack_many(cc, [m for _, m in pairs])
            except StaleAck as exc:
                if len(pairs) == 1:
                    self.service.forget([pairs[0][0]])
                raise ApiError(409, "StaleReceipt",
                               f"a delivery was given back before its ack ({exc}); none of "
                               "this request's receipts was acknowledged") from None
            self.service.forget([r for r, _ in pairs])
        return len(found)

    async def ack(self, request):
        name = _name(request)
        receipts = await _receipts(request)
        return web.json_response({"acked": await self._ack(name, receipts)})

    async def nack(self, request):
        name = _name(request)
        receipts = await _receipts(request)
        delay = _number(request, "delay", 0.0, hi=store.MAX_RETENTION)
        for r, d in self._deliveries(name, receipts):
            try:
                await self.run(self.service.nack, d.cconn, d.message, delay)
            except NotHeld:
                self.service.forget([r])
                raise ApiError(409, "StaleReceipt", "the delivery was given back already",
                               receipts=[r]) from None
            self.service.forget([r])
        return web.json_response({"nacked": len(receipts)})

    async def change_visibility(self, request):
        name = _name(request)
        receipts = await _receipts(request)
        seconds = _number(request, "visibility_timeout", None, lo=-1e9, hi=43200)
        if seconds is None:
            raise ApiError(400, "InvalidRequest", "visibility_timeout is required")
        for r, d in self._deliveries(name, receipts):
            try:
                await self.run(self.service.change_visibility, d.cconn, d.message, seconds)
            except NotHeld:
                self.service.forget([r])
                raise ApiError(409, "StaleReceipt", "the delivery was given back already",
                               receipts=[r]) from None
            if seconds <= 0:
                self.service.forget([r])
        return web.json_response({"changed": len(receipts)})

    async def receive(self, request):
        name = _name(request)
        client = _client(request, required=True)
        n = _number(request, "max", 1, lo=1, hi=MAX_RECEIVE, integer=True)
        wait = _number(request, "wait", 0.0, hi=MAX_WAIT)
        vt = _number(request, "visibility_timeout", None, lo=0.001, hi=43200)
        dead = _dead_letter_options(request, name)
        acks = [r for r in request.query.getall("ack", []) for r in r.split(",") if r]
        if acks:
            await self._ack(name, acks)       # durable before this receive returns
        session = self.session(client)
        q = await self.queue(name)
        cc = session.conns.get(name)
        if cc is None:
            cc = await self.run(self.service.client_conn, session, name)
        now = None if dead else (lambda: self.service.receive_now(cc, n, vt))
        messages = await self.poll(request, name, q, cc,
                                   lambda: self.service.receive(cc, n, vt, **dead), wait,
                                   done=lambda: session.closed, now=now)
        delivered = self.service.register(name, session, cc, messages)
        if FRAMES in request.headers.get("Accept", ""):
            return _frames_response(delivered)
        return web.json_response({"messages": [_message_json(r, m) for r, m in delivered]})

    async def poll(self, request, name, q, cc, attempt, wait, *, give_back=True,
                   done=lambda: False, now=None):
        """The service's one long poll (the native receive and Sasquatch's use it):
        attempt() in the pool until it returns messages, done() says stop, the service
        stops, or wait seconds pass, holding no thread in between: ready listeners wake
        it, next_ready_at bounds its sleep.  A client that leaves ends it at once (the
        request is cancelled) and, with give_back, what it got goes back.  now: an
        attempt that never blocks, tried first on the loop's thread (no pool hop);
        it returns None where it would block, and attempt() runs in the pool."""
        loop = self.loop
        deadline = loop.time() + wait
        event = Waker(loop)             # waker.py: resumes a loop iteration after set()
        waiters = self.waiters.setdefault(name, set())
        waiters.add(event)
        try:
            while True:
                event.clear()
                messages = None if now is None else now()
                if messages is None:
                    messages = await self._attempt(cc, attempt, give_back)
                if messages or done() or self.stopping:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                ready_at = q.next_ready_at()
                if ready_at is not None:
                    remaining = min(remaining, max(0.0, ready_at - time.time()) + 0.005)
                await event.wait(remaining)
        finally:
            waiters.discard(event)
        if messages and give_back and (request.transport is None
                                       or request.transport.is_closing()):
            await self.run(self.service.give_back, cc, messages)   # its client left
            messages = []
        return messages

    async def _attempt(self, cc, attempt, give_back):
        """attempt() in the pool; a cancelled request gives back what it got."""
        fut = self.loop.run_in_executor(self.pool, attempt)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if give_back:
                def back(f):
                    if not f.cancelled() and f.exception() is None and f.result():
                        self.pool.submit(self.service.give_back, cc, f.result())
                fut.add_done_callback(back)
            raise

    async def purge(self, request):
        q = await self.queue(_name(request))
        return web.json_response({"purged": await self.run(q.purge)})

    async def browse(self, request):
        name = _name(request)
        after = _number(request, "after", -1, lo=-1, integer=True)
        limit = _number(request, "limit", 100, lo=1, hi=1000, integer=True)
        q = await self.queue(name)
        rows, more = await self.run(browse_page, q, after, limit)
        out = [{"id": int(m.id), "state": m.state, "priority": m.priority,
                "receive_count": m.receive_count, "sent_at": m.sent_at, "age": m.age,
                "attributes": m.attributes, "visible_at": m.visible_at,
                "deadline": m.deadline, "expires_at": m.expires_at,
                "encoding": codec.kind(m.body),
                "body": base64.b64encode(codec.payload(m.body)).decode("ascii")}
               for m in rows]
        return web.json_response({"messages": out,
                                  "next_after": int(rows[-1].id) if more else None})

    async def renew(self, request):
        try:
            client = check_client(request.match_info["client"])
        except ValueError as exc:
            raise ApiError(400, "InvalidRequest", str(exc)) from None
        self.session(client)
        return web.json_response({"client": client,
                                  "lease_timeout": self.service.leases.timeout})

    async def end_lease(self, request):
        try:
            client = check_client(request.match_info["client"])
        except ValueError as exc:
            raise ApiError(400, "InvalidRequest", str(exc)) from None
        s = self.service.leases.remove(client)
        if s is not None:
            await self.close_session(s)
        return web.json_response({"client": client, "ended": s is not None})


def browse_page(q, after, limit):
    """(up to limit messages with an id greater than after, in id order; whether more
    follow).  Costs O(limit + log n) reads: q.browse(after=...) starts at a key into the
    message index (before, every page scanned the whole queue: an export was quadratic)."""
    it = q.browse(after=after)
    try:
        rows = list(itertools.islice(it, limit + 1))
    finally:
        it.close()                              # ends its snapshot now
    return rows[:limit], len(rows) > limit


async def _receipts(request):
    """Receipt handles from ?receipt=... (repeatable, comma-separated) or a JSON body
    {"receipts": [...]}."""
    receipts = [r for v in request.query.getall("receipt", []) for r in v.split(",") if r]
    if request.body_exists:                 # read (and cached) by Api._read_body
        data = await request.read()
        if data.strip():
            try:
                doc = jsontext.loads(data)
                more = doc["receipts"]
                if not isinstance(more, list) or not all(isinstance(r, str) for r in more):
                    raise ValueError
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "InvalidRequest",
                               'the body must be {"receipts": ["...", ...]}'
                               + jsontext.why(exc)) from None
            receipts += more
    if not receipts:
        raise ApiError(400, "InvalidRequest", "no receipt handle given")
    if len(receipts) > MAX_BATCH:
        raise ApiError(400, "ValidationError", f"at most {MAX_BATCH} receipts")
    return receipts


API = web.AppKey("api", Api)                    # app[API]: the application's Api


def make_app(service, *, pool_size=64, max_body=1 << 20, client_timeout=60.0,
             sasquatch=None, auth=None):
    """The aiohttp application serving service's native API, Sasquatch's API (sasquatch:
    its settings), the stats page and metrics (auth: an auth.Auth, or None)."""
    api = Api(service, pool_size=pool_size, max_body=max_body, client_timeout=client_timeout)
    app = web.Application(middlewares=[api.errors], client_max_size=api.client_max_size)
    app[API] = api
    app.on_startup.append(api.on_startup)
    app.on_shutdown.append(api.on_shutdown)
    app.on_cleanup.append(api.on_cleanup)
    r = app.router
    r.add_get("/health", api.health)
    r.add_get("/openapi.json", api.openapi)
    r.add_get("/v1/queues", api.list_queues)
    r.add_get("/v1/queues/{name}", api.queue_info)
    r.add_post("/v1/queues/{name}/messages", api.put)
    r.add_post("/v1/queues/{name}/batch", api.put_batch)
    r.add_post("/v1/queues/{name}/receive", api.receive)
    r.add_post("/v1/queues/{name}/ack", api.ack)
    r.add_delete("/v1/queues/{name}/messages", api.ack)
    r.add_post("/v1/queues/{name}/nack", api.nack)
    r.add_post("/v1/queues/{name}/visibility", api.change_visibility)
    r.add_post("/v1/queues/{name}/purge", api.purge)
    r.add_get("/v1/queues/{name}/browse", api.browse)
    r.add_post("/v1/leases/{client}", api.renew)
    r.add_delete("/v1/leases/{client}", api.end_lease)
    from . import admin, batch, batches, codecs, stats
    batch.add_routes(app, api)                  # POST /v1/batch (batch.py)
    admin.add_routes(app, api)                  # redrive, pack (admin.py)
    codecs.add_routes(app, api)                 # /v1/queues/{name}/codec (codecs.py)
    batches.add_routes(app, api)                # leased batches, row puts (stream processors)
    stats.add_routes(app, api)                  # /stats, /stats.json, /metrics (stats.py)
    from .sasquatch import add_routes as add_sasquatch_routes
    add_sasquatch_routes(app, api, sasquatch)   # Sasquatch's API on the same port
    from .sqs import add_routes as add_sqs_routes
    add_sqs_routes(app, api, auth)              # the SQS JSON protocol on POST / (sqs/)
    if auth is not None:                        # before anything else runs but the body's
        app.middlewares.insert(0, auth.middleware)    # size and time checks, just below
        app.middlewares.insert(0, api.body_limits)
    return app
