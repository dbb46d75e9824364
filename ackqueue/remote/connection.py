"""The remote drop-in: ``AckQueue(path="http://HOST:PORT", name=...)`` through ``ackqueue serve``.

The front (ackqueue.queue.AckQueue) stays the same class; with an http:// or https:// path
it opens a ``RemoteDatabase`` instead of a ZODB database.  The pieces here play the parts
the front expects:

- ``RemoteConnection``: the per-thread proxy (what QueueConnection is for a ZODB queue):
  put/put_many/get/get_message/get_many/ack_holding/nack_holding/change_visibility_holding/
  peek/oldest_unacked/find/close, each one HTTP request to the service's native API (/v1);
- ``RemoteState``: what the front asks of its state (the mutex and conditions named as
  queue.Queue names them, counts, unfinished, ready_count, size_for_maxsize, purge);
- ``RemoteDatabase``: the service address, this process's client id and its lease, and a
  background thread that renews the lease, gives back what ended threads held, and makes
  deferred acks durable (ack_with_next_get).

HTTP: one persistent connection per thread (ackqueue.wire), reopened by itself.  An operation
waits up to wait_timeout seconds (30 by default, ``?wait_timeout=`` in the URL) for the
service, retrying refused or cut-off requests, then raises ServerUnavailable.  Every put
carries an Idempotency-Key, so a put retried after a cut-off request is stored once.

Items are encoded here with ackqueue.codec (a str as text, bytes as bytes, anything else
pickled; the service stores the bytes and never unpickles them) and decoded here on
receive (allowed_classes applies here).

Deliveries are held by this process's client id (host:pid:random), whose lease a background
thread renews every lease/3 seconds: when the process dies, the service gives back what it
held once the lease ends (``ackqueue serve --lease-timeout``, 30 s by default).  A thread
of a live process that ends holding items gives them back (nack) within about a second, by
the embedded queue's rule (the program acknowledges on this queue, or the thread died of an
exception).
"""
import base64
import json
import logging
import os
import queue as _stdlib_queue
import re
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
import weakref

from . import access, codec, store, wire
from .frames import FRAMES, decode_frames, encode_frames
from .connection import (ThreadBound, check_item_sizes, check_visibility, check_wait,
                         watch_thread_failure)
from .errors import (AckQueueError, CodecMismatch, DuplicateMessage, EncodingRefused,
                     ItemTooLarge, NotHeld, NotSupported, ServerUnavailable, ShutDown,
                     StaleAck, unreadable_error)
from .message import Message, MessageId
from .remote_block import RemoteBlock, not_in_block
from .state import check_timeout

__all__ = ["is_url", "RemoteDatabase", "RemoteState", "RemoteConnection", "client_id",
           "check_ack_with_next_get"]

log = logging.getLogger(__name__)

DEFAULT_WAIT_TIMEOUT = 30.0   # seconds an operation waits for an unreachable service
LONG_POLL_SLICE = 20.0        # the longest one receive request waits on the service
POLL_INTERVAL = 0.05          # put() waiting for room under maxsize, join(): counts polled
TICK = 0.05                   # the background thread's period (deferred acks: 50 ms)
REAP_INTERVAL = 0.2           # ended threads' holdings looked for
UNREADABLE_DELAY = 60.0       # a received body that cannot be decoded is set aside so long
_DEFAULT = object()           # connection.DEFAULT's role: the queue's visibility timeout

_CONTENT_TYPES = {codec.PICKLE: "application/x-python-pickle", codec.TEXT: "text/plain",
                  codec.BYTES: "application/octet-stream", codec.JSON: "application/json"}
_MARKS = {codec.TEXT: b"\x01", codec.BYTES: b"\x02", codec.JSON: b"\x03"}
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,80}\Z")


def is_url(path):
    """Whether path names a queue service (http:// or https://)."""
    return isinstance(path, str) and path[:8].lower().startswith(("http://", "https://"))


def check_ack_with_next_get(value):
    """The ack_with_next_get option, checked for its type.  Through the service it is this
    module's; through a server (zeo://) a deferred ack with a longer window
    (ackqueue.deferred.NEXT_GET_WINDOW); AckQueue refuses it for a storage its process
    holds alone, once that storage is open."""
    if value not in (False, True):
        raise TypeError("ack_with_next_get must be True or False")
    return value


_client = (None, None)


def client_id():
    """This process's client id (host:pid:random), new after a fork."""
    global _client
    pid = os.getpid()
    if _client[0] != pid:
        host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:60] or "host"
        _client = (pid, f"{host}:{pid}:{uuid.uuid4().hex[:12]}")
    return _client[1]


# Open remote queues of this process per service address: the lease ends with the last.
_open_lock = threading.Lock()
_open_count = {}




def _restore(encoding, payload):
    """The stored body (codec's marked bytes) for a payload the service returned."""
    mark = _MARKS.get(encoding)
    return payload if mark is None else mark + payload


class _Interrupted(Exception):
    """A long poll cut short by shutdown() in another thread."""


class _Http:
    """One thread's persistent connection to the service."""

    def __init__(self, target):
        self.target = target
        self.conn = None
        self.interrupted = False

    def close(self):
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def interrupt(self):
        self.interrupted = True
        conn = self.conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _connect(self, timeout):
        t = self.target
        self.conn = wire.Connection(t.host, t.port, timeout,
                                    t.access.ssl_context() if t.https else None)

    def request(self, method, path, body=None, headers=None, *, read_timeout=None,
                retry=True):
        """(status, content type, data, attempts before the answered one).  Retries a
        refused, cut-off or 502/503/504 request until wait_timeout, then ServerUnavailable."""
        t = self.target
        deadline = time.monotonic() + t.wait_timeout
        read_timeout = read_timeout or t.wait_timeout
        attempt, pause, why = 0, 0.02, None
        while True:
            try:
                if self.conn is None:
                    self._connect(min(read_timeout, t.wait_timeout))
                self.conn.sock.settimeout(read_timeout)
                status, answer, data = self.conn.request(method, t.prefix + path, body,
                                                         headers)
                if self.conn.will_close:
                    self.close()
                if status in (502, 503, 504):
                    why = f"HTTP {status}"
                    code, message, _ = _error(status, data)
                    if code == "StorageFull":   # retried too (space may be freed); said
                        why += f": {message}"
                else:
                    return status, answer.get("content-type", ""), data, attempt
            except ssl.SSLCertVerificationError as exc:
                self.close()                # retrying cannot help: say so at once
                raise AckQueueError(access.verify_failed(t, exc)) from None
            except OSError as exc:              # wire.WireError and timeouts too
                self.close()
                if self.interrupted:
                    self.interrupted = False
                    raise _Interrupted() from exc
                why = repr(exc)
            except BaseException:
                # KeyboardInterrupt or the like mid-request: drop the connection now, so
                # the service sees its client gone (a long poll that finds a message then
                # gives it back) and no late answer is read as the next request's.
                self.close()
                raise
            if not retry or time.monotonic() + pause > deadline:
                raise ServerUnavailable(
                    f"the queue service at {t.url} could not be reached within "
                    f"{t.wait_timeout:g} s ({why}); {method} {path.split('?')[0]} "
                    "may not have been done")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            attempt += 1


class _Target:
    """Where the service is, and how to reach it: parsed from the queue's URL,
    ``http[s]://[NAME@]HOST:PORT[?wait_timeout=S&tls_ca=FILE&token_file=FILE]``
    (ackqueue.access: TLS and the bearer token)."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a queue service URL is http://HOST:PORT, not {url!r}")
        self.https = parts.scheme.lower() == "https"
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if self.https else 80)
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        self.prefix = parts.path.rstrip("/")
        options = access.parse_options(parts, url)
        self.wait_timeout = options.pop("wait_timeout", DEFAULT_WAIT_TIMEOUT)
        self.access = access.Access(parts, options, url)
        netloc = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port:
            netloc += f":{parts.port}"
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        self.netloc = (parts.username + "@" if parts.username else "") + netloc


def _error(status, data):
    try:
        doc = json.loads(data)["error"]
        return doc.get("code", ""), doc.get("message", ""), doc
    except Exception:
        return "", data[:200].decode("utf-8", "replace"), {}


def _unsupported(what, instead):
    return NotSupported(f"{what} cannot work on a queue reached through the queue service "
                        f"(ackqueue serve): {instead}")


class RemoteDatabase:
    """The front's self._database for a queue service URL."""

    exclusive = False
    owned = True

    def __init__(self, front, url, db, durability, repair):
        if db is not None:
            raise TypeError("pass either path= or db=, not both")
        if durability is not None:
            raise ValueError("durability= applies to a queue file; a queue service's "
                             "durability is set where it runs (ackqueue serve --durability)")
        if repair:
            raise ValueError("repair=True applies to a queue file (path=); repair the "
                             "service's file where it runs")
        if front._clock is not time.time:
            raise ValueError("clock= cannot travel to a queue service: deadlines, delays, "
                             "retention and dedup windows run on the service's own clock "
                             "(time.time where ackqueue serve runs); test with a fake "
                             "clock on an embedded queue instead")
        if front.dead_letter is not None and not _NAME.match(front.dead_letter):
            raise ValueError("a dead-letter queue served by ackqueue serve has a name of 1 "
                             "to 80 characters among A-Z a-z 0-9 _ . -")
        self.target = _Target(url)
        self.description = self.target.url
        self.client = self.target.access.client_id(client_id())
        self.front = weakref.ref(front)
        self.ack_with_next_get = getattr(front, "ack_with_next_get", False)
        front._proxy = RemoteConnection
        self.closed = False
        self.state_ = None
        self._local = threading.local()
        self._https = weakref.WeakSet()
        self._https_lock = threading.Lock()
        self.lease_timeout = None
        self._pid = os.getpid()
        self._renew()                           # reachable now, or ServerUnavailable
        self._start()

    def _start(self):
        self._pid = os.getpid()
        self._key = (self._pid, self.target.netloc)
        with _open_lock:
            _open_count[self._key] = _open_count.get(self._key, 0) + 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ackqueue-remote {self.target.url}")
        self._thread.start()

    def _after_fork(self):
        """A forked child (multiprocessing's fork) using a queue its parent opened: its
        own client id, lease, connections and background thread; the parent's deliveries
        stay the parent's."""
        with _open_lock:
            if self._pid == os.getpid():
                return
            self._local = threading.local()
            self._https = weakref.WeakSet()
            self._https_lock = threading.Lock()
            self.client = self.target.access.client_id(client_id())
            if self.state_ is not None:
                for conn in list(self.state_.conns):
                    conn._holdings.clear()
                    conn._by_item.clear()
                    conn._pending = []
            self._pid = os.getpid()
        self._start()

    # -- what the front asks of a database ---------------------------------------------

    @property
    def db(self):
        raise _unsupported("db (the ZODB database)",
                           "the queue's storage lives in the service's process; to reach a "
                           "queue inside your own ZODB, use AckQueue(db=...) or ZEO")

    @property
    def pack_lock(self):
        raise _unsupported("pack()", "pack the service's file where it runs (stop "
                           "ackqueue serve and run ackqueue pack FILE, or pack an embedded "
                           "queue on it)")

    def pack_through_service(self, keep_seconds):
        """POST /v1/pack: the service packs its storage while its queues stay in use (one
        pack at a time there: a pack asked for meanwhile joins the running one)."""
        from .maintenance import PackReport
        status, doc, _ = self.call("POST", f"/v1/pack?keep_seconds={keep_seconds!r}")
        _raise_for(status, doc)
        return PackReport(doc["size_before"], doc["size_after"], doc["seconds"],
                          self.description)

    def enable_autopack(self, threshold):
        raise _unsupported("autopack=", "pack the service's file where it runs")

    def state(self, name, kind, clock, codec_name, allowed):
        if kind != store.FIFO:
            raise _unsupported(
                "a LIFO or priority-by-value queue (AckLifoQueue, AckPriorityQueue, "
                "lifo=True)", "the service opens FIFO queues, and ordering by item value "
                "would make it unpickle items; use priority= levels on AckQueue's put "
                "(higher first, FIFO within a level), or share the queue through ZEO "
                "(ackqueue server, path='zeo://...')")
        if not _NAME.match(name):
            raise ValueError("a queue served by ackqueue serve has a name of 1 to 80 "
                             "characters among A-Z a-z 0-9 _ . -")
        # A codec asked for is agreed now (CodecMismatch at open, as embedded); without
        # one, the recorded codec is asked for at the first put (so that opening a queue
        # to look at it creates nothing on the service).
        agreed = None if codec_name is None else self.agree_codec(name, codec_name)
        self.state_ = RemoteState(self, name, agreed, allowed)
        return self.state_

    def agree_codec(self, name, wanted):
        """The codec queue name encodes with, as the service records it: wanted is recorded
        if the queue has none (None: the recorded one, or the default); another recorded
        one raises CodecMismatch, as an embedded queue does."""
        return self.codec_answer(name, wanted)[1]["codec"]

    def codec_answer(self, name, wanted):
        """(status, answer) of the service's codec route for queue name (GET when wanted
        is None, else PUT ?codec=wanted); raises for an error answer."""
        if wanted is None:
            status, doc, _ = self.call("GET", self.queue_path(name, "/codec"))
        else:
            status, doc, _ = self.call("PUT", self.queue_path(name, f"/codec?codec={wanted}"))
        _raise_for(status, doc)
        return status, doc

    def http(self):
        if self._pid != os.getpid():
            self._after_fork()
        h = getattr(self._local, "http", None)
        if h is None:
            h = self._local.http = _Http(self.target)
            with self._https_lock:
                self._https.add(h)
        return h

    def call(self, method, path, body=None, headers=None, *, read_timeout=None):
        """(status, decoded JSON or bytes, attempts) of one request, as this thread."""
        hdrs = {"X-Client-Id": self.client, **self.target.access.headers}
        if headers:
            hdrs.update(headers)
        status, ctype, data, attempt = self.http().request(
            method, path, body, hdrs, read_timeout=read_timeout)
        if "json" in ctype:
            try:
                data = json.loads(data)
            except ValueError:
                pass
        return status, data, attempt

    def list_queues(self):
        """{name: {"ready", "in_flight", "delayed"}} of every queue the service has."""
        status, doc, _ = self.call("GET", "/v1/queues")
        _raise_for(status, doc)
        return doc["queues"]

    def queue_path(self, name, what=""):
        return f"/v1/queues/{name}{what}"

    # -- the lease and the background thread ---------------------------------------------

    def _renew(self):
        status, doc, _ = self.call("POST", f"/v1/leases/{self.client}")
        if status in (401, 403):
            raise AckQueueError(access.refused(self.target, status, doc))
        if status != 200:
            raise AckQueueError(f"the queue service refused this client's lease: {doc!r}")
        self.lease_timeout = float(doc.get("lease_timeout", 30.0))

    def _run(self):
        next_renew = time.monotonic() + (self.lease_timeout or 30.0) / 3
        next_reap = 0.0
        while not self._stop.wait(TICK):
            try:
                now = time.monotonic()
                state = self.state_
                if state is not None:
                    for conn in list(state.conns):
                        conn.flush_acks(older_than=TICK)
                    if now >= next_reap:
                        next_reap = now + REAP_INTERVAL
                        state.reap()
                if now >= next_renew:
                    self._renew()
                    next_renew = now + (self.lease_timeout or 30.0) / 3
            except Exception as exc:          # the service away: the next tick tries again
                log.debug("ackqueue remote: background pass failed: %r", exc)

    def _release(self):
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.target.wait_timeout + 5)
        with _open_lock:
            left = _open_count.get(self._key, 1) - 1
            if left:
                _open_count[self._key] = left
            else:
                _open_count.pop(self._key, None)
        if not left and self._key[0] == os.getpid():
            try:      # nothing of this process is held any more: end the lease now
                self.call("DELETE", f"/v1/leases/{self.client}")
            except AckQueueError:
                pass
        with self._https_lock:
            for h in list(self._https):
                h.close()


class _PollingCondition(threading.Condition):
    """join()'s condition: nothing in this process hears of the service's acks, so a wait
    without a timeout looks again every POLL_INTERVAL."""

    def wait(self, timeout=None):
        return super().wait(POLL_INTERVAL if timeout is None else min(timeout, POLL_INTERVAL))


class _WakingCondition(threading.Condition):
    """not_empty/not_full: shutdown() notifies them; that also cuts this queue's long polls
    in progress, so blocked get() calls see the shutdown."""

    def __init__(self, lock, on_notify):
        super().__init__(lock)
        self._on_notify = on_notify

    def notify_all(self):
        self._on_notify()
        super().notify_all()


def _put_options(opts, dedup_id):
    """(query parameters, headers) of a put's options; a put without a dedup id carries an
    Idempotency-Key, so that a retry after a cut-off request is stored once."""
    query, headers = [], {}
    if opts is not None:
        if opts.priority != store.DEFAULT_PRIORITY:
            query.append(f"priority={opts.priority}")
        if opts.delay:
            query.append(f"delay={opts.delay!r}")
        if opts.retention != store.DEFAULT_RETENTION:
            query.append(f"retention={opts.retention!r}")
        if opts.attributes:
            headers["X-Attributes"] = json.dumps(dict(opts.attributes))
    if dedup_id is not None:
        query.append("dedup_id=" + urllib.parse.quote(dedup_id, safe=""))
        if opts is not None and opts.dedup_window != store.DEFAULT_DEDUP_WINDOW:
            query.append(f"dedup_window={opts.dedup_window!r}")
    else:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    return query, headers


def _receive_query(n, wait, visibility_timeout, policy):
    """A receive's query parameters; the dead-letter policy (max_receives, dead_letter)
    travels with each receive, as the embedded queue applies it at each get."""
    query = [f"max={n}", f"wait={wait:.3f}"]
    if visibility_timeout is not None:
        query.append(f"visibility_timeout={visibility_timeout!r}")
    if policy is not None:
        query.append(f"max_receives={policy.max_receives}")
        if policy.target is not None:
            query.append("dead_letter=" + urllib.parse.quote(policy.target, safe=""))
    return query


def _put_request(bodies, query, headers):
    """(path, request body) of a put: one message as itself with its Content-Type, a batch
    as frames of one encoding (a mixed batch travels as pickles); adds to query/headers."""
    kinds = {codec.kind(b) for b in bodies}
    if len(bodies) == 1:
        headers["Content-Type"] = _CONTENT_TYPES[kinds.pop()]
        return "/messages", codec.payload(bodies[0])
    if len(kinds) == 1:
        kind = kinds.pop()
        payloads = [codec.payload(b) for b in bodies]
    else:
        kind = codec.PICKLE
        payloads = [b if codec.kind(b) == codec.PICKLE else _pickled(codec.decode(b))
                    for b in bodies]
    query.append(f"encoding={kind}")
    headers["Content-Type"] = "application/vnd.ackqueue.frames"
    return "/batch", encode_frames(payloads)


class RemoteState:
    """What the front asks of self._state, answered by the service."""

    def __init__(self, database, name, codec_name, allowed):
        self.database = database
        self.name = name
        self.kind = store.FIFO
        self._codec = codec_name
        self.allowed_classes = allowed
        self.acknowledging = False
        self.mutex = threading.Lock()
        self.not_empty = _WakingCondition(self.mutex, self.interrupt_polls)
        self.not_full = _WakingCondition(self.mutex, self.interrupt_polls)
        self.all_tasks_done = _PollingCondition(self.mutex)
        self.conns = weakref.WeakSet()
        self.polls = {}               # thread ident -> _Http of a long poll in progress
        self.polls_lock = threading.Lock()

    @property
    def codec(self):
        """How puts encode items: the queue's codec as the service records it."""
        if self._codec is None:
            self._codec = self.database.agree_codec(self.name, None)
        return self._codec

    def record_codec(self, wanted=None):
        """(the queue's codec, whether the service records one), once wanted (None: only
        read) is recorded if the queue has none (the service's codec route)."""
        status, doc = self.database.codec_answer(self.name, wanted)
        self._codec = doc["codec"]
        return self._codec, doc["stored"]

    def interrupt_polls(self):
        with self.polls_lock:
            for h in self.polls.values():
                h.interrupt()

    def stats(self):
        status, doc, _ = self.database.call("GET", self.database.queue_path(self.name))
        _raise_for(status, doc)
        return doc["stats"]

    def counts(self):
        s = self.stats()
        return {"ready": s["ready"], "in_flight": s["in_flight"], "delayed": s["delayed"]}

    def totals(self):
        return {k: v for k, v in self.stats().items()
                if k not in ("ready", "in_flight", "delayed")}

    def unfinished(self):
        """Messages not yet acknowledged as the service counts them (ready + in flight +
        delayed); deferred acks of this process are made durable first."""
        for conn in list(self.conns):
            conn.flush_acks()
        c = self.counts()
        return c["ready"] + c["in_flight"] + c["delayed"]

    def ready_count(self):
        return self.counts()["ready"]

    def size_for_maxsize(self):
        c = self.counts()
        return c["ready"] + c["delayed"]

    def expire_due(self):
        pass                          # the service does it

    def drop_expired(self):
        pass                          # the service's counts leave out the expired

    def purge(self):
        status, doc, _ = self.database.call("POST", self.database.queue_path(self.name,
                                                                              "/purge"))
        _raise_for(status, doc)
        return doc["purged"]

    def next_ready_at(self):
        raise _unsupported("next_ready_at()", "a blocking get() waits on the service's "
                           "long poll; get(timeout=...) bounds it")

    def add_listener(self, callback):
        raise _unsupported("add_ready_listener()", "a blocking get() waits on the "
                           "service's long poll (an asyncio program can call it in a "
                           "thread, or speak the native API with an HTTP client)")

    remove_listener = add_listener

    def dedup_lookup(self, dedup_id):
        raise _unsupported("dedup_lookup()", "a put with an Idempotency-Key returns the "
                           "original id when retried")

    def browse(self, allowed=None, after=None):
        """Every message, changing nothing, through the service's paged browse (GET
        /v1/queues/NAME/browse): in id order, page by page, so not one snapshot; bodies
        keep their encoding mark (ackqueue.codec)."""
        from .browse import BrowsedMessage
        from .message import MessageId
        after = -1 if after is None else after
        queue_codec = self.codec
        while True:
            status, doc, _ = self.database.call(
                "GET", self.database.queue_path(self.name, f"/browse?after={after}&limit=1000"))
            _raise_for(status, doc)
            for m in doc["messages"]:
                body = codec.mark(m.get("encoding", codec.BYTES), base64.b64decode(m["body"]))
                yield BrowsedMessage(
                    MessageId(m["id"]), m["state"], body, m["priority"], m["receive_count"],
                    m["sent_at"], m["age"], self.name, m.get("attributes") or {},
                    visible_at=m.get("visible_at"), deadline=m.get("deadline"),
                    expires_at=m.get("expires_at"), allowed_classes=allowed,
                    codec=queue_codec)
            if doc.get("next_after") is None:
                return
            after = doc["next_after"]

    def reap(self):
        """Give back what ended threads held (the background thread, every 0.2 s)."""
        for conn in list(self.conns):
            if conn.closed or conn._thread is None:
                continue
            thread = conn._thread()
            if thread is not None and thread.is_alive():
                continue
            conn.flush_acks()
            if conn._holdings and (self.acknowledging or conn.ended_by_exception()):
                conn.give_back_all("its thread ended")
                conn.closed = True
            elif not conn._holdings:
                conn.closed = True


def _raise_for(status, doc, stale_ok=False):
    if status == 200:
        return
    code, message, error = _error(status, doc if isinstance(doc, bytes) else
                                  json.dumps(doc).encode())
    if status in (409, 410) and code in ("StaleReceipt", "UnknownReceipt"):
        raise StaleAck(f"the delivery was given back before this ack or nack (its "
                       f"visibility deadline passed, its client's lease ended, or the "
                       f"service restarted): {message}")
    if status == 409 and code in ("NotOwned", "LeaseExpired"):     # a batch's lease check
        raise StaleAck(f"a delivery this batch needed held is no longer held by this "
                       f"client: {message}")
    if status == 413:
        raise ItemTooLarge(f"the queue service refused the item: {message}")
    if code == "DuplicateMessage":
        raise DuplicateMessage(message)
    if code == "CodecMismatch":
        raise CodecMismatch(message)
    if code == "UnsupportedEncoding":
        raise EncodingRefused(message, codec=error.get("codec"),
                              encoding=error.get("encoding"))
    raise AckQueueError(f"the queue service answered HTTP {status} {code}: {message}")


class RemoteHolding:
    """One delivery held by this process (the service's receipt handle names it)."""

    __slots__ = ("receipt", "seq", "item", "meta", "holder", "deadline", "released",
                 "token", "__weakref__")

    def __init__(self, receipt, seq, item, meta, holder):
        self.receipt = receipt
        self.token = receipt
        self.seq = seq
        self.item = item
        self.meta = meta
        self.holder = holder
        self.deadline = meta.get("deadline")
        self.released = None


class RemoteConnection(ThreadBound):
    """One thread's handle on a remote queue: the front's proxy (see QueueConnection)."""

    thread_bound = True

    def __init__(self, front, state, thread_bound=True):
        self._front = front
        self._state = state
        self._db = state.database
        if thread_bound:
            self._thread = weakref.ref(threading.current_thread())
            watch_thread_failure(threading.current_thread())
        else:
            self.thread_bound = False
            self._thread = None
        self._holdings = {}           # receipt -> RemoteHolding, oldest delivery first
        self._by_item = {}            # id(item) -> [RemoteHolding]
        self._pending = []            # receipts acknowledged, riding on the next receive
        self._pending_since = None
        self._lock = threading.Lock()  # _pending, shared with the background thread
        self._block = None            # the transaction block in progress (remote_block)
        self.closed = False
        state.conns.add(self)

    def __repr__(self):
        return f"<RemoteConnection to {self._state.name!r} at {self._db.description}>"

    def _check_thread(self):
        if self.closed:
            raise AckQueueError("this queue connection is closed")
        if self._thread is not None and self._thread() is not threading.current_thread():
            raise AckQueueError(f"{self!r} belongs to another thread")

    def _path(self, what):
        return self._db.queue_path(self._state.name, what)

    # -- put -------------------------------------------------------------------------------

    def put(self, item, block=True, timeout=None, *, opts=None, dedup_id=None):
        self.put_many([item], block, timeout, opts=opts, dedup_ids=[dedup_id])

    def put_many(self, items, block=True, timeout=None, *, opts=None, dedup_ids=None,
                 encoded=False, then=None):
        if then is not None:
            raise _unsupported("put_many(then=...), the non-blocking seam,",
                               "it serves an event loop inside the process that holds "
                               "the storage; call put_many() from a thread instead")
        timeout = check_wait(block, timeout)
        if self._front.is_shutdown:
            raise ShutDown
        pairs = self._pairs(items, encoded)
        check_item_sizes(pairs, self._front.max_item_size)
        if not pairs:
            return []
        dedup_ids = dedup_ids or [None] * len(pairs)
        if len(pairs) > 1 and any(d is not None for d in dedup_ids):
            raise _unsupported("put_many(dedup_ids=...)", "the service's batch put takes "
                               "one idempotency key for the whole batch; put() each item "
                               "with its dedup_id")
        self._wait_for_room(len(pairs), block, timeout)
        bodies = [body for _, body in pairs]
        if self._block is not None:
            return self._block.put(bodies, opts, dedup_ids)
        query, headers = _put_options(opts, dedup_ids[0])
        path, data = _put_request(bodies, query, headers)
        url = self._path(path) + ("?" + "&".join(query) if query else "")
        status, doc, attempt = self._db.call("POST", url, data, headers)
        if status == 409 and attempt and dedup_ids[0] is not None:
            # A retried put with a dedup id: the cut-off attempt stored it.
            return [None] * len(bodies)
        _raise_for(status, doc)
        if "ids" in doc:
            return [MessageId(i) for i in doc["ids"]]
        return [MessageId(doc["id"])]

    def _pairs(self, items, encoded):
        """(item, stored body) of each item: encoded by the queue's codec, or already
        bytes (encoded=True)."""
        if not encoded:
            return [(item, codec.encode(item, self._state.codec)) for item in items]
        pairs = []
        for b in items:
            if isinstance(b, (bytearray, memoryview)):
                b = bytes(b)
            if not isinstance(b, bytes):
                raise TypeError(f"an encoded item must be bytes, not {type(b).__name__}")
            pairs.append((b, b))
        return pairs

    def _wait_for_room(self, count, block, timeout):
        maxsize = self._front.maxsize
        if maxsize <= 0:
            return
        end = None if timeout is None else time.monotonic() + timeout
        state = self._state
        while True:
            if self._front.is_shutdown:
                raise ShutDown
            if state.size_for_maxsize() + count <= max(maxsize, count):
                return
            if not block:
                raise _stdlib_queue.Full
            wait = POLL_INTERVAL
            if end is not None:
                wait = min(wait, end - time.monotonic())
                if wait <= 0:
                    raise _stdlib_queue.Full
            with state.mutex:
                if not self._front.is_shutdown:
                    state.not_full.wait(wait)

    # -- get -------------------------------------------------------------------------------

    def get(self, block=True, timeout=None, *, visibility_timeout=_DEFAULT, shuffle=False,
            policy=None):
        return self._receive(block, timeout, visibility_timeout, shuffle, policy)[0].item

    def get_message(self, block=True, timeout=None, *, visibility_timeout=_DEFAULT,
                    shuffle=False, policy=None, raw=False):
        return self._message(self._receive(block, timeout, visibility_timeout, shuffle,
                                           policy, raw=raw)[0])

    def get_many(self, n, block=True, timeout=None, *, visibility_timeout=_DEFAULT,
                 shuffle=False, policy=None, messages=False, raw=False):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 1:
            raise ValueError("n must be at least 1")
        got = []
        while n > 0:     # the service hands out at most 100 per receive
            try:
                more = self._receive(block and not got, timeout if not got else None,
                                     visibility_timeout, shuffle, policy, min(n, 100), raw)
            except _stdlib_queue.Empty:
                if got:
                    break
                raise
            got += more
            n -= len(more)
            if len(more) < 100:
                break
        return [self._message(h) for h in got] if messages else [h.item for h in got]

    def _message(self, h):
        m = h.meta
        return Message(MessageId(h.seq), h.item, m.get("receive_count", 1),
                       m.get("sent_at"), m.get("deadline"), m.get("priority"),
                       self._state.name, dict(m.get("attributes") or {}), None, None,
                       h.seq, None, _holding=h)

    def _receive(self, block, timeout, visibility_timeout, shuffle=False, policy=None,
                 n=1, raw=False):
        self._check_thread()
        if shuffle:
            raise _unsupported("get(shuffle=True)", "the service delivers in queue order")
        timeout = check_wait(block, timeout)
        if visibility_timeout is _DEFAULT or visibility_timeout is ...:
            visibility_timeout = self._front.visibility_timeout
        visibility_timeout = check_visibility(visibility_timeout)
        if visibility_timeout is not None:
            self._state.acknowledging = True
        end = None if timeout is None else time.monotonic() + timeout
        front, state = self._front, self._state
        while True:
            if front.shutdown_immediate:
                raise ShutDown
            if not block or front.is_shutdown:
                wait = 0.0
            else:
                wait = LONG_POLL_SLICE
                if end is not None:
                    wait = max(0.0, min(wait, end - time.monotonic()))
            query = _receive_query(n, wait, visibility_timeout, policy)
            with self._lock:
                acks, self._pending, self._pending_since = self._pending, [], None
            if acks:
                query.append("ack=" + ",".join(acks))
            url = self._path("/receive?" + "&".join(query))
            h = self._db.http()
            with state.polls_lock:
                state.polls[threading.get_ident()] = h
            try:
                if front.is_shutdown and wait:     # a shutdown came in meanwhile
                    if acks:
                        self._ack_now(acks)
                    continue
                status, doc, _ = self._db.call("POST", url, headers={"Accept": FRAMES},
                                               read_timeout=wait + self._db.target.wait_timeout)
            except _Interrupted:
                if acks:
                    self._ack_now(acks)
                continue
            finally:
                with state.polls_lock:
                    state.polls.pop(threading.get_ident(), None)
            if status in (409, 410) and acks:
                # A deferred ack was stale: the receive was not made; settle the acks
                # one by one (a stale one is logged: its item is delivered again).
                self._ack_now(acks)
                continue
            _raise_for(status, doc)
            got = self._hand_out(doc, raw)
            if got:
                return got
            if front.is_shutdown:
                raise ShutDown
            if not block or (end is not None and time.monotonic() >= end):
                raise _stdlib_queue.Empty

    def _decode(self, body):
        """The item of a received body: a pickle only in a queue whose codec is "pickle"
        (the queue's codec is asked of the service once, at the first pickle)."""
        if codec.kind(body) != codec.PICKLE:
            return codec.decode(body)
        return codec.decode(body, self._front.allowed_classes, self._state.codec)

    def _hand_out(self, data, raw):
        if isinstance(data, dict):         # a JSON answer (a service without frames)
            pairs = [(m, base64.b64decode(m["body"])) for m in data.get("messages", ())]
        else:
            parts = decode_frames(data)
            pairs = [(json.loads(parts[i]), parts[i + 1]) for i in range(0, len(parts), 2)]
        got, unreadable = [], None
        for meta, payload in pairs:
            body = _restore(meta.get("encoding"), bytes(payload))
            try:
                item = body if raw else self._decode(body)
            except Exception as exc:
                self._nack_receipts([meta["receipt"]], UNREADABLE_DELAY)
                unreadable = unreadable_error(meta["id"], self._state.name, exc,
                                              UNREADABLE_DELAY)
                log.warning("ackqueue: %s", unreadable)
                continue
            h = RemoteHolding(meta["receipt"], meta["id"], item, meta, self)
            self._holdings[h.receipt] = h
            self._by_item.setdefault(id(item), []).append(h)
            got.append(h)
        if pairs and not got:
            raise unreadable
        return got

    def peek(self):
        """The Message the next get() would receive (highest priority, then oldest ready),
        read with the service's browse pages; None if none is ready."""
        self._check_thread()
        after, best = -1, None
        while True:
            status, doc, _ = self._db.call(
                "GET", self._path(f"/browse?after={after}&limit=1000"))
            _raise_for(status, doc)
            for m in doc["messages"]:
                if m["state"] == "ready" and (best is None or (-m["priority"], m["id"]) <
                                              (-best["priority"], best["id"])):
                    best = m
            if doc.get("next_after") is None:
                break
            after = doc["next_after"]
        if best is None:
            return None
        body = _restore(best["encoding"], base64.b64decode(best["body"]))
        return Message(MessageId(best["id"]), self._decode(body),
                       best["receive_count"], best["sent_at"], None, best["priority"],
                       self._state.name, dict(best.get("attributes") or {}), None, None,
                       best["id"], None)

    # -- ack, nack, visibility ------------------------------------------------------------

    def find(self, x):
        if isinstance(x, Message):
            return x._holding if x.queue == self._state.name else None
        same = self._by_item.get(id(x))
        if same:
            return same[0]
        if isinstance(x, MessageId):
            for h in reversed(list(self._holdings.values())):
                if h.seq == x:
                    return h
        return None

    def find_many(self, items):
        return [self.find(x) for x in items]

    def oldest_unacked(self):
        for h in self._holdings.values():
            return h
        return None

    def _forget(self, h):
        if self._holdings.pop(h.receipt, None) is not None:
            same = self._by_item.get(id(h.item))
            if same is not None:
                if h in same:
                    same.remove(h)
                if not same:
                    del self._by_item[id(h.item)]

    def ack_holding(self, h):
        self._state.acknowledging = True
        if h.receipt not in h.holder._holdings:
            if h.released is not None:
                raise StaleAck(f"{h.item!r} was given back before this ack "
                               f"({h.released}); it may be held by someone else now")
            raise NotHeld(f"{h.item!r} was acknowledged already")
        if self._block is not None:
            return self._block.ack(h)
        if (self._db.ack_with_next_get and h.holder is self and self._thread is not None
                and not self.closed):
            # Deferred: durable with this thread's next receive, a flush within 50 ms,
            # or close() (see README "ack_with_next_get").
            self._forget(h)
            with self._lock:
                if not self._pending:
                    self._pending_since = time.monotonic()
                self._pending.append(h.receipt)
            return
        try:
            self._ack_receipts([h.receipt])
        finally:
            h.holder._forget(h)

    def ack_many_holdings(self, holdings, then=None):
        if then is not None:
            raise _unsupported("ack_many(then=...), the non-blocking seam,",
                               "it serves an event loop inside the process that holds "
                               "the storage; call ack_many() from a thread instead")
        self._state.acknowledging = True
        if self._block is not None:
            for h in holdings:
                self._block.ack(h)
            return
        try:
            self._ack_receipts([h.receipt for h in holdings])
        finally:
            for h in holdings:
                h.holder._forget(h)

    def _ack_receipts(self, receipts):
        status, doc, attempt = self._db.call(
            "POST", self._path("/ack"), json.dumps({"receipts": receipts}).encode(),
            {"Content-Type": "application/json"})
        if status in (409, 410) and attempt:
            raise StaleAck("the ack's first request was cut off and the service no longer "
                           "knows the delivery: it was either acknowledged by that request "
                           "or given back (then it is delivered again)")
        _raise_for(status, doc)

    def _ack_now(self, receipts):
        """Deferred acks settled one by one; a stale one is logged, not raised."""
        for r in receipts:
            try:
                self._ack_receipts([r])
            except StaleAck as exc:
                log.warning("ackqueue: a deferred ack (ack_with_next_get) came too late; "
                            "its item will be delivered again: %s", exc)

    def flush_acks(self, older_than=None):
        """Make deferred acks durable now (older_than: only once the oldest waited so
        long)."""
        with self._lock:
            if not self._pending:
                return
            if older_than is not None and \
                    time.monotonic() - self._pending_since < older_than:
                return
            acks, self._pending, self._pending_since = self._pending, [], None
        try:
            self._ack_now(acks)
        except AckQueueError:
            with self._lock:          # the service away: keep them for the next try
                self._pending[:0] = acks
                self._pending_since = self._pending_since or time.monotonic()
            raise

    def nack_holding(self, h, delay=0):
        check_timeout(delay, "delay")
        if self._block is not None:
            raise not_in_block("nack()")
        self._state.acknowledging = True
        try:
            self._nack_receipts([h.receipt], delay)
        finally:
            h.released = "given back with nack()"
            h.holder._forget(h)

    def _nack_receipts(self, receipts, delay=0):
        status, doc, _ = self._db.call(
            "POST", self._path(f"/nack?delay={float(delay)!r}"),
            json.dumps({"receipts": receipts}).encode(), {"Content-Type": "application/json"})
        _raise_for(status, doc)

    def change_visibility_holding(self, h, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            raise ValueError(f"seconds must be a finite number, not {seconds!r}")
        if self._block is not None:
            raise not_in_block("change_visibility()")
        self._state.acknowledging = True
        seconds = max(-1e9, min(float(seconds), 43200.0))
        status, doc, _ = self._db.call(
            "POST", self._path(f"/visibility?receipt={h.receipt}"
                               f"&visibility_timeout={seconds!r}"))
        try:
            _raise_for(status, doc)
        except StaleAck:
            h.holder._forget(h)
            raise
        if seconds <= 0:
            h.released = "given back by change_visibility()"
            h.holder._forget(h)

    def give_back_all(self, why):
        held = list(self._holdings.values())
        if held:
            log.info("ackqueue: giving back %d item(s) of queue %r: %s", len(held),
                     self._state.name, why)
            for h in held:
                try:
                    self._nack_receipts([h.receipt])
                except StaleAck:
                    pass
                h.released = why
                self._forget(h)

    # -- what the service cannot do ---------------------------------------------------------

    def transaction(self):
        """``with conn.transaction():``: the block's puts and acks travel as one atomic
        batch request when it ends; its gets are made at once (see remote_block)."""
        self._check_thread()
        self._state.acknowledging = True
        if self._block is not None:
            raise AckQueueError("a queue transaction is already in progress in this thread "
                                "(transaction blocks do not nest)")
        self.flush_acks()             # acks riding on the next get are not the block's
        self._block = RemoteBlock(self)
        return self._block

    def redrive(self, to=None):
        """POST /v1/queues/NAME/redrive[?to=]: the service moves the ready dead letters."""
        self._check_thread()
        what = "/redrive" + ("" if to is None else "?to=" + urllib.parse.quote(to, safe=""))
        status, doc, _ = self._db.call("POST", self._path(what))
        _raise_for(status, doc)
        return doc["moved"]

    def close(self):
        if self.closed:
            return
        try:
            self.flush_acks()
            self.give_back_all("its queue was closed")
        except AckQueueError as exc:
            log.warning("ackqueue: closing %r: %s (the service gives back what this "
                        "process held when its lease ends)", self, exc)
        self.closed = True


def _pickled(item):
    return codec._pickle(item)
