"""The OpenAPI 3 document of the native API, served at /openapi.json (written by hand:
keep it in step with ackqueue.service.http)."""

__all__ = ["document"]

_ERR = {"description": "error", "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/Error"}}}}


def _q(name, schema, description, required=False):
    return {"name": name, "in": "query", "required": required, "schema": schema,
            "description": description}


_NAME = {"name": "name", "in": "path", "required": True,
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,80}$"},
         "description": "queue name; a queue is opened (created) on first use"}
_CLIENT_H = {"name": "X-Client-Id", "in": "header", "required": True,
             "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:\\-]{1,128}$"},
             "description": "the client whose lease holds the deliveries; any request "
                            "carrying it renews the lease"}
_RECEIPTS = [
    _q("receipt", {"type": "string"}, "receipt handle(s), repeatable or comma-separated"),
]
_RECEIPTS_BODY = {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {"receipts": {"type": "array",
                                                  "items": {"type": "string"},
                                                  "maxItems": 1000}},
    "required": ["receipts"]}}}}
_ENCODING = _q("encoding", {"type": "string", "enum": ["str", "bytes", "json", "pickle"]},
               "what the body holds, stored with it so every front reads it back the same "
               "(default: from the Content-Type, else bytes)")
_PUT_PARAMS = [
    _NAME,
    _q("priority", {"type": "integer", "minimum": 0, "maximum": 1000, "default": 100},
       "higher first; FIFO within a level"),
    _q("delay", {"type": "number", "minimum": 0}, "seconds before it becomes visible"),
    _q("retention", {"type": "number", "minimum": 0.001, "maximum": 1209600},
       "seconds until it expires unprocessed (default: 4 days)"),
    _q("dedup_id", {"type": "string", "minLength": 1, "maxLength": 128},
       "a second put with it within the dedup window (300 s) gets 409"),
    {"name": "Idempotency-Key", "in": "header", "required": False,
     "schema": {"type": "string", "minLength": 1, "maxLength": 100},
     "description": "a retried put with the same key returns the original id "
                    "(duplicate: true) and stores nothing; not with dedup_id"},
    {"name": "X-Attributes", "in": "header", "required": False,
     "schema": {"type": "string"},
     "description": "a JSON object of up to 10 string: string pairs"},
    _q("dedup_window", {"type": "number", "minimum": 0, "maximum": 1209600},
       "seconds the put's dedup id is remembered (default 300)"),
]


def _ok(schema, description="ok"):
    return {"description": description,
            "content": {"application/json": {"schema": schema}}}


def _errors(*codes):
    return {str(c): _ERR for c in codes}


def _sasquatch_paths():
    from .rpc import OPENAPI_PATHS
    return OPENAPI_PATHS


def _batches_paths():
    from .leased_batches import OPENAPI_PATHS
    return OPENAPI_PATHS


def document():
    """The OpenAPI document of the native API (and, merged in, Sasquatch's paths).  Longer
    than 60 lines on purpose: it is one data literal, read top to bottom like the API."""
    msg = {"$ref": "#/components/schemas/Message"}
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "ackqueue native API", "version": "1",
                 "description": "The queue service (ackqueue serve). Bodies are opaque "
                                "bytes: raw in a put, base64 in JSON answers, raw in the "
                                "frames encoding (application/vnd.ackqueue.frames: each "
                                "part a 4-byte big-endian length and its bytes). A request "
                                "that changes a queue is answered once its commit is "
                                "durable."},
        "paths": {
            "/health": {"get": {"summary": "liveness and server figures", "responses": {
                "200": _ok({"type": "object", "properties": {
                    "status": {"type": "string"}, "threads": {"type": "integer"},
                    "queues_open": {"type": "integer"}, "clients": {"type": "integer"},
                    "long_polls": {"type": "integer"}, "uptime": {"type": "number"}}})}}},
            "/openapi.json": {"get": {"summary": "this document",
                                      "responses": {"200": _ok({"type": "object"})}}},
            "/v1/queues": {"get": {"summary": "every queue of the storage with its counts",
                                   "responses": {"200": _ok({"type": "object", "properties": {
                                       "queues": {"type": "object", "additionalProperties":
                                                  {"$ref": "#/components/schemas/Counts"}}}}),
                                       **_errors(500)}}},
            "/v1/queues/{name}": {"get": {
                "summary": "counts and lifetime totals (stats)", "parameters": [_NAME],
                "responses": {"200": _ok({"type": "object", "properties": {
                    "name": {"type": "string"}, "stats": {"type": "object",
                                                          "additionalProperties":
                                                              {"type": "integer"}}}}),
                    **_errors(400, 500)}}},
            "/v1/queues/{name}/messages": {
                "post": {"summary": "put one message; the request body is its bytes, "
                                    "stored as its Content-Type (or ?encoding=) says: "
                                    "text/plain a str, application/json a JSON value, "
                                    "application/x-python-pickle a pickle, anything "
                                    "else bytes",
                         "parameters": _PUT_PARAMS + [_ENCODING],
                         "requestBody": {"required": True, "content": {
                             t: {"schema": {"type": "string", "format": "binary"}}
                             for t in ("application/octet-stream", "text/plain",
                                       "application/json", "application/x-python-pickle")}},
                         "responses": {"200": _ok({"type": "object", "properties": {
                             "id": {"type": "integer"}, "duplicate": {"type": "boolean"}},
                             "required": ["id"]}), **_errors(400, 409, 413, 500)}},
                "delete": {"summary": "acknowledge (same as POST .../ack)",
                           "parameters": [_NAME] + _RECEIPTS, "requestBody": _RECEIPTS_BODY,
                           "responses": {"200": _ok({"type": "object", "properties": {
                               "acked": {"type": "integer"}}}), **_errors(400, 409, 410)}}},
            "/v1/queues/{name}/batch": {"post": {
                "summary": "put 1 to 1000 messages in one commit (all or none); the body is "
                           "frames, one per message; options apply to all; an "
                           "Idempotency-Key covers the batch (resend the same batch)",
                "parameters": _PUT_PARAMS[:4] + _PUT_PARAMS[5:] + [_PUT_PARAMS[4], _ENCODING],
                "requestBody": {"required": True, "content": {
                    "application/vnd.ackqueue.frames": {"schema": {"type": "string",
                                                                   "format": "binary"}}}},
                "responses": {"200": _ok({"type": "object", "properties": {
                    "ids": {"type": "array", "items": {"type": "integer"}},
                    "duplicate": {"type": "boolean"}}}), **_errors(400, 409, 413, 500)}}},
            "/v1/queues/{name}/receive": {"post": {
                "summary": "receive up to max messages, long-polling up to wait seconds; "
                           "ack= receipts are acknowledged durably first",
                "parameters": [_NAME, _CLIENT_H,
                               _q("max", {"type": "integer", "minimum": 1, "maximum": 100,
                                          "default": 1}, "most messages to receive"),
                               _q("wait", {"type": "number", "minimum": 0, "maximum": 60,
                                           "default": 0}, "long poll seconds"),
                               _q("visibility_timeout", {"type": "number",
                                                         "minimum": 0.001,
                                                         "maximum": 43200},
                                  "seconds before an unacknowledged delivery is given "
                                  "back (default: held until ack or lease end)"),
                               _q("ack", {"type": "string"},
                                  "receipts to acknowledge before receiving"),
                               _q("max_receives", {"type": "integer", "minimum": 1},
                                  "a message received this often without an ack is "
                                  "dead-lettered at the receive that would deliver it "
                                  "again"),
                               _q("dead_letter", {"type": "string",
                                                  "pattern": "^[A-Za-z0-9_.\\-]{1,80}$"},
                                  "the queue it moves to (with max_receives; write right "
                                  "there under --auth); without it, dropped")],
                "responses": {"200": {"description": "messages (possibly none)", "content": {
                    "application/json": {"schema": {"type": "object", "properties": {
                        "messages": {"type": "array", "items": msg}}}},
                    "application/vnd.ackqueue.frames": {"schema": {
                        "type": "string", "format": "binary",
                        "description": "two frames per message: its metadata as JSON (a "
                                       "Message without body), then its body"}}}},
                    **_errors(400, 409, 410, 500)}}},
            "/v1/queues/{name}/ack": {"post": {
                "summary": "acknowledge deliveries (one commit per client; all or none)",
                "parameters": [_NAME] + _RECEIPTS, "requestBody": _RECEIPTS_BODY,
                "responses": {"200": _ok({"type": "object", "properties": {
                    "acked": {"type": "integer"}}}), **_errors(400, 409, 410, 500)}}},
            "/v1/queues/{name}/nack": {"post": {
                "summary": "give deliveries back now (or after delay seconds)",
                "parameters": [_NAME] + _RECEIPTS + [
                    _q("delay", {"type": "number", "minimum": 0}, "seconds")],
                "requestBody": _RECEIPTS_BODY,
                "responses": {"200": _ok({"type": "object", "properties": {
                    "nacked": {"type": "integer"}}}), **_errors(400, 409, 410, 500)}}},
            "/v1/queues/{name}/visibility": {"post": {
                "summary": "a new visibility deadline; 0 or less gives it back now",
                "parameters": [_NAME] + _RECEIPTS + [
                    _q("visibility_timeout", {"type": "number", "maximum": 43200},
                       "seconds from now", required=True)],
                "requestBody": _RECEIPTS_BODY,
                "responses": {"200": _ok({"type": "object", "properties": {
                    "changed": {"type": "integer"}}}), **_errors(400, 409, 410, 500)}}},
            "/v1/queues/{name}/purge": {"post": {
                "summary": "remove every ready and delayed message", "parameters": [_NAME],
                "responses": {"200": _ok({"type": "object", "properties": {
                    "purged": {"type": "integer"}}}), **_errors(400, 500)}}},
            "/v1/queues/{name}/browse": {"get": {
                "summary": "read-only page of messages by id (nothing claimed or counted)",
                "parameters": [_NAME,
                               _q("after", {"type": "integer", "minimum": -1, "default": -1},
                                  "ids greater than this"),
                               _q("limit", {"type": "integer", "minimum": 1, "maximum": 1000,
                                            "default": 100}, "page size")],
                "responses": {"200": _ok({"type": "object", "properties": {
                    "messages": {"type": "array", "items": {"type": "object"}},
                    "next_after": {"type": "integer", "nullable": True}}}),
                    **_errors(400, 500)}}},
            "/v1/leases/{client}": {
                "post": {"summary": "renew a client's lease",
                         "parameters": [{"name": "client", "in": "path", "required": True,
                                         "schema": {"type": "string"}}],
                         "responses": {"200": _ok({"type": "object"}), **_errors(400)}},
                "delete": {"summary": "end a client's lease now: what it holds is given back",
                           "parameters": [{"name": "client", "in": "path", "required": True,
                                           "schema": {"type": "string"}}],
                           "responses": {"200": _ok({"type": "object"}), **_errors(400)}}},
            **_sasquatch_paths(),        # Sasquatch's API, on the same port
            **_batches_paths(),          # stream processors' routes (service/batches.py)
        },
        "components": {"schemas": {
            "Error": {"type": "object", "properties": {"error": {
                "type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string", "enum": [
                        "InvalidRequest", "ValidationError", "NotFound", "MethodNotAllowed",
                        "DuplicateMessage", "StaleReceipt", "UnknownReceipt",
                        "MessageSizeExceeded", "RequestTimeout", "InternalError",
                        "QueueFull", "QueueKindMismatch", "StorageFull"]},
                    "message": {"type": "string"}}}}},
            "Counts": {"type": "object", "properties": {
                "ready": {"type": "integer"}, "in_flight": {"type": "integer"},
                "delayed": {"type": "integer"}}},
            "Message": {"type": "object", "properties": {
                "id": {"type": "integer"}, "receipt": {"type": "string"},
                "receive_count": {"type": "integer"}, "sent_at": {"type": "number"},
                "deadline": {"type": "number", "nullable": True},
                "priority": {"type": "integer"},
                "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
                "encoding": {"type": "string", "enum": ["str", "bytes", "json", "pickle"],
                             "description": "what the body holds (ackqueue.codec): UTF-8 "
                                            "text, bytes, JSON, or a Python pickle, which "
                                            "the service never unpickles"},
                "body": {"type": "string", "format": "byte"}}},
        }},
    }
    from .stats import openapi_paths             # /stats, /stats.json, /metrics; auth
    openapi_paths(doc)
    from . import admin, atomic_batch, encodings
    atomic_batch.openapi_paths(doc)                     # /v1/batch
    admin.openapi_paths(doc)                     # redrive, pack
    encodings.openapi_paths(doc)                    # /v1/queues/{name}/codec
    _storage_full(doc)
    return doc


_FULL = {"description": "the storage is full (StorageFull; Sasquatch's sends: also "
                        "QueueFull): nothing of the commit was kept; retry after "
                        "Retry-After seconds",
         "headers": {"Retry-After": {"schema": {"type": "integer"},
                                     "description": "seconds to wait before a retry"}},
         "content": _ERR["content"]}


def _storage_full(doc):
    """A 503 answer on every operation that answers errors: any of them may open (make)
    a queue or commit, which a full disk refuses (service/storagefull.py)."""
    for item in doc["paths"].values():
        for op in item.values():
            responses = op.get("responses", {})
            if any(code[0] in "45" for code in responses):
                responses["503"] = _FULL
