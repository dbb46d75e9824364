"""``ackqueue server PATH --listen HOST:PORT``: share a queue file through a ZEO server.

The server is ZEO's own StorageServer serving one FileStorage (storage name "1"), so any
ZEO client can use it; ackqueue clients open it as AckQueue(path="zeo://HOST:PORT").  It
runs in this process because conflict resolution runs on the server and needs ackqueue's
classes (store.Counters, store.SeqCounter) importable.  SIGTERM and SIGINT stop it cleanly:
client connections are closed and the file is closed, writing its .index so that the next
open is fast.

The equivalent runzeo configuration, for people who already run ZEO (the Python running it
must have ackqueue installed)::

    <zeo>
      address 127.0.0.1:8100
    </zeo>
    <filestorage 1>
      path /var/lib/ackqueue/jobs.fs
    </filestorage>
"""
import errno
import logging
import os
import signal
import socket
import sys
import threading

import ZODB
from ZEO.StorageServer import StorageServer
from ZODB.POSException import POSKeyError

from ..errors import QueueLocked
from ..filestorage import pid_note, lock_holder, note_holder, open_file_storage

__all__ = ["serve", "parse_listen", "DEFAULT_PORT"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8100


def parse_listen(text):
    """HOST:PORT, :PORT or PORT -> (host, port); the host defaults to 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port)
    except ValueError:
        raise ValueError(f"--listen wants HOST:PORT, :PORT or PORT, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    return host, port


class _PeerGoneIsNotAnError(logging.Filter):
    """ZEO's server logs a client connection that ended with a connection error at ERROR.
    For a queue server that is routine, not a fault: a client process was killed, or it
    closed its connection while invalidations the server had sent it were still unread
    (the kernel then resets the connection).  Log it at INFO."""

    def filter(self, record):
        if (record.levelno == logging.ERROR and record.msg == "Disconnected %s:%s"
                and isinstance(record.args, tuple) and len(record.args) == 2
                and isinstance(record.args[1], ConnectionError)):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.msg = "a client disconnected abruptly (%s: %s)"
        return True


class _PackedAwayIsNotAnError(logging.Filter):
    """A writer that started from a revision a pack then removed (a pack with a small
    keep_seconds) conflicts, and ZODB's conflict resolution cannot read that revision: it
    logs POSKeyError with a traceback at ERROR and the writer gets a ConflictError, which
    ackqueue's committer retries from a fresh snapshot.  Nothing is lost: log one line at
    INFO."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        if (record.levelno == logging.ERROR and isinstance(exc, POSKeyError)
                and str(record.msg).startswith("Unexpected error while trying to resolve")):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.msg = ("conflict resolution on %s could not read the revision the writer "
                          "started from (a pack removed it, POSKeyError %s): the writer gets "
                          "a ConflictError and retries")
            record.args = (record.args[0] if record.args else "?", exc)
            record.exc_info = record.exc_text = None
        return True


def _install_filter(logger, kind):
    if not any(isinstance(f, kind) for f in logger.filters):     # serve() may run twice
        logger.addFilter(kind())


class _OnePackAtATime:
    """The served storage's pack: clients asking to pack while a pack is in progress wait
    for it (and get its outcome) instead of starting another, which FileStorage refused
    with "Already packing" (the client got a StorageError)."""

    def __init__(self, storage):
        self.pack = storage.pack
        self.guard = threading.Lock()
        self.running = None         # (Event set when it ends, [its error or None])

    def __call__(self, t, referencesf, *args):
        with self.guard:
            running, mine = self.running, self.running is None
            if mine:
                running = self.running = (threading.Event(), [None])
        if not mine:
            log.info("ackqueue server: a pack is in progress: this request waits for it "
                     "instead of starting another")
            running[0].wait()
            if running[1][0] is not None:
                raise running[1][0]
            return None
        log.info("ackqueue server: packing (a client asked)")
        try:
            return self.pack(t, referencesf, *args)
        except BaseException as exc:
            running[1][0] = exc
            raise
        finally:
            with self.guard:
                self.running = None
            running[0].set()


def _FILES(path):
    return [path, path + ".index", path + ".lock", path + ".tmp"]


def _check_address(host, port):
    """Refuse at once, in one line, an address this process cannot listen on (a port in
    use, an address not of this machine), before anything is created.  ZEO binds the
    same way (SO_REUSEADDR) a moment later."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(errno.EADDRNOTAVAIL,
                      f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            why = ("the address is already in use (another server listens there; choose "
                   "another port with --listen, or port 0 for a free one)"
                   if exc.errno == errno.EADDRINUSE else exc.strerror)
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {why}") from None


def _stop(signum):
    log.info("ackqueue server: stopping on %s", signal.Signals(signum).name)
    raise SystemExit(0)


def serve(path, host="127.0.0.1", port=DEFAULT_PORT, *, durability="fsync", tls=None,
          out=sys.stdout):
    """Serve the queue file path on (host, port) until SIGTERM or SIGINT.  Port 0 picks a
    free port; the address served is printed on out as ``... at zeo://HOST:PORT``.
    tls: (certificate, key, client CA) files: TLS, and only clients presenting a
    certificate that CA signed get in (ackqueue.zeo.tls)."""
    ssl_context = None
    if tls is not None:
        from .tls import server_context
        ssl_context = server_context(*tls)
    path = os.path.realpath(path)
    _install_filter(logging.getLogger("ZEO.asyncio.server"), _PeerGoneIsNotAnError)
    _install_filter(logging.getLogger("ZODB.ConflictResolution"), _PackedAwayIsNotAnError)
    _check_address(host, port)      # before the file is touched: a busy port creates nothing
    existed = [p for p in _FILES(path) if os.path.exists(p)]
    try:
        ZODB.DB(open_file_storage(path)).close()    # create the root before clients race
        storage = open_file_storage(path, durability)
    except QueueLocked:
        if lock_holder(path)[1] is not None:
            raise                   # it names the server or service that holds the file
        raise QueueLocked(
            f"queue file {path!r} is already open in another process{pid_note(path)}: "
            "if that is an ackqueue server, clients reach the queue at its address "
            "(zeo://HOST:PORT); to serve the file from here, stop that process first"
        ) from None
    storage.pack = _OnePackAtATime(storage)
    try:
        server = StorageServer((host, port), {"1": storage}, ssl=ssl_context)
    except BaseException:
        storage.close()
        for created in set(_FILES(path)) - set(existed):   # nothing left when it cannot start
            try:
                os.remove(created)
            except OSError:
                pass
        raise
    try:
        bound_host, bound_port = server.addr[:2]
        note_holder(path, f"zeo://{bound_host}:{bound_port}")   # for a process refused it
        for signum in (signal.SIGTERM, signal.SIGINT):
            # Raised by the event loop between two requests.  Raised from a plain signal
            # handler, SystemExit could land inside a request (a vote reading its data),
            # where ZEO turns it into that client's error and the server runs on.
            server.acceptor.event_loop.add_signal_handler(signum, _stop, signum)
        print(f"ackqueue server: serving {path} at zeo://{bound_host}:{bound_port} "
              f"(pid {os.getpid()}, durability {durability}"
              f"{', TLS with client certificates' if tls else ''}); stop with SIGTERM or "
              "Ctrl-C", file=out, flush=True)
        server.loop()
    finally:
        server.close()          # closes client connections and the storage (.index)
        log.info("ackqueue server: closed %s", path)
    return 0
