"""The runtime of one storage under a queue: in memory, a FileStorage file, a queue
server (zeo://HOST:PORT), or an application's DB.

A process opens each file or server once.  Every AckQueue on the same file (any name)
shares one Database handle: one ZODB.DB, one Committer, and one live state per queue name,
so two queue objects for the same queue in one process behave as one queue.  The handle is
reference counted and closed (writing FileStorage's .index, which makes the next open fast)
when its last queue closes, or at interpreter exit.

A storage this process holds alone (a file, memory) is *exclusive*: queues keep their state
in memory (ackqueue.arbiters.local).  A server's storage is *shared* with other processes:
queues read the store (ackqueue.arbiters.shared), the process holds a lease
(ackqueue.lease), and the server's invalidations wake waiting getters here (through the
client storage of ackqueue.zeo.client, which reports them and remembers what this process
wrote) and prefetch what those getters are about to read, or, in an idle producer, what its
next put will write.

The files themselves (FileStorage and its durabilities, the lock, repair) are
ackqueue.filestorage's; the ZEO client is ackqueue.zeo.client's.
"""
import atexit
import itertools
import logging
import os
import queue as _queue
import threading
from time import monotonic as _monotonic

import transaction
from zope.interface import implementer
import ZODB
from ZODB.FileStorage import FileStorage
from ZODB.MappingStorage import MappingStorage
from ZODB.POSException import ConflictError

from . import store
from .arbiters.local import LocalArbiter
from .arbiters.shared import SharedArbiter
from .commit import Committer
from .connection import QueueConnection
from .filestorage import check_durability, open_file_storage
from .lease import DEFAULT_LEASE_TIMEOUT, LeaseKeeper
from .state import QueueState
from .zeo.client import open_zeo, parse_zeo_url, prefetch
from .interfaces import IDatabase

log = logging.getLogger(__name__)

__all__ = ["Database", "open_database", "check_format"]

WARM_QUIET = 0.005  # seconds without a change before the warm prefetch runs
WARM_AFTER_PUT = 10.0   # seconds after its latest put that a process keeps its objects warm

_registry = {}                    # key -> Database
_registry_lock = threading.Lock()


@implementer(IDatabase)
class Database:
    """A ZODB database as ackqueue uses it: the DB, its committer, and live queue states."""

    proxy_class = QueueConnection     # the front's per-thread proxy

    def __init__(self, db, *, key, owned, exclusive, description,
                 lease_timeout=DEFAULT_LEASE_TIMEOUT):
        self.db = db
        self.key = key
        self.owned = owned            # we opened it, so we close it
        self.exclusive = exclusive    # no other process can write it: in-flight at open is stale
        self.description = description
        # Ours and held alone: nothing but this committer writes its queues (their
        # opening too, LocalArbiter.load), which spares it writes that only guard against
        # a concurrent writer.  An application's own db= may write them in its own
        # transactions (connection._AppTransactionBlock); another process through ZEO too.
        self.committer = Committer(db, description="ackqueue", alone=owned and exclusive)
        self.states = {}              # queue name -> QueueState
        self.lock = threading.Lock()  # guards states and refs
        self.refs = 0
        self.closed = False
        self.lease = None
        self.durability = None        # for files: "fsync" or "os"
        self._watched = {}            # oid -> shared state woken when that object changes
        self._changes = None
        self.last_put_at = None       # monotonic time of this process's latest put (shared)
        self.pack_lock = threading.Lock()   # one pack at a time (ackqueue.maintenance)
        self.autopacker = None
        self.owner = None             # a file's: serves it to other processes (shared.owner)
        self.inherited = False        # a forked child's copy: the parent's, never touched
        if not exclusive:
            try:
                self.lease = LeaseKeeper(self, lease_timeout)
            except BaseException:
                self.committer.close()
                raise
            self._changes = _queue.SimpleQueue()
            threading.Thread(target=self._dispatch_changes, daemon=True,
                             name="ackqueue-wakeups").start()

    def __repr__(self):
        return f"<ackqueue Database {self.description}>"

    @property
    def lease_id(self):
        return self.lease.lease_id

    def state(self, name, kind, clock, codec=None, allowed=None):
        """The live state of queue name, made on first use: its arbiter is this process's
        memory when it holds the storage alone, the store when processes share it.  kind
        and codec (None: the stored ones) are checked against the stored queue."""
        with self.lock:
            state = self.states.get(name)
            if state is None:
                arbiter = LocalArbiter if self.exclusive else SharedArbiter
                state = self.states[name] = QueueState(self, name, kind, clock, arbiter,
                                                       codec, allowed)
            return state

    def enable_autopack(self, threshold_bytes, *, interval=None, keep_seconds=None):
        """Pack whenever the storage grew by threshold_bytes: see
        ackqueue.maintenance.enable_autopack (idempotent, keeps the smaller threshold)."""
        from .maintenance import enable_autopack
        return enable_autopack(self, threshold_bytes, interval=interval,
                               keep_seconds=keep_seconds)

    def shared_arbiters(self):
        """The arbiters of the queues this process shares through a server (leases)."""
        with self.lock:
            return [s.arbiter for s in self.states.values() if not self.exclusive]

    # -- wake-ups from the server's invalidations ----------------------------------------

    def watch(self, oid, state):
        """Wake state's waiters whenever the object oid changes in another process."""
        self._watched[oid] = state

    def changed(self, oids, tid=None):
        """Called by the client storage's I/O thread: must not block, so just hand over."""
        if self._changes is not None:
            self._changes.put((oids, tid))

    def _dispatch_changes(self):
        """Wake the states watching what changed, and prefetch what will be read next.

        Two prefetches, so that a process's next operation finds in its client cache the
        objects another process changed instead of loading them one round trip at a time:
        - a getter here is blocked in get(): it reads the change at once, so load all of it;
        - otherwise, in a process that put lately (a producer, whose next put writes the
          same objects: the tail of the queue, the counters), the changed objects it wrote
          lately: loaded once no change has come for WARM_QUIET seconds and no commit of
          its own is under way, which an idle producer has time for and a busy one does
          not (each further change would make the load stale before its use; in 2
          producer + 2 consumer processes the producers never did it).  An idle producer's
          put after a pause no longer loads 3 objects one round trip after another
          first: (e) across processes p50 9.6-11.7 -> 8.3-8.5 ms.  Consumers are left
          out: a waiting getter's wake-up loads what it reads, and keeping everything
          each process wrote warm cost 2 producer + 4 consumer processes about a tenth
          of their items per second (6 interleaved runs each)."""
        storage = self.db.storage
        warm, warm_tid = set(), None
        while True:
            try:
                change = self._changes.get(timeout=WARM_QUIET if warm else None)
            except _queue.Empty:
                # Unless this process commits now or committed since: that commit reads or
                # wrote newer states.
                if not self.committer.busy() and (storage.last_own_tid is None
                                                  or storage.last_own_tid < warm_tid):
                    prefetch(storage, warm, warm_tid)
                warm.clear()
                continue
            if change is _STOP:
                return
            oids, tid = change
            if oids is None:                  # the client's cache was dropped: look again
                targets = set(self._watched.values())
                warm.clear()
            else:
                targets = {self._watched[o] for o in oids if o in self._watched}
                # Everything only when getters here are about to read it: prefetching every
                # change made every client load every commit, needed or not (2 producer and
                # 2 consumer processes: about 115 -> 70 items/s).
                if any(state.getters_waiting for state in targets):
                    prefetch(storage, oids, tid)
                    warm.clear()
                else:
                    keep = self.keep_warm(oids)
                    if keep:
                        warm.update(keep)
                        warm_tid = tid
            for state in targets:
                try:
                    state.store_changed()
                except Exception:  # pragma: no cover - a wake-up must not kill the thread
                    log.exception("ackqueue: wake-up failed")

    def keep_warm(self, oids):
        """Of oids, changed by another process, those this process keeps warm (prefetches
        once changes stop): in a process that put in the last WARM_AFTER_PUT seconds, the
        ones it wrote lately (see _dispatch_changes)."""
        if self.last_put_at is None or _monotonic() - self.last_put_at >= WARM_AFTER_PUT:
            return []
        return self.db.storage.written_lately(oids)

    def release(self):
        """Give back one reference (open_database's caller calls it once); the last one
        closes the handle: its queues' states, the lease, the committer and, if this
        handle opened it, the DB (which writes a file's .index)."""
        if self.inherited:              # the parent's storage: closing it is the parent's
            return
        with self.lock:
            self.refs -= 1
            owner = self.owner
            # Only the owner's service still uses the file: stop it, and its own releases
            # close the handle.
            serving_only = (owner is not None and not owner.stopping
                            and 0 < self.refs <= owner.references())
            if not serving_only:
                if self.refs > 0 or self.closed:
                    return
                self.closed = True
                states = list(self.states.values())
        if serving_only:
            owner.stop()
            return
        with _registry_lock:
            if _registry.get(self.key) is self:
                del _registry[self.key]
        if owner is not None:
            owner.stop()                # no client is served past this point
        if self.autopacker is not None:
            self.autopacker.stop()      # finishes a pack in progress
        with self.pack_lock:            # and waits for a manual one (pack() checks closed)
            pass
        for state in states:
            state.stop()
        if self.lease is not None:
            self.lease.close()
            self._changes.put(_STOP)
        self.committer.close()
        if self.owned:
            self.db.close()


_STOP = object()


def _open_file(path, durability="fsync", repair=False):
    storage = open_file_storage(path, durability, repair)
    try:
        return ZODB.DB(storage, pool_size=64, cache_size=20000)
    except BaseException:
        storage.close()
        raise


def open_database(path=None, db=None, durability=None, repair=False, *, share=None):
    """The shared Database handle for path (a file), db (an application's ZODB.DB), or a new
    in-memory database when both are None.  The caller must call release() once.
    durability ("fsync", the default, or "os") applies to files this opens.  share: None,
    or what serves a file this opens to the other processes that open it (the front's
    opener, queue.FileServing; see ackqueue.shared.owner): an application's queue file is
    shared so, while a server (ackqueue serve, ackqueue server) shares it its own way."""
    if path is not None and db is not None:
        raise TypeError("pass either path= or db=, not both")
    if durability is not None:
        check_durability(durability)
        if durability != "fsync" and (path is None or os.fspath(path).startswith("zeo://")):
            raise ValueError("durability= applies to a queue file (path=); a server's "
                             "durability is set where it runs (ackqueue server "
                             "--durability), an application database's by its storage")
    if repair and (path is None or os.fspath(path).startswith("zeo://")):
        raise ValueError("repair=True applies to a queue file (path=)")
    if db is not None:
        return _app_database(db)
    if path is None:
        return _memory_database()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path= must be a str or os.PathLike, not {type(path).__name__}")
    path = os.fspath(path)
    if path.startswith("zeo://"):
        return _server_database(path)
    return _file_database(os.path.realpath(path), durability, repair, share)


def _app_database(db):
    if not isinstance(db, ZODB.DB):
        raise TypeError(f"db= must be a ZODB.DB, not {type(db).__name__}")
    key = ("db", id(db))
    # q.db of a queue file this process opened: the same handle (one committer, closed
    # with its last queue, in any order), not a second one over the same DB.
    with _registry_lock:
        for handle in _registry.values():
            if handle.db is db:
                with handle.lock:
                    if not handle.closed:
                        handle.refs += 1
                        return handle
    # A FileStorage is locked to one process and a MappingStorage lives in it, so what is
    # in flight there at open belongs to no live holder.  Anything else (a ZEO client
    # storage) may be shared with live processes.
    exclusive = isinstance(db.storage, (FileStorage, MappingStorage))

    def make():
        check_format(db)
        return Database(db, key=key, owned=False, exclusive=exclusive,
                        description=f"db {db.database_name!r}")
    return _shared_handle(key, make)


def _memory_database():
    # Registered under its DB, so that AckQueue(db=q.db, name=...) opens another queue of
    # the same in-memory storage (its dead-letter queue, say) through this handle.
    memory_db = ZODB.DB(MappingStorage())
    key = ("db", id(memory_db))
    return _shared_handle(key, lambda: Database(memory_db, key=key, owned=True,
                                                exclusive=True, description="memory"))


def _server_database(url):
    addr, _ = parse_zeo_url(url)
    key = ("zeo", addr)

    def make():
        db, options = open_zeo(url)
        try:
            check_format(db, f"the storage of server {url}")
            handle = Database(db, key=key, owned=True, exclusive=False,
                              description=f"server {url}",
                              lease_timeout=options.get("lease_timeout",
                                                        DEFAULT_LEASE_TIMEOUT))
        except BaseException:
            db.close()
            raise
        db.storage.ackqueue_database = handle
        return handle
    return _shared_handle(key, make)


def _file_database(path, durability, repair=False, share=None):
    key = ("file", path)

    def make():
        db = _open_file(path, durability or "fsync", repair)
        try:
            check_format(db, f"queue file {path!r}")
        except BaseException:
            db.close()
            raise
        handle = Database(db, key=key, owned=True, exclusive=True,
                          description=f"file {path!r}")
        handle.durability = durability or "fsync"
        if share is not None:
            _serve_others(handle, path, share)
        return handle
    handle = _shared_handle(key, make)
    if durability is not None and handle.durability != durability:
        handle.release()
        raise ValueError(f"queue file {path!r} is already open in this process with "
                         f"durability={handle.durability!r}")
    return handle


def _serve_others(handle, path, serving):
    """Let the other processes that open path reach its queues through this process (see
    ackqueue.shared.owner), where this platform can."""
    from .shared import files
    from .shared.owner import Owner
    if not files.available():
        return
    try:
        handle.owner = Owner(handle, path, serving)
    except OSError as exc:            # a socket cannot be made there: the file stays ours
        log.warning("ackqueue: queue file %r cannot be shared with other processes (its "
                    "socket %r: %s); they get QueueLocked", path, files.socket_path(path),
                    exc.strerror or exc)


def check_format(db, where=None):
    """Refuse a storage written in a newer store format (UnsupportedFormat; nothing is
    written), and migrate one of an older format, before anything else uses it: see
    ackqueue.store.open_catalog.  Reads the catalog, and writes only to migrate."""
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    try:
        for attempt in itertools.count():
            try:
                with tm:
                    store.open_catalog(conn.root(), where)
                return
            except ConflictError:       # another process migrated it meanwhile
                if attempt >= 10:
                    raise
    finally:
        conn.close()


def _shared_handle(key, make):
    with _registry_lock:
        handle = _registry.get(key)
        if handle is None or handle.closed:
            handle = _registry[key] = make()
        with handle.lock:
            handle.refs += 1
    return handle


def _forked():
    """In a forked child: every handle open in the parent is the parent's.  The child
    must never write through the parent's file handles, nor close them (closing writes a
    file's .index), and their committer threads did not survive the fork: the child's
    queues reopen their files as clients of the parent (AckQueue._after_fork), and the
    child's own opens make new handles."""
    global _registry_lock
    _registry_lock = threading.Lock()   # another thread of the parent may have held it
    for handle in _registry.values():
        handle.inherited = True
        handle.lock = threading.Lock()
    _registry.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@atexit.register
def _close_all():
    """Close open files at exit, so their .index is written and the next open is fast."""
    with _registry_lock:
        handles = list(_registry.values())
    for handle in handles:
        with handle.lock:
            handle.refs = 1
        try:
            handle.release()
        except Exception:  # pragma: no cover - best effort at exit
            pass
