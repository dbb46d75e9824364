"""Giving back the space of acknowledged messages: packing, by hand or automatically.

Why the file grows: every commit appends new revisions of the small persistent objects it
changed (ackqueue.store: a put or an ack rewrites a segment of 64 neighbouring messages and a
few counters) and leaves the old revisions in place.  Acknowledged messages and emptied
segments stay in the file too, unreferenced.  Nothing of that is ever read again; a ZODB
*pack* removes it.

Contract:

- ``pack(database, keep_seconds=0.0)`` packs the storage under a queue (an
  ackqueue.database.Database): it drops every revision that was no longer current
  keep_seconds ago and every object nothing reaches any more.  What is queued, in flight or
  delayed is untouched, in order.  It runs while other threads (and, through a server,
  other processes) keep putting, getting and acknowledging: FileStorage copies the live
  data to ``FILE.pack`` beside the file without stopping writers, then briefly holds
  commits while it copies what they wrote meanwhile and swaps the files.  It packs the
  whole storage: with AckQueue(db=...) that is the application's database too.
- Through a server (zeo://) the server packs its file.  In memory (MappingStorage) the
  old revisions are dropped from memory.
- Failure (a full disk, an I/O error, a lost server) raises ackqueue.errors.StorageError
  (ServerUnavailable for a lost server); the file is left as it was, no ``.pack`` file is
  left behind, and the queue stays usable.
- Free disk: the packed copy is written beside the file before it replaces it, so a pack
  needs free space about the size of the live data (what the file holds after the pack;
  never more than the file's current size).  Queue files are opened without keeping the
  pre-pack ``.old`` copy (ackqueue.filestorage.open_file_storage), so nothing more is needed
  and the space is given back as soon as the pack ends.
- keep_seconds=0 also drops revisions that a reader whose snapshot began just before the
  pack may still load: ZODB then raises ReadConflictError ("object deleted, likely by
  simultaneous pack"), and a server's conflict resolution, which reads the revision a
  writer started from, gives up (the writer gets a ConflictError).  ackqueue's reads
  (gets, sizes, peek, the reaper, the lease heartbeat, the sweep) read again from a
  fresh snapshot (ackqueue.pack_rereads), the committer retries conflicts, and ``ackqueue
  server`` logs such a conflict resolution in one INFO line instead of ZODB's traceback:
  nothing fails and nothing is logged as an error.  browse() keeps one snapshot for its
  whole iteration and can still meet it.  Snapshots in ackqueue live for milliseconds,
  so keep_seconds of a few seconds avoids all of it at the cost of keeping those seconds
  of traffic; the automatic policy keeps AUTOPACK_KEEP_SECONDS.
- ``AutoPacker`` (``Database.enable_autopack(threshold)``) packs whenever the storage has
  grown by threshold bytes since the last pack (or since it started), checking every few
  seconds; it stops, finishing a pack in progress, when the Database is closed.
"""
import collections
import dataclasses
import logging
import os
import shutil
import threading
import time
from typing import Optional

from ZEO.Exceptions import ClientDisconnected
from ZODB.FileStorage import FileStorage
from ZODB.MappingStorage import MappingStorage
from ZODB.serialize import referencesf

from .errors import ServerUnavailable, StorageError

__all__ = ["PackReport", "pack", "AutoPacker", "enable_autopack", "autopack_threshold",
           "check_keep_seconds",
           "DEFAULT_AUTOPACK_BYTES", "DEFAULT_CHECK_INTERVAL", "AUTOPACK_KEEP_SECONDS"]

log = logging.getLogger(__name__)

# autopack=True packs after every 256 MB of growth.  A pack reads the whole file and writes
# the live data, so packing after G bytes of growth costs about one extra read of G (plus a
# copy of the backlog) per G the queue wrote: a small constant factor on the queue's own
# I/O, however busy it is.  Measured here: a put+get+ack of a small message costs about
# 1.2 KB of file (2.2 KB for a 1 KB message), so 256 MB is 100,000-200,000 messages
# between packs, and packing a 256 MB file holding a 10,000-message backlog took 2.7 s.
# The file stays within 256 MB of its live size, and a pack needs free disk only for the
# live data.  Lower it for small disks; raise it for very busy queues with a big backlog.
DEFAULT_AUTOPACK_BYTES = 256 * 1024 * 1024
DEFAULT_CHECK_INTERVAL = 5.0    # seconds between size checks (the storage's own count: cheap)
# An automatic pack keeps the last minute of revisions: a reader or a server-side conflict
# resolution never misses a revision it started from (see above), even with clocks between
# a client and its server a little apart; a minute of traffic is little next to the
# threshold.
AUTOPACK_KEEP_SECONDS = 60.0
MEASURE_SHARE = 0.01            # a costly size measure (memory) takes at most 1% of the time
RETRY_AFTER = 600.0             # seconds before a failed automatic pack is tried again


@dataclasses.dataclass(frozen=True)
class PackReport:
    """What one pack did.  Sizes are bytes of the data file (None in memory, or through a
    server that did not report them); seconds is the pack's measured duration."""

    size_before: Optional[int]
    size_after: Optional[int]
    seconds: float
    storage: str

    @property
    def freed(self):
        """Bytes given back (None when a size is unknown)."""
        if self.size_before is None or self.size_after is None:
            return None
        return self.size_before - self.size_after


def pack(database, *, keep_seconds=0.0):
    """Pack the storage under a queue; see the module docstring.  Returns a PackReport."""
    through_service = getattr(database, "pack_through_service", None)
    if through_service is not None:     # a queue of ackqueue serve: the service packs
        return through_service(check_keep_seconds(keep_seconds))
    report = _pack(database, check_keep_seconds(keep_seconds))
    log.info("ackqueue: packed %s: %s -> %s bytes in %.2f s", report.storage,
             _fmt(report.size_before), _fmt(report.size_after), report.seconds)
    return report


def check_keep_seconds(keep_seconds):
    if isinstance(keep_seconds, bool) or not isinstance(keep_seconds, (int, float)):
        raise TypeError(f"keep_seconds must be a number, not {type(keep_seconds).__name__}")
    if not keep_seconds >= 0:          # also refuses NaN
        raise ValueError(f"keep_seconds must be >= 0, not {keep_seconds!r}")
    return keep_seconds


def _pack(database, keep_seconds):
    with database.pack_lock:           # one pack at a time per Database (see ackqueue.database)
        if database.closed:
            raise StorageError(f"cannot pack {database.description}: it is closed")
        storage = database.db.storage
        before = _file_size(storage)
        start = time.monotonic()
        try:
            _pack_storage(storage, time.time() - keep_seconds)
        except ClientDisconnected as exc:
            raise ServerUnavailable(
                f"cannot pack {database.description}: the server is unreachable ({exc}); "
                "nothing was changed") from exc
        except Exception as exc:
            _remove_pack_leftover(storage)
            raise StorageError(
                f"packing {database.description} failed ({type(exc).__name__}: {exc}); the "
                f"queue was left as it was and is still usable.{_disk_hint(storage, before)}"
            ) from exc
        return PackReport(before, _file_size(storage), time.monotonic() - start,
                          database.description)


def _pack_storage(storage, t):
    try:
        # Called on the storage rather than through ZODB.DB.pack, which would log the
        # failure's traceback on top of the error raised here.
        storage.pack(t, referencesf)
    except ValueError as exc:
        # MappingStorage refuses to pack to an earlier time than its last pack, where
        # FileStorage quietly does nothing ("redundant pack"): do nothing here too.
        if not (isinstance(storage, MappingStorage) and "Already packed" in str(exc)):
            raise


def _file_size(storage):
    """Bytes of data in the file: a FileStorage's (where its last commit ends: a synced
    queue file keeps zeros written past it, filestorage.SyncedFileStorage), the server's (as
    it last reported), or None (memory, or another kind of storage)."""
    if isinstance(storage, FileStorage):
        return storage.getSize()
    if isinstance(storage, MappingStorage):
        return None
    size = getattr(storage, "getSize", None)
    if size is None or not hasattr(storage, "is_connected"):     # not a ZEO ClientStorage
        return None
    try:
        return int(size())
    except Exception:
        return None


def _growth_size(storage):
    """A size to watch for growth: the data file's, or an estimate (memory, others)."""
    size = _file_size(storage)
    if size is None:
        try:
            size = int(storage.getSize())  # MappingStorage: walks the records (see MEASURE_SHARE)
        except Exception:
            return None
    return size


def _remove_pack_leftover(storage):
    # FileStorage removes its FILE.pack when a write fails (OSError), but not on every
    # error.  Remove it unless another pack of this storage (the application's own, with
    # AckQueue(db=...)) is still writing it.
    if isinstance(storage, FileStorage) and not storage._pack_is_in_progress:
        try:
            os.remove(storage._file_name + ".pack")
        except OSError:
            pass


def _disk_hint(storage, size):
    if not isinstance(storage, FileStorage):
        return ""
    try:
        free = shutil.disk_usage(os.path.dirname(storage._file_name) or ".").free
    except OSError:
        return ""
    return (f" Packing writes a packed copy beside the file and needs free disk about the "
            f"size of the live data (at most the file's {_fmt(size)} bytes); "
            f"{_fmt(free)} bytes are free.")


def _fmt(n):
    return "?" if n is None else f"{n:,}"


def autopack_threshold(value):
    """Check AckQueue's autopack= option: None/False -> None (off), True ->
    DEFAULT_AUTOPACK_BYTES, a positive int -> that many bytes of growth between packs."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_AUTOPACK_BYTES
    if not isinstance(value, int):
        raise TypeError(f"autopack must be None, a bool or an int number of bytes of growth "
                        f"between packs, not {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"autopack must be a positive number of bytes, not {value}")
    return value


def enable_autopack(database, threshold, *, interval=None, keep_seconds=None):
    """Start database's AutoPacker (Database.enable_autopack) and return it.  threshold is
    an autopack= value other than None/False; interval and keep_seconds default to
    DEFAULT_CHECK_INTERVAL and AUTOPACK_KEEP_SECONDS.  Idempotent: when the packer runs
    already, it keeps the smaller threshold (and interval, keep_seconds if given)."""
    threshold = autopack_threshold(threshold)
    if threshold is None:
        raise ValueError("enable_autopack needs a positive number of bytes (or True)")
    if interval is not None:
        interval = _check_interval(interval)
    if keep_seconds is not None:
        keep_seconds = check_keep_seconds(keep_seconds)
    with database.lock:     # against a concurrent close (Database.release stops the packer)
        if database.closed:
            raise StorageError(f"cannot enable autopack: {database.description} is closed")
        packer = database.autopacker
        if packer is None:
            packer = database.autopacker = AutoPacker(
                database, threshold, interval=interval or DEFAULT_CHECK_INTERVAL,
                keep_seconds=AUTOPACK_KEEP_SECONDS if keep_seconds is None else keep_seconds,
            ).start()
        else:
            packer.threshold = min(packer.threshold, threshold)
            if interval is not None:
                packer.interval = min(packer.interval, interval)
            if keep_seconds is not None:
                packer.keep_seconds = min(packer.keep_seconds, keep_seconds)
        return packer


def _check_interval(interval):
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, not {type(interval).__name__}")
    if not interval > 0:
        raise ValueError(f"interval must be positive, not {interval!r}")
    return interval


class AutoPacker:
    """A daemon thread that packs database whenever its storage has grown by at least
    threshold bytes since the last pack (or since the thread started).  Made and stopped by
    Database.enable_autopack() and Database's close; ``reports`` holds the latest PackReports."""

    def __init__(self, database, threshold, *, interval=DEFAULT_CHECK_INTERVAL,
                 keep_seconds=AUTOPACK_KEEP_SECONDS):
        self.database = database
        self.threshold = autopack_threshold(threshold)
        if self.threshold is None:
            raise ValueError("an AutoPacker needs a threshold")
        self.interval = _check_interval(interval)
        self.keep_seconds = check_keep_seconds(keep_seconds)
        self.reports = collections.deque(maxlen=32)     # the latest PackReports, oldest first
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ackqueue-autopack {database.description}")

    def start(self):
        self._thread.start()
        return self

    @property
    def alive(self):
        return self._thread.is_alive()

    def stop(self):
        """Stop checking; a pack in progress is finished first."""
        self._stop.set()
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self):
        storage = self.database.db.storage
        base = _growth_size(storage)        # the size the growth is counted from
        retry_at = 0.0
        wait = self.interval
        while not self._stop.wait(wait):
            began = time.monotonic()
            size = _growth_size(storage)
            # A costly measure (MappingStorage.getSize walks every record) is taken
            # rarely enough to cost at most MEASURE_SHARE of the time.
            wait = max(self.interval, (time.monotonic() - began) / MEASURE_SHARE)
            if base is None:
                base = size
            if size is None or size - base < self.threshold or time.monotonic() < retry_at:
                continue
            try:
                report = _pack(self.database, self.keep_seconds)
            except Exception as exc:
                if self.database.closed:
                    return
                self.failures += 1
                retry_at = time.monotonic() + RETRY_AFTER
                log.warning("ackqueue: automatic pack failed, trying again in %g s: %s",
                            RETRY_AFTER, exc, exc_info=not isinstance(exc, StorageError))
                continue
            log.info("ackqueue: automatic pack of %s (grew %s bytes, threshold %s): "
                     "%s -> %s bytes in %.2f s", report.storage, _fmt(size - base),
                     _fmt(self.threshold), _fmt(report.size_before), _fmt(report.size_after),
                     report.seconds)
            self.reports.append(report)     # after the log: who sees the report sees the log
            base = _growth_size(storage)
