"""Request parameters of the native API, shared by the fronts that read them the same way
(the native handlers, admin, encodings, leased batches, the atomic batch).

Each helper reads one parameter from an aiohttp request (query, header, path or body) and
returns it checked, or raises errors.ApiError: 400 InvalidRequest for a value that cannot
be read (not a number, malformed JSON), 400 ValidationError for one out of its range.
Nothing here touches a queue.
"""
import math

from ackqueue import codec, jsontext, store
from ackqueue.frames import FRAMES, decode_frames
from ackqueue.queue import MAX_ATTRIBUTES, MAX_DEDUP_ID

from .backend import check_client, check_name
from .errors import ApiError

__all__ = ["MAX_BATCH", "MAX_RECEIVE", "MAX_WAIT", "number", "queue_name", "client",
           "path_client", "put_options", "dead_letter_options", "dedup", "encoding",
           "marked", "receipts", "frames", "batch_document", "batch_queues"]

MAX_BATCH = 1000            # messages of a batch put, receipts of one ack
MAX_RECEIVE = 100           # messages of one receive
MAX_WAIT = 60.0             # seconds of one long poll


def number(request, key, default, *, lo=0.0, hi=None, integer=False):
    """The query parameter key as a number in [lo, hi] (an int when integer), default when
    absent."""
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


def queue_name(request):
    """The queue name of the route's {name}."""
    try:
        return check_name(request.match_info["name"])
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc)) from None


def client(request, required):
    """The client id (header X-Client-Id, else ?client=); None when absent and not
    required."""
    value = request.headers.get("X-Client-Id") or request.query.get("client")
    if value is None:
        if required:
            raise ApiError(400, "InvalidRequest",
                           "this request needs a client id (header X-Client-Id): the "
                           "deliveries it receives are held for that client's lease")
        return None
    try:
        return check_client(value)
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc)) from None


def path_client(request):
    """The client id of the route's {client}."""
    try:
        return check_client(request.match_info["client"])
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", str(exc)) from None


def put_options(request):
    """A put's keyword arguments: priority, delay, retention, dedup_window, attributes
    (header X-Attributes, a JSON object of strings)."""
    opts = {"priority": number(request, "priority", store.DEFAULT_PRIORITY,
                               hi=store.PRIORITY_MAX, integer=True),
            "delay": number(request, "delay", 0.0, hi=store.MAX_RETENTION)}
    retention = number(request, "retention", None, lo=0.001, hi=store.MAX_RETENTION)
    if retention is not None:
        opts["retention"] = retention
    window = number(request, "dedup_window", None, hi=store.MAX_RETENTION)
    if window is not None:                  # how long the put's dedup id is remembered
        opts["dedup_window"] = window
    raw = request.headers.get("X-Attributes")
    if raw is not None:
        opts["attributes"] = _attributes(raw)
    return opts


def _attributes(raw):
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
    return attributes


def dead_letter_options(request, name):
    """A receive's dead-letter policy (AckQueue's max_receives= and dead_letter=)."""
    opts = {}
    max_receives = number(request, "max_receives", None, lo=1, hi=1 << 31, integer=True)
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


def dedup(request):
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


def encoding(request):
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


def marked(what, body, index=None):
    """body marked as encoding what (codec.mark); 400 when it is not what it says."""
    try:
        return codec.mark(what, body)
    except ValueError as exc:
        where = "" if index is None else f"message {index}: "
        raise ApiError(400, "ValidationError",
                       f"{where}the body is not {what} as its encoding says ({exc})") from None


async def receipts(request):
    """Receipt handles from ?receipt=... (repeatable, comma-separated) or a JSON body
    {"receipts": [...]}; 1 to MAX_BATCH of them."""
    found = [r for v in request.query.getall("receipt", []) for r in v.split(",") if r]
    if request.body_exists:                 # read (and cached) by the runtime's middleware
        data = await request.read()
        if data.strip():
            found += _body_receipts(data)
    if not found:
        raise ApiError(400, "InvalidRequest", "no receipt handle given")
    if len(found) > MAX_BATCH:
        raise ApiError(400, "ValidationError", f"at most {MAX_BATCH} receipts")
    return found


def _body_receipts(data):
    try:
        doc = jsontext.loads(data)
        more = doc["receipts"]
        if not isinstance(more, list) or not all(isinstance(r, str) for r in more):
            raise ValueError
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "InvalidRequest",
                       'the body must be {"receipts": ["...", ...]}'
                       + jsontext.why(exc)) from None
    return more


def frames(data):
    """The parts of a framed body (ackqueue.frames); 400 InvalidRequest when its framing
    is bad."""
    try:
        return decode_frames(data)
    except ValueError as exc:
        raise ApiError(400, "InvalidRequest", f"bad framing: {exc}") from None


def batch_document(data, content_type):
    """(document, bodies or None) of an atomic batch's body (POST /v1/batch), JSON or
    frames; ApiError for a body that is neither, or names unknown fields."""
    bodies = None
    if content_type == FRAMES:
        parts = frames(data)
        if not parts:
            raise ApiError(400, "InvalidRequest", "frames: the JSON document comes first")
        data, bodies = parts[0], parts[1:]
    try:
        doc = jsontext.loads(data)
    except ValueError as exc:                   # (UnicodeDecodeError is one)
        raise ApiError(400, "InvalidRequest",
                       "the body must be a JSON object" + jsontext.why(exc)) from None
    if not isinstance(doc, dict):
        raise ApiError(400, "InvalidRequest", "the body must be a JSON object")
    unknown = set(doc) - {"puts", "acks", "lease", "idempotency_key"}
    if unknown:
        raise ApiError(400, "ValidationError", f"unknown fields: {', '.join(sorted(unknown))}")
    return doc, bodies


def batch_queues(data, content_type):
    """[(queue, right)] a batch request touches, for access control: write on the queues
    it puts to, read on those whose receipts it acks or checks.  A body that cannot be
    read names none (the handler refuses it)."""
    try:
        doc, _ = batch_document(data, content_type)
    except ApiError:
        return []
    out = []
    for key, right in (("puts", "write"), ("acks", "read")):
        items = doc.get(key)
        for e in items if isinstance(items, list) else ():
            if isinstance(e, dict) and isinstance(e.get("queue"), str):
                out.append((e["queue"], right))
    lease = doc.get("lease")
    items = lease.get("receipts") if isinstance(lease, dict) else None
    for e in items if isinstance(items, list) else ():
        if isinstance(e, dict) and isinstance(e.get("queue"), str):
            out.append((e["queue"], "read"))
    return out
