"""``ackqueue serve``: run the queue service until SIGTERM or SIGINT."""
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from ..storage import note_holder
from .core import Service
from .http import make_app

__all__ = ["serve", "DEFAULT_PORT"]

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


async def _serve(service, host, port, socket_path, out, *, pool_size, max_body,
                 shutdown_timeout, client_timeout=60.0, sasquatch=None, ssl_context=None,
                 auth=None):
    app = make_app(service, pool_size=pool_size, max_body=max_body,
                   client_timeout=client_timeout, sasquatch=sasquatch, auth=auth)
    # keepalive_timeout: a connection that sends no complete request for this long (idle,
    # or stalled in its headers) is closed; a stalled body: Api._read_body.  After a 413
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
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        where = []
        for sock in site._server.sockets:               # the port actually bound (port 0)
            h, p = sock.getsockname()[:2]
            where.append(f"{'https' if ssl_context else 'http'}://{'[' + h + ']' if ':' in h else h}:{p}")
        if socket_path:
            usite = web.UnixSite(runner, socket_path)
            await usite.start()
            where.append(f"unix:{socket_path}")
        if service.path is not None:    # a process refused the file is told this URL
            note_holder(service.path, where[0])
        print(f"ackqueue serve: listening on {' and '.join(where)} (pid {os.getpid()}, "
              f"{service.description}); stop with SIGTERM or Ctrl-C", file=out, flush=True)
        await stop.wait()
        log.info("ackqueue serve: stopping")
    finally:
        await runner.cleanup()     # stop accepting, finish requests, close the queues


def serve(path=None, host="127.0.0.1", port=DEFAULT_PORT, *, socket_path=None,
          durability="fsync", lease_timeout=30.0, pool_size=64, max_body=1 << 20,
          loop="asyncio", shutdown_timeout=10.0, client_timeout=60.0, out=sys.stdout,
          sasquatch=None, ssl_context=None, auth=None):
    """Serve the queues of the file path (memory when None) until SIGTERM or SIGINT."""
    if path is not None:
        path = os.path.realpath(path)
    service = Service(path, durability=durability, lease_timeout=lease_timeout)
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
                      ssl_context=ssl_context, auth=auth))
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
