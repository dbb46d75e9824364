"""The per-application runtime every front of the service shares (the native API,
Sasquatch's, the SQS protocol, the batch routes): the event loop, the thread pool, the
bridge to the committer, the long poll and its wake-ups, the client sessions and their
reaper, and the error middleware.  It imports no route module: app.py composes the
application, and each front's add_routes(app, api) receives this Api.

Contract (what a front may use; everything else is the runtime's own):
- ``api.service``: the backend (backend.Service); ``api.loop``, ``api.pool``,
  ``api.bridge`` (bridge.Bridge), ``api.max_body``, ``api.client_max_size``,
  ``api.route_limits`` (path -> body limit, checked before the body is read),
  ``api.waiters`` (queue name -> the wake-ups of its long polls), ``api.started``.
- ``await api.run(fn, *args)``: a blocking call in the pool.
- ``await api.queue(name)``: the backend's queue, with a ready listener that wakes long
  polls; ``api.wake(name)`` (loop thread) wakes the long polls on queue name now.
- ``await api.put_many(q, bodies, **kw)``, ``await api.ack_many(cc, messages)``: commits
  submitted through the library's non-blocking seam, returned once durable; no thread
  waits for them.
- ``await api.poll(...)``: the one long poll; ``api.session(client)``: a client's session,
  its lease renewed; ``await api.close_session(s)``; ``api.storage_full(exc)``.

Puts and acks hold no thread while their commit is on its way: the loop submits them
(``put_many(then=)``, ``ack_many(then=)``) and awaits their outcome (bridge.py), so the
commits of concurrent requests gather into the library's group commit.  Other blocking
library calls run in the thread pool.  A long poll holds no thread: it tries a
non-blocking get (on the loop's own thread when the client's connection is free, else in
the pool), then awaits a Waker that the queue's ready listener sets (through
loop.call_soon_threadsafe) or the time at which q.next_ready_at() says something becomes
ready by itself.
"""
import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from zope.interface import implementer

import ackqueue
from ackqueue.errors import EncodingRefused
from ackqueue.interfaces import IServiceRuntime

from . import storagefull
from .bridge import Bridge
from .backend import check_client
from .errors import TOO_LARGE, ApiError, closing_response, error_response, refused
from .listener import RateLimitedLog
from .waker import Waker

__all__ = ["Api", "API", "VERSION"]

log = logging.getLogger("ackqueue.service")

VERSION = ackqueue.__version__


@implementer(IServiceRuntime)
class Api:
    """The runtime of one application over one backend (service)."""

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
        self.waiters = {}               # queue name -> set of waker.Waker
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
        """The backend's queue name (opened in the pool on first use), with the ready
        listener that wakes its long polls."""
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
        self.bridge.call_soon(self.wake, name)

    def wake(self, name):
        """Wake every long poll waiting on queue name (the loop's thread only): each tries
        its receive again."""
        for ev in self.waiters.get(name, ()):
            ev.set()

    def session(self, client):
        """client's session (made on first use), its lease renewed."""
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
        """Reads the body under its limit and timeout, keeps the client's session alive
        while the request runs, and answers every error in the JSON style (errors.py): an
        ApiError as itself, aiohttp's 404/405/413 in the same style, a full storage 503,
        anything else 500 (logged with its traceback)."""
        session = self._active_session(request)
        try:
            if request.body_exists:
                await self._read_body(request)
            return await handler(request)
        except ApiError as exc:
            if exc.status in (408, 413):
                return closing_response(exc.status, exc.code, exc.message, **exc.extra)
            return error_response(exc.status, exc.code, exc.message, headers=exc.headers,
                                  **exc.extra)
        except EncodingRefused as exc:      # a front that put without encodings.check_bodies
            exc = refused(exc)
            return error_response(exc.status, exc.code, exc.message, **exc.extra)
        except web.HTTPRequestEntityTooLarge:
            return closing_response(*TOO_LARGE)
        except web.HTTPException as exc:
            return _http_error(request, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._internal_error(request, exc)
        finally:
            if session is not None:
                session.active -= 1
                session.last_seen = self.service.leases.clock()

    def _active_session(self, request):
        """The session of the request's X-Client-Id, counted active (None without one)."""
        client = request.headers.get("X-Client-Id")
        if client is None:
            return None
        try:
            session = self.session(check_client(client))
        except ValueError:
            return None
        session.active += 1
        return session

    def _internal_error(self, request, exc):
        full = self.storage_full(exc)
        if full is not None:            # no traceback: one line per interval
            return error_response(full.status, full.code, full.message,
                                  headers=full.headers)
        log.exception("ackqueue service: internal error on %s %s", request.method,
                      request.path)
        return error_response(500, "InternalError", "internal error")

    @web.middleware
    async def body_limits(self, request, handler):
        """With --auth, outermost: a body past the limit gets its 413 (connection closed)
        and a stalled one its 408 before the auth middleware reads it for queue names."""
        if request.body_exists:
            try:
                await self._read_body(request)
            except ApiError as exc:
                return closing_response(exc.status, exc.code, exc.message)
            except web.HTTPRequestEntityTooLarge:
                return closing_response(*TOO_LARGE)
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
            self.wake(name)
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
        """End the sessions whose lease ran out, giving back what they held."""
        for s in self.service.leases.expired():
            log.info("ackqueue service: lease of client %r ended; giving back what it held",
                     s.client)
            await self.close_session(s)

    async def close_session(self, s):
        """Close session s's connections (their deliveries go back) and forget its
        receipts."""
        await self.run(self.service.close_session_conns, s)
        self.service.forget(list(s.receipts))

    # -- the long poll -------------------------------------------------------------------

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


def _http_error(request, exc):
    """aiohttp's own HTTP errors (no route, wrong method, ...) in the JSON style."""
    if exc.status == 404:
        return error_response(404, "NotFound", f"no route {request.path}")
    if exc.status == 405:
        return error_response(405, "MethodNotAllowed",
                              f"{request.method} is not allowed on {request.path}")
    return error_response(exc.status, "InvalidRequest", exc.reason)


API = web.AppKey("api", Api)                    # app[API]: the application's Api
