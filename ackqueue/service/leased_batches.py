"""Leased batches and deduplicated row puts: the native API's part for stream processors
(the Spark source and sink, ackqueue.spark).

A stream processor that replays a batch after a failure must read exactly the batch it
read before, and must acknowledge only once it has finished the batch for good.  So the
service keeps, per queue and *stream* (an id the processor keeps in its own checkpoint),
a durable record for each batch part, keyed by the part's sequence number and index
(ackqueue/service/streams.py): the part's messages stay in the queue, in flight, under a
durable hold of the queue (ackqueue.holds) written in the same commit as the record that
names their ids, so it survives the service's crash as well as the processor's:

``POST /v1/queues/{name}/streams/{stream}/batches/{seq}/{part}?max=N&visibility_timeout=S
[&max_receives=K&dead_letter=Q]``
    The first call receives up to N ready messages (not waiting) and holds them for the
    part for S seconds (in flight: the queue's counts show them so); every later call,
    before or after a restart of the service, returns the same messages (ids, bodies,
    attributes), their lease renewed for S seconds from then.  Each call counts as one
    receive of its messages (durably: the ``receive_count`` returned counts every call).
    With max_receives, a part read more than max_receives times is failing its
    processor each time: one message alone is moved to the queue dead_letter (or
    dropped); more are halved, the second half given back to the queue (at its original
    place, with the receive counts it had before the part) and the first half kept under
    a fresh count of reads (streams.Book.lease); so a replay is exact for the first
    max_receives reads.  The first receive applies the queue's own rule (a message
    received max_receives times goes to dead_letter at the get that would deliver it once
    more).  A part whose lease ran out gives its messages back at their original place,
    with their receive counts counted, as any delivery's visibility deadline does (the
    queue itself at the deadline, or at its next open); its record is deleted by the
    next call on the stream or the service's sweep (every second, and at start before it
    listens); a later read of that part takes afresh.  A part of a batch already
    committed (seq at or below the stream's commit) returns nothing.  The answer is
    frames (ackqueue.frames.encode_frames): a JSON header ``{"messages": [{id,
    receive_count, sent_at, priority, attributes, encoding}, ...]}`` and then each
    message's body; with ``format=columns``, a JSON header of columns ``{"ids",
    "receive_counts", "sent_at", "priorities", "encodings": [...], "attributes": [...]
    or null when no message has any}``, then the payloads' offsets (n + 1 little-endian
    64-bit integers) and all the payloads in one frame: Arrow's layout of a binary
    column, which the Spark source hands to Spark without a step per row.
``POST /v1/queues/{name}/streams/{stream}/commit?upto=SEQ``
    Acknowledge the messages of every part of the stream up to seq SEQ and delete their
    records, in one commit (cumulative and idempotent: a repeated commit acks nothing);
    the answer says ``{"acked": messages acknowledged, "committed": the stream's last
    seq}``.
``GET /v1/queues/{name}/streams``
    The queue's streams, as leased now: ``{"streams": {stream: {"committed": last seq
    committed (-1: none), "parts": parts leased, "messages": messages they hold}}}``.
``POST /v1/queues/{name}/rows?encoding=str|bytes&dedup_window=S``
    Put rows, each with its own dedup id: frames, a JSON header ``{"dedup_ids": [...],
    "priorities": [...]|null, "attributes": [...]|null}`` then each row's body.  A row
    whose dedup id was put less than S seconds ago (default: one day) is skipped, not
    refused; the answer says ``{"put": n, "duplicates": k}``.
"""
import array
import asyncio
import itertools
import json
import logging
import sys
import time

from aiohttp import web

from ackqueue import codec, jsontext, store
from ackqueue.errors import DuplicateMessage
from ackqueue.queue import MAX_ATTRIBUTES, MAX_DEDUP_ID
from ackqueue.state import PutOptions
from ackqueue.frames import FRAMES, decode_frames, encode_frames

from . import encodings, params
from .backend import check_client, check_name
from .errors import ApiError
from .params import MAX_BATCH
from .runtime import API
from .streams import Book

__all__ = ["add_routes", "BatchLeases"]

log = logging.getLogger("ackqueue.service")

MAX_BATCH_RECEIVE = 10000
DEFAULT_ROW_DEDUP_WINDOW = 86400.0
SWEEP_PERIOD = 1.0              # seconds between two looks for leases that ran out


class BatchLeases:
    """The service's side of the durable leases (ackqueue.service.streams.Book): read
    from the store at start, where run-out leases are expired before the service listens,
    and every SWEEP_PERIOD seconds after; clock (wall time) injectable."""

    def __init__(self, api, clock=time.time, period=SWEEP_PERIOD):
        self.api = api
        self.book = Book(clock)
        self.period = period
        self.sweeper = None

    async def start(self, app=None):
        await self.api.run(self.book.load, self.api.service.db)
        await self.expire()
        self.sweeper = asyncio.ensure_future(self._sweep())

    async def stop(self, app=None):
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None

    async def expire(self):
        for name, stream, given in await self.api.run(self.book.expire_all,
                                                      self.api.service.queue):
            log.info("ackqueue service: the lease of %d message(s) of stream %r of queue "
                     "%r ran out; they are back in the queue", given, stream, name)

    async def _sweep(self):
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.expire()
            except Exception:
                log.exception("ackqueue service: stream lease sweep")


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


def _frames(messages):
    head = [{"id": m.id, "receive_count": m.receive_count,
             "sent_at": m.sent_at, "priority": m.priority, "attributes": m.attributes or {},
             "encoding": codec.kind(m.body)} for m in messages]
    parts = [json.dumps({"messages": head}, separators=(",", ":")).encode()]
    parts += [codec.payload(m.body) for m in messages]
    return web.Response(body=encode_frames(parts), content_type=FRAMES)


def _columns(messages):
    """The columnar answer (format=columns): a JSON header of columns, then the payloads'
    offsets (n + 1 little-endian 64-bit integers) and the payloads, one after the other:
    Arrow's own layout of a binary column, which a client takes without a copy."""
    payloads = [codec.payload(m.body) for m in messages]
    offsets = array.array("q", itertools.accumulate(map(len, payloads), initial=0))
    if sys.byteorder != "little":
        offsets.byteswap()
    attributes = [m.attributes or {} for m in messages]
    head = {"ids": [m.id for m in messages],
            "receive_counts": [m.receive_count for m in messages],
            "sent_at": [m.sent_at for m in messages],
            "priorities": [m.priority for m in messages],
            "encodings": [codec.kind(m.body) for m in messages],
            "attributes": attributes if any(attributes) else None}
    parts = [json.dumps(head, separators=(",", ":")).encode(), offsets.tobytes(),
             b"".join(payloads)]
    return web.Response(body=encode_frames(parts), content_type=FRAMES)


async def read_batch(request):
    api = request.app[API]
    leases = request.app[BATCH_LEASES]
    name, stream_id = params.queue_name(request), _stream_id(request)
    key = (_int_path(request, "seq"), _int_path(request, "part"))
    n = params.number(request, "max", 1, lo=1, hi=MAX_BATCH_RECEIVE, integer=True)
    vt = params.number(request, "visibility_timeout", 30.0, lo=0.001, hi=43200)
    max_receives = params.number(request, "max_receives", None, lo=1, hi=1000, integer=True)
    answer = request.query.get("format", "messages")
    if answer not in ("messages", "columns"):
        raise ApiError(400, "ValidationError", "format must be messages or columns")
    columns = answer == "columns"
    dead_letter = request.query.get("dead_letter")
    if dead_letter is not None:
        dead_letter = _name_of(dead_letter)
        if dead_letter == name:
            raise ApiError(400, "ValidationError", "a queue cannot be its own dead letter")
    q = await api.queue(name)
    dlq = None if dead_letter is None else await api.queue(dead_letter)
    # The dead-letter rule of the first read's receive, as the front's get() builds it.
    policy = q.receive_policy(max_receives, dead_letter)
    messages, _ = await api.run(leases.book.lease, q, stream_id, key, n, vt, policy,
                                max_receives, dlq)
    return (_columns if columns else _frames)(messages)


def _name_of(value):
    try:
        return check_name(value)
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", f"dead_letter: {exc}") from None


async def commit_stream(request):
    api = request.app[API]
    leases = request.app[BATCH_LEASES]
    name, stream_id = params.queue_name(request), _stream_id(request)
    upto = params.number(request, "upto", None, lo=0, integer=True)
    if upto is None:
        raise ApiError(400, "InvalidRequest", "upto (the last seq to commit) is required")
    q = await api.queue(name)
    acked, committed = await api.run(leases.book.commit, q, stream_id, upto)
    return web.json_response({"acked": acked, "committed": committed})


async def list_streams(request):
    leases = request.app[BATCH_LEASES]
    return web.json_response({"streams": leases.book.streams_of(params.queue_name(request))})


def _rows_header(data):
    try:
        parts = decode_frames(data)
        head = jsontext.loads(parts[0])
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
    name = params.queue_name(request)
    what = request.query.get("encoding", codec.BYTES)
    if what not in codec.CODECS:
        raise ApiError(400, "ValidationError",
                       f"encoding must be one of {', '.join(codec.CODECS)}")
    window = params.number(request, "dedup_window", DEFAULT_ROW_DEDUP_WINDOW, lo=1,
                     hi=store.MAX_RETENTION)
    bodies, dedup_ids, priorities, attributes = _rows_header(await request.read())
    q = await api.queue(name)
    groups = []
    for i, (body, d, p, a) in enumerate(zip(bodies, dedup_ids, priorities, attributes)):
        _check_row(i, body, d, p, a, api.max_body)
        attrs = tuple(sorted(a.items())) or None if a else None
        body = encodings.in_queue_codec(q, params.marked(what, body, i), i)
        if groups and groups[-1][0] == (p, attrs):
            groups[-1][1].append((body, d))
        else:
            groups.append(((p, attrs), [(body, d)]))
    put, dup = await api.run(_put_rows, q, groups, window)
    return web.json_response({"put": put, "duplicates": dup})


BATCH_LEASES = web.AppKey("batch_leases", BatchLeases)   # app[BATCH_LEASES]: the leases


def add_routes(app, api):
    """The stream processors' routes (one call in make_app)."""
    app[BATCH_LEASES] = leases = BatchLeases(api)
    app.on_startup.append(leases.start)
    app.on_shutdown.append(leases.stop)
    r = app.router
    r.add_post("/v1/queues/{name}/streams/{stream}/batches/{seq}/{part}", read_batch)
    r.add_post("/v1/queues/{name}/streams/{stream}/commit", commit_stream)
    r.add_get("/v1/queues/{name}/streams", list_streams)
    r.add_post("/v1/queues/{name}/rows", put_rows)
