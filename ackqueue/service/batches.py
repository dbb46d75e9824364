"""Leased batches and deduplicated row puts: the native API's part for stream processors
(the Spark source and sink, ackqueue.spark).

A stream processor that replays a batch after a failure must read exactly the batch it
read before, and must acknowledge only once it has finished the batch for good.  So the
service keeps, per queue and *stream* (an id the processor keeps in its own checkpoint),
a record for each batch part, keyed by the part's sequence number and index:

``POST /v1/queues/{name}/streams/{stream}/batches/{seq}/{part}?max=N&visibility_timeout=S
[&max_receives=K&dead_letter=Q]``
    The first call receives up to N ready messages (not waiting) for the record and holds
    them for S seconds; every later call returns the same messages, their lease renewed
    for S seconds from then.  Each call counts as one receive of its messages (the
    ``receive_count`` returned is the queue's count plus the calls after the first).  With
    max_receives, a record read more than max_receives times is failing its processor
    each time: one message alone is moved to the queue dead_letter (or dropped); more are
    halved, the second half given back to the queue and the first half kept under a fresh
    count (see _isolate); so a replay is exact for the first max_receives reads.  The first
    receive applies the queue's own rule (a message received max_receives times goes to
    dead_letter at the get that would deliver it once more).  A record whose
    lease ran out is dropped (its messages went back to the queue) and the call receives
    afresh.  A part of a batch already committed (seq at or below the stream's commit)
    returns nothing.  The answer is frames (ackqueue.service.http.encode_frames): a JSON
    header ``{"messages": [{id, receive_count, sent_at, priority, attributes, encoding},
    ...]}`` and then each message's body.
``POST /v1/queues/{name}/streams/{stream}/commit?upto=SEQ``
    Acknowledge the messages of every record of the stream up to seq SEQ (cumulative and
    idempotent: records already committed are gone, a repeated commit acks nothing).
``POST /v1/queues/{name}/rows?encoding=str|bytes&dedup_window=S``
    Put rows, each with its own dedup id: frames, a JSON header ``{"dedup_ids": [...],
    "priorities": [...]|null, "attributes": [...]|null}`` then each row's body.  A row
    whose dedup id was put less than S seconds ago (default: one day) is skipped, not
    refused; the answer says ``{"put": n, "duplicates": k}``.

The records live in the service process: they survive the processor's crash (the case
they exist for), not the service's (a restarted service has given every lease back, so
the messages are received again in later batches: at least once still holds).
"""
import asyncio
import json
import time

from aiohttp import web

from ackqueue import codec, store
from ackqueue.errors import DuplicateMessage, NotHeld, StaleAck
from ackqueue.queue import MAX_ATTRIBUTES, MAX_DEDUP_ID
from ackqueue.state import PutOptions

from .core import ClientConn, check_client
from .http import (API, FRAMES, MAX_BATCH, ApiError, _marked, _name, _number, decode_frames,
                   encode_frames)

__all__ = ["add_routes", "BatchLeases", "OPENAPI_PATHS"]

MAX_BATCH_RECEIVE = 10000
DEFAULT_ROW_DEDUP_WINDOW = 86400.0


class Record:
    """One batch part's leased messages."""

    __slots__ = ("messages", "reads", "deadline")

    def __init__(self, messages, deadline):
        self.messages = messages        # Message objects held by the stream's connection
        self.reads = 1
        self.deadline = deadline


class Stream:
    __slots__ = ("cc", "records", "committed", "lock")

    def __init__(self, cc):
        self.cc = cc
        self.records = {}               # (seq, part) -> Record
        self.committed = -1
        # Two reads of one record at once (a speculative task) must not both receive.
        self.lock = asyncio.Lock()


class BatchLeases:
    """The records of every stream; clock (wall time, as message deadlines) injectable."""

    def __init__(self, api, clock=time.time):
        self.api = api
        self.clock = clock
        self.streams = {}               # (queue name, stream id) -> Stream

    async def stream(self, name, stream_id):
        s = self.streams.get((name, stream_id))
        if s is None:
            q = await self.api.queue(name)
            conn = await self.api.run(lambda: q.connect(thread_bound=False))
            s = self.streams.setdefault((name, stream_id), Stream(ClientConn(q, conn)))
        return s

    def sweep(self, s):
        """Drop records whose lease ran out: their messages went back by themselves."""
        now = self.clock()
        for key in [k for k, r in s.records.items() if r.deadline <= now]:
            del s.records[key]

    async def close(self, app=None):
        for s in list(self.streams.values()):
            await self.api.run(s.cc.close)
        self.streams.clear()


def _stream_id(request):
    try:
        return check_client(request.match_info["stream"])
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc).replace("client id", "stream id")) \
            from None


def _int_path(request, key):
    try:
        value = int(request.match_info[key])
    except ValueError:
        raise ApiError(400, "InvalidRequest", f"{key} must be an integer") from None
    if value < 0:
        raise ApiError(400, "ValidationError", f"{key} must not be negative")
    return value


def _receive(cc, n, vt, policy):
    import ackqueue
    with cc.lock:
        try:
            return cc.conn.get_many(n, block=False, messages=True, raw=True,
                                    visibility_timeout=vt, policy=policy)
        except ackqueue.Empty:
            return []


def _renew(cc, messages, vt):
    """Extend the lease of messages still held; those given back already are dropped."""
    kept = []
    with cc.lock:
        for m in messages:
            try:
                cc.queue.change_visibility(m, vt)
                kept.append(m)
            except (NotHeld, StaleAck):
                pass
    return kept


def _ack_all(cc, messages):
    """Acknowledge what is still held (one commit); a delivery given back is skipped."""
    if not messages:
        return 0
    with cc.lock:
        try:
            cc.queue.ack_many(messages)
            return len(messages)
        except (StaleAck, NotHeld):
            pass
        done = 0
        for m in messages:
            try:
                cc.queue.ack_many([m])
                done += 1
            except (StaleAck, NotHeld):
                pass
        return done


def _dead_letter(cc, m, dlq):
    """Move m to queue dlq (None: drop it): put it there once (a dedup id per message makes
    a repeat harmless), then acknowledge it here."""
    if dlq is not None:
        try:
            dlq.put_many([m.body], encoded=True, dedup_ids=[f"dead:{m.queue}:{int(m.id)}"],
                         attributes=dict(m.attributes or {}) or None)
        except DuplicateMessage:
            pass
    _ack_all(cc, [m])


def _frames(messages, extra_reads):
    head = [{"id": int(m.id), "receive_count": m.receive_count + extra_reads,
             "sent_at": m.sent_at, "priority": m.priority, "attributes": m.attributes,
             "encoding": codec.kind(m.body)} for m in messages]
    parts = [json.dumps({"messages": head}, separators=(",", ":")).encode()]
    parts += [codec.payload(m.body) for m in messages]
    return web.Response(body=encode_frames(parts), content_type=FRAMES)


async def read_batch(request):
    api = request.app[API]
    leases = request.app[BATCH_LEASES]
    name, stream_id = _name(request), _stream_id(request)
    key = (_int_path(request, "seq"), _int_path(request, "part"))
    n = _number(request, "max", 1, lo=1, hi=MAX_BATCH_RECEIVE, integer=True)
    vt = _number(request, "visibility_timeout", 30.0, lo=0.001, hi=43200)
    max_receives = _number(request, "max_receives", None, lo=1, hi=1000, integer=True)
    dead_letter = request.query.get("dead_letter")
    if dead_letter is not None:
        dead_letter = _name_of(dead_letter)
        if dead_letter == name:
            raise ApiError(400, "ValidationError", "a queue cannot be its own dead letter")
    s = await leases.stream(name, stream_id)
    async with s.lock:
        messages, extra = await _lease(api, leases, s, key, n, vt, max_receives, dead_letter)
    return _frames(messages, extra)


async def _lease(api, leases, s, key, n, vt, max_receives, dead_letter):
    """(messages, reads before this one) of the record key of stream s."""
    leases.sweep(s)
    if key[0] <= s.committed:
        return [], 0
    rec = s.records.get(key)
    if rec is None:
        policy = s.cc.queue._dead_letter_policy(max_receives, dead_letter)
        got = await api.run(_receive, s.cc, n, vt, policy)
        s.records[key] = Record(got, leases.clock() + vt)
        return got, 0
    rec.reads += 1
    rec.messages = await api.run(_renew, s.cc, rec.messages, vt)
    rec.deadline = leases.clock() + vt
    if max_receives is not None and rec.reads > max_receives and rec.messages:
        await _isolate(api, s.cc, rec, dead_letter)
    return rec.messages, rec.reads - 1


async def _isolate(api, cc, rec, dead_letter):
    """A batch part read more than max_receives times: the processor fails on it each
    time, and which message is to blame is not known.  One message alone goes to the
    dead-letter queue; more are halved, the second half given back to the queue and the
    first half read again from a fresh count, so a poison message is cornered in about
    max_receives * log2(n) attempts while its batch-mates go on."""
    if len(rec.messages) == 1:
        dlq = None if dead_letter is None else await api.queue(dead_letter)
        await api.run(_dead_letter, cc, rec.messages[0], dlq)
        rec.messages = []
        return
    keep = (len(rec.messages) + 1) // 2
    await api.run(_give_back, cc, rec.messages[keep:])
    rec.messages = rec.messages[:keep]
    rec.reads = 1


def _give_back(cc, messages):
    with cc.lock:
        for m in messages:
            try:
                cc.conn.nack(m)
            except (NotHeld, StaleAck):
                pass


def _name_of(value):
    from .core import check_name
    try:
        return check_name(value)
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", f"dead_letter: {exc}") from None


async def commit_stream(request):
    api = request.app[API]
    leases = request.app[BATCH_LEASES]
    name, stream_id = _name(request), _stream_id(request)
    upto = _number(request, "upto", None, lo=0, integer=True)
    if upto is None:
        raise ApiError(400, "InvalidRequest", "upto (the last seq to commit) is required")
    s = await leases.stream(name, stream_id)
    keys = [k for k in s.records if k[0] <= upto]
    messages = [m for k in keys for m in s.records[k].messages]
    acked = await api.run(_ack_all, s.cc, messages)
    for k in keys:
        s.records.pop(k, None)
    s.committed = max(s.committed, upto)
    return web.json_response({"acked": acked, "committed": s.committed})


def _rows_header(data):
    try:
        parts = decode_frames(data)
        head = json.loads(parts[0])
        dedup_ids = head["dedup_ids"]
        bodies = parts[1:]
        priorities = head.get("priorities") or [store.DEFAULT_PRIORITY] * len(bodies)
        attributes = head.get("attributes") or [None] * len(bodies)
        if not (len(dedup_ids) == len(priorities) == len(attributes) == len(bodies)):
            raise ValueError("one dedup id, priority and attributes per row")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ApiError(400, "InvalidRequest", f"bad rows request: {exc}") from None
    if len(bodies) > MAX_BATCH:
        raise ApiError(400, "ValidationError", f"at most {MAX_BATCH} rows a request")
    return bodies, dedup_ids, priorities, attributes


def _put_rows(q, groups, window):
    """Put each group (rows of one priority and attributes) in one commit; a group that
    holds a dedup id put before is put row by row, skipping the duplicates."""
    conn = q.connect(thread_bound=False)
    put = dup = 0
    try:
        for (priority, attrs), rows in groups:
            opts = PutOptions(priority, 0.0, q.retention, attrs, window)
            try:
                conn.put_many([b for b, _ in rows], opts=opts,
                              dedup_ids=[d for _, d in rows], encoded=True)
                put += len(rows)
                continue
            except DuplicateMessage:
                pass
            for body, dedup_id in rows:
                try:
                    conn.put_many([body], opts=opts, dedup_ids=[dedup_id], encoded=True)
                    put += 1
                except DuplicateMessage:
                    dup += 1
    finally:
        conn.close()
    return put, dup


def _check_row(i, body, dedup_id, priority, attributes, max_body):
    if len(body) > max_body:
        raise ApiError(413, "MessageSizeExceeded", f"row {i} is over {max_body} bytes",
                       index=i)
    if not isinstance(dedup_id, str) or not 0 < len(dedup_id) <= MAX_DEDUP_ID:
        raise ApiError(400, "ValidationError",
                       f"row {i}: a dedup id has 1 to {MAX_DEDUP_ID} characters")
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            0 <= priority <= store.PRIORITY_MAX):
        raise ApiError(400, "ValidationError", f"row {i}: bad priority {priority!r}")
    if attributes is not None and not (
            isinstance(attributes, dict) and len(attributes) <= MAX_ATTRIBUTES and all(
                isinstance(k, str) and isinstance(v, str) for k, v in attributes.items())):
        raise ApiError(400, "ValidationError", f"row {i}: attributes are at most "
                       f"{MAX_ATTRIBUTES} pairs of strings")


async def put_rows(request):
    api = request.app[API]
    name = _name(request)
    what = request.query.get("encoding", codec.BYTES)
    if what not in codec.CODECS:
        raise ApiError(400, "ValidationError",
                       f"encoding must be one of {', '.join(codec.CODECS)}")
    window = _number(request, "dedup_window", DEFAULT_ROW_DEDUP_WINDOW, lo=1,
                     hi=store.MAX_RETENTION)
    bodies, dedup_ids, priorities, attributes = _rows_header(await request.read())
    groups = []
    for i, (body, d, p, a) in enumerate(zip(bodies, dedup_ids, priorities, attributes)):
        _check_row(i, body, d, p, a, api.max_body)
        attrs = tuple(sorted(a.items())) or None if a else None
        if groups and groups[-1][0] == (p, attrs):
            groups[-1][1].append((_marked(what, body, i), d))
        else:
            groups.append(((p, attrs), [(_marked(what, body, i), d)]))
    q = await api.queue(name)
    put, dup = await api.run(_put_rows, q, groups, window)
    return web.json_response({"put": put, "duplicates": dup})


BATCH_LEASES = web.AppKey("batch_leases", BatchLeases)   # app[BATCH_LEASES]: the leases


def add_routes(app, api):
    """The stream processors' routes (one call in make_app)."""
    app[BATCH_LEASES] = leases = BatchLeases(api)
    app.on_shutdown.append(leases.close)
    r = app.router
    r.add_post("/v1/queues/{name}/streams/{stream}/batches/{seq}/{part}", read_batch)
    r.add_post("/v1/queues/{name}/streams/{stream}/commit", commit_stream)
    r.add_post("/v1/queues/{name}/rows", put_rows)


def _p(name, where, schema, description, required=False):
    return {"name": name, "in": where, "required": required, "schema": schema,
            "description": description}


def _err():
    return {"description": "error", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}}


_QUEUE = _p("name", "path", {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,80}$"},
            "queue name", True)
_STREAM = _p("stream", "path", {"type": "string", "pattern": "^[A-Za-z0-9_.:\\-]{1,128}$"},
             "the stream's id (kept by the processor, e.g. in its checkpoint)", True)
_FRAMES_BODY = {"required": True, "content": {FRAMES: {"schema": {"type": "string",
                                                                  "format": "binary"}}}}
OPENAPI_PATHS = {
    "/v1/queues/{name}/streams/{stream}/batches/{seq}/{part}": {"post": {
        "summary": "a leased batch part: the first call receives up to max messages and "
                   "holds them under (stream, seq, part); later calls return the same "
                   "ones until the stream commits seq (service/batches.py)",
        "parameters": [
            _QUEUE, _STREAM,
            _p("seq", "path", {"type": "integer", "minimum": 0}, "batch number", True),
            _p("part", "path", {"type": "integer", "minimum": 0}, "part of the batch", True),
            _p("max", "query", {"type": "integer", "minimum": 1,
                                "maximum": MAX_BATCH_RECEIVE, "default": 1},
               "most messages the part receives"),
            _p("visibility_timeout", "query", {"type": "number", "minimum": 0.001,
                                               "maximum": 43200, "default": 30},
               "seconds the part's messages stay leased from this call"),
            _p("max_receives", "query", {"type": "integer", "minimum": 1, "maximum": 1000},
               "reads of the part after which it is halved, or one message dead-lettered"),
            _p("dead_letter", "query", {"type": "string"}, "the dead-letter queue")],
        "responses": {"200": {"description": "frames: a JSON header, then the bodies",
                              "content": {FRAMES: {"schema": {"type": "string",
                                                              "format": "binary"}}}},
                      "400": _err(), "500": _err()}}},
    "/v1/queues/{name}/streams/{stream}/commit": {"post": {
        "summary": "acknowledge every batch part of the stream up to seq upto "
                   "(cumulative, idempotent)",
        "parameters": [_QUEUE, _STREAM,
                       _p("upto", "query", {"type": "integer", "minimum": 0},
                          "the last batch committed", True)],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "properties": {
                "acked": {"type": "integer"}, "committed": {"type": "integer"}}}}}},
            "400": _err(), "500": _err()}}},
    "/v1/queues/{name}/rows": {"post": {
        "summary": "put rows, each under its own dedup id; a row put before within "
                   "dedup_window seconds is skipped (counted as a duplicate)",
        "parameters": [
            _QUEUE,
            _p("encoding", "query", {"type": "string",
                                     "enum": ["str", "bytes", "json", "pickle"]},
               "what every body holds (default bytes)"),
            _p("dedup_window", "query", {"type": "number", "minimum": 1,
                                         "maximum": 1209600, "default": 86400},
               "seconds a dedup id is remembered")],
        "requestBody": _FRAMES_BODY,
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "properties": {
                "put": {"type": "integer"}, "duplicates": {"type": "integer"}}}}}},
            "400": _err(), "413": _err(), "500": _err()}}},
}
