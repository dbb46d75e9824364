"""The remote drop-in's database and state: what the front (ackqueue.queue.AckQueue) asks
of them for a queue reached through ``ackqueue serve`` (``AckQueue(path="http://...")``).

- ``RemoteDatabase``: the service address, this process's client id and its lease, and a
  background thread that renews the lease, gives back what ended threads held, and makes
  deferred acks durable (ack_with_next_get).  Its ``proxy_class`` names the front's
  per-thread proxy, ackqueue.remote.connection.RemoteConnection.
- ``RemoteState``: what the front asks of its state (the mutex and conditions named as
  queue.Queue names them, counts, unfinished, ready_count, size_for_maxsize, purge).

Deliveries are held by this process's client id (host:pid:random), whose lease the
background thread renews every lease/3 seconds: when the process dies, the service gives
back what it held once the lease ends (``ackqueue serve --lease-timeout``, 30 s by
default).  A thread of a live process that ends holding items gives them back (nack)
within about a second, by the embedded queue's rule (the program acknowledges on this
queue, or the thread died of an exception).
"""
import base64
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
import weakref

from zope.interface import implementer
from .. import codec, store
from ..errors import AckQueueError
from . import access
from .connection import POLL_INTERVAL, RemoteConnection
from .http import ServiceHttp, Target, raise_for, unsupported
from ..interfaces import IDatabase, IFrontState

__all__ = ["is_url", "RemoteDatabase", "RemoteState", "client_id",
           "check_ack_with_next_get"]

log = logging.getLogger(__name__)

TICK = 0.05                   # the background thread's period (deferred acks: 50 ms)
REAP_INTERVAL = 0.2           # ended threads' holdings looked for
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




@implementer(IDatabase)
class RemoteDatabase:
    """The front's self._database for a queue service URL."""

    exclusive = False
    owned = True
    proxy_class = RemoteConnection     # the front's per-thread proxy
    channel_class = ServiceHttp        # one thread's connection, made of the target

    def __init__(self, front, url, db, durability, repair):
        if db is not None:
            raise TypeError("pass either path= or db=, not both")
        if durability is not None:
            raise ValueError("durability= applies to a queue file; a queue service's "
                             "durability is set where it runs (ackqueue serve --durability)")
        if repair:
            raise ValueError("repair=True applies to a queue file (path=); repair the "
                             "service's file where it runs")
        if front.clock is not time.time:
            raise ValueError("clock= cannot travel to a queue service: deadlines, delays, "
                             "retention and dedup windows run on the service's own clock "
                             "(time.time where ackqueue serve runs); test with a fake "
                             "clock on an embedded queue instead")
        if front.dead_letter is not None and not _NAME.match(front.dead_letter):
            raise ValueError("a dead-letter queue served by ackqueue serve has a name of 1 "
                             "to 80 characters among A-Z a-z 0-9 _ . -")
        self.target = Target(url)
        self.description = self.target.url
        self.set_up(front, self.target.access.client_id(client_id()))
        self._renew()                           # reachable now, or ServerUnavailable
        self.start()

    def set_up(self, front, client, lease_timeout=None):
        """This process's state as a client: its id, the front, no channel yet."""
        self.client = client
        self.front = weakref.ref(front)
        self.ack_with_next_get = getattr(front, "ack_with_next_get", False)
        self.closed = False
        self.state_ = None
        self._local = threading.local()
        self._https = weakref.WeakSet()
        self._https_lock = threading.Lock()
        self.lease_timeout = lease_timeout
        self._pid = os.getpid()

    def start(self):
        """Start the background thread (at open, and in a forked child)."""
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
                    conn.holdings.clear()
                    conn.by_item.clear()
                    conn._pending = []
            self._pid = os.getpid()
        self.start()

    # -- what the front asks of a database ---------------------------------------------

    @property
    def db(self):
        raise unsupported("db (the ZODB database)",
                           "the queue's storage lives in the service's process; to reach a "
                           "queue inside your own ZODB, use AckQueue(db=...) or ZEO")

    @property
    def pack_lock(self):
        raise unsupported("pack()", "pack the service's file where it runs (stop "
                           "ackqueue serve and run ackqueue pack FILE, or pack an embedded "
                           "queue on it)")

    def pack_through_service(self, keep_seconds):
        """POST /v1/pack: the service packs its storage while its queues stay in use (one
        pack at a time there: a pack asked for meanwhile joins the running one)."""
        from ..maintenance import PackReport
        status, doc, _ = self.call("POST", f"/v1/pack?keep_seconds={keep_seconds!r}")
        raise_for(status, doc)
        return PackReport(doc["size_before"], doc["size_after"], doc["seconds"],
                          self.description)

    def enable_autopack(self, threshold):
        raise unsupported("autopack=", "pack the service's file where it runs")

    def state(self, name, kind, clock, codec_name, allowed):
        if kind != store.FIFO:
            raise unsupported(
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
        raise_for(status, doc)
        return status, doc

    def http(self):
        if self._pid != os.getpid():
            self._after_fork()
        h = getattr(self._local, "http", None)
        if h is None:
            h = self._local.http = self.channel_class(self.target)
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
        raise_for(status, doc)
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

    def release(self):
        """The front closes: stop the background thread, and end the lease with this
        process's last queue of this service."""
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
            self._end_lease()       # nothing of this process is held any more
        for h in self.channels():
            h.close()

    def channels(self):
        """This process's threads' connections (channel_class) made so far."""
        with self._https_lock:
            return list(self._https)

    def _end_lease(self):
        try:
            self.call("DELETE", f"/v1/leases/{self.client}")
        except AckQueueError:
            pass


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

@implementer(IFrontState)
class RemoteState:
    """What the front asks of self.state, answered by the service."""

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
        raise_for(status, doc)
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
        raise_for(status, doc)
        return doc["purged"]

    def next_ready_at(self):
        raise unsupported("next_ready_at()", "a blocking get() waits on the service's "
                           "long poll; get(timeout=...) bounds it")

    def add_listener(self, callback):
        raise unsupported("add_ready_listener()", "a blocking get() waits on the "
                           "service's long poll (an asyncio program can call it in a "
                           "thread, or speak the native API with an HTTP client)")

    remove_listener = add_listener

    def dedup_lookup(self, dedup_id):
        raise unsupported("dedup_lookup()", "a put with an Idempotency-Key returns the "
                           "original id when retried")

    def browse(self, allowed=None, after=None):
        """Every message, changing nothing, through the service's paged browse (GET
        /v1/queues/NAME/browse): in id order, page by page, so not one snapshot; bodies
        keep their encoding mark (ackqueue.codec)."""
        from ..browse import BrowsedMessage
        from ..message import MessageId
        queue_codec = self.codec
        for m, body in self.browse_rows(after):
            yield BrowsedMessage(
                MessageId(m["id"]), m["state"], body, m["priority"], m["receive_count"],
                m["sent_at"], m["age"], self.name, m.get("attributes") or {},
                visible_at=m.get("visible_at"), deadline=m.get("deadline"),
                expires_at=m.get("expires_at"), allowed_classes=allowed,
                codec=queue_codec)

    def browse_rows(self, after=None):
        """(metadata, stored body) of every message with an id above after (None: all),
        page by page, in id order."""
        after = -1 if after is None else after
        while True:
            status, doc, _ = self.database.call(
                "GET", self.database.queue_path(self.name, f"/browse?after={after}&limit=1000"))
            raise_for(status, doc)
            for m in doc["messages"]:
                yield m, codec.mark(m.get("encoding", codec.BYTES), base64.b64decode(m["body"]))
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
            if conn.holdings and (self.acknowledging or conn.ended_by_exception()):
                conn.give_back_all("its thread ended")
                conn.closed = True
            elif not conn.holdings:
                conn.closed = True

