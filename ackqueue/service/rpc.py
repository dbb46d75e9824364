"""Sasquatch's HTTP API on the service's port: POST /send, /send_batch, /receive (and the
legacy /dequeue), /delete, /change_visibility, /delete_all, /queue_length, /enqueue;
GET /queues, /health (shared with the native API), /stats (JSON; the HTML page is the
stats page's).

Every request goes through the library's queues and group commit, as the native API's do
(runtime.Api: its thread pool, ready listeners and long-poll waiters).
Sasquatch's defaults and limits (SasquatchSettings: 4 receives then dead letter or drop,
5,000 messages per queue, 256 KB bodies, ...) apply to requests through this API only: the
native API and Python keep the library's defaults.

Bodies: what Sasquatch sends is text, stored as a str (codec "str"), so a Python consumer
gets a str.  A stored body that is not text is returned with "message_body_encoding":
"json" (the body is the JSON text), "bytes" or "pickle" (the body is base64, never
unpickled).  A queue whose name ends in ``_lifo`` is LIFO (an AckLifoQueue); a queue open as
another kind answers 409 QueueKindMismatch.

Receipts: /delete and /change_visibility take an optional queue_name (Sasquatch's clients
send none); a receipt of another queue than the one named matches nothing, and with
``--auth`` the read right is checked on each receipt's own queue (403, nothing done).
"""
import asyncio
import base64
import hashlib
import queue as _stdlib_queue
import random
import re
import threading
import time
from collections import Counter

from aiohttp import web

from ackqueue import codec, jsontext, store
from ackqueue.browse import READY
from ackqueue.errors import DuplicateMessage, EncodingRefused, NotHeld, QueueKindMismatch
from ackqueue.state import PutOptions

from . import auth
from .config import SasquatchSettings
from .backend import ClientConn, Session, take_now
from .errors import ApiError, refused
from .runtime import VERSION

__all__ = ["add_routes", "sasquatch_stats", "VERSION"]

_QUEUE = re.compile(r"[A-Za-z0-9_\-]{1,80}\Z")
_DEDUP = re.compile(r"[A-Za-z0-9]{1,128}\Z")
MAX_BATCH = 10
MAX_DELAY = 43200
MAX_VISIBILITY = 43200
MAX_WAIT = 20
MAX_ATTRIBUTES, MAX_KEY, MAX_VALUE = 10, 64, 1024
OVERHEAD = 4096                 # JSON's share of a /send body past the message itself


def _fail(code, message, status=400):
    raise ApiError(status, code, message)


# -- validation of JSON fields ------------------------------------------------------------

def _int(doc, key, default, lo, hi, required=False):
    if key not in doc or doc[key] is None:
        if required:
            _fail("InvalidRequest", f"{key} is required")
        return default
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (
            isinstance(v, float) and not v.is_integer()):
        _fail("InvalidRequest", f"{key} must be an integer")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        _fail("ValidationError", f"{key} must be between {lo} and "
                                 f"{hi if hi is not None else 'inf'}")
    return v


def _bool(doc, key):
    v = doc.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        _fail("InvalidRequest", f"{key} must be true or false")
    return v


def _queue_name(doc, key="queue_name", required=True, star=False):
    v = doc.get(key)
    if v is None:
        if required:
            _fail("InvalidRequest", f"{key} is required")
        return None
    if not isinstance(v, str):
        _fail("InvalidRequest", f"{key} must be a string")
    if star and v == "*":
        return v
    if not _QUEUE.match(v):
        _fail("ValidationError", f"{key} is 1 to 80 characters among A-Z a-z 0-9 _ -")
    return v


def _receipts(doc):
    v = doc.get("receipt_handles")
    if v is None:
        _fail("InvalidRequest", "receipt_handles is required")
    if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
        _fail("InvalidRequest", "receipt_handles must be an array of strings")
    if not 1 <= len(v) <= MAX_BATCH:
        _fail("ValidationError", f"receipt_handles has 1 to {MAX_BATCH} handles")
    if not all(0 < len(r) <= 200 for r in v):
        _fail("ValidationError", "a receipt handle has 1 to 200 characters")
    return v


def _json_object(data):
    try:
        doc = jsontext.loads(data)
    except ValueError as exc:                   # (UnicodeDecodeError is one)
        _fail("InvalidRequest", "the request body is not valid JSON" + jsontext.why(exc))
    if not isinstance(doc, dict):
        _fail("InvalidRequest", "the request body must be a JSON object")
    return doc


async def _read(request, limit):
    """The request body, at most limit bytes (413, the connection closed, past it)."""
    if request.content_length is not None and request.content_length > limit:
        raise _TooLarge(limit)
    data = await request.read()     # read once, under the service's size and time limits
    if len(data) > limit:
        raise _TooLarge(limit)
    return data


class _TooLarge(Exception):
    def __init__(self, limit):
        super().__init__(limit)
        self.limit = limit


def _body_json(raw):
    """(message_body, md5, extra fields) of a stored body: text as it is; JSON as its
    text; bytes and pickles in base64 (never unpickled)."""
    what = codec.kind(raw)
    data = codec.payload(raw)
    md5 = hashlib.md5(data).hexdigest()
    if what == codec.TEXT:
        return data.decode("utf-8", "surrogatepass"), md5, {}
    if what == codec.JSON:
        return data.decode("utf-8"), md5, {"message_body_encoding": "json"}
    return (base64.b64encode(data).decode("ascii"), md5,
            {"message_body_encoding": what})


class Sasquatch:
    def __init__(self, api, settings=None):
        self.api = api
        self.service = api.service
        self.cfg = settings or SasquatchSettings()
        self.limited = {}           # queue name -> AckQueue with maxsize (for sends)
        self.conns = {}             # queue name -> ClientConn holding this API's deliveries
        self.lock = threading.Lock()    # limited and conns, changed from pool threads
        # Deliveries through this API belong to no client lease: they come back at their
        # visibility deadline, as Sasquatch's do.
        self.session = Session("sasquatch", 0.0)
        self.counters = Counter()
        self.started = time.time()
        self.expiry = {}            # receipt -> when its delivery is given back (clock)
        self.swept = time.time()

    @property
    def max_message(self):
        return self.cfg.max_message_size_kb * 1024

    # -- queues ----------------------------------------------------------------------------

    def _open(self, name):
        """(queue, its maxsize twin) of name, opened LIFO when name ends in _lifo
        (blocking: from the pool).  QueueKindMismatch if it is open as another kind."""
        want = store.LIFO if name.endswith("_lifo") else store.FIFO
        q = self.service.queue(name, lifo=want == store.LIFO)
        if q.kind != want:
            raise QueueKindMismatch(
                f"queue {name!r} is open as {store.KIND_NAMES[q.kind]}; "
                f"through Sasquatch's API a name ending in _lifo is LIFO and any other "
                f"FIFO")
        with self.lock:
            lim = self.limited.get(name)
            if lim is None:
                lim = self.limited[name] = self.service.open_front(
                    name, self.cfg.max_queue_length, lifo=want == store.LIFO)
            cc = self.conns.get(name)
            if cc is None:
                cc = self.conns[name] = ClientConn(q, q.connect(thread_bound=False))
        return q, lim, cc

    async def queue(self, name):
        try:
            q, lim, cc = await self.api.run(self._open, name)
        except QueueKindMismatch as exc:
            raise ApiError(409, "QueueKindMismatch", str(exc)) from None
        await self.api.queue(name)          # its ready listener wakes long polls
        return q, lim, cc

    # -- handlers ----------------------------------------------------------------------------

    def body_limit(self, path):
        """The most a request body to path may be (its handler's own check)."""
        return {"/send": self.max_message + OVERHEAD,
                "/send_batch": self.max_message * MAX_BATCH + OVERHEAD,
                "/enqueue": self.max_message}.get(
            path, self.cfg.max_request_body_size_kb * 1024)

    async def _doc(self, request, limit=None):
        data = await _read(request, limit or self.cfg.max_request_body_size_kb * 1024)
        return _json_object(data)

    def _send_fields(self, doc):
        """Validated fields of one SendRequest: (queue, body bytes, PutOptions, dedup id)."""
        if not isinstance(doc, dict):
            _fail("InvalidRequest", "a message must be a JSON object")
        name = _queue_name(doc)
        body = doc.get("message_body")
        if body is None:
            _fail("InvalidRequest", "message_body is required")
        if not isinstance(body, str):
            _fail("InvalidRequest", "message_body must be a string")
        data = body.encode("utf-8", "surrogatepass")
        if len(data) > self.max_message:
            raise ApiError(413, "MessageSizeExceeded",
                           f"message_body is {len(data)} bytes, over the maximum of "
                           f"{self.max_message} bytes")
        priority = _int(doc, "priority", self.cfg.default_priority, 0, store.PRIORITY_MAX)
        delay = _int(doc, "delay_seconds", 0, 0, MAX_DELAY)
        retention = _int(doc, "message_retention_period", self.cfg.default_retention_period,
                         60, 1209600)
        dedup_period = _int(doc, "message_deduplication_time_period",
                            self.cfg.default_dedup_time_period, 1, 43200)
        dedup = doc.get("message_deduplication_id")
        if dedup is not None:
            if not isinstance(dedup, str):
                _fail("InvalidRequest", "message_deduplication_id must be a string")
            if not _DEDUP.match(dedup):
                _fail("ValidationError", "message_deduplication_id is 1 to 128 "
                                         "alphanumeric characters")
        attrs = doc.get("message_attributes")
        if attrs is not None:
            if not isinstance(attrs, dict) or not all(isinstance(v, str)
                                                      for v in attrs.values()):
                _fail("InvalidRequest", "message_attributes must be an object of strings")
            if len(attrs) > MAX_ATTRIBUTES:
                _fail("ValidationError", f"at most {MAX_ATTRIBUTES} message_attributes")
            for k, v in attrs.items():
                if not 1 <= len(k) <= MAX_KEY:
                    _fail("ValidationError", f"an attribute key has 1 to {MAX_KEY} "
                                             "characters")
                if len(v) > MAX_VALUE:
                    _fail("ValidationError", f"an attribute value has at most {MAX_VALUE} "
                                             "characters")
            attrs = tuple(sorted(attrs.items())) or None
        opts = PutOptions(priority, float(delay), float(retention), attrs, float(dedup_period))
        return name, codec.mark(codec.TEXT, data), opts, dedup

    async def _put(self, name, body, opts, dedup):
        _, lim, _ = await self.queue(name)
        try:                                  # text, in the queue's codec
            body = codec.mark_text(lim.codec, codec.payload(body), name)
        except EncodingRefused as exc:
            raise refused(exc) from None
        try:                                  # never waits for room: Full answers 503
            [mid] = await self.api.put_many(lim, [body], block=False, options=opts,
                                            dedup_ids=[dedup])
        except _stdlib_queue.Full:
            raise ApiError(503, "QueueFull", f"queue {name!r} has reached its maximum of "
                                             f"{self.cfg.max_queue_length} messages") from None
        except DuplicateMessage:
            raise ApiError(409, "DuplicateMessage",
                           f"message_deduplication_id {dedup!r} was used in queue {name!r} "
                           "within its deduplication period") from None
        self.counters["messages_sent"] += 1
        return {"message_id": str(int(mid)),
                "md5_of_message_body": hashlib.md5(codec.payload(body)).hexdigest(),
                "sequence_number": int(mid)}

    async def send(self, request):
        doc = await self._doc(request, self.max_message + OVERHEAD)
        return web.json_response(await self._put(*self._send_fields(doc)))

    async def enqueue(self, request):
        doc = {"queue_name": request.query.get("queue_name")}
        if "priority" in request.query:
            try:
                doc["priority"] = int(request.query["priority"])
            except ValueError:
                _fail("InvalidRequest", "priority must be an integer")
        data = await _read(request, self.max_message)
        try:
            doc["message_body"] = data.decode("utf-8")
        except UnicodeDecodeError:
            _fail("InvalidRequest", "the message body must be UTF-8 text")
        return web.json_response(await self._put(*self._send_fields(doc)))

    async def send_batch(self, request):
        doc = await self._doc(request, self.max_message * MAX_BATCH + OVERHEAD)
        messages = doc.get("messages")
        if messages is None:
            _fail("InvalidRequest", "messages is required")
        if not isinstance(messages, list):
            _fail("InvalidRequest", "messages must be an array")
        if not 1 <= len(messages) <= MAX_BATCH:
            _fail("ValidationError", f"messages has 1 to {MAX_BATCH} messages")

        full = []                           # the entries' StorageFull errors

        async def one(i, m):
            try:
                return i, await self._put(*self._send_fields(m)), None
            except ApiError as exc:
                return i, None, {"code": exc.code, "message": exc.message}
            except OSError as exc:          # a full storage fails this entry, not all
                error = self.api.storage_full(exc)
                if error is None:
                    raise
                full.append(error)
                return i, None, {"code": error.code, "message": error.message}
        # Concurrent puts share the library's group commits.
        results = await asyncio.gather(*(one(i, m) for i, m in enumerate(messages)))
        if len(full) == len(results):       # none stored: the request's 503, Retry-After
            raise full[0]
        return web.json_response({
            "successful": [dict(index=i, **ok) for i, ok, _ in results if ok is not None],
            "failed": [{"index": i, "error": err} for i, _, err in results if err is not None]})

    async def receive(self, request):
        doc = await self._doc(request)
        name = _queue_name(doc)
        vt = _int(doc, "visibility_timeout", self.cfg.default_visibility_timeout, 0,
                  MAX_VISIBILITY)
        wait = _int(doc, "wait_time_seconds", self.cfg.default_wait_time_seconds, 0, MAX_WAIT)
        n = _int(doc, "max_number_of_messages", 1, 1, MAX_BATCH)
        max_receives = _int(doc, "max_receives", self.cfg.default_max_receives, 1, 10)
        dlq = _queue_name(doc, "dead_letter_queue_name", required=False)
        peek, shuffle = _bool(doc, "peek"), _bool(doc, "shuffle")
        if dlq is not None and dlq == name:
            _fail("ValidationError", "dead_letter_queue_name must differ from queue_name")
        if peek and dlq is not None:
            _fail("ValidationError", "peek cannot be combined with dead_letter_queue_name")
        q, _, cc = await self.queue(name)
        if dlq is not None:
            await self.queue(dlq)
        policy = q.receive_policy(max_receives, dlq)
        if peek:
            attempt = (lambda: self._peek(q, shuffle))
        else:
            attempt = (lambda: take_now(cc, n, vt, policy, shuffle))
        messages = await self._poll(request, name, q, cc, attempt, wait, give_back=not peek)
        out = []
        if peek:
            for m in messages:
                out.append(self._message_json(m, None))
        else:
            delivered = ([(None, m) for m in messages] if vt == 0 else
                         self.service.register(name, self.session, cc, messages))
            self._expire_receipts([r for r, _ in delivered if r is not None], vt)
            self.counters["messages_received"] += len(delivered)
            for r, m in delivered:
                out.append(self._message_json(m, r))
        return web.json_response({"messages": out})

    def _expire_receipts(self, receipts, seconds):
        """Remember when receipts' deliveries are given back; forget the receipts of
        deliveries given back long ago (at most every 10 s), so that the receipt map does
        not grow with the messages never deleted."""
        now = time.time()
        for r in receipts:
            self.expiry[r] = now + seconds
        if now - self.swept < 10:
            return
        self.swept = now
        gone = [r for r, t in self.expiry.items() if t < now - 60
                or r not in self.service.receipts]
        for r in gone:
            del self.expiry[r]
        self.service.forget(gone)

    @staticmethod
    def _peek(q, shuffle):
        """The next ready message (or a random one), read-only (pool thread)."""
        it = q.browse()
        try:
            if not shuffle:
                for m in it:
                    return [m] if m.state == READY else []
                return []
            chosen, seen = None, 0
            for m in it:
                if m.state != READY:
                    break
                seen += 1
                if random.randrange(seen) == 0:
                    chosen = m
            return [chosen] if chosen is not None else []
        finally:
            it.close()

    async def _poll(self, request, name, q, cc, attempt, wait, give_back):
        """attempt() until it returns something or wait seconds pass: the service's one
        long poll (Api.poll), holding no thread in between."""
        return await self.api.poll(request, name, q, cc, attempt, wait, give_back=give_back)

    def _message_json(self, m, receipt):
        body, md5, extra = _body_json(m.body)
        out = {"message_id": str(int(m.id)), "message_body": body,
               "md5_of_message_body": md5, "priority": m.priority,
               "approximate_receive_count": m.receive_count,
               "approximate_first_receive_timestamp": int(m.first_received or m.sent_at),
               "sent_timestamp": int(m.sent_at),
               "sequence_number": int(m.sequence_number or m.id)}
        if receipt is not None:
            out["receipt_handle"] = receipt
        if m.attributes:
            out["message_attributes"] = dict(m.attributes)
        out.update(extra)
        return out

    def _held(self, request, doc):
        """[(receipt, Delivery)] of the body's receipt handles that name a delivery held
        through this API in the queue the body names (queue_name; any queue when it names
        none): a receipt of another queue matches nothing.  403, and nothing done, when
        the client has no read right on the queue of one of them."""
        receipts = _receipts(doc)
        name = _queue_name(doc, required=False)
        held = []
        for r in dict.fromkeys(receipts):
            d = self.service.receipts.get(r)
            if d is not None and d.session is self.session and name in (None, d.queue):
                held.append((r, d))
        for _, d in held:
            if not auth.may(request, "read", d.queue):
                raise ApiError(403, "Forbidden", "this client has no read right on the queue "
                                                 "of a receipt handle it gave; nothing was done")
        return held

    async def delete(self, request):
        deleted = 0
        for r, d in self._held(request, await self._doc(request)):
            try:
                await self.api.ack_many(d.cconn, [d.message])
                deleted += 1
            except NotHeld:            # given back meanwhile (a StaleAck): no match
                pass
            self.service.forget([r])
        if not deleted:
            raise ApiError(404, "NotFound", "no message matched the receipt handles")
        self.counters["messages_deleted"] += deleted
        return web.json_response({"deleted": deleted})

    async def change_visibility(self, request):
        doc = await self._doc(request)
        seconds = _int(doc, "visibility_timeout", None, -MAX_VISIBILITY, MAX_VISIBILITY,
                       required=True)
        changed = 0
        for r, d in self._held(request, doc):
            try:
                await self.api.run(self.service.change_visibility, d.cconn, d.message,
                                   seconds)
                changed += 1
            except NotHeld:
                self.service.forget([r])
                continue
            if seconds <= 0:
                self.service.forget([r])
            else:
                self.expiry[r] = time.time() + seconds
        if not changed:
            raise ApiError(404, "NotFound", "no message matched the receipt handles")
        return web.json_response({"result": "ok"})

    async def delete_all(self, request):
        name = _queue_name(await self._doc(request), star=True)
        if name == "*":
            names = sorted(await self.api.run(self.service.list_queues))
        elif name not in self.service.queues:      # never created: nothing to purge
            names = [n for n in await self.api.run(self.service.list_queues) if n == name]
        else:
            names = [name]
        purged = 0
        for n in names:
            q = self.service.queues.get(n)
            if q is None:
                try:
                    q, _, _ = await self.queue(n)
                except ApiError:
                    if name == "*":        # stored as another kind: purge the others
                        continue
                    raise
            purged += await self.api.run(q.purge)
        return web.json_response({"result": "ok", "deleted": purged})

    async def queue_length(self, request):
        name = _queue_name(await self._doc(request))
        q = self.service.queues.get(name)
        if q is None:
            counts = (await self.api.run(self.service.list_queues)).get(name)
        else:
            counts = await self.api.run(q.counts)
        counts = counts or {}
        return web.json_response({"queue_name": name, "count": counts.get("ready", 0),
                                  "in_flight": counts.get("in_flight", 0)})

    async def queues(self, request):
        found = await self.api.run(self.service.list_queues)
        return web.json_response([{"queue_name": n, "count": c.get("ready", 0),
                                   "in_flight": c.get("in_flight", 0)}
                                  for n, c in sorted(found.items())])

    async def on_cleanup(self, app):
        """Close the maxsize twins before the service closes its queues and storage."""
        for q in list(self.limited.values()):
            await self.api.run(q.close)
        self.limited.clear()

    def stats_json(self):
        return {"uptime_seconds": round(time.time() - self.started, 3),
                "requests": dict(sorted((k[9:], v) for k, v in self.counters.items()
                                        if k.startswith("requests "))),
                "errors": self.counters["errors"],
                "messages_sent": self.counters["messages_sent"],
                "messages_received": self.counters["messages_received"],
                "messages_deleted": self.counters["messages_deleted"]}

    def counted(self, handler, path):
        async def run(request):
            self.counters["requests " + path] += 1
            try:
                return await handler(request)
            except _TooLarge as exc:
                self.counters["errors"] += 1
                body = {"error": {"code": "MessageSizeExceeded",
                                  "message": f"the request body is over {exc.limit} bytes"}}
                resp = web.json_response(body, status=413)
                resp.force_close()           # the rest of the body is not read
                return resp
            except ApiError:
                self.counters["errors"] += 1
                raise
        return run


SASQUATCH = web.AppKey("sasquatch", Sasquatch)


def sasquatch_stats(request):
    """Sasquatch's JSON stats when the request asks for JSON (Accept: application/json or
    ?format=json), else None: the stats page (HTML) answers."""
    wants = (request.query.get("format") == "json"
             or "application/json" in request.headers.get("Accept", ""))
    if not wants:
        return None
    return web.json_response(request.app[SASQUATCH].stats_json())


async def _stats(request):
    resp = sasquatch_stats(request)
    if resp is not None:
        return resp
    s = request.app[SASQUATCH].stats_json()
    rows = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in s["requests"].items())
    return web.Response(content_type="text/html", text=(
        "<!doctype html><title>ackqueue stats</title><h1>Sasquatch API requests</h1>"
        f"<table>{rows}</table><p>uptime {s['uptime_seconds']:.0f} s</p>"))


def add_routes(app, api, settings=None):
    """Register Sasquatch's endpoints on app (make_app calls this)."""
    sq = Sasquatch(api, settings)
    app[SASQUATCH] = sq
    app.on_cleanup.insert(0, sq.on_cleanup)
    r = app.router
    for path, handler in (("/send", sq.send), ("/send_batch", sq.send_batch),
                          ("/receive", sq.receive), ("/dequeue", sq.receive),
                          ("/delete", sq.delete), ("/change_visibility", sq.change_visibility),
                          ("/delete_all", sq.delete_all), ("/queue_length", sq.queue_length),
                          ("/enqueue", sq.enqueue)):
        r.add_post(path, sq.counted(handler, path))
        api.route_limits[path] = sq.body_limit(path)     # checked before auth reads it
    r.add_get("/queues", sq.counted(sq.queues, "/queues"))
    # GET /stats: the stats page's route when it has one (its handler answers JSON through
    # sasquatch_stats first); else this one.
    if not any(getattr(res, "canonical", None) == "/stats" for res in r.resources()):
        r.add_get("/stats", _stats)
    return sq
