"""``ackqueue serve``: run the queue service until SIGTERM or SIGINT."""
import asyncio
import logging
import os
import resource
import signal
import sys

from aiohttp import web

from ..filestorage import note_holder
from .backend import Service
from .gate import HEADER_TIMEOUT, Gate, default_caps
from .app import make_app
from .listener import Listener, RateLimitedLog

__all__ = ["serve", "DEFAULT_PORT", "descriptor_limit"]

log = logging.getLogger("ackqueue.service")

DEFAULT_PORT = 8080
LINGER = 2.0


def _use_uvloop(choice):
    if choice == "asyncio":
        return False
    try:
        import importlib
        importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("ackqueue serve: --loop uvloop, but uvloop is not installed "
                             "(pip install 'ackqueue[service]')")
        return False
    return True


def descriptor_limit():
    """The process's soft limit on open file descriptors (None: unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _gate(pool_size, max_idle_connections, max_idle_per_address, header_timeout,
          client_timeout, auth):
    """The connection gate, its caps given or derived from the descriptor limit (0: derive),
    with one line in the log saying what they are."""
    notes = RateLimitedLog(log, call_later=asyncio.get_running_loop().call_later)
    nofile = descriptor_limit()
    total, per_address = default_caps(nofile, pool_size)
    total = max_idle_connections or total
    per_address = min(max_idle_per_address or per_address, total)
    header_timeout = min(header_timeout, client_timeout)
    log.info("ackqueue serve: at most %d unauthenticated idle connections, %d per address; "
             "a new connection has %g s to send a complete request (descriptor limit %s)",
             total, per_address, header_timeout, nofile or "unlimited")
    return Gate(total, per_address, header_timeout, notes, auth=auth)


async def _listen(runner, gate, host, port, socket_path, ssl_context):
    """The Listener on host:port (and socket_path), and the URLs it serves."""
    listener = Listener(runner.server, gate, gate.notes, ssl_context=ssl_context)
    try:
        await listener.start_tcp(host, port)
        where = []
        for sock in listener.sockets:               # the port actually bound (port 0)
            h, p = sock.getsockname()[:2]
            where.append(f"{'https' if ssl_context else 'http'}://{'[' + h + ']' if ':' in h else h}:{p}")
        if socket_path:
            listener.start_unix(socket_path)
            where.append(f"unix:{socket_path}")
    except BaseException:
        await listener.close()
        raise
    return listener, where


async def _serve(service, host, port, socket_path, out, *, pool_size, max_body,
                 shutdown_timeout, client_timeout=60.0, sasquatch=None, ssl_context=None,
                 auth=None, max_idle_connections=0, max_idle_per_address=0,
                 header_timeout=HEADER_TIMEOUT):
    app = make_app(service, pool_size=pool_size, max_body=max_body,
                   client_timeout=client_timeout, sasquatch=sasquatch, auth=auth)
    gate = _gate(pool_size, max_idle_connections, max_idle_per_address, header_timeout,
                 client_timeout, auth)
    app.middlewares.insert(0, gate.middleware)      # outermost: sees every request
    # keepalive_timeout: a connection that sends no complete request for this long (idle,
    # or stalled in its headers) is closed; a stalled body: runtime.Api (408).  After a 413
    # or 408 (Connection: close) the rest of an unread body is read and dropped for at
    # most LINGER seconds, so that the client reads the answer rather than a reset.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=shutdown_timeout,
                           keepalive_timeout=client_timeout,
                           lingering_time=min(LINGER, client_timeout))
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listener = None
    try:
        listener, where = await _listen(runner, gate, host, port, socket_path, ssl_context)
        if service.path is not None:    # a process refused the file is told this URL
            note_holder(service.path, where[0])
        print(f"ackqueue serve: listening on {' and '.join(where)} (pid {os.getpid()}, "
              f"{service.description}); stop with SIGTERM or Ctrl-C", file=out, flush=True)
        await stop.wait()
        log.info("ackqueue serve: stopping")
    finally:
        if listener is not None:
            await listener.close()      # stop accepting
        await runner.cleanup()          # finish requests, close the queues


def _share_file(service):
    """--share-file: the file's own socket too (a failure closes the service)."""
    try:
        log.info("ackqueue serve: processes that open %s itself reach it on %s",
                 service.path, service.share_file())
    except BaseException:
        service.close()
        raise


def serve(path=None, host="127.0.0.1", port=DEFAULT_PORT, *, socket_path=None,
          durability="fsync", lease_timeout=30.0, pool_size=64, max_body=1 << 20,
          loop="asyncio", shutdown_timeout=10.0, client_timeout=60.0, out=sys.stdout,
          sasquatch=None, ssl_context=None, auth=None, max_idle_connections=0,
          max_idle_per_address=0, header_timeout=HEADER_TIMEOUT, share_file=False):
    """Serve the queues of the file path (memory when None) until SIGTERM or SIGINT.
    max_idle_connections, max_idle_per_address: the caps on unauthenticated idle
    connections (0: derived from the descriptor limit); header_timeout: the seconds a new
    connection has to send a complete request (ackqueue.service.gate).  share_file: also
    serve the processes of this machine that open the file itself (Service.share_file)."""
    if path is not None:
        path = os.path.realpath(path)
    service = Service(path, durability=durability, lease_timeout=lease_timeout)
    if share_file:
        _share_file(service)
    service.description = (f"file {path}, durability {durability}" if path
                           else "in memory")
    try:
        if _use_uvloop(loop):
            import uvloop
            runner = uvloop.run
        else:
            runner = asyncio.run
        runner(_serve(service, host, port, socket_path, out, pool_size=pool_size,
                      max_body=max_body, shutdown_timeout=shutdown_timeout,
                      client_timeout=client_timeout, sasquatch=sasquatch,
                      ssl_context=ssl_context, auth=auth,
                      max_idle_connections=max_idle_connections,
                      max_idle_per_address=max_idle_per_address,
                      header_timeout=header_timeout))
    finally:
        if not service.closed:
            service.close()
        if socket_path and os.path.exists(socket_path):
            try:
                os.unlink(socket_path)
            except OSError:
                pass
    log.info("ackqueue serve: closed")
    return 0
