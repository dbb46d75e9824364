"""The service's one backend: named queues opened lazily over one storage, client sessions
with leases, and the receipt handles of the deliveries held for remote clients.  Every
front (native, Sasquatch's RPC, SQS, batches) reaches the store through it.

Everything here uses the queue's public seams (AckQueue, q.connect(thread_bound=False),
put_many(encoded=True), get_many(raw=True), DuplicateMessage.original_id); the event
loop (ackqueue.service.runtime) calls the blocking parts from its thread pool.

Threads: the maps (sessions, receipts, queues) are changed only in the event loop's thread,
except ``Service.queue``, which opens a queue under a lock from a pool thread.  A client's
connection to a queue (``ClientConn``) is used by one pool thread at a time, under its lock.
"""
import queue as _stdlib_queue
import re
import secrets
import threading
import time

from zope.interface import implementer

import ackqueue
from ackqueue import AckQueue
from ackqueue.errors import NotHeld
from ackqueue.database import open_database
from ackqueue.interfaces import IServiceBackend
from ackqueue.shared.owner import ClientConn   # one client's connection to one queue

__all__ = ["Service", "Session", "Leases", "Delivery", "ClientConn", "check_name",
           "check_client"]

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,80}\Z")
_CLIENT = re.compile(r"[A-Za-z0-9_.:\-]{1,128}\Z")


def check_name(name):
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError("a queue name is 1 to 80 characters among A-Z a-z 0-9 _ . -")
    return name


def check_client(client):
    if not isinstance(client, str) or not _CLIENT.match(client):
        raise ValueError("a client id is 1 to 128 characters among A-Z a-z 0-9 _ . : -")
    return client


class Delivery:
    """What a receipt handle names: one delivery held for one client."""

    __slots__ = ("queue", "session", "cconn", "message")

    def __init__(self, queue, session, cconn, message):
        self.queue, self.session, self.cconn, self.message = queue, session, cconn, message


class Session:
    """A client id's lease and its connections (one per queue it received from)."""

    def __init__(self, client, now):
        self.client = client
        self.last_seen = now
        self.active = 0               # requests in progress: a long poll keeps it alive
        self.conns = {}               # queue name -> ClientConn
        self.receipts = set()
        self.closed = False


class Leases:
    """Client sessions and their leases.  clock is injectable (time.monotonic)."""

    def __init__(self, timeout, clock=time.monotonic):
        if not timeout > 0:
            raise ValueError("the lease timeout must be positive")
        self.timeout = float(timeout)
        self.clock = clock
        self.sessions = {}

    def touch(self, client):
        """The session of client (made on first use), its lease renewed."""
        now = self.clock()
        s = self.sessions.get(client)
        if s is None:
            s = self.sessions[client] = Session(client, now)
        s.last_seen = now
        return s

    def expired(self):
        """Remove and return the sessions whose lease ran out (none with a request in
        progress)."""
        now = self.clock()
        gone = [s for s in self.sessions.values()
                if s.active == 0 and now - s.last_seen > self.timeout]
        for s in gone:
            del self.sessions[s.client]
            s.closed = True
        return gone

    def remove(self, client):
        s = self.sessions.pop(client, None)
        if s is not None:
            s.closed = True
        return s


@implementer(IServiceBackend)
class Service:
    """Queues of one storage (a file, or memory when path is None).

    Contract (what the fronts and the runtime use):
    - ``path``, ``durability``, ``closed``; ``db``: the storage's ZODB database, for the
      records kept beside the queues; ``committer()``: what the bridge listens to;
    - ``queues`` (name -> AckQueue, read on the loop), ``queue(name, lifo=)`` (opens and
      keeps one, pool thread), ``open_front(name, maxsize, lifo=)`` (a front the caller
      owns), ``list_queues()``, ``pack(keep_seconds)``;
    - ``leases`` (Leases: the sessions), ``client_conn(session, name)``,
      ``close_session_conns(session)``;
    - deliveries: ``receive``, ``receive_now``, ``register`` (their receipts),
      ``receipts`` (receipt -> Delivery), ``forget``, ``give_back``, ``ack_submit``,
      ``nack``, ``change_visibility``; ``close()`` releases the storage.
    Blocking methods run in the runtime's pool, never on the loop (receive_now and the
    maps aside).
    """

    def __init__(self, path=None, *, durability="fsync", lease_timeout=30.0,
                 clock=time.monotonic):
        self.path = path
        self.durability = durability
        # Holds the storage for the service's lifetime (a file is locked to this process
        # from here on: a second service on it fails at start, not at its first request).
        self._handle = open_database(path, None, durability if path else None)
        self._lock = threading.Lock()
        self.queues = {}
        self.leases = Leases(lease_timeout, clock)
        self.receipts = {}            # receipt handle -> Delivery
        self.closed = False

    @property
    def db(self):
        """The ZODB database of the service's storage (for the records the service keeps
        beside the queues: stream leases, the SQS registry)."""
        return self._handle.db

    def queue(self, name, *, lifo=False):
        """The AckQueue named name, opened on first use and kept until close (blocking:
        call from the pool).  lifo: the kind it is opened as when this call opens it; a
        queue open already is returned as it is (the caller compares its kind).
        RuntimeError once the service is closing."""
        q = self.queues.get(name)
        if q is not None:
            return q
        with self._lock:
            q = self.queues.get(name)
            if q is None:
                if self.closed:
                    raise RuntimeError("the service is closing")
                q = self.queues[name] = self.open_front(name, lifo=lifo)
            return q

    def open_front(self, name, maxsize=0, *, lifo=False):
        """A new AckQueue front on queue name of the service's storage, with its own
        maxsize, not kept by the service: the caller closes it (blocking)."""
        if self.path is None:
            return AckQueue(maxsize, db=self._handle.db, name=name, lifo=lifo)
        return AckQueue(maxsize, path=self.path, name=name, durability=self.durability,
                        lifo=lifo)

    def share_file(self):
        """Serve, beside the service, the processes of this machine that open the file
        itself (AckQueue(path=FILE)) over the lean wire on its Unix socket (see
        ackqueue.shared.owner); the socket's path.  They share every queue with the
        service's clients."""
        from ackqueue.queue import FileServing
        from ackqueue.shared.owner import Owner
        if self.path is None:
            raise ValueError("--share-file applies to a queue file, not --memory")
        if self._handle.owner is None:
            self._handle.owner = Owner(self._handle, self.path,
                                       FileServing(self.path, self.durability))
        return self._handle.owner.socket_path

    def committer(self):
        """The committer of the service's storage: the event loop's bridge listens to it
        (bridge.Bridge.attach) to learn when a group commit's outcomes have all run."""
        return self._handle.committer

    def pack(self, keep_seconds=0.0):
        """Pack the storage while the queues stay in use (blocking); a
        maintenance.PackReport.  Packs of one storage run one at a time."""
        from ackqueue.maintenance import pack
        return pack(self._handle, keep_seconds=keep_seconds)

    def list_queues(self):
        """{name: counts} of every queue of the storage (blocking)."""
        return ackqueue.queues(self.path if self.path is not None else self._handle.db)

    # -- deliveries ----------------------------------------------------------------------

    def client_conn(self, session, name):
        """session's connection to queue name (blocking: opens the queue)."""
        cc = session.conns.get(name)
        if cc is None:
            q = self.queue(name)
            cc = session.conns.setdefault(name, ClientConn(q, q.connect(thread_bound=False)))
        return cc

    def receive(self, cc, n, visibility_timeout, **dead_letter):
        """Up to n messages now, never waiting (blocking only for the pool's thread).
        dead_letter: max_receives= (and dead_letter=), the receive rules of AckQueue.get."""
        kwargs = {} if visibility_timeout is None else {
            "visibility_timeout": visibility_timeout}
        if dead_letter:
            # The front's options, as its get() builds them: the policy names the
            # dead-letter queue's live state in this process.
            kwargs["policy"] = cc.queue.receive_policy(dead_letter.get("max_receives"),
                                                       dead_letter.get("dead_letter"))
        with cc.lock:
            if cc.conn.closed:
                return []
            try:
                return cc.conn.get_many(n, block=False, messages=True, raw=True, **kwargs)
            except ackqueue.Empty:
                return []

    def receive_now(self, cc, n, visibility_timeout):
        """receive() for the event loop's own thread, with no dead-letter policy (whose
        claim waits for a commit): None when cc's lock is busy (an ack of this client
        waiting for its commit holds it), so the caller tries in the pool instead.  The
        claim itself is in memory (its message's body from the body cache, or, rarely, one
        read of the local file), so it costs the loop far less than two thread hops."""
        if not cc.lock.acquire(blocking=False):
            return None
        try:
            if cc.conn.closed:
                return []
            kwargs = {} if visibility_timeout is None else {
                "visibility_timeout": visibility_timeout}
            try:
                return cc.conn.get_many(n, block=False, messages=True, raw=True, **kwargs)
            except ackqueue.Empty:
                return []
        finally:
            cc.lock.release()

    def register(self, name, session, cc, messages):
        """Receipt handles for delivered messages (event loop thread): the message's id,
        144 random bits drawn for this batch, and the message's place in it, so a
        receipt names one delivery and cannot be guessed from another's."""
        out = []
        secret = secrets.token_urlsafe(18)
        for i, m in enumerate(messages):
            receipt = f"{int(m.id)}.{secret}{i}"
            self.receipts[receipt] = Delivery(name, session, cc, m)
            session.receipts.add(receipt)
            out.append((receipt, m))
        return out

    def forget(self, receipts):
        for r in receipts:
            d = self.receipts.pop(r, None)
            if d is not None:
                d.session.receipts.discard(r)

    def give_back(self, cc, messages):
        """Deliveries that never reached their client go back (blocking)."""
        with cc.lock:
            for m in messages:
                try:
                    cc.conn.nack(m)
                except ackqueue.NotHeld:      # its deadline gave it back already
                    pass

    def ack_submit(self, cc, messages, then):
        """Acknowledge messages held by cc in one commit, all or (StaleAck) none, without
        waiting for it (the seam's then=; runtime.Api.ack_many calls it from a pool thread
        when cc's lock is busy): StaleAck at once, else then(error) once durable."""
        with cc.lock:
            cc.submit_acks(messages, then)

    def nack(self, cc, message, delay):
        with cc.lock:
            cc.conn.nack(message, delay)

    def change_visibility(self, cc, message, seconds):
        with cc.lock:
            cc.conn.change_visibility_holding(cc.holding(message), seconds)

    def close_session_conns(self, session):
        """A session's lease ended: close its connections, giving back what they held."""
        for cc in list(session.conns.values()):
            cc.close()

    def close(self):
        """Close every session and queue, then release the storage (writes the .index)."""
        with self._lock:
            self.closed = True
        for s in list(self.leases.sessions.values()):
            self.close_session_conns(s)
        self.leases.sessions.clear()
        self.receipts.clear()
        for q in list(self.queues.values()):
            q.close()
        self.queues.clear()
        self._handle.release()


def take_now(cc, n, vt, policy, shuffle=False):
    """Up to n messages of a client's connection now, never waiting (pool thread), for the
    fronts whose receives count a visibility of 0 (Sasquatch's explicit 0, SQS's
    VisibilityTimeout=0): such messages are received (counted) and at once visible again."""
    with cc.lock:
        if cc.conn.closed:
            return []
        try:
            got = cc.conn.get_many(n, block=False, messages=True, raw=True,
                                   visibility_timeout=vt or 1, shuffle=shuffle,
                                   policy=policy)
        except _stdlib_queue.Empty:
            return []
        if vt == 0:
            for m in got:
                try:
                    cc.conn.nack(m)
                except NotHeld:
                    pass
        return got
