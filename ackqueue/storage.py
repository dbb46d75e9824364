"""Opening the storage under a queue: in memory, a FileStorage file, or an application's DB.

A process opens each file once.  Every AckQueue on the same file (any name) shares one
Database handle: one ZODB.DB, one Committer, and one live QueueState per queue name, so two
queue objects for the same queue in one process behave as one queue.  The handle is
reference counted and closed (writing FileStorage's .index, which makes the next open fast)
when its last queue closes, or at interpreter exit.
"""
import atexit
import os
import threading

import ZODB
import zc.lockfile
from ZODB.FileStorage import FileStorage
from ZODB.FileStorage.FileStorage import FileStorageFormatError
from ZODB.MappingStorage import MappingStorage

from .commit import Committer
from .errors import NotAQueueFile, QueueLocked, StorageError

__all__ = ["Database", "open_database"]

_registry = {}                    # key -> Database
_registry_lock = threading.Lock()


class Database:
    """A ZODB database as ackqueue uses it: the DB, its committer, and live queue states."""

    def __init__(self, db, *, key, owned, exclusive, description):
        self.db = db
        self.key = key
        self.owned = owned            # we opened it, so we close it
        self.exclusive = exclusive    # no other process can write it: in-flight at open is stale
        self.description = description
        self.committer = Committer(db, description="ackqueue")
        self.states = {}              # queue name -> QueueState
        self.lock = threading.Lock()  # guards states and refs
        self.refs = 0
        self.closed = False

    def __repr__(self):
        return f"<ackqueue Database {self.description}>"

    def state(self, name, factory):
        """The live state of queue name, made by factory() on first use."""
        with self.lock:
            state = self.states.get(name)
            if state is None:
                state = self.states[name] = factory()
            return state

    def _release(self):
        with self.lock:
            self.refs -= 1
            if self.refs > 0 or self.closed:
                return
            self.closed = True
            states = list(self.states.values())
        with _registry_lock:
            if _registry.get(self.key) is self:
                del _registry[self.key]
        for state in states:
            state.stop()
        self.committer.close()
        if self.owned:
            self.db.close()


def _open_file(path):
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"cannot create queue file {path!r}: directory {directory!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"queue path {path!r} is a directory, not a queue file")
    try:
        storage = FileStorage(path, create=not os.path.exists(path))
    except zc.lockfile.LockError:
        raise QueueLocked(
            f"queue file {path!r} is already open in another process{_lock_holder(path)}. "
            "A queue file can be used by one process at a time; to share a queue between "
            f"processes, serve the file (ackqueue server {path}) and open it as "
            "AckQueue(path='zeo://HOST:PORT')") from None
    except FileStorageFormatError:
        _remove_stale_lock(path)
        raise NotAQueueFile(
            f"{path!r} is not a ZODB FileStorage file, so it cannot hold a queue "
            "(choose another path; ackqueue never overwrites a file it does not recognise)"
        ) from None
    except PermissionError as exc:
        raise PermissionError(exc.errno, f"cannot open queue file {path!r}: {exc.strerror}",
                              path) from None
    return ZODB.DB(storage, pool_size=64, cache_size=20000)


def _lock_holder(path):
    try:
        with open(path + ".lock") as f:
            pid = f.read().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid else ""


def _remove_stale_lock(path):
    # FileStorage takes its lock before it reads the header; on a foreign file it raises
    # without closing, leaving the lock held and a .lock file behind.  Lock files are
    # released when their file object is garbage collected, so removing the file is safe.
    try:
        os.remove(path + ".lock")
    except OSError:
        pass


def open_database(path=None, db=None):
    """The shared Database handle for path (a file), db (an application's ZODB.DB), or a new
    in-memory database when both are None.  The caller must call release() once."""
    if path is not None and db is not None:
        raise TypeError("pass either path= or db=, not both")
    if db is not None:
        if not isinstance(db, ZODB.DB):
            raise TypeError(f"db= must be a ZODB.DB, not {type(db).__name__}")
        key = ("db", id(db))
        # A FileStorage is locked to one process and a MappingStorage lives in it, so what
        # is in flight there at open belongs to no live holder.  Anything else (a ZEO
        # client storage) may be shared with live processes.
        exclusive = isinstance(db.storage, (FileStorage, MappingStorage))
        make = lambda: Database(db, key=key, owned=False, exclusive=exclusive,  # noqa: E731
                                description=f"db {db.database_name!r}")
    elif path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path= must be a str or os.PathLike, not {type(path).__name__}")
        path = os.fspath(path)
        if path.startswith("zeo://"):
            raise StorageError("zeo:// queues (shared through a server) are not available "
                               "in this version yet")
        path = os.path.realpath(path)
        key = ("file", path)
        make = lambda: Database(_open_file(path), key=key, owned=True,  # noqa: E731
                                exclusive=True, description=f"file {path!r}")
    else:
        handle = Database(ZODB.DB(MappingStorage()), key=None, owned=True, exclusive=True,
                          description="memory")
        handle.refs = 1
        return handle
    with _registry_lock:
        handle = _registry.get(key)
        if handle is None or handle.closed:
            handle = _registry[key] = make()
        with handle.lock:
            handle.refs += 1
    return handle


@atexit.register
def _close_all():
    """Close open files at exit, so their .index is written and the next open is fast."""
    with _registry_lock:
        handles = list(_registry.values())
    for handle in handles:
        with handle.lock:
            handle.refs = 1
        try:
            handle._release()
        except Exception:  # pragma: no cover - best effort at exit
            pass
