"""The native API's atomic batch: ``POST /v1/batch``.

One request names puts (to any queues of the service), acks (receipt handles) and a lease
check (a client id whose lease must still hold, and receipts it must still own); the
service writes them as **one ZODB commit**, through the library's transaction blocks
(``ackqueue.atomic.transaction`` over every queue involved: the service's queues all live
in its one storage, so one batch may span several queues).  All of it is durable when the
answer is 200; if any entry fails (a stale or unknown receipt, a lapsed lease, a duplicate
dedup id) nothing is put and nothing acknowledged, and the error names the entry
(``"entry": "acks[1]"``) in the native API's error shape.

The request is JSON, or frames (``application/vnd.ackqueue.frames``: the JSON document
first, then one frame per put with its body as bytes, no base64)::

    {"puts": [{"queue": "links", "body": "https://...", "encoding": "str",
               "priority": 0, "delay": 0, "retention": 3600, "attributes": {"k": "v"},
               "dedup_id": "...", "idempotency_key": "..."}],
     "acks": [{"queue": "pages", "receipt": "..."}],
     "lease": {"client": "crawler-1", "receipts": [{"queue": "pages", "receipt": "..."}]},
     "idempotency_key": "..."}

In JSON a put's body is text for the encodings str and json, base64 for bytes and pickle.
Idempotency: a put's idempotency_key (or the batch's, which stands for one key per put
without its own) is stored as the message's dedup id, so a retried batch puts nothing
twice: when every keyed put of a batch is found already stored (within the queue's dedup
window), the answer is the original ids with ``"duplicate": true``; its acks were made by
the first attempt, in the same commit.
"""
import asyncio
import base64
import binascii
import math

from aiohttp import web

from ackqueue import codec, store
from ackqueue.atomic import transaction
from ackqueue.errors import DuplicateMessage, ItemTooLarge, QueueKindMismatch, StaleAck
from ackqueue.queue import MAX_ATTRIBUTES, MAX_DEDUP_ID

from .backend import check_client, check_name
from .errors import ApiError
from .params import MAX_BATCH, batch_document

__all__ = ["add_routes", "parse"]

_PUT_KEYS = {"queue", "body", "encoding", "priority", "delay", "retention", "attributes",
             "dedup_id", "idempotency_key"}


def add_routes(app, api):
    app.router.add_post("/v1/batch", Batch(api).handle)


class Put:
    __slots__ = ("queue", "body", "opts", "dedup_id", "idempotent")

    def __init__(self, queue, body, opts, dedup_id, idempotent):
        self.queue, self.body, self.opts = queue, body, opts
        self.dedup_id, self.idempotent = dedup_id, idempotent


# -- parsing ------------------------------------------------------------------------------

def _bad(entry, message, code="ValidationError", status=400):
    return ApiError(status, code, f"{entry}: {message}", entry=entry)


def _list(doc, key):
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise _bad(key, "must be a list")
    if len(value) > MAX_BATCH:
        raise _bad(key, f"at most {MAX_BATCH} entries")
    return value


def _queue_of(entry, e):
    try:
        return check_name(e.get("queue"))
    except ValueError as exc:
        raise _bad(entry, f"queue: {exc}") from None


def _key(entry, value, what="idempotency_key", limit=100):
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise _bad(entry, f"{what} is a string of 1 to {limit} characters")
    return value


def _num(entry, e, key, default, lo, hi, integer=False):
    value = e.get(key)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
        raise _bad(entry, f"{key} must be a{'n integer' if integer else ' number'} "
                          f"between {lo:g} and {hi:g}")
    return value


def _options(entry, e):
    opts = {"priority": _num(entry, e, "priority", store.DEFAULT_PRIORITY, 0,
                             store.PRIORITY_MAX, integer=True),
            "delay": _num(entry, e, "delay", 0.0, 0, store.MAX_RETENTION)}
    retention = _num(entry, e, "retention", None, 0.001, store.MAX_RETENTION)
    if retention is not None:
        opts["retention"] = retention
    attributes = e.get("attributes")
    if attributes is not None:
        if not isinstance(attributes, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()):
            raise _bad(entry, "attributes must be an object of strings to strings")
        if len(attributes) > MAX_ATTRIBUTES:
            raise _bad(entry, f"at most {MAX_ATTRIBUTES} attributes")
        opts["attributes"] = attributes
    return opts


def _body(entry, e, framed, what):
    """The put's payload as bytes (frames: as sent; JSON: text or base64)."""
    if framed is not None:
        if "body" in e:
            raise _bad(entry, "with frames, a put's body is its frame, not a field")
        return framed
    body = e.get("body")
    if not isinstance(body, str):
        raise _bad(entry, "body must be a string (text for str and json, base64 for "
                          "bytes and pickle)")
    if what in (codec.TEXT, codec.JSON):
        return body.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(entry, "body is not valid base64") from None


def _put(i, e, framed, batch_key, max_body):
    entry = f"puts[{i}]"
    if not isinstance(e, dict):
        raise _bad(entry, "must be an object")
    unknown = set(e) - _PUT_KEYS
    if unknown:
        raise _bad(entry, f"unknown fields: {', '.join(sorted(unknown))}")
    name = _queue_of(entry, e)
    what = e.get("encoding", codec.BYTES)
    if what not in codec.CODECS:
        raise _bad(entry, f"encoding must be one of {', '.join(codec.CODECS)}")
    payload = _body(entry, e, framed, what)
    if len(payload) > max_body:
        raise _bad(entry, f"a message body is at most {max_body} bytes",
                   "MessageSizeExceeded", 413)
    try:
        body = codec.mark(what, payload)
    except ValueError as exc:
        raise _bad(entry, f"the body is not {what} as its encoding says ({exc})") from None
    dedup_id, key = e.get("dedup_id"), e.get("idempotency_key")
    if dedup_id is not None and key is not None:
        raise _bad(entry, "give a dedup_id or an idempotency_key, not both")
    if dedup_id is not None:
        return Put(name, body, _options(entry, e), _key(entry, dedup_id, "dedup_id",
                                                           MAX_DEDUP_ID), False)
    if key is not None:
        key = "idempotency:" + _key(entry, key)
    elif batch_key is not None:
        key = f"idempotency:{batch_key}#{i}"
    return Put(name, body, _options(entry, e), key, key is not None)


def _receipt_refs(where, value):
    if not isinstance(value, list):
        raise _bad(where, "must be a list")
    if len(value) > MAX_BATCH:
        raise _bad(where, f"at most {MAX_BATCH} entries")
    refs = []
    for i, e in enumerate(value):
        entry = f"{where}[{i}]"
        if not isinstance(e, dict) or set(e) - {"queue", "receipt"}:
            raise _bad(entry, 'must be {"queue": NAME, "receipt": HANDLE}')
        if not isinstance(e.get("receipt"), str) or not e["receipt"]:
            raise _bad(entry, "receipt must be a receipt handle (a string)")
        refs.append((entry, _queue_of(entry, e), e["receipt"]))
    return refs


def _lease(doc):
    lease = doc.get("lease")
    if lease is None:
        return None, []
    if not isinstance(lease, dict) or set(lease) - {"client", "receipts"}:
        raise _bad("lease", 'must be {"client": ID, "receipts": [...]}')
    try:
        client = check_client(lease.get("client"))
    except ValueError as exc:
        raise _bad("lease", str(exc)) from None
    return client, _receipt_refs("lease.receipts", lease.get("receipts", []))


def parse(data, content_type, max_body):
    """(puts, acks, lease client or None, lease receipts) of a batch request, validated;
    ApiError (naming the entry) otherwise."""
    doc, bodies = batch_document(data, content_type)
    batch_key = doc.get("idempotency_key")
    if batch_key is not None:
        batch_key = _key("idempotency_key", batch_key, limit=90)
    raw_puts = _list(doc, "puts")
    if bodies is not None and len(bodies) != len(raw_puts):
        raise ApiError(400, "ValidationError", f"frames: {len(raw_puts)} puts but "
                       f"{len(bodies)} body frames")
    puts = [_put(i, e, None if bodies is None else bodies[i], batch_key, max_body)
            for i, e in enumerate(raw_puts)]
    seen = {}
    for i, p in enumerate(puts):
        if p.dedup_id is not None:
            if (p.queue, p.dedup_id) in seen:
                raise _bad(f"puts[{i}]", f"the same dedup id as puts[{seen[p.queue, p.dedup_id]}]")
            seen[p.queue, p.dedup_id] = i
    acks = _receipt_refs("acks", doc.get("acks", []))
    client, kept = _lease(doc)
    if not puts and not acks and client is None:
        raise ApiError(400, "ValidationError", "a batch has puts, acks or a lease check")
    return puts, acks, client, kept


def _check_encodings(queues, puts):
    """415 UnsupportedEncoding, naming the entry, for a put whose body's encoding its
    queue's codec does not admit (ackqueue.codec.admits): nothing of the batch is done."""
    for i, p in enumerate(puts):
        queue_codec, what = queues[p.queue].codec, codec.kind(p.body)
        if not codec.admits(queue_codec, what):
            refused = codec.refusal(queue_codec, what, p.queue)
            raise _bad(f"puts[{i}]", f"{refused}; nothing in this batch was done",
                       "UnsupportedEncoding", 415)


# -- the handler --------------------------------------------------------------------------

class Batch:
    def __init__(self, api):
        self.api = api
        self.service = api.service
        self.running = {}             # (queue, idempotency dedup id) -> Future of its batch

    async def handle(self, request):
        api = self.api
        data = await request.read()
        puts, acks, client, kept = parse(data, request.content_type, api.max_body)
        queues = {}
        for p in puts:
            if p.queue not in queues:
                queues[p.queue] = await api.queue(p.queue)
        _check_encodings(queues, puts)
        keyed = [(i, p) for i, p in enumerate(puts) if p.idempotent]
        done, mine = await self._claim_keys(queues, puts, keyed)
        if done is not None:
            return done
        commit = []                           # the commit's future, once it began
        try:
            return await self._apply(queues, puts, acks, client, kept, keyed, commit)
        finally:
            if commit and not commit[0].done():   # its client left: the commit goes on,
                commit[0].add_done_callback(      # and its keys are held until it ends
                    lambda _: self._release_keys(keyed, mine))
            else:
                self._release_keys(keyed, mine)

    async def _apply(self, queues, puts, acks, client, kept, keyed, commit):
        api = self.api
        ack_found = self._resolve(acks)
        session, kept_found = self._check_lease(client, kept)
        for _, _, d in ack_found + kept_found:
            if d.queue not in queues:
                queues[d.queue] = await api.queue(d.queue)
        if not queues:                        # a lease check alone: it held
            return web.json_response({"ids": [], "acked": 0})
        if session is not None:
            session.active += 1               # its lease cannot end during the commit
        try:
            commit.append(api.loop.run_in_executor(api.pool, self._commit, queues, puts,
                                                   ack_found, kept_found))
            ids = await asyncio.shield(commit[0])
        except DuplicateMessage as exc:
            done = await self._already_done(queues, puts, keyed) if keyed else None
            if done is not None:
                return done
            raise await self._duplicate(queues, puts, exc) from None
        except StaleAck as exc:
            raise self._stale(exc, ack_found, kept_found) from None
        finally:
            if session is not None:
                session.active -= 1
                session.last_seen = self.service.leases.clock()
        self.service.forget([r for _, r, _ in ack_found])
        return web.json_response({"ids": [int(i) for i in ids], "acked": len(ack_found)})

    async def _claim_keys(self, queues, puts, keyed):
        """(the answer to a retried batch, None) or (None, the Future this batch holds its
        idempotency keys with).  A batch with the same keys still in progress (a client
        that timed out and resent) is waited for first, then answered as a retry."""
        keys = [(p.queue, p.dedup_id) for _, p in keyed]
        while keys:
            busy = {id(f): f for f in (self.running.get(k) for k in keys) if f is not None}
            if busy:
                await asyncio.wait(list(busy.values()))
                continue
            done = await self._already_done(queues, puts, keyed)
            if done is not None:
                return done, None
            if any(k in self.running for k in keys):
                continue                      # another one began while we looked
            mine = asyncio.get_running_loop().create_future()
            for k in keys:
                self.running[k] = mine
            return None, mine
        return None, None

    def _release_keys(self, keyed, mine):
        if mine is None:
            return
        for _, p in keyed:
            if self.running.get((p.queue, p.dedup_id)) is mine:
                del self.running[p.queue, p.dedup_id]
        mine.set_result(None)

    def _resolve(self, refs):
        """[(entry, receipt, Delivery)] for receipt references; 410 for an unknown one."""
        found = []
        for entry, name, receipt in refs:
            d = self.service.receipts.get(receipt)
            if d is None or d.queue != name:
                raise _bad(entry, "no delivery held under this receipt in this queue "
                                  "(acknowledged already, its client's lease ended, or it "
                                  "never existed); nothing in this batch was done",
                           "UnknownReceipt", 410)
            found.append((entry, receipt, d))
        return found

    def _check_lease(self, client, kept):
        """The lease's session if it still holds, and its receipts' deliveries; 409
        LeaseExpired or NotOwned otherwise."""
        if client is None:
            return None, []
        leases = self.service.leases
        session = leases.sessions.get(client)
        if session is None or session.closed or (
                session.active == 0 and leases.clock() - session.last_seen > leases.timeout):
            raise _bad("lease", f"the lease of client {client!r} has ended (or never "
                                "began); nothing in this batch was done", "LeaseExpired", 409)
        found = []
        for entry, name, receipt in kept:
            d = self.service.receipts.get(receipt)
            if d is None or d.queue != name or d.session is not session:
                raise _bad(entry, f"client {client!r} does not hold this delivery; nothing "
                                  "in this batch was done", "NotOwned", 409)
            found.append((entry, receipt, d))
        return session, found

    def _commit(self, queues, puts, ack_found, kept_found):
        """In a pool thread: every put and ack in one commit (blocking)."""
        conns = {id(d.cconn): d.cconn for _, _, d in ack_found + kept_found}
        locks = [conns[k].lock for k in sorted(conns)]
        for lock in locks:                    # a client's connection: one thread at a time
            lock.acquire()
        try:
            with transaction(*queues.values(), keep=[d.message for _, _, d in kept_found]):
                ids = []
                for p in puts:
                    ids += queues[p.queue].put_many([p.body], encoded=True,
                                                    dedup_ids=[p.dedup_id], **p.opts)
                by_queue = {}
                for _, _, d in ack_found:
                    by_queue.setdefault(d.queue, []).append(d.message)
                for name, messages in by_queue.items():
                    queues[name].ack_many(messages)
            return ids
        except (StaleAck, DuplicateMessage):
            raise                             # (ValueErrors too) the handler names the entry
        except (ItemTooLarge, QueueKindMismatch, ValueError) as exc:
            raise ApiError(400, "ValidationError", f"{exc}; nothing in this batch was "
                           "done") from None
        finally:
            for lock in locks:
                lock.release()

    async def _already_done(self, queues, puts, keyed):
        """The answer to a retried batch (every keyed put found stored), None if none
        was; 409 if only some were (the keys were used by another batch)."""
        def look():
            return [queues[p.queue].dedup_lookup(p.dedup_id) for _, p in keyed]
        found = await self.api.run(look)
        if not any(f is not None for f in found):
            return None
        if not all(f is not None for f in found):
            # Each lookup reads its own snapshot: a batch with these keys that committed
            # while we looked shows in some of them.  Its commit was one: look again.
            found = await self.api.run(look)
        if not all(f is not None for f in found):
            i = keyed[[f is not None for f in found].index(True)][0]
            raise _bad(f"puts[{i}]", "this idempotency key was used by a batch that put "
                                     "other messages; nothing in this batch was done",
                       "DuplicateMessage", 409)
        # the original ids of the puts that have a dedup id (None for the others)
        found = await self.api.run(lambda: [
            None if p.dedup_id is None else queues[p.queue].dedup_lookup(p.dedup_id)
            for p in puts])
        ids = [None if mid is None else int(mid) for mid in found]
        return web.json_response({"ids": ids, "acked": None, "duplicate": True})

    async def _duplicate(self, queues, puts, exc):
        def first():
            for i, p in enumerate(puts):
                if p.dedup_id is not None and queues[p.queue].dedup_lookup(p.dedup_id):
                    return i
            return None
        i = await self.api.run(first)
        entry = "puts" if i is None else f"puts[{i}]"
        return _bad(entry, f"{exc}; nothing in this batch was done", "DuplicateMessage", 409)

    def _stale(self, exc, ack_found, kept_found):
        for entry, receipt, d in ack_found + kept_found:
            if d.queue == exc.queue and int(d.message.id) == exc.message_id:
                if entry.startswith("acks"):
                    self.service.forget([receipt])
                return _bad(entry, f"the delivery was given back before this batch ({exc}); "
                                   "nothing in this batch was done", "StaleReceipt", 409)
        return ApiError(409, "StaleReceipt", f"{exc}; nothing in this batch was done")
