"""The clients of a queue file's owner: ``AckQueue(path="jobs.fs")`` in a process that
could not lock the file, because another process (its owner, shared.owner) holds it.

These are the remote drop-in's pieces (ackqueue.remote: the holdings, deferred acks,
thread give-back, waits and shutdown are theirs) over the lean wire (shared.wire) on the
owner's Unix socket instead of HTTP:

- ``SharedDatabase``: this process's client id, one ``Channel`` (socket) per thread, and
  the background thread that gives back what ended threads held and pings the owner every
  second (so that an owner that went is noticed, and the file taken over, even while this
  process is idle);
- ``SharedState`` and ``SharedConnection``: RemoteState and RemoteConnection with every
  request made as one frame.

When the owner goes (it closed the file, exited, or was killed), a request that finds its
socket closed or refused asks ``take_over`` (given by the front: it tries the file's lock,
and serves the file from this process if it gets it) and retries until a process serves
the file again, up to wait_timeout (then ServerUnavailable).  A put carries an idempotency
key, so a put retried after a cut-off request is stored once; deliveries handed out by an
owner that went are given back by the file's next open, so their acks raise StaleAck.
"""
import socket
import time
import uuid

from .. import errors, store
from ..errors import AckQueueError, ServerUnavailable
from ..message import MessageId
from ..remote.connection import RemoteConnection
from ..remote.database import RemoteDatabase, RemoteState, client_id
from ..remote.http import DEFAULT_WAIT_TIMEOUT, Interrupted
from . import files, wire

__all__ = ["SharedDatabase", "SharedState", "SharedConnection", "Channel", "raise_error"]

PING_INTERVAL = 1.0           # seconds between the background thread's pings
_ERRORS = {name: getattr(errors, name) for name in errors.__all__
           if isinstance(getattr(errors, name), type)}
_ERRORS.update(ValueError=ValueError, TypeError=TypeError, KeyError=KeyError)


def raise_error(doc):
    """Raise the error an owner's error answer names (an ackqueue error, ValueError or
    TypeError as the embedded queue raises it; AckQueueError for anything else)."""
    kind, message = doc.get("type"), doc.get("message", "")
    cls = _ERRORS.get(kind)
    if cls is errors.DuplicateMessage:
        exc = cls(message)
        if doc.get("original_id") is not None:
            exc.original_id = MessageId(doc["original_id"])
        raise exc
    if cls is errors.EncodingRefused:
        raise cls(message, codec=doc.get("codec"), encoding=doc.get("encoding"))
    if cls is not None:
        raise cls(message)
    raise AckQueueError(f"the owner of the queue file failed a request: {kind}: {message}")


class Channel:
    """One thread's connection to the owner: a request, then its answer."""

    def __init__(self, database):
        self.database = database
        self.sock = None
        self.buf = bytearray()
        self.ids = 0
        self.interrupted = False

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def interrupt(self):
        """Cut a long poll in progress short (shutdown() in another thread)."""
        self.interrupted = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _connect(self, timeout):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self.database.socket_path)
            self.sock, self.buf = sock, bytearray()
            self._exchange(wire.OPS["hello"], {"client": self.database.client}, ())
        except BaseException:
            self.close()
            sock.close()
            raise

    def _exchange(self, op, header, blobs):
        self.ids = (self.ids + 1) & 0xFFFFFFFF
        self.sock.sendall(wire.encode(self.ids, op, header, blobs))
        rid, kind, answer, out = wire.read_frame(self.sock, self.buf)
        if rid != self.ids:
            raise wire.WireError(f"answer {rid} to request {self.ids}")
        return kind, answer, out

    def request(self, name, header, blobs=(), *, read_timeout=None):
        """(answer header, answer blobs, attempts before the answered one) of one request;
        an error answer raises (raise_error).  A refused or cut-off request is retried
        (the file taken over if its owner went) until wait_timeout, then
        ServerUnavailable."""
        database = self.database
        wait_timeout = database.wait_timeout
        deadline = time.monotonic() + wait_timeout
        attempt, pause, why = 0, 0.005, None
        op = wire.OPS[name]
        while True:
            try:
                if self.sock is None:
                    self._connect(min(read_timeout or wait_timeout, wait_timeout))
                self.sock.settimeout(read_timeout or wait_timeout)
                kind, answer, out = self._exchange(op, header, blobs)
                if kind == wire.ERROR:
                    raise_error(answer)
                return answer, out, attempt
            except (OSError, EOFError) as exc:      # wire.WireError and timeouts too
                self.close()
                if self.interrupted:
                    self.interrupted = False
                    raise Interrupted() from exc
                why = repr(exc)
            except BaseException:
                self.close()            # mid-request: no late answer is read as the next's
                raise
            database.take_over()
            if time.monotonic() + pause > deadline:
                raise ServerUnavailable(
                    f"no process served {database.description} within {wait_timeout:g} s "
                    f"({why}); {name} may not have been done")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            attempt += 1


class SharedDatabase(RemoteDatabase):
    """The front's self._database for a queue file another process holds."""

    shared_file = None
    channel_class = Channel          # made of its target: this database itself

    def __init__(self, front, path, take_over, on_release, wait_timeout=DEFAULT_WAIT_TIMEOUT):
        if front.clock is not time.time:
            raise ValueError("clock= cannot travel to the process that holds the queue "
                             "file: deadlines, delays and retention run on its clock; test "
                             "with a fake clock on a queue file no other process holds")
        self.shared_file = path
        self.socket_path = files.socket_path(path)
        self.description = f"queue file {path!r} (shared)"
        self.wait_timeout = wait_timeout
        self.take_over = take_over
        self._on_release = on_release
        self.target = self               # what RemoteDatabase reads off its target
        self.url = self.netloc = self.description
        self.set_up(front, client_id(), PING_INTERVAL * 3)
        try:
            self._renew()                # reachable now, or ServerUnavailable
        except BaseException:
            on_release()
            raise
        self.start()

    def _after_fork(self):
        inherited = self.channels()
        super()._after_fork()
        for channel in inherited:        # the parent's sockets: this process's copies go
            channel.close()

    def request(self, name, header, blobs=(), *, read_timeout=None):
        return self.http().request(name, header, blobs, read_timeout=read_timeout)

    def call(self, method, path, body=None, headers=None, *, read_timeout=None):
        raise AckQueueError(f"{self.description} is reached through its owner's socket, "
                            f"not HTTP ({method} {path})")

    # -- what the front asks of a database ---------------------------------------------

    def pack_through_service(self, keep_seconds):
        from ..maintenance import PackReport
        doc, _, _ = self.request("pack", {"keep_seconds": keep_seconds})
        return PackReport(doc["size_before"], doc["size_after"], doc["seconds"],
                          self.description)

    def state(self, name, kind, clock, codec_name, allowed):
        if kind == store.VALUE:
            from ..remote.http import unsupported
            raise unsupported(
                "AckPriorityQueue (ordering by item value)",
                "the process that holds the file would have to unpickle items to order "
                "them; use priority= levels on AckQueue's put (higher first, FIFO within "
                "a level)")
        self.state_ = SharedState(self, name, kind, None, allowed)
        if codec_name is not None:
            self.state_.record_codec_now(codec_name)
        return self.state_

    def codec_answer(self, name, wanted):
        kind = self.state_.kind if self.state_ is not None else None
        doc, _, _ = self.request("codec", {"queue": name, "kind": kind, "wanted": wanted})
        return 200, doc

    def list_queues(self):
        return self.request("queues", {})[0]["queues"]

    def _renew(self):
        self.request("ping", {})

    def _end_lease(self):
        pass                    # the owner ends a client with its last connection

    def release(self):
        if not self.closed:
            super().release()
            self._on_release()


class SharedState(RemoteState):
    """What the front asks of self.state, answered by the file's owner."""

    def __init__(self, database, name, kind, codec_name, allowed):
        super().__init__(database, name, codec_name, allowed)
        self.kind = kind

    def _ask(self, name, **fields):
        return self.database.request(name, {"queue": self.name, "kind": self.kind,
                                            **fields})[0]

    def record_codec_now(self, wanted):
        """The codec asked for at open, agreed now (CodecMismatch at open, as embedded)."""
        self._codec = self._ask("codec", wanted=wanted)["codec"]

    def stats(self):
        return self._ask("stats")["stats"]

    def purge(self):
        return self._ask("purge")["purged"]

    def browse_rows(self, after=None):
        while True:
            doc, bodies, _ = self.database.request(
                "browse", {"queue": self.name, "kind": self.kind, "after": after,
                           "limit": 1000})
            yield from zip(doc["messages"], bodies)
            if doc.get("next_after") is None:
                return
            after = doc["next_after"]


class SharedConnection(RemoteConnection):
    """One thread's handle on a queue of a file another process holds (its proxy)."""

    shuffles = True

    def _header(self, **fields):
        return {"queue": self.state.name, "kind": self.state.kind, **fields}

    def _send_put(self, bodies, opts, dedup_ids):
        fields = {}
        if opts is not None:
            fields = {"priority": opts.priority, "delay": opts.delay,
                      "retention": opts.retention, "dedup_window": opts.dedup_window}
            if opts.attributes:
                fields["attributes"] = dict(opts.attributes)
        header = self._header(opts=fields)
        if any(d is not None for d in dedup_ids):
            header["dedup_ids"] = list(dedup_ids)
        else:
            header["key"] = uuid.uuid4().hex
        doc, _, _ = self.database.request("put", header, bodies)
        return [MessageId(i) for i in doc["ids"]]

    def _poll(self, n, wait, visibility_timeout, policy, shuffle, acks):
        header = self._header(n=n, wait=wait, visibility_timeout=visibility_timeout,
                              shuffle=shuffle, acks=acks)
        if policy is not None:
            header["max_receives"] = policy.max_receives
            header["dead_letter"] = policy.target
        try:
            doc, bodies, _ = self.database.request(
                "get", header, read_timeout=wait + self.database.wait_timeout)
        except errors.StaleAck:
            if acks:
                return None
            raise
        return list(zip(doc["messages"], bodies))

    def _ack_receipts(self, receipts):
        try:
            _, _, attempt = self.database.request("ack", self._header(receipts=receipts))
        except errors.StaleAck as exc:
            raise errors.StaleAck(f"{exc} (if this ack's first request was cut off, it may "
                                  "have been made by it)") from None
        return attempt

    def nack_receipts(self, receipts, delay=0):
        self.database.request("nack", self._header(receipts=receipts, delay=float(delay)))

    def _send_visibility(self, receipt, seconds):
        self.database.request("visibility", self._header(receipt=receipt, seconds=seconds))

    def _send_redrive(self, to):
        return self.database.request("redrive", self._header(to=to))[0]["moved"]

    def transaction(self):
        from ..remote.http import unsupported
        raise unsupported("with q.transaction(): on a queue file another process holds",
                          "open the queue in the process that holds the file, or share it "
                          "through the queue service (ackqueue serve FILE, "
                          "path='http://...'), whose atomic batches carry a transaction")


SharedDatabase.proxy_class = SharedConnection
