"""The service's own listening sockets and accept loop, in place of asyncio's server.

asyncio's accept loop, out of descriptors (EMFILE, ENFILE), logs a traceback per failed
accept and tries again at once, up to its backlog each time the socket is readable: a
flood of idle connections made hundreds of thousands of tracebacks a minute and starved
every other task.  Here:

- ``Listener`` binds the TCP addresses (and the Unix socket) itself and accepts with
  ``loop.sock_accept``.  An accept that fails for want of resources (EMFILE, ENFILE,
  ENOBUFS, ENOMEM) pauses that socket's accepting for a while (``Backoff``: doubling from
  BACKOFF_FIRST to BACKOFF_CAP seconds, back to the start on the next success); the
  pending connections wait in the kernel's backlog meanwhile.  Any other accept error
  backs off the same way rather than spin.
- Every accepted socket goes first to the gate (``ackqueue.service.gate``), which may close
  it at once, then to aiohttp's protocol through ``loop.connect_accepted_socket`` (with TLS
  when the site has a context; the handshake is bounded by the gate's header timeout).
- ``RateLimitedLog`` writes one line per kind of event and interval: the first event at
  once, then each LOG_INTERVAL a count of the ones not written ("accept failed: too many
  open files (EMFILE); 1,532 more in the last 5 s"), never a traceback per event.

Works with asyncio's loop and uvloop (both have sock_accept and connect_accepted_socket).
"""
import asyncio
import errno
import logging
import os
import socket
import stat

__all__ = ["Listener", "Backoff", "RateLimitedLog", "LOG_INTERVAL", "BACKOFF_FIRST",
           "BACKOFF_CAP", "BACKLOG"]

log = logging.getLogger("ackqueue.service")

LOG_INTERVAL = 5.0          # seconds: at most one line per kind of event and interval
BACKOFF_FIRST = 0.01        # seconds: the first pause after a failed accept
BACKOFF_CAP = 1.0           # seconds: the longest pause
BACKLOG = 128               # aiohttp's default
YIELD_EVERY = 64            # accepts in a row before other tasks get a turn

_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Backoff:
    """Pauses that double from first to cap; reset() starts again from first."""

    def __init__(self, first=BACKOFF_FIRST, cap=BACKOFF_CAP):
        self.first, self.cap = first, cap
        self._next = first

    def next(self):
        delay = self._next
        self._next = min(self.cap, delay * 2)
        return delay

    def reset(self):
        self._next = self.first


class RateLimitedLog:
    """One line per key and interval on logger: note(key, line) writes line at once if
    nothing of key was written in the current window, else counts it; at the window's end
    a line "KEY; N more in the last I s" tells what was not written, and a new window
    starts while events go on.  call_later(delay, fn, *args) schedules (the loop's, or a
    test's); close() writes what is pending."""

    def __init__(self, logger=log, interval=LOG_INTERVAL, *, call_later):
        self.logger, self.interval = logger, interval
        self._call_later = call_later
        self._windows = {}                  # key -> [level, suppressed count, handle]

    def note(self, key, line=None, level=logging.WARNING, exc_info=None):
        window = self._windows.get(key)
        if window is not None:
            window[1] += 1
            return
        self.logger.log(level, "ackqueue serve: %s", line or key, exc_info=exc_info)
        self._windows[key] = [level, 0, self._call_later(self.interval, self._end, key)]

    def _end(self, key):
        level, count, _ = self._windows[key]
        if not count:
            del self._windows[key]
            return
        self.logger.log(level, "ackqueue serve: %s; %s more in the last %g s", key,
                        f"{count:,}", self.interval)
        self._windows[key] = [level, 0, self._call_later(self.interval, self._end, key)]

    def close(self):
        for key, (level, count, handle) in list(self._windows.items()):
            handle.cancel()
            if count:
                self.logger.log(level, "ackqueue serve: %s; %s more before stopping", key,
                                f"{count:,}")
        self._windows.clear()


def _accept_error_key(exc):
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    reason = (exc.strerror or str(exc)).lower()
    return f"accept failed: {reason} ({name})"


async def _bind_tcp(host, port, backlog):
    """Listening sockets for every address host resolves to (as asyncio's create_server:
    SO_REUSEADDR, IPv6 sockets IPv6-only); OSError naming the address otherwise."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    sockets = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()
                raise OSError(exc.errno, f"error while attempting to bind on address "
                                         f"{address!r}: {reason}") from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind_unix(path, backlog):
    """A listening Unix socket at path (a stale socket file there is replaced)."""
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Listener:
    """Accepts on its sockets and hands each connection, if gate admits it, to factory
    (aiohttp's protocol factory: the runner's server).  close() stops accepting."""

    def __init__(self, factory, gate, notes, *, ssl_context=None, backlog=BACKLOG):
        self.factory, self.gate, self.notes = factory, gate, notes
        self.ssl_context, self.backlog = ssl_context, backlog
        self.sockets = []
        self._tasks = set()

    async def start_tcp(self, host, port):
        for sock in await _bind_tcp(host, port, self.backlog):
            self._start(sock, self.ssl_context)

    def start_unix(self, path):
        self._start(_bind_unix(path, self.backlog), None)   # plain: file permissions

    def _start(self, sock, ssl_context):
        self.sockets.append(sock)
        self._spawn(self._accept_loop(sock, ssl_context))

    def _spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, sock, ssl_context):
        loop = asyncio.get_running_loop()
        backoff, streak = Backoff(), 0
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue                    # the client gave up before we took it
            except OSError as exc:
                delay = backoff.next()
                key = _accept_error_key(exc)
                self.notes.note(key, f"{key}; accepting paused, retried every "
                                     f"{BACKOFF_FIRST:g} to {BACKOFF_CAP:g} s"
                                if exc.errno in _RESOURCES else None)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self._accepted(conn, address, ssl_context)
            streak += 1
            if streak >= YIELD_EVERY:       # a long backlog does not starve the requests
                streak = 0
                await asyncio.sleep(0)

    def _accepted(self, conn, address, ssl_context):
        try:
            conn.setblocking(False)
            peer = address[0] if conn.family in (socket.AF_INET, socket.AF_INET6) else None
            entry = self.gate.admit(conn, peer, tls=ssl_context is not None)
        except Exception as exc:            # a bug must not end accepting
            conn.close()
            self.notes.note("handling an accepted connection failed", exc_info=exc)
            return
        if entry is None:
            conn.close()                    # beyond the cap: closed at once
            return
        self._spawn(self._connect(conn, entry, ssl_context))

    async def _connect(self, conn, entry, ssl_context):
        loop = asyncio.get_running_loop()
        extra = {} if ssl_context is None else {
            "ssl": ssl_context, "ssl_handshake_timeout": entry.header_timeout}
        try:
            await loop.connect_accepted_socket(lambda: entry.protocol(self.factory()),
                                               conn, **extra)
        except asyncio.CancelledError:
            entry.lost()
            conn.close()
            raise
        except Exception:                   # a failed TLS handshake: the client's fault
            entry.lost()
            conn.close()

    async def close(self):
        """Stop accepting: the accept loops and pending handshakes end, the listening
        sockets close (the connections already handed to aiohttp are left to it)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self.sockets:
            sock.close()
        self.notes.close()
