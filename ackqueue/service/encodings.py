"""A queue's codec through the service, so that remote producers and consumers agree.

An embedded queue records the codec it was first opened with (``AckQueue(codec="json")``)
in the queue's record, and refuses another (CodecMismatch).  A queue reached through the
service (``AckQueue(path="http://...", codec=...)``) does the same with two requests:

- ``GET /v1/queues/{name}/codec``: ``{"codec": the queue's codec, "stored": whether one is
  recorded}`` (the default, pickle, when none is);
- ``PUT /v1/queues/{name}/codec?codec=C``: records C when the queue has none (pickle, the
  default, is not recorded, as an embedded queue does not), answers as GET; 409
  ``CodecMismatch`` when the queue records another.

The recorded codec also decides which bodies the service takes: a queue whose codec is
"json", "str" or "bytes" takes bodies of that encoding only (415 ``UnsupportedEncoding``
naming the codec for another, a pickle above all), so that its consumers, which never
unpickle, are never handed one (``check_bodies``).  The service itself stores and returns
bodies as opaque marked bytes (ackqueue.codec) and never unpickles.
"""
from aiohttp import web

from ackqueue import codec
from ackqueue.errors import CodecMismatch, EncodingRefused

from . import params
from .errors import ApiError, refused

__all__ = ["add_routes", "check_bodies", "in_queue_codec"]


def check_bodies(q, bodies):
    """Raise ApiError 415 UnsupportedEncoding for the first of the stored bodies that q's
    codec does not admit (codec.admits)."""
    try:
        codec.check_admitted(q.codec, bodies, q.name)
    except EncodingRefused as exc:
        raise refused(exc) from None


def in_queue_codec(q, body, index=None):
    """A stored body as q's codec admits it: text (what SQS, Sasquatch and a Spark string
    column send) becomes JSON in a "json" queue (if it is JSON) and bytes in a "bytes"
    queue (codec.mark_text); any other body must be of q's encoding already.  ApiError
    415 UnsupportedEncoding otherwise."""
    try:
        if codec.kind(body) == codec.TEXT:
            return codec.mark_text(q.codec, codec.payload(body), q.name)
        codec.check_admitted(q.codec, [body], q.name)
    except EncodingRefused as exc:
        if index is not None:
            exc = EncodingRefused(f"row {index}: {exc}", exc.codec, exc.encoding, index)
        raise refused(exc) from None
    return body


def add_routes(app, api):
    """Register the two routes on the service's application (api: runtime.Api)."""
    async def handle(request):
        name = params.queue_name(request)
        wanted = None
        if request.method == "PUT":
            wanted = request.query.get("codec")
            if wanted not in codec.CODECS:
                raise ApiError(400, "ValidationError",
                               f"codec must be one of {', '.join(codec.CODECS)}")
        q = await api.queue(name)
        try:
            agreed, stored = await api.run(q.record_codec, wanted)
        except CodecMismatch:
            recorded = q.codec
            raise ApiError(409, "CodecMismatch",
                           f"queue {name!r} stores its items with codec {recorded!r}; open "
                           f"it with codec={recorded!r} (or without codec=)",
                           codec=recorded) from None
        return web.json_response({"name": name, "codec": agreed, "stored": stored})

    app.router.add_get("/v1/queues/{name}/codec", handle)
    app.router.add_put("/v1/queues/{name}/codec", handle)
