"""The AWS SQS JSON protocol on ``ackqueue serve``: ``POST /`` with
``X-Amz-Target: AmazonSQS.<Action>`` and a JSON body (``application/x-amz-json-1.0``), what
boto3, the AWS CLI and the AWS SDKs send.  The queues are the service's queues: a queue made
through SQS is the one the native API, Sasquatch's API and the Python drop-in see.

Modules: ``errors`` (SQS's error shape and codes), ``sigv4`` (signature verification),
``queueattrs`` (queue attributes, names, ARNs), ``registry`` (their durable record),
``msgattrs`` and ``digest`` (message attributes and their MD5), ``front`` (the state),
``fifo`` (FIFO queues' message groups), ``queues``, ``messages``, ``receive``, ``redrive``
and ``permissions`` (the actions).

One road per message, the native API's: sends go through the runtime's ``put_many``; a
receive takes through the front's connection to the queue (``SqsFront.queue``), on the
event loop's thread when messages are ready (the runtime's poll with the service's
``receive_now``); its deletes (the runtime's ``ack_many``) and visibility changes go
through that same connection, the one holding the delivery.

Auth: with ``--auth FILE``, a request must be signed (SigV4) with a client's name as access
key id and its ``secret`` as secret key, and the client needs the action's right on the
queue (read: receive, delete, change visibility, get attributes, URL and tags; write:
send, create; admin: delete and purge queues, set attributes, tag, move messages).
Without ``--auth`` any credentials are accepted (the service refuses to listen beyond
loopback without auth unless --insecure).
"""
import json
import logging
import uuid

from aiohttp import web

from ackqueue import jsontext

from . import messages, permissions, queues, receive, redrive
from .errors import CONTENT_TYPE, SqsError, error_response
from .front import Call, SqsFront
from .params import queue_name_of_url
from .queueattrs import REGION, name_of_arn
from .sigv4 import verify

__all__ = ["add_routes", "SQS_FRONT"]

log = logging.getLogger("ackqueue.service.sqs")
PREFIX = "AmazonSQS."
SQS_FRONT = web.AppKey("sqs", SqsFront)
ACTIONS = {**queues.ACTIONS, **messages.ACTIONS, **receive.ACTIONS, **redrive.ACTIONS,
           **permissions.ACTIONS}


def _queues_of(params, where):
    """The queue names a request touches, for the rights check."""
    if where is None:
        return ["*"]
    if where == "name":
        name = params.get("QueueName")
        return [name if isinstance(name, str) and name else "*"]
    if where == "url":
        try:
            return [queue_name_of_url(params.get("QueueUrl"))]
        except SqsError:
            return ["*"]
    key = where.split(":", 1)[1]
    return [name_of_arn(params.get(key)) or "*"]


class Handler:
    def __init__(self, front, auth):
        self.front = front
        self.auth = auth

    def _secret(self, key_id):
        client = self.auth.clients.get(key_id)
        return None if client is None else getattr(client, "secret", None)

    def _authorize(self, request, body, action, params):
        """(auth.Client or None, key id, region) of the request, or SqsError."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        if self.auth is None:
            scope = headers.get("authorization", "").split("Credential=", 1)[-1].split("/")
            region = scope[2] if len(scope) >= 5 else REGION
            return None, scope[0] if len(scope) >= 5 else None, region
        key_id, region = verify(request.method, request.path, request.query_string, headers,
                                body, self._secret)
        client = self.auth.clients[key_id]
        handler, right, where = ACTIONS[action]
        if right is not None:
            for queue in _queues_of(params, where):
                if not client.may(right, queue):
                    raise SqsError("AccessDenied",
                                   f"User: {key_id} is not authorized to perform: "
                                   f"sqs:{action} on resource: {queue}")
        return client, key_id, region

    async def handle(self, request):
        try:
            return await self._handle(request)
        except SqsError as exc:
            return error_response(exc)
        except web.HTTPException:
            raise
        except Exception as exc:
            full = self.front.api.storage_full(exc)
            if full is not None:            # no traceback: one line per interval
                return error_response(SqsError("ServiceUnavailable", full.message,
                                               headers=full.headers))
            log.exception("ackqueue SQS: internal error")
            return error_response(SqsError("InternalError", "internal error"))

    async def _handle(self, request):
        target = request.headers.get("X-Amz-Target", "")
        if not target.startswith(PREFIX):
            raise SqsError("InvalidAction", "this endpoint speaks the SQS JSON protocol: "
                                            "X-Amz-Target: AmazonSQS.<Action>")
        action = target[len(PREFIX):]
        if action not in ACTIONS:
            raise SqsError("InvalidAction", f"The action {action} is not valid for this "
                                            "endpoint.")
        body = await request.read()
        try:
            params = jsontext.loads(body) if body.strip() else {}
        except ValueError as exc:               # (UnicodeDecodeError is one)
            raise SqsError("InvalidParameterValue",
                           "the request body is not JSON" + jsontext.why(exc)) from None
        if not isinstance(params, dict):
            raise SqsError("InvalidParameterValue", "the request body must be a JSON object")
        client, key_id, region = self._authorize(request, body, action, params)
        call = Call(action, params, f"{request.scheme}://{request.host}", region, client,
                    key_id, request=request)
        result = await ACTIONS[action][0](self.front, call)
        return web.Response(body=json.dumps(result).encode(), content_type=CONTENT_TYPE,
                            headers={"x-amzn-RequestId": str(uuid.uuid4())})


def add_routes(app, api, auth=None):
    """Register the SQS endpoint (POST /) on app; make_app calls this."""
    front = SqsFront(api)
    app[SQS_FRONT] = front
    app.on_cleanup.insert(0, front.close)
    app.router.add_post("/", Handler(front, auth).handle)     # a coroutine function, as aiohttp wants
    return front
