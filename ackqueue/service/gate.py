"""Caps on the unauthenticated idle connections of ``ackqueue serve``, and their header
timeout, so that idle connections cannot take every file descriptor.

A connection is *unproven* from its accept until it has sent a complete request head
(without --auth: every client is as good as another, so any request proves it) or, with
--auth, until a request on it was answered as authenticated (a status under 400 on a
route that needs credentials; POST / is SQS, signed and checked by the SQS front, so an
answer under 400 there counts too).  While a request runs the connection is busy; after
an anonymous or refused request it is unproven again.

- ``Gate.admit``: at most ``total`` unproven connections in all and ``per_address`` per
  client address (Unix socket clients count in all only).  A connection accepted beyond
  either is closed at once, unless its complete request head already waits in its socket
  (peeked: it is not idle).  A connection unproven again beyond the cap is answered and
  closed (Connection: close).
- an unproven connection that is not busy is closed ``header_timeout`` seconds after it
  was made or after its last answer (aiohttp's keepalive timeout, --client-timeout,
  covers every other connection).
- ``Gate.middleware``, the application's outermost middleware, sees requests start and
  end; each admitted connection's protocol is wrapped (``Entry.protocol``) to see its
  request head arrive and its end.
- refusals and timeouts are logged through a RateLimitedLog (ackqueue.service.listener).

``default_caps(nofile, pool_size)``: the caps derived from the descriptor limit.
"""
import asyncio
import collections
import logging
import socket

from aiohttp import web

from .auth import ROUTES

__all__ = ["Gate", "Entry", "default_caps", "HEADROOM", "HEADER_TIMEOUT"]

HEADER_TIMEOUT = 10.0   # seconds a new connection has to send a complete request
HEADROOM = 32           # descriptors kept for the storage's files, the listening sockets,
                        # the event loop, stdio and the logs
PEEK = 16384            # bytes looked at in a connection beyond the cap
_END_OF_HEAD = b"\r\n\r\n"

FRESH, BUSY, PROVEN, GONE = "fresh", "busy", "proven", "gone"


def default_caps(nofile, pool_size):
    """(total, per_address) for a descriptor limit nofile: past HEADROOM and one
    descriptor per pool thread (a FileStorage reader each), a quarter of what is left for
    unproven connections, the rest for the clients that sent requests; half of that
    quarter for one address.  Never under 8 and 4."""
    if nofile is None or nofile < 0:
        nofile = 1 << 16                       # unlimited
    spare = max(0, min(nofile, 1 << 16) - HEADROOM - pool_size)
    total = max(8, spare // 4)
    return total, max(4, total // 2)


def _has_request_head(conn):
    """Whether a complete request head already waits in conn (without reading it)."""
    try:
        return _END_OF_HEAD in conn.recv(PEEK, socket.MSG_PEEK)
    except OSError:                            # nothing yet (BlockingIOError) or gone
        return False


def _anonymous(request):
    """Whether request's route is open to anyone under --auth (/health, /openapi.json):
    its answer proves nothing about the client."""
    resource = request.match_info.route.resource
    canonical = resource.canonical if resource is not None else None
    method = "GET" if request.method == "HEAD" else request.method
    return canonical != "/" and ROUTES.get((method, canonical), "needs rights") is None


class Gate:
    """The unproven connections, counted in all and per address (auth: the service's
    Auth, or None; notes: a RateLimitedLog)."""

    def __init__(self, total, per_address, header_timeout, notes, *, auth=None):
        self.total, self.per_address = total, per_address
        self.header_timeout, self.notes, self.auth = header_timeout, notes, auth
        self.loop = asyncio.get_running_loop()
        self.unproven = 0
        self._by_address = collections.Counter()
        self._by_transport = {}                # transport -> Entry

    def full(self, peer):
        """Whether one more unproven connection from peer would pass a cap."""
        return self.unproven >= self.total or (
            peer is not None and self._by_address[peer] >= self.per_address)

    def count(self, peer, delta):
        self.unproven += delta
        if peer is not None:
            self._by_address[peer] += delta
            if self._by_address[peer] <= 0:
                del self._by_address[peer]

    def refused(self, peer, when):
        """Log (rate-limited) that a connection from peer was closed beyond the cap."""
        waiting = "are unauthenticated" if self.auth is not None else "have sent no request"
        if self.unproven >= self.total:
            key = (f"closed connections {when}: {self.total} connections {waiting} yet "
                   "(--max-idle-connections)")
        else:
            key = (f"closed connections {when}: {self.per_address} connections from one "
                   f"address {waiting} yet (--max-idle-per-address)")
        self.notes.note(key, f"{key}; this one from {peer or 'the Unix socket'}")

    def admit(self, conn, peer, *, tls=False):
        """An Entry for the accepted socket conn from peer (an address, or None), or None
        when it is to be closed at once."""
        if self.full(peer) and (tls or not _has_request_head(conn)):
            self.refused(peer, "at once")
            return None
        return Entry(self, peer)

    def attach(self, transport, entry):
        self._by_transport[transport] = entry

    def detach(self, transport):
        self._by_transport.pop(transport, None)

    @web.middleware
    async def middleware(self, request, handler):
        """Marks a request's connection busy while it runs, proven or unproven after."""
        entry = self._by_transport.get(request.transport)
        if entry is None:
            return await handler(request)
        entry.started()
        response = None
        try:
            response = await handler(request)
            return response
        finally:
            proven = self.auth is None or (
                response is not None and response.status < 400 and not _anonymous(request))
            entry.done(proven, response)


class Entry:
    """One admitted connection: its state (FRESH: unproven and counted, BUSY, PROVEN,
    GONE), its transport once made, and its header timer."""

    __slots__ = ("gate", "peer", "state", "transport", "timer")

    def __init__(self, gate, peer):
        self.gate, self.peer = gate, peer
        self.state, self.transport, self.timer = FRESH, None, None
        gate.count(peer, 1)

    @property
    def header_timeout(self):
        return self.gate.header_timeout

    def protocol(self, inner):
        """inner (aiohttp's protocol for this connection) wrapped to report to self."""
        return _Tracked(inner, self)

    def made(self, transport):
        self.transport = transport
        self.gate.attach(transport, self)
        if self.state == FRESH:
            self._arm()

    def _arm(self):
        self.timer = self.gate.loop.call_later(self.gate.header_timeout, self._expired)

    def _disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _leave_fresh(self, state):
        self._disarm()
        self.gate.count(self.peer, -1)
        self.state = state

    def _expired(self):
        self.timer = None
        if self.state == FRESH and self.transport is not None:
            self.gate.notes.note(f"closed connections that sent no complete request "
                                 f"within {self.gate.header_timeout:g} s (--header-timeout)",
                                 level=logging.INFO)
            self.transport.close()

    def started(self):
        """A complete request head arrived (or its handler started)."""
        if self.state == FRESH:
            self._leave_fresh(BUSY if self.gate.auth is not None else PROVEN)

    def done(self, proven, response):
        """A request ended: proven (authenticated) or unproven again, closed after its
        answer when that would pass a cap."""
        if self.state != BUSY:
            return
        if proven:
            self.state = PROVEN
        elif self.gate.full(self.peer) and response is not None:
            self.state = GONE
            response.force_close()
            self.gate.refused(self.peer, "after an unauthenticated request")
        else:
            self.state = FRESH
            self.gate.count(self.peer, 1)
            self._arm()

    def lost(self):
        """The connection closed (or never got to aiohttp); idempotent."""
        if self.state == FRESH:
            self._leave_fresh(GONE)
        self._disarm()
        self.state = GONE
        if self.transport is not None:
            self.gate.detach(self.transport)


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, reporting to its Entry: the end of a request
    head while the connection is unproven, and the connection's end."""

    __slots__ = ("inner", "entry", "tail")

    def __init__(self, inner, entry):
        self.inner, self.entry, self.tail = inner, entry, b""

    def connection_made(self, transport):
        self.entry.made(transport)
        self.inner.connection_made(transport)

    def data_received(self, data):
        if self.entry.state == FRESH:       # only until proven: no cost afterwards
            if _END_OF_HEAD in data or _END_OF_HEAD in self.tail + data[:3]:
                self.entry.started()
            self.tail = (self.tail + data[-3:])[-3:]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc):
        self.entry.lost()
        self.inner.connection_lost(exc)

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()
