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
import logging
import os
import signal
import sys

import ZODB
from ZEO.StorageServer import StorageServer

from .storage import open_file_storage

__all__ = ["serve", "parse_listen", "DEFAULT_PORT"]

log = logging.getLogger("ackqueue.server")

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


def _install_filter(logger, kind):
    if not any(isinstance(f, kind) for f in logger.filters):     # serve() may run twice
        logger.addFilter(kind())


def _stop(signum):
    log.info("ackqueue server: stopping on %s", signal.Signals(signum).name)
    raise SystemExit(0)


def serve(path, host="127.0.0.1", port=DEFAULT_PORT, *, durability="fsync", tls=None,
          out=sys.stdout):
    """Serve the queue file path on (host, port) until SIGTERM or SIGINT.  Port 0 picks a
    free port; the address served is printed on out as ``... at zeo://HOST:PORT``.
    tls: (certificate, key, client CA) files: TLS, and only clients presenting a
    certificate that CA signed get in (ackqueue.tls)."""
    ssl_context = None
    if tls is not None:
        from .tls import server_context
        ssl_context = server_context(*tls)
    path = os.path.realpath(path)
    _install_filter(logging.getLogger("ZEO.asyncio.server"), _PeerGoneIsNotAnError)
    ZODB.DB(open_file_storage(path)).close()    # create the root before clients race to
    storage = open_file_storage(path, durability)
    try:
        server = StorageServer((host, port), {"1": storage}, ssl=ssl_context)
    except BaseException:
        storage.close()
        raise
    try:
        bound_host, bound_port = server.addr[:2]
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
