"""The native HTTP API (/v1): its handlers and routes (add_routes).

Routes: GET /health, /openapi.json, /v1/queues, /v1/queues/{name}; POST
/v1/queues/{name}/messages (a put), /batch (a batch put, frames), /receive (a long poll),
/ack (also DELETE /messages), /nack, /visibility, /purge; GET /v1/queues/{name}/browse;
POST and DELETE /v1/leases/{client} (renew, end a client's lease).  Every handler uses the
runtime's calls (runtime.Api: put_many, ack_many, queue, poll, session) and the backend's
methods (backend.Service), and raises errors.ApiError for a client's mistake.  A receive
answers JSON (bodies in base64) or, with Accept: application/vnd.ackqueue.frames, frames:
one of JSON metadata, one of the body, per message (ackqueue.frames).
"""
import base64
import itertools
import json
import threading
import time

from aiohttp import web

from ackqueue import codec, store
from ackqueue.errors import DuplicateMessage, NotHeld, StaleAck
from ackqueue.frames import FRAMES, encode_frames

from . import encodings, params, runtime
from .errors import ApiError
from .openapi import document
from .params import MAX_BATCH, MAX_RECEIVE, MAX_WAIT

__all__ = ["add_routes", "Native", "browse_page"]


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


class Native:
    """The native API's handlers over the runtime api (runtime.Api)."""

    def __init__(self, api):
        self.api = api
        self.service = api.service

    async def health(self, request):
        return web.json_response({"status": "ok", "version": runtime.VERSION,
                                  "threads": threading.active_count(),
                                  "queues_open": len(self.service.queues),
                                  "clients": len(self.service.leases.sessions),
                                  "long_polls": sum(len(w) for w in self.api.waiters.values()),
                                  "uptime": time.time() - self.api.started})

    async def openapi(self, request):
        return web.json_response(document())

    async def list_queues(self, request):
        return web.json_response({"queues": await self.api.run(self.service.list_queues)})

    async def queue_info(self, request):
        name = params.queue_name(request)
        q = await self.api.queue(name)
        stats = await self.api.run(q.stats)
        return web.json_response({"name": name, "stats": stats})

    async def put(self, request):
        name = params.queue_name(request)
        opts = params.put_options(request)
        dedup_id, idempotent = params.dedup(request)
        if (request.content_length or 0) > self.api.max_body:
            raise ApiError(413, "MessageSizeExceeded",
                           f"a message body is at most {self.api.max_body} bytes")
        body = await request.read()
        if len(body) > self.api.max_body:
            raise ApiError(413, "MessageSizeExceeded",
                           f"a message body is at most {self.api.max_body} bytes")
        body = params.marked(params.encoding(request), body)
        q = await self.api.queue(name)
        encodings.check_bodies(q, [body])
        try:
            [mid] = await self.api.put_many(q, [body], dedup_ids=[dedup_id], **opts)
        except DuplicateMessage as exc:
            if idempotent and exc.original_id is not None:
                return web.json_response({"id": int(exc.original_id), "duplicate": True})
            raise ApiError(409, "DuplicateMessage", str(exc)) from None
        return web.json_response({"id": int(mid)})

    async def put_batch(self, request):
        name = params.queue_name(request)
        opts = params.put_options(request)
        dedup_id, idempotent = params.dedup(request)
        data = await request.read()
        bodies = params.frames(data)
        if not bodies:
            raise ApiError(400, "ValidationError", "a batch has 1 or more messages")
        if len(bodies) > MAX_BATCH:
            raise ApiError(400, "ValidationError", f"a batch has at most {MAX_BATCH} messages")
        for i, b in enumerate(bodies):
            if len(b) > self.api.max_body:
                raise ApiError(413, "MessageSizeExceeded",
                               f"message {i} is over {self.api.max_body} bytes", index=i)
        what = params.encoding(request)
        bodies = [params.marked(what, b, i) for i, b in enumerate(bodies)]
        dedup_ids = None
        if dedup_id is not None:
            dedup_ids = [dedup_id] + [None] * (len(bodies) - 1)
        q = await self.api.queue(name)
        encodings.check_bodies(q, bodies[:1])      # (one encoding for the whole batch)
        try:
            ids = await self.api.put_many(q, bodies, dedup_ids=dedup_ids, **opts)
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
                await self.api.ack_many(cc, [m for _, m in pairs])
            except StaleAck as exc:
                if len(pairs) == 1:
                    self.service.forget([pairs[0][0]])
                raise ApiError(409, "StaleReceipt",
                               f"a delivery was given back before its ack ({exc}); none of "
                               "this request's receipts was acknowledged") from None
            self.service.forget([r for r, _ in pairs])
        return len(found)

    async def ack(self, request):
        name = params.queue_name(request)
        receipts = await params.receipts(request)
        return web.json_response({"acked": await self._ack(name, receipts)})

    async def nack(self, request):
        name = params.queue_name(request)
        receipts = await params.receipts(request)
        delay = params.number(request, "delay", 0.0, hi=store.MAX_RETENTION)
        for r, d in self._deliveries(name, receipts):
            try:
                await self.api.run(self.service.nack, d.cconn, d.message, delay)
            except NotHeld:
                self.service.forget([r])
                raise ApiError(409, "StaleReceipt", "the delivery was given back already",
                               receipts=[r]) from None
            self.service.forget([r])
        return web.json_response({"nacked": len(receipts)})

    async def change_visibility(self, request):
        name = params.queue_name(request)
        receipts = await params.receipts(request)
        seconds = params.number(request, "visibility_timeout", None, lo=-1e9, hi=43200)
        if seconds is None:
            raise ApiError(400, "InvalidRequest", "visibility_timeout is required")
        for r, d in self._deliveries(name, receipts):
            try:
                await self.api.run(self.service.change_visibility, d.cconn, d.message, seconds)
            except NotHeld:
                self.service.forget([r])
                raise ApiError(409, "StaleReceipt", "the delivery was given back already",
                               receipts=[r]) from None
            if seconds <= 0:
                self.service.forget([r])
        return web.json_response({"changed": len(receipts)})

    async def receive(self, request):
        name = params.queue_name(request)
        client = params.client(request, required=True)
        n = params.number(request, "max", 1, lo=1, hi=MAX_RECEIVE, integer=True)
        wait = params.number(request, "wait", 0.0, hi=MAX_WAIT)
        vt = params.number(request, "visibility_timeout", None, lo=0.001, hi=43200)
        dead = params.dead_letter_options(request, name)
        acks = [r for r in request.query.getall("ack", []) for r in r.split(",") if r]
        if acks:
            await self._ack(name, acks)       # durable before this receive returns
        session = self.api.session(client)
        q = await self.api.queue(name)
        cc = session.conns.get(name)
        if cc is None:
            cc = await self.api.run(self.service.client_conn, session, name)
        now = None if dead else (lambda: self.service.receive_now(cc, n, vt))
        messages = await self.api.poll(request, name, q, cc,
                                   lambda: self.service.receive(cc, n, vt, **dead), wait,
                                   done=lambda: session.closed, now=now)
        delivered = self.service.register(name, session, cc, messages)
        if FRAMES in request.headers.get("Accept", ""):
            return _frames_response(delivered)
        return web.json_response({"messages": [_message_json(r, m) for r, m in delivered]})

    async def purge(self, request):
        q = await self.api.queue(params.queue_name(request))
        return web.json_response({"purged": await self.api.run(q.purge)})

    async def browse(self, request):
        name = params.queue_name(request)
        after = params.number(request, "after", -1, lo=-1, integer=True)
        limit = params.number(request, "limit", 100, lo=1, hi=1000, integer=True)
        q = await self.api.queue(name)
        rows, more = await self.api.run(browse_page, q, after, limit)
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
        client = params.path_client(request)
        self.api.session(client)
        return web.json_response({"client": client,
                                  "lease_timeout": self.service.leases.timeout})

    async def end_lease(self, request):
        client = params.path_client(request)
        s = self.service.leases.remove(client)
        if s is not None:
            await self.api.close_session(s)
        return web.json_response({"client": client, "ended": s is not None})


def browse_page(q, after, limit):
    """(up to limit messages with an id greater than after, in id order; whether more
    follow).  Costs O(limit + log n) reads: q.browse(after=...) starts at a key into the
    message index."""
    it = q.browse(after=after)
    try:
        rows = list(itertools.islice(it, limit + 1))
    finally:
        it.close()                              # ends its snapshot now
    return rows[:limit], len(rows) > limit


def add_routes(app, api):
    """Register the native API's routes on app (api: its runtime.Api)."""
    n = Native(api)
    r = app.router
    r.add_get("/health", n.health)
    r.add_get("/openapi.json", n.openapi)
    r.add_get("/v1/queues", n.list_queues)
    r.add_get("/v1/queues/{name}", n.queue_info)
    r.add_post("/v1/queues/{name}/messages", n.put)
    r.add_post("/v1/queues/{name}/batch", n.put_batch)
    r.add_post("/v1/queues/{name}/receive", n.receive)
    r.add_post("/v1/queues/{name}/ack", n.ack)
    r.add_delete("/v1/queues/{name}/messages", n.ack)
    r.add_post("/v1/queues/{name}/nack", n.nack)
    r.add_post("/v1/queues/{name}/visibility", n.change_visibility)
    r.add_post("/v1/queues/{name}/purge", n.purge)
    r.add_get("/v1/queues/{name}/browse", n.browse)
    r.add_post("/v1/leases/{client}", n.renew)
    r.add_delete("/v1/leases/{client}", n.end_lease)
    return n
