"""A queue's codec through the service, so that remote producers and consumers agree.

An embedded queue records the codec it was first opened with (``AckQueue(codec="json")``)
in the queue's record, and refuses another (CodecMismatch).  A queue reached through the
service (``AckQueue(path="http://...", codec=...)``) does the same with two requests:

- ``GET /v1/queues/{name}/codec``: ``{"codec": the queue's codec, "stored": whether one is
  recorded}`` (the default, pickle, when none is);
- ``PUT /v1/queues/{name}/codec?codec=C``: records C when the queue has none (pickle, the
  default, is not recorded, as an embedded queue does not), answers as GET; 409
  ``CodecMismatch`` when the queue records another.

The codec only says how clients *encode* items: the service stores and returns bodies as
opaque marked bytes (ackqueue.codec) and never decodes them, so its own fronts ignore it.
"""
import transaction
from aiohttp import web
from ZODB.POSException import ConflictError

from ackqueue import codec, store

__all__ = ["agree", "add_routes", "openapi_paths"]

_ATTEMPTS = 10                  # a conflicting commit of the record is tried again


def agree(q, wanted):
    """(the queue's codec, whether one is stored) once wanted (None: only read) is
    recorded on q's queue record if it had none.  Raises ValueError naming the stored codec
    when wanted differs from it.  Blocking: call from the pool."""
    for attempt in range(_ATTEMPTS):
        tm = transaction.TransactionManager()
        conn = q.db.open(transaction_manager=tm)
        try:
            tm.begin()
            rec = store.ensure_queue(conn.root(), q.name, None)
            stored = rec.codec
            if wanted is not None and stored is not None and stored != wanted:
                raise ValueError(stored)
            if wanted is not None and stored is None and wanted != codec.DEFAULT:
                rec.codec = stored = wanted
                tm.commit()
            return stored or codec.DEFAULT, stored is not None
        except ConflictError:
            if attempt + 1 == _ATTEMPTS:
                raise
        finally:
            tm.abort()
            conn.close()


def add_routes(app, api):
    """Register the two routes on the service's application (api: http.Api)."""
    from .http import ApiError, _name

    async def handle(request):
        name = _name(request)
        wanted = None
        if request.method == "PUT":
            wanted = request.query.get("codec")
            if wanted not in codec.CODECS:
                raise ApiError(400, "ValidationError",
                               f"codec must be one of {', '.join(codec.CODECS)}")
        q = await api.queue(name)
        try:
            agreed, stored = await api.run(agree, q, wanted)
        except ValueError as exc:
            raise ApiError(409, "CodecMismatch",
                           f"queue {name!r} stores its items with codec {str(exc)!r}; open "
                           f"it with codec={str(exc)!r} (or without codec=)",
                           codec=str(exc)) from None
        return web.json_response({"name": name, "codec": agreed, "stored": stored})

    app.router.add_get("/v1/queues/{name}/codec", handle)
    app.router.add_put("/v1/queues/{name}/codec", handle)


def openapi_paths(doc):
    """Add the two routes to the OpenAPI document."""
    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,80}$"}}
    answer = {"description": "the queue's codec", "content": {"application/json": {
        "schema": {"type": "object", "properties": {
            "name": {"type": "string"}, "stored": {"type": "boolean"},
            "codec": {"type": "string", "enum": list(codec.CODECS)}}}}}}
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    doc["paths"]["/v1/queues/{name}/codec"] = {
        "get": {"summary": "the queue's codec (how clients encode its items)",
                "parameters": [name],
                "responses": {"200": answer, "400": dict(error, description="bad request")}},
        "put": {"summary": "record the queue's codec if it has none; 409 if it has another",
                "parameters": [name, {"name": "codec", "in": "query", "required": True,
                                      "schema": {"type": "string",
                                                 "enum": list(codec.CODECS)}}],
                "responses": {"200": answer, "400": dict(error, description="bad request"),
                              "409": dict(error, description="the queue has another codec")}}}
    codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
    if "CodecMismatch" not in codes["enum"]:
        codes["enum"].append("CodecMismatch")
