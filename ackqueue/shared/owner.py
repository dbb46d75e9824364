"""The owner of a queue file: the process that holds it serves its queues to the other
processes that open the same path, over the Unix socket beside it (shared.files).

The owner is this process's own file handle (database.Database) plus one thread that
accepts connections and one thread per connection, which reads a request (shared.wire),
runs it on the queue's embedded front and answers.  Its fronts come from the ``serving``
object the front layer hands down (queue.FileServing: ``front(name, kind)``,
``list_queues()``), and it uses only their public seams: ``connect(thread_bound=False)``,
``put_many(encoded=True)``, ``get_many(raw=True, messages=True)``, ``ack_many_holdings``,
``add_ready_listener``, ``next_ready_at``.  Every front of the file in this process shares
one live state per queue with the owner's, so a message goes to one process only, and the
commits of every client's requests (and the owner's own) gather in the file's one
committer's group commits.

Clients: a client process says who it is (``hello``: its client id) on each connection it
opens, one per thread.  Deliveries are held per client id; when the last connection of a
client id closes (its process exited or was killed), everything it held goes back at
once, where the service waits for a lease to end.  A blocking get waits outside the
connection's lock, on a wake-up from the queue's ready listener (or until the next
delayed message or deadline), so another thread of the same client can ack meanwhile.

Bodies stay bytes here: the owner checks a put's encoding against the queue's codec
(codec.check_admitted) and never unpickles what a client sends.
"""
import itertools
import logging
import os
import queue as _queue
import socket
import threading
import time

from zope.interface import implementer

from .. import codec
from ..errors import DuplicateMessage, NotHeld, QueueKindMismatch, StaleAck
from ..interfaces import IClientConnection
from ..filestorage import note_holder
from . import files, wire

log = logging.getLogger(__name__)

__all__ = ["Owner", "ClientConn", "error_doc"]

MAX_WAIT = 20.0             # the longest one get request waits
WAKE_SLICE = 1.0            # a waiting get looks again at least this often
_PUT_OPTIONS = ("priority", "delay", "retention", "attributes", "dedup_window")


@implementer(IClientConnection)
class ClientConn:
    """One client's connection to one queue: it holds that client's deliveries, and their
    acks, nacks and visibility changes go through it (the connection that received them),
    one call at a time under its lock.  The queue service's backend holds its remote
    clients' deliveries in these too."""

    __slots__ = ("conn", "lock", "queue")

    def __init__(self, queue, conn):
        self.queue = queue
        self.conn = conn
        self.lock = threading.Lock()

    def holding(self, message):
        """The delivery a received Message names; NotHeld when it names none."""
        h = self.conn.find(message)
        if h is None:
            raise NotHeld(f"{message!r} is not a delivery of queue {self.queue.name!r} "
                          "held for this client")
        return h

    def submit_acks(self, messages, then):
        """Acknowledge received messages in one commit, all or none, without waiting for
        it (the seam's then=): StaleAck or NotHeld at once and nothing is submitted, else
        then(error) runs once the commit is durable (None) or has failed.  The caller
        holds the lock."""
        holdings = list(dict.fromkeys(map(self.holding, messages)))   # a message twice: once
        if holdings:
            self.conn.ack_many_holdings(holdings, then=then)
        else:
            then(None)

    def close(self):
        with self.lock:
            self.conn.close()         # gives back everything it still holds


class _Session:
    """A client id: its open connections and what it holds."""

    def __init__(self, client):
        self.client = client
        self.sockets = 0
        self.conns = {}               # queue name -> ClientConn
        self.deliveries = {}          # receipt -> (queue name, ClientConn, Message)
        self.counter = itertools.count(1)


class _Wakeup:
    """A queue's ready listener, for the gets that wait on it."""

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.generation = 0

    def __call__(self, name=None):
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def wait(self, seen, timeout):
        with self.cond:
            if self.generation == seen:
                self.cond.wait(timeout)


def error_doc(exc):
    """An error answer's header: the exception's class name, message and fields."""
    doc = {"type": type(exc).__name__, "message": str(exc)}
    original = getattr(exc, "original_id", None)
    if original is not None:
        doc["original_id"] = int(original)
    for field in ("codec", "encoding"):
        if getattr(exc, field, None) is not None:
            doc[field] = getattr(exc, field)
    return doc


class Owner:
    """Serves the queues of the file path, which this process holds through handle, on
    files.socket_path(path).  serving: the front layer's opener (queue.FileServing)."""

    def __init__(self, handle, path, serving):
        self.handle = handle
        self.path = path
        self.serving = serving
        self.socket_path = files.socket_path(path)
        self.stopping = False
        self.fronts = {}              # queue name -> the owner's front on it
        self.wakeups = {}             # queue name -> _Wakeup
        self.sessions = {}            # client id -> _Session
        self._lock = threading.Lock()  # fronts, sessions, _conns
        self._conns = set()
        self._threads = set()
        self._sock, self._inode = files.bind(self.socket_path)
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"ackqueue-owner {path}")
        self._acceptor.start()
        note_holder(path, files.owner_url(path))

    def __repr__(self):
        return f"<ackqueue Owner of {self.path!r} on {self.socket_path!r}>"

    def references(self):
        """The handle references the owner holds (one per front it opened): when the
        handle has no others, nothing of this process but the owner uses the file."""
        return len(self.fronts)

    # -- connections ---------------------------------------------------------------------

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self.stopping:
                    return
                time.sleep(0.05)        # out of descriptors, say: try again
                continue
            with self._lock:
                if self.stopping:
                    conn.close()
                    return
                self._conns.add(conn)
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                     name="ackqueue-owner-client")
                self._threads.add(t)
            t.start()

    def _serve(self, conn):
        buf, session = bytearray(), None
        try:
            while True:
                rid, op, header, blobs = wire.read_frame(conn, buf)
                name = wire.OP_NAMES.get(op)
                undo = None
                try:
                    if name == "hello":
                        session, answer, out = self._hello(session, header)
                    elif session is None or name is None:
                        raise ValueError(f"unknown or early request {op} (say hello first)")
                    else:
                        answer, out, undo = getattr(self, "_" + name)(session, header, blobs)
                    data = wire.encode(rid, wire.OK, answer, out)
                except Exception as exc:
                    data = wire.encode(rid, wire.ERROR, error_doc(exc))
                try:
                    conn.sendall(data)
                except OSError:
                    if undo is not None:
                        undo()          # a get whose answer never left: given back
                    raise
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("ackqueue: the owner of %s dropped a client connection", self.path)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()
            if session is not None:
                self._left(session)

    def _hello(self, session, header):
        client = header.get("client") if isinstance(header, dict) else None
        if not isinstance(client, str) or not 0 < len(client) <= 200:
            raise ValueError("hello names the client id (a str)")
        if session is not None:
            raise ValueError("hello comes once per connection")
        with self._lock:
            session = self.sessions.get(client)
            if session is None:
                session = self.sessions[client] = _Session(client)
            session.sockets += 1
        return session, {"pid": os.getpid(), "max_wait": MAX_WAIT}, ()

    def _left(self, session):
        """A connection of session closed: with its last, the client is gone (its process
        ended or was killed) and what it held goes back."""
        with self._lock:
            session.sockets -= 1
            if session.sockets > 0 or self.sessions.get(session.client) is not session:
                return
            del self.sessions[session.client]
        self._end(session)

    def _end(self, session):
        session.deliveries.clear()
        for cc in list(session.conns.values()):
            try:
                cc.close()
            except Exception:
                log.exception("ackqueue: giving back what client %s held", session.client)

    # -- queues ----------------------------------------------------------------------------

    def front(self, name, kind=None):
        """The owner's front on queue name, opened on first use (kind: how a queue new to
        this process is opened; a queue open as another kind: QueueKindMismatch)."""
        q = self.fronts.get(name)
        if q is None:
            if not isinstance(name, str) or not name:
                raise ValueError("a queue name is a non-empty str")
            with self._lock:
                if self.stopping:
                    raise RuntimeError("the owner of this file is stopping")
                q = self.fronts.get(name)
                if q is None:
                    q = self.serving.front(name, kind)
                    wakeup = self.wakeups[name] = _Wakeup()
                    q.add_ready_listener(wakeup)
                    self.fronts[name] = q
        if kind is not None and q.kind != kind:
            raise QueueKindMismatch(f"queue {name!r} is open as {q.kind!r}, not {kind!r}: "
                                    "open it with that class")
        return q

    def _client_conn(self, session, name, kind):
        cc = session.conns.get(name)
        if cc is None:
            q = self.front(name, kind)
            cc = session.conns.setdefault(name, ClientConn(q, q.connect(thread_bound=False)))
        return cc

    def _held(self, session, name, receipts):
        """(receipt, ClientConn, Message) of each receipt of queue name session holds;
        StaleAck for one it does not (given back, or acknowledged already)."""
        if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
            raise ValueError("receipts is a list of str")
        out = []
        for r in receipts:
            d = session.deliveries.get(r)
            if d is None or d[0] != name:
                raise StaleAck(f"receipt {r!r} names no delivery of queue {name!r} held by "
                               "this client: it was given back (its visibility deadline "
                               "passed, or the file's owner changed) or acknowledged")
            out.append((r, d[1], d[2]))
        return out

    # -- requests: each returns (answer header, answer blobs, undo or None) --------------

    def _ping(self, session, h, blobs):
        return {}, (), None

    def _codec(self, session, h, blobs):
        q = self.front(h["queue"], h.get("kind"))
        name, stored = q.record_codec(h.get("wanted"))
        return {"codec": name, "stored": stored}, (), None

    def _put(self, session, h, blobs):
        q = self.front(h["queue"], h.get("kind"))
        bodies = list(blobs)
        codec.check_admitted(q.codec, bodies, q.name)
        opts = {k: v for k, v in (h.get("opts") or {}).items() if k in _PUT_OPTIONS}
        dedup_ids, key = h.get("dedup_ids"), h.get("key")
        if key is not None:           # a retry of a put cut off on its way is stored once
            dedup_ids = ["idempotency:" + str(key)] + [None] * (len(bodies) - 1)
        try:
            ids = q.put_many(bodies, encoded=True, dedup_ids=dedup_ids, **opts)
        except DuplicateMessage as exc:
            if key is None or exc.original_id is None:
                raise
            first = int(exc.original_id)
            return {"ids": list(range(first, first + len(bodies))), "duplicate": True}, (), None
        return {"ids": [int(i) for i in ids]}, (), None

    def _get(self, session, h, blobs):
        name = h["queue"]
        cc = self._client_conn(session, name, h.get("kind"))
        if h.get("acks"):
            self._ack(session, {"queue": name, "receipts": h["acks"]}, ())
        q, wakeup = cc.queue, self.wakeups[name]
        n = max(1, min(int(h.get("n", 1)), 100))
        wait = max(0.0, min(float(h.get("wait", 0.0)), MAX_WAIT))
        kwargs = {"shuffle": bool(h.get("shuffle"))}
        if h.get("visibility_timeout") is not None:
            kwargs["visibility_timeout"] = float(h["visibility_timeout"])
        if h.get("max_receives") is not None:
            kwargs["policy"] = q.receive_policy(h["max_receives"], h.get("dead_letter"))
        got = self._take(cc, q, wakeup, n, time.monotonic() + wait, kwargs)
        metas, bodies = [], []
        for m in got:
            receipt = f"{int(m.id)}.{next(session.counter)}"
            session.deliveries[receipt] = (name, cc, m)
            metas.append({"id": int(m.id), "receipt": receipt,
                          "receive_count": m.receive_count, "sent_at": m.sent_at,
                          "deadline": m.deadline, "priority": m.priority,
                          "attributes": m.attributes})
            bodies.append(m.body)

        def undo():
            for meta, m in zip(metas, got):
                session.deliveries.pop(meta["receipt"], None)
                with cc.lock:
                    try:
                        cc.conn.nack(m)
                    except NotHeld:
                        pass
        return {"messages": metas}, bodies, (undo if got else None)

    def _take(self, cc, q, wakeup, n, deadline, kwargs):
        """Up to n messages for cc, waiting until deadline (monotonic) for one."""
        while True:
            seen = wakeup.generation
            with cc.lock:
                if cc.conn.closed:
                    return []
                try:
                    return cc.conn.get_many(n, block=False, messages=True, raw=True, **kwargs)
                except _queue.Empty:
                    pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.stopping:
                return []
            ready_at = q.next_ready_at()
            if ready_at is not None:
                remaining = min(remaining, max(0.0, ready_at - time.time()) + 0.001)
            wakeup.wait(seen, min(remaining, WAKE_SLICE))

    def _ack(self, session, h, blobs):
        name = h["queue"]
        held = self._held(session, name, h.get("receipts"))
        by_conn = {}
        for r, cc, m in held:
            by_conn.setdefault(cc, []).append((r, m))
        for cc, pairs in by_conn.items():
            done, outcome = threading.Event(), []

            def then(error, done=done, outcome=outcome):
                outcome.append(error)
                done.set()
            with cc.lock:
                try:
                    cc.submit_acks([m for _, m in pairs], then)
                except NotHeld as exc:
                    for r, _ in pairs:
                        session.deliveries.pop(r, None)
                    raise StaleAck(f"a delivery was given back before this ack: {exc}") \
                        from None
            done.wait()               # the commit's outcome, outside the lock
            for r, _ in pairs:
                session.deliveries.pop(r, None)
            if outcome[0] is not None:
                raise outcome[0]
        return {"acked": len(held)}, (), None

    def _nack(self, session, h, blobs):
        held = self._held(session, h["queue"], h.get("receipts"))
        delay = float(h.get("delay") or 0.0)
        for r, cc, m in held:
            session.deliveries.pop(r, None)
            with cc.lock:
                try:
                    cc.conn.nack(m, delay)
                except NotHeld:
                    raise StaleAck("the delivery was given back already") from None
        return {"nacked": len(held)}, (), None

    def _visibility(self, session, h, blobs):
        [(r, cc, m)] = self._held(session, h["queue"], [h.get("receipt")])
        seconds = float(h["seconds"])
        with cc.lock:
            try:
                cc.conn.change_visibility_holding(cc.holding(m), seconds)
            except NotHeld:
                session.deliveries.pop(r, None)
                raise StaleAck("the delivery was given back already") from None
        if seconds <= 0:
            session.deliveries.pop(r, None)
        return {"changed": 1}, (), None

    def _stats(self, session, h, blobs):
        return {"stats": self.front(h["queue"], h.get("kind")).stats()}, (), None

    def _purge(self, session, h, blobs):
        return {"purged": self.front(h["queue"], h.get("kind")).purge()}, (), None

    def _redrive(self, session, h, blobs):
        q = self.front(h["queue"], h.get("kind"))
        return {"moved": q.redrive(to=h.get("to"))}, (), None

    def _browse(self, session, h, blobs):
        q = self.front(h["queue"], h.get("kind"))
        limit = max(1, min(int(h.get("limit", 1000)), 1000))
        it = q.browse(after=h.get("after"))
        try:
            rows = list(itertools.islice(it, limit + 1))
        finally:
            it.close()
        out = [{"id": int(m.id), "state": m.state, "priority": m.priority,
                "receive_count": m.receive_count, "sent_at": m.sent_at, "age": m.age,
                "attributes": m.attributes, "visible_at": m.visible_at,
                "deadline": m.deadline, "expires_at": m.expires_at} for m in rows[:limit]]
        more = len(rows) > limit
        return ({"messages": out, "next_after": out[-1]["id"] if more else None},
                [m.body for m in rows[:limit]], None)

    def _queues(self, session, h, blobs):
        return {"queues": self.serving.list_queues()}, (), None

    def _pack(self, session, h, blobs):
        from ..maintenance import pack
        report = pack(self.handle, keep_seconds=float(h.get("keep_seconds") or 0.0))
        return {"size_before": report.size_before, "size_after": report.size_after,
                "seconds": report.seconds}, (), None

    # -- stopping --------------------------------------------------------------------------

    def stop(self):
        """Stop serving: the socket goes, every client connection is cut (clients retry,
        and one of them takes the file over), what clients held is given back, and the
        owner's fronts close (releasing their references to the handle)."""
        with self._lock:
            if self.stopping:
                return
            self.stopping = True
            conns, threads = list(self._conns), list(self._threads)
            sessions, self.sessions = list(self.sessions.values()), {}
        files.unlink_if(self.socket_path, self._inode)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for wakeup in list(self.wakeups.values()):
            wakeup()
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join(10)
        for session in sessions:
            self._end(session)
        for q in list(self.fronts.values()):
            try:
                q.close()
            except Exception:
                log.exception("ackqueue: the owner of %s closing queue %r", self.path, q.name)
