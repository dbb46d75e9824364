"""TLS and access control for ``ackqueue serve``.

``--auth FILE`` names the clients, a secret each, and their rights per queue pattern::

    {"clients": {
        "alice":   {"secret_sha256": "<64 hex digits>",
                    "rights": {"jobs*": ["read", "write"], "*": ["read"]}},
        "monitor": {"secret": "a long random string", "rights": {"*": ["admin"]}}}}

- a secret is given as ``secret_sha256`` (the hex SHA-256 of the token: the file then
  holds nothing a client can send) or as ``secret`` (the token itself, at least 16
  characters).  Tokens are meant to be long random strings (``python -c "import secrets;
  print(secrets.token_urlsafe(32))"``), so a plain SHA-256 is enough: there is nothing to
  guess that a slow password hash would protect.  Each secret names one client.
- rights are "read", "write" and "admin" (admin includes read and write); a pattern is a
  shell pattern (fnmatch, case-sensitive) on queue names; a client's rights on a queue
  are the union of the rights of every pattern that matches it (there is no deny).
- a service-wide route (the list of queues, /stats, /metrics) needs its right under the
  pattern "*" itself.

A request carries ``Authorization: Bearer <secret>`` (or Basic with the client's name as
user and its secret as password: what a browser sends for the stats page after asking).
Without valid credentials: 401 with ``WWW-Authenticate``; without the right: 403; both
``{"error": {"code", "message"}}``.  /health and /openapi.json stay open.  With auth on,
a client id (X-Client-Id, ?client=, /v1/leases/{client}) must be the client's name or
start with its name and ":" (alice, alice:worker-3): no client renews or ends another's
lease.  Routes this module does not know (added later) need admin on "*".

Routes that take receipt handles act on a receipt only within the queue the request names,
and the right is checked on the receipt's own queue: Sasquatch's /delete and
/change_visibility, which may name no queue, check it in their handler (``may``: the
request's client, which the middleware records on the request).

Secrets are compared in constant time (hmac.compare_digest over every client).
"""
import base64
import fnmatch
import hashlib
import hmac
import ipaddress
import json
import re
import ssl

from aiohttp import web

from ackqueue import jsontext

from .params import batch_queues

__all__ = ["Auth", "load_auth", "ROUTES", "prepare", "Refused", "is_loopback", "may"]

RIGHTS = ("read", "write", "admin")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def _request_key(name):
    """A key of a request's storage: web.RequestKey where aiohttp has it (newer releases
    warn about string keys), the string name on the older ones setup.py allows."""
    key_type = getattr(web, "RequestKey", None)
    return name if key_type is None else key_type(name, object)


AUTH = _request_key("ackqueue.auth")           # set on every request: auth is on
CLIENT = _request_key("ackqueue.client")       # the request's auth.Client

# (method, route) -> (right, where the queue name is): "path" {name}; "all" service-wide
# (the right under "*"); "body" the JSON body's queue_name (Sasquatch); "batch" every
# queue_name of the body's messages; "query" ?queue_name=; "lease" the client id in the
# path must be the caller's; "txn" an atomic batch's queues (params.batch_queues: write
# where it puts, read where it acks); "receipts" the body's queue_name if it names one,
# else the handler checks each receipt's queue (may()); None: open.
ROUTES = {
    ("GET", "/health"): None,
    ("GET", "/openapi.json"): None,
    # the native API
    ("GET", "/v1/queues"): ("read", "all"),
    ("GET", "/v1/queues/{name}"): ("read", "path"),
    ("POST", "/v1/queues/{name}/messages"): ("write", "path"),
    ("POST", "/v1/queues/{name}/batch"): ("write", "path"),
    ("POST", "/v1/queues/{name}/receive"): ("read", "path"),
    ("POST", "/v1/queues/{name}/ack"): ("read", "path"),
    ("DELETE", "/v1/queues/{name}/messages"): ("read", "path"),
    ("POST", "/v1/queues/{name}/nack"): ("read", "path"),
    ("POST", "/v1/queues/{name}/visibility"): ("read", "path"),
    ("GET", "/v1/queues/{name}/browse"): ("read", "path"),
    ("GET", "/v1/queues/{name}/codec"): ("read", "path"),
    ("PUT", "/v1/queues/{name}/codec"): ("write", "path"),
    ("POST", "/v1/queues/{name}/purge"): ("admin", "path"),
    ("POST", "/v1/queues/{name}/redrive"): ("admin", "path"),
    ("POST", "/v1/batch"): ("write", "txn"),
    ("POST", "/v1/pack"): ("admin", "all"),
    ("POST", "/v1/leases/{client}"): ("read", "lease"),
    ("DELETE", "/v1/leases/{client}"): ("read", "lease"),
    # leased batches and row puts of stream processors (service/leased_batches.py)
    ("POST", "/v1/queues/{name}/streams/{stream}/batches/{seq}/{part}"): ("read", "path"),
    ("POST", "/v1/queues/{name}/streams/{stream}/commit"): ("read", "path"),
    ("GET", "/v1/queues/{name}/streams"): ("read", "path"),
    ("POST", "/v1/queues/{name}/rows"): ("write", "path"),
    # figures
    ("GET", "/stats"): ("admin", "all"),
    ("GET", "/stats.json"): ("admin", "all"),
    ("GET", "/metrics"): ("admin", "all"),
    # Sasquatch's API
    ("POST", "/send"): ("write", "body"),
    ("POST", "/send_batch"): ("write", "batch"),
    ("POST", "/enqueue"): ("write", "query"),
    ("POST", "/receive"): ("read", "body"),
    ("POST", "/dequeue"): ("read", "body"),
    ("POST", "/delete"): ("read", "receipts"),
    ("POST", "/change_visibility"): ("read", "receipts"),
    ("POST", "/queue_length"): ("read", "body"),
    ("POST", "/delete_all"): ("admin", "body"),
    ("GET", "/queues"): ("read", "all"),
    # SQS's JSON protocol: signed with SigV4, checked by ackqueue.service.sqs itself
    ("POST", "/"): None,
}
_UNKNOWN = ("admin", "all")


class Refused(Exception):
    """The service will not start as asked (one line for the operator)."""


def _error(status, code, message, challenge=None):
    body = {"error": {"code": code, "message": message}}
    response = web.json_response(body, status=status)
    if challenge is not None:
        response.headers.add("WWW-Authenticate", challenge)
        response.headers.add("WWW-Authenticate", 'Basic realm="ackqueue", charset="UTF-8"')
    return response


class Client:
    __slots__ = ("name", "digest", "rights", "secret")

    def __init__(self, name, digest, rights, secret=None):
        self.name, self.digest, self.rights = name, digest, rights
        self.secret = secret      # given as "secret": SQS's SigV4 needs it (key id: name)

    def may(self, right, queue):
        """Whether this client has right on the queue named queue ("*": every queue)."""
        for pattern, rights in self.rights:
            if (right in rights or "admin" in rights) and (
                    pattern == "*" if queue == "*" else fnmatch.fnmatchcase(queue, pattern)):
                return True
        return False

    def owns(self, client_id):
        return client_id == self.name or client_id.startswith(self.name + ":")


class Auth:
    """The clients of an auth file and the middleware that checks every request."""

    def __init__(self, clients):
        self.clients = clients                        # name -> Client
        self._dummy = hashlib.sha256(b"no such client").digest()

    # -- who is asking -------------------------------------------------------------------

    def authenticate(self, header):
        """The Client the Authorization header names, or None."""
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        scheme = scheme.lower()
        if scheme == "bearer" and value:
            digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()
            found = None
            for client in self.clients.values():       # every one: constant time
                if hmac.compare_digest(digest, client.digest):
                    found = client
            return found
        if scheme == "basic" and value:
            try:
                name, sep, secret = base64.b64decode(value, validate=True).decode(
                    "utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            if not sep:
                return None
            client = self.clients.get(name)
            digest = hashlib.sha256(secret.encode("utf-8")).digest()
            ok = hmac.compare_digest(digest, client.digest if client else self._dummy)
            return client if ok and client is not None else None
        return None

    # -- the middleware ------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request, handler):
        request[AUTH] = self
        route = request.match_info.route
        canonical = route.resource.canonical if route.resource is not None else None
        rule = ROUTES.get((request.method, canonical), _UNKNOWN)
        if request.method == "HEAD":
            rule = ROUTES.get(("GET", canonical), _UNKNOWN)
        if rule is None:
            return await handler(request)
        header = request.headers.get("Authorization")
        if header is None:
            return _error(401, "Unauthenticated",
                          "this service needs credentials: Authorization: Bearer <secret>",
                          'Bearer realm="ackqueue"')
        client = self.authenticate(header)
        if client is None:
            return _error(401, "Unauthenticated", "unknown or malformed credentials",
                          'Bearer realm="ackqueue", error="invalid_token"')
        request[CLIENT] = client
        if canonical is None:                          # no route: the app says 404/405
            return await handler(request)
        for cid in (request.headers.get("X-Client-Id"), request.query.get("client")):
            if cid is not None and not client.owns(cid):
                return _error(403, "Forbidden", f"client {client.name} may use client ids "
                              f"{client.name} and {client.name}:..., not {cid!r}")
        right, where = rule
        if where == "lease":
            cid = request.match_info.get("client", "")
            if not client.owns(cid):
                return _error(403, "Forbidden", f"client {client.name} may not renew or end "
                              f"the lease of {cid!r}")
            return await handler(request)
        try:
            queues = await _queues(request, where)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "MessageSizeExceeded", "the request body is over the limit")
        for queue, need in queues:
            need = need or right
            if not client.may(need, queue):
                what = "every queue (*)" if queue == "*" else f"queue {queue!r}"
                return _error(403, "Forbidden",
                              f"client {client.name} has no {need} right on {what}")
        return await handler(request)


async def _queues(request, where):
    """(queue name, right or None for the route's) a request touches ("*" when
    service-wide or unknown)."""
    if where == "path":
        names = [(request.match_info.get("name", "*"), None)]
        if request.query.get("dead_letter"):
            # a native receive that dead-letters moves messages there: write on that queue
            names.append((request.query["dead_letter"], "write"))
        return names
    if where == "query":
        return [(request.query.get("queue_name") or "*", None)]
    if where == "txn":
        data = await request.read() if request.body_exists else b""
        return batch_queues(data, request.content_type) or [("*", None)]
    if where == "receipts":
        names = await _queues(request, "body")
        # No queue named: the handler checks the queue of each receipt instead of "*".
        return [] if names == [("*", None)] else names
    if where in ("body", "batch"):
        try:
            doc = jsontext.loads(await request.read()) if request.body_exists else None
        except ValueError:                  # (UnicodeDecodeError is one)
            doc = None
        if where == "body":
            names = [(doc.get("queue_name"), None)] if isinstance(doc, dict) else []
        else:
            items = doc.get("messages") if isinstance(doc, dict) else doc
            names = [(m.get("queue_name"), None) for m in items if isinstance(m, dict)] \
                if isinstance(items, list) else []
        names = [(n, r) for n, r in names if isinstance(n, str) and n]
        if not names:
            names = [("*", None)]      # a body that names no queue needs the right on *
        if isinstance(doc, dict) and isinstance(doc.get("dead_letter_queue_name"), str):
            # a receive that dead-letters moves messages there: write on that queue
            names.append((doc["dead_letter_queue_name"], "write"))
        return names
    return [("*", None)]


def may(request, right, queue):
    """Whether the request's client has right on queue: always when the service runs
    without auth (no middleware saw the request); never when it runs with auth and the
    request has no client (an open route), so that a missing check refuses."""
    if request.get(AUTH) is None:
        return True
    client = request.get(CLIENT)
    return client is not None and client.may(right, queue)


def load_auth(path):
    """Auth from a JSON auth file; ValueError listing every problem."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the auth file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"the auth file {path} is not JSON: {exc}") from None
    problems, clients, digests = [], {}, {}
    if not isinstance(doc, dict) or set(doc) != {"clients"} or not isinstance(
            doc["clients"], dict) or not doc["clients"]:
        raise ValueError(f'the auth file {path} must be {{"clients": {{NAME: {{...}}, ...}}}}')
    for name, spec in doc["clients"].items():
        where = f"client {name!r}"
        if not re.match(r"[A-Za-z0-9_.\-]{1,64}\Z", name):
            problems.append(f"{where}: a name is 1 to 64 characters among A-Z a-z 0-9 _ . -")
        if not isinstance(spec, dict):
            problems.append(f"{where}: must be an object with secret and rights")
            continue
        unknown = set(spec) - {"secret", "secret_sha256", "rights"}
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)}")
        digest = None
        if ("secret" in spec) == ("secret_sha256" in spec):
            problems.append(f"{where}: give secret or secret_sha256 (one of them)")
        elif "secret" in spec:
            if not isinstance(spec["secret"], str) or len(spec["secret"]) < 16:
                problems.append(f"{where}: a secret is a string of at least 16 characters")
            else:
                digest = hashlib.sha256(spec["secret"].encode("utf-8")).digest()
        else:
            h = spec["secret_sha256"]
            if not isinstance(h, str) or not _HEX64.match(h.lower()):
                problems.append(f"{where}: secret_sha256 is 64 hex digits")
            else:
                digest = bytes.fromhex(h)
        if digest is not None:
            if digest in digests:
                problems.append(f"{where}: same secret as client {digests[digest]!r}")
            digests[digest] = name
        rights = []
        if not isinstance(spec.get("rights"), dict) or not spec["rights"]:
            problems.append(f"{where}: rights is an object {{PATTERN: [RIGHT, ...]}}")
        else:
            for pattern, granted in spec["rights"].items():
                if not isinstance(granted, list) or not granted or not all(
                        r in RIGHTS for r in granted):
                    problems.append(f"{where}: rights of {pattern!r} are a list among "
                                    f"{', '.join(RIGHTS)}")
                    continue
                rights.append((pattern, frozenset(granted)))
        clients[name] = Client(name, digest, rights, spec.get("secret"))
    if problems:
        raise ValueError(f"the auth file {path}: " + "; ".join(problems))
    return Auth(clients)


def is_loopback(host):
    if host in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def prepare(host, tls_cert=None, tls_key=None, auth_file=None, insecure=False):
    """(ssl context or None, Auth or None) for serve's options; Refused with one line."""
    if (tls_cert is None) != (tls_key is None):
        raise Refused("ackqueue serve: give --tls-cert and --tls-key together")
    if not is_loopback(host) and not (tls_cert and auth_file) and not insecure:
        missing = " and ".join(w for w, on in (("TLS (--tls-cert/--tls-key)", tls_cert),
                                                 ("auth (--auth FILE)", auth_file)) if not on)
        raise Refused(f"ackqueue serve: refusing to listen on {host}, not a loopback address, "
                      f"without {missing}; give --insecure to do it anyway")
    context = None
    if tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise Refused(f"ackqueue serve: cannot load the TLS certificate {tls_cert} and "
                          f"key {tls_key}: {exc}") from None
    auth = None
    if auth_file is not None:
        try:
            auth = load_auth(auth_file)
        except ValueError as exc:
            raise Refused(f"ackqueue serve: {exc}") from None
    return context, auth
