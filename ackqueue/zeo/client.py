"""The ZEO client under a queue server's storage (zeo://HOST:PORT): the address and its
options, the client storage that tells ackqueue.database which objects other processes
changed, and the prefetch of what a wake-up is about to read."""
import collections
import logging
import socket
import threading
from urllib.parse import parse_qs, urlsplit

import ZODB
from ZEO.ClientStorage import ClientStorage
from ZEO.Exceptions import ClientDisconnected
from ZODB.POSException import ConflictError
from ZODB.utils import p64, u64

from ..errors import ServerUnavailable

log = logging.getLogger(__name__)

__all__ = ["parse_zeo_url", "open_zeo", "prefetch", "PREFETCH_MAX", "WRITTEN_KEPT"]

PREFETCH_MAX = 64   # objects changed by another process's commit that a wake-up prefetches
WRITTEN_KEPT = 256  # objects this process wrote lately, remembered for the warm prefetch


class _NotifyingClientStorage(ClientStorage):
    """ZEO's ClientStorage, telling ackqueue which objects other processes changed, and
    remembering which objects this process wrote lately (see Database._dispatch_changes)."""

    ackqueue_database = None

    def __init__(self, *args, **kwargs):
        self._storing = {}                  # id(transaction) -> the oids it stores
        self._written = collections.OrderedDict()   # oids this process wrote, latest last
        self._written_lock = threading.Lock()       # commits may finish in several threads
        self.last_own_tid = None            # the tid of this process's latest commit
        super().__init__(*args, **kwargs)

    def written_lately(self, oids):
        """Those of oids that this process's latest commits wrote (WRITTEN_KEPT at most)."""
        with self._written_lock:
            return [oid for oid in oids if oid in self._written]

    def store(self, oid, serial, data, version, txn):
        super().store(oid, serial, data, version, txn)
        self._storing.setdefault(id(txn), []).append(oid)

    def tpc_finish(self, txn, f=lambda tid: None):
        oids = self._storing.pop(id(txn), ())
        tid = super().tpc_finish(txn, f)
        with self._written_lock:
            written = self._written
            for oid in oids:
                written[oid] = None
                written.move_to_end(oid)
            while len(written) > WRITTEN_KEPT:
                written.popitem(last=False)
            self.last_own_tid = tid
        return tid

    def tpc_abort(self, txn, *args, **kwargs):
        self._storing.pop(id(txn), None)
        return super().tpc_abort(txn, *args, **kwargs)

    def invalidateTransaction(self, tid, oids):
        super().invalidateTransaction(tid, oids)
        if self.ackqueue_database is not None:
            self.ackqueue_database.changed(set(oids), tid)

    def invalidateCache(self):
        super().invalidateCache()
        if self.ackqueue_database is not None:
            self.ackqueue_database.changed(None)


def prefetch(storage, oids, tid):
    """Start loading, all at once, the states that objects oids have after transaction tid
    (another process's commit that this client was told of), without waiting.

    The getters woken for that change, and the committer applying their claims, then join
    the loads in flight or find the states in the client's cache, instead of making a
    round trip to the server for each in turn (a wake-up and its claim loaded seven
    objects, one after another)."""
    if tid is None or len(oids) > PREFETCH_MAX or not storage.is_connected():
        return
    try:
        # A connection that syncs now reads "before" the next transaction id; asking the
        # same makes the requests identical, and ZEO merges identical loads in flight.
        storage.prefetch(oids, p64(u64(tid) + 1))
    except ClientDisconnected:      # lost meanwhile: the readers will load when they can
        pass


_NUMBER_OPTIONS = ("wait_timeout", "lease_timeout")
_FILE_OPTIONS = ("tls_ca", "tls_cert", "tls_key")


def parse_zeo_url(url):
    """zeo://HOST:PORT[?wait_timeout=S&lease_timeout=S&tls_ca=F&tls_cert=F&tls_key=F] ->
    ((host, port), options); the tls_ options are file paths (ackqueue.zeo.tls)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "zeo" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"not a queue server address: {url!r} (expected zeo://HOST:PORT)")
    options = {}
    for name, values in parse_qs(parts.query, strict_parsing=False).items():
        if name in _FILE_OPTIONS:
            options[name] = values[-1]
            continue
        if name not in _NUMBER_OPTIONS:
            raise ValueError(f"unknown option {name!r} in {url!r} (known: "
                             f"{', '.join(_NUMBER_OPTIONS + _FILE_OPTIONS)})")
        try:
            options[name] = float(values[-1])
        except ValueError:
            raise ValueError(f"option {name} in {url!r} must be a number of seconds") from None
        if options[name] <= 0:
            raise ValueError(f"option {name} in {url!r} must be positive")
    if ("tls_cert" in options) != ("tls_key" in options) or (
            "tls_cert" in options and "tls_ca" not in options):
        raise ValueError(f"{url!r}: tls_cert and tls_key go together, with tls_ca")
    return (parts.hostname, port), options


def _client_ssl(options):
    """The ssl.SSLContext a zeo:// address's tls_ options ask for, or None."""
    if "tls_ca" not in options:
        return None
    from .tls import client_context
    return client_context(options["tls_ca"], options.get("tls_cert"), options.get("tls_key"))


QUIET_WAIT = 1.0        # a wait for a server shorter than this is not announced


def _probe_server(url, addr, wait):
    """Fail at once when the server's host cannot be resolved; log once (WARNING) when
    nothing listens there yet, before ZEO's client waits up to wait seconds in silence."""
    try:
        socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServerUnavailable(
            f"cannot reach the queue server at {url}: host {addr[0]!r} cannot be resolved "
            f"({exc.strerror})") from None
    try:
        socket.create_connection(addr, timeout=min(wait, 5.0)).close()
    except OSError as exc:
        if wait < QUIET_WAIT:
            return                    # over before anyone would wonder: no warning
        log.warning("ackqueue: no queue server answers at %s:%s yet (%s); waiting up to "
                    "%g s for it (wait_timeout) before raising ServerUnavailable",
                    addr[0], addr[1], exc.strerror or type(exc).__name__, wait)


def open_zeo(url):
    """(ZODB.DB over a client storage of the server at url, the url's options)."""
    addr, options = parse_zeo_url(url)
    wait = options.get("wait_timeout", 30.0)
    _probe_server(url, addr, wait)
    for attempt in range(10):
        try:
            ssl_context = _client_ssl(options)
            storage = _NotifyingClientStorage(
                addr, wait_timeout=wait, ssl=ssl_context,
                ssl_server_hostname=addr[0] if ssl_context is not None else None)
        except ClientDisconnected:
            raise ServerUnavailable(
                f"cannot reach the queue server at {url} within {wait:g} s: is it running "
                f"(ackqueue server PATH --listen {addr[0]}:{addr[1]})?") from None
        try:
            return ZODB.DB(storage, pool_size=64, cache_size=20000), options
        except ConflictError:
            # Processes that open a brand-new storage at once race to create its root.
            storage.close()
            if attempt == 9:
                raise

