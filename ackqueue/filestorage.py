"""The queue file under a queue: FileStorage subclasses (the commit's scratch in memory,
known tids, the watched file, the two durabilities "fsync" and "os"), their pools, the
file's lock and the holder note a refused process reads, repair, and the stale-index note.

open_file_storage opens a file with clear errors (ackqueue.database opens it as a
Database; ackqueue.zeo.server serves it).  A torn tail is cut first (ackqueue.torn_tail).
"""
import contextlib
import io
import logging
import os
import stat
import time

import zc.lockfile
from ZODB.FileStorage import FileStorage
from ZODB.FileStorage.FileStorage import (FilePool, FileStorageFormatError,
                                          FileStorageQuotaError, TempFormatter)
from ZODB.FileStorage.format import DataHeader, TxnHeader
from ZODB.POSException import ReadOnlyError, StorageTransactionError
from ZODB.utils import as_bytes, p64

from .errors import NotAQueueFile, QueueFileGone, QueueLocked, StorageError
from .torn_tail import check_tail

log = logging.getLogger(__name__)

__all__ = ["open_file_storage", "check_durability", "DURABILITIES", "repair", "lock_holder",
           "note_holder", "SyncedFileStorage", "OSDurableFileStorage"]

SCRATCH_KEPT = 1 << 20  # bytes of a commit's in-memory scratch kept for the next commit
AHEAD = 1 << 20         # bytes of zeros a synced queue file keeps written past its end
KNOWN_TIDS = 4096       # objects whose last record's tid a queue file's storage keeps
SETTLE_NS = 100_000_000     # a directory unchanged this long shows any later change
COARSE_SETTLE_NS = 2_100_000_000    # the same where times are whole seconds (FAT: 2 s)
# Where ``ackqueue serve FILE`` listens by default: the way to share a file between
# processes that a process refused the file is told of (ackqueue.service's DEFAULT_PORT).
SHARING_URL = "http://127.0.0.1:8080"


DURABILITIES = ("fsync", "os")
_PWRITE = hasattr(os, "pwrite")     # Windows has none: FileStorage's own writes there


def _pwrite_all(fd, data, pos):
    """Write all of data at pos in file descriptor fd (a pwrite may write less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        view, pos = view[written:], pos + written


class _Pool(FilePool):
    """FileStorage's pool of read-only file objects, with its write_lock (taken by every
    commit's finish) a plain context manager instead of a generator-based one: the same
    steps for 1.1 us instead of 1.9 here (benchmarks: a commit is 250-450 us)."""

    def __init__(self, file_name):
        super().__init__(file_name)
        self._writing = _PoolWriteLock(self)

    def write_lock(self):
        return self._writing


class _PoolWriteLock:
    """FilePool.write_lock's steps, as __enter__ and __exit__ (one per pool: the pool
    holds the state)."""

    __slots__ = ("pool",)

    def __init__(self, pool):
        self.pool = pool

    def __enter__(self):
        pool = self.pool
        with pool._cond:
            pool.writers += 1
            while pool.writing or pool._out:
                pool._cond.wait()
            if pool.closed:
                raise ValueError("closed")
            pool.writing = True

    def __exit__(self, *exc_info):
        pool = self.pool
        with pool._cond:
            pool.writing = False
            if pool.writers > 0:
                pool.writers -= 1
            pool._cond.notify_all()


class MemoryScratchFileStorage(FileStorage):
    """A FileStorage that gathers each commit's records in memory, not in FILE.tmp.

    FileStorage writes what a transaction stores to its FILE.tmp, and at the vote seeks
    that file, reads it back and copies it into the storage file: three or four system
    calls per commit that the commit does not need.  Each one releases the GIL, and a
    commit runs under the storage's lock, so threads woken by the previous commit take the
    GIL at those calls and run their Python inside this commit instead of beside its fsync:
    with 4 putting and 4 getting threads (benchmarks, scenario (c)) ackqueue moved 0.77x
    the lean ZODB queue's items/s with FILE.tmp and 0.90x without it, in one interleaved
    run.  The bytes written to the storage file are the same.  FILE.tmp is scratch that
    FileStorage empties when it opens and never reads after a crash, so durability is
    unchanged; the file is still made (FileStorage opens it) and stays empty.

    A commit's records are then held in memory until it ends, beside the pickles they are
    made of.  A buffer grown past SCRATCH_KEPT by a large commit is dropped after it rather
    than kept for the next one.

    The vote then writes the transaction (its header, those records, its length) with one
    pwrite, and the finish its status byte with another, on the storage file opened
    without Python's buffer: FileStorage's seeks, writes and flushes through a buffered
    file made four more system calls per commit (a seek before each of its two writes,
    and an lseek after each flush).  Where nothing can refuse the write (_defers: into
    space written ahead on a file system that writes in place, SyncedFileStorage) the
    vote only makes the transaction, with its final status, and the finish writes it
    whole with one pwrite: a system call less per commit.  A crash between the two
    leaves nothing of it in the file, where FileStorage left a transaction marked in
    progress that the next open cut off; one between the write and the sync leaves what
    a crash there always left, the transaction written and perhaps not synced (the open
    cuts a torn tail, ackqueue.torn_tail).
    Unbuffered, nothing can hold bytes of the file that a later commit writes; the reads
    FileStorage makes through this file (a header now and then, undo, loadSerial) each
    make a system call or two, as they did after every commit's seek.  The file is
    reopened so once it is open (the scan of a tail without .index reads it buffered),
    and again when a pack installs the packed file."""

    _unbuffered = False         # the storage file was reopened without a buffer
    _voted = None               # the voted transaction its finish writes (see _defers)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        unused, self._files = self._files, self._pool_class(self._file_name)
        unused.close()
        if self._tfile is not None:         # None when opened read-only
            self._tfile.close()
            self._new_scratch()
            self._unbuffer()

    _pool_class = _Pool

    def _defers(self, size):
        """Whether a voted transaction of size bytes may be written by the finish alone:
        only if no write of it can fail for want of space (so a full disk still refuses
        a commit at its vote, which aborts it cleanly)."""
        return False

    def _unbuffer(self):
        if _PWRITE:
            buffered, self._file = self._file, open(self._file_name, "r+b", buffering=0)
            buffered.close()
            self._unbuffered = True

    def _initIndex(self, index, tindex):
        super()._initIndex(index, tindex)
        if self._unbuffered and not isinstance(self._file, io.FileIO):
            self._unbuffer()        # a pack opened the packed file (its locks held)

    def tpc_vote(self, transaction):
        # FileStorage.tpc_vote, the transaction written with one pwrite.
        if not self._unbuffered:
            return super().tpc_vote(transaction)
        with self._lock:
            if transaction is not self._transaction:
                raise StorageTransactionError("tpc_vote called with wrong transaction")
            dlen = self._tfile.tell()
            user, descr, ext = self._ude
            tl = self._thl + dlen
            defer = self._defers(tl + 8)
            h = TxnHeader(self._tid, tl, self._tstatus if defer else "c",
                          len(user), len(descr), len(ext))
            h.user = user
            h.descr = descr
            h.ext = ext
            scratch = self._tfile.getbuffer()
            try:
                data = b"".join((h.asString(), scratch[:dlen], p64(tl)))
            finally:
                scratch.release()     # the scratch can grow again once it is let go
            if defer:
                self._voted = data
            else:
                try:
                    _pwrite_all(self._file.fileno(), data, self._pos)
                except BaseException:
                    # As FileStorage: a disk full, say; nothing of it is left in the file.
                    self._file.truncate(self._pos)
                    self._files.flush()
                    raise
            self._nextpos = self._pos + (tl + 8)
            return self._resolved

    def _finish(self, tid, u, d, e):
        # FileStorage._finish, the status byte written with one pwrite.
        if not self._unbuffered:
            return super()._finish(tid, u, d, e)
        voted, self._voted = self._voted, None
        if voted is None:
            _pwrite_all(self._file.fileno(), as_bytes(self._tstatus), self._pos + 16)
        try:
            if voted is not None:       # the whole transaction, its status final
                _pwrite_all(self._file.fileno(), voted, self._pos)
            self._finish_finish(tid)
        except BaseException:
            log.critical("ackqueue: a commit of %r failed after its vote; the storage is "
                         "closed", self._file_name, exc_info=True)
            self.close()
            raise

    def _new_scratch(self):
        self._tfile = io.BytesIO()
        self._tfmt = TempFormatter(self._tfile)

    def _abort(self):
        if self._voted is not None:     # voted, and nothing of it written: nothing to cut
            self._voted = None
            self._nextpos = 0
            self._blob_tpc_abort()
        super()._abort()

    def _clear_temp(self):
        # Called at tpc_begin, tpc_finish and tpc_abort, under the storage's locks; after a
        # commit the scratch's position is the size of what it held.
        self._voted = None
        if self._tfile is not None and self._tfile.tell() > SCRATCH_KEPT:
            self._new_scratch()
        super()._clear_temp()


class KnownTidsFileStorage(MemoryScratchFileStorage):
    """A FileStorage whose commits do not read back what they wrote themselves.

    FileStorage.store checks each object against the transaction id of its last record,
    which it reads from the file: a seek and a 4 KiB buffered read per object stored, and
    a seek back before the commit writes (strace: 3 of a one-object commit's 11 system
    calls).  The queue writes the same few records over and over (its Counters, the
    segments at the ends of its indexes), and the last record of each was written by
    this storage: it keeps, for each object it committed, the position and transaction id
    of that record, and store() takes the id from there when the index still points at
    that position.  Records at a position never change while the file is open, so that
    is the id the file holds; a pack gives positions to other records, and the index it
    installs empties the table (_initIndex).  Everything else (a record restored,
    undone, written by an older version, or one among more than KNOWN_TIDS objects)
    is read from the file as before.  It cost 59.5 against 55.3 us of CPU per one-object
    commit here, 182 against 166 for nine objects (the sync left out).

    It also ends each commit as FileStorage does, with the sync a subclass chooses
    (_sync): fsync here, fdatasync (SyncedFileStorage), none ("os")."""

    _known_tids = None          # {oid: (position, tid)} of records this storage committed

    def _initIndex(self, index, tindex):
        # At open, and when a pack installs the packed file's index (under its locks).
        super()._initIndex(index, tindex)
        self._known_tids = {}

    def store(self, oid, oldserial, data, version, transaction):
        # FileStorage.store, with the transaction id of an object's last record taken
        # from _known_tids when that record is one this storage committed.
        if self._is_read_only:
            raise ReadOnlyError()
        if transaction is not self._transaction:
            raise StorageTransactionError(self, transaction)
        assert not version

        with self._lock:
            if oid > self._oid:
                self.set_max_oid(oid)
            old = self._index_get(oid, 0)
            if old:
                known = self._known_tids.get(oid)
                if known is not None and known[0] == old:
                    committed_tid = known[1]
                else:
                    committed_tid = self._read_data_header(old, oid).tid
                if oldserial != committed_tid:
                    data = self.tryToResolveConflict(oid, committed_tid, oldserial, data)
                    self._resolved.append(oid)

            pos = self._pos
            here = pos + self._tfile.tell() + self._thl
            self._tindex[oid] = here
            new = DataHeader(oid, self._tid, old, pos, 0, len(data))

            self._tfile.write(new.asString())
            self._tfile.write(data)

            if self._quota is not None and here > self._quota:
                raise FileStorageQuotaError("The storage quota has been exceeded.")

    def _finish_finish(self, tid):
        # FileStorage._finish_finish (the method exists to be replaced) with the sync its
        # subclasses choose, then the records' ids kept: every record of a transaction
        # carries its id, whatever wrote it (store, restore, undo).
        self._file.flush()
        self._sync()
        self._pos = self._nextpos
        self._index.update(self._tindex)
        self._ltid = tid
        self._blob_tpc_finish()
        known, written = self._known_tids, self._tindex
        if len(known) + len(written) > KNOWN_TIDS:
            known.clear()           # the hot few come back with their next commit
            if len(written) > KNOWN_TIDS:
                return
        for oid, pos in written.items():
            known[oid] = (pos, tid)

    def _sync(self):
        os.fsync(self._file.fileno())


class WatchedFileStorage(KnownTidsFileStorage):
    """A FileStorage that refuses to commit once its file was deleted or replaced by
    another file while open (QueueFileGone).  Before, puts and acks went on succeeding
    into the open, unlinked file, and everything was gone at the next open.  The check
    runs in tpc_begin under the commit lock (so never during a pack's swap of the file),
    for every writer: the committer, an application's connection, a server's clients.

    The check compares the file at its path with the open one by device and inode (read
    once per file object: a pack replaces it).  It stats the path only when the file's
    directory changed since the last time it did (its device, inode, mtime or ctime);
    deleting, renaming or replacing the file changes them all.  At every other commit it
    stats the directory alone, because a stat of the file itself made the commit's sync
    dearer: on this machine's Linux (6.18, ext4; since 6.13 a file whose times were read
    gets fine-grained times at its next write) the fdatasync of a 1.5 KB commit took
    106-121 us with nothing between commits, 156-185 with a stat of the file (154-161
    with an fstat), 100-114 with a stat of its directory (benchmarks/stat_sync.py,
    benchmarks/results/statsync-2026-11-27/).  A
    directory stamp is trusted only once it is SETTLE_NS old (COARSE_SETTLE_NS where its
    times are whole seconds): a change in the same tick of a coarse clock could leave it
    as it was, and one made later than that cannot."""

    _opened = (None, None)      # (the open file object, its (st_dev, st_ino))
    _dir_seen = None            # the directory's stamp when the file was last found there
    _time_ns = staticmethod(time.time_ns)   # the wall clock directory times are set by

    def _file_gone(self):
        """What happened to the file (a phrase), or None when it is still the open one."""
        opened_file, opened = self._opened
        if opened_file is not self._file:
            # The open file's identity is read once per file object (a pack replaces the
            # file object), not at every commit.
            try:
                stat = os.fstat(self._file.fileno())
            except (OSError, AttributeError, ValueError):
                return None             # closed: FileStorage says so itself
            opened = (stat.st_dev, stat.st_ino)
            self._opened = (self._file, opened)
            self._dir_seen = None
            self._dir_name = os.path.dirname(self._file_name)
        try:
            folder = os.stat(self._dir_name)
            stamp = (folder.st_dev, folder.st_ino, folder.st_mtime_ns, folder.st_ctime_ns)
        except OSError:
            stamp = None                # the directory went too: the file's stat says so
        if stamp is not None and stamp == self._dir_seen:
            return None
        try:
            now = os.stat(self._file_name)
        except FileNotFoundError:
            return "was deleted"
        except OSError:
            return None
        if (now.st_dev, now.st_ino) != opened:
            return "was replaced by another file"
        if stamp is not None and self._settled(stamp):
            self._dir_seen = stamp
        return None

    def _settled(self, stamp):
        """Whether a change made after this directory stamp must show in the next one:
        it is older than the file system's time granularity, with a margin.  Times in
        whole seconds mean a coarse file system (ext3, HFS+, FAT's 2 s, some NFS
        servers), where a change in the same second as the stamp would leave it as it
        was."""
        times = stamp[2:]
        coarse = any(t % 1_000_000_000 == 0 for t in times)
        return self._time_ns() - max(times) >= (COARSE_SETTLE_NS if coarse else SETTLE_NS)

    def tpc_begin(self, transaction, tid=None, status=" "):
        super().tpc_begin(transaction, tid, status)
        what = self._file_gone()
        if what is not None:
            self.tpc_abort(transaction)
            raise QueueFileGone(
                f"queue file {self._file_name!r} {what} while this process had it open: "
                "nothing more is written (this commit was refused, and every later one "
                "will be); what was committed before is only in the open file, and is "
                "lost when it closes unless the file is put back")

    def _save_index(self):
        if self._file_gone() is None:   # never write an index beside a file not ours
            super()._save_index()

_fdatasync = getattr(os, "fdatasync", os.fsync)    # macOS has no fdatasync


class _FreshReadPool(_Pool):
    """FileStorage's pool of read-only file objects, each lent with its read buffer emptied
    (a seek to the end does that).  FileStorage counts on a read past the end of its data
    coming back short, which a buffered reader never keeps; over zeros written ahead
    (SyncedFileStorage) it would come back whole, and a later load in the same buffered
    block would read those zeros where a commit has since written.  Commits cannot finish
    while a file is lent (FilePool.write_lock), so one emptying per loan is enough."""

    @contextlib.contextmanager
    def get(self):
        with super().get() as f:
            f.seek(0, 2)
            yield f


class SyncedFileStorage(WatchedFileStorage):
    """durability="fsync": every commit synced before it counts, into space written ahead.

    FileStorage appends each commit and fsyncs it; a sync that also grows the file must
    commit the file system's journal for the new size.  This storage keeps AHEAD bytes of
    zeros written past the end of its last commit (topped up, and synced, when less than a
    quarter is left), so a commit overwrites them and fdatasync writes the data alone, as
    a database's write-ahead log reuses space it wrote before.  Durability does not depend
    on the zeros: a commit larger than what is left grows the file, and fdatasync then
    syncs its new size as well; only the speed does.

    The zeros are never data, and never seen as data:
    - close() cuts them off: a closed queue file is an ordinary FileStorage file, and its
      .index says where it ends;
    - after a crash they follow the last whole transaction, and the next open cuts them
      (ackqueue.torn_tail; zeros alone are not kept as a torn tail);
    - pack() cuts them first, and commits append until the pack ends (ZODB's packer
      reads the file to its end);
    - FileStorage's readers are lent with their buffers emptied (_FreshReadPool).
    A failure to write them (a full disk) is logged once and commits go on appending."""

    _ahead_end = 0          # where the zeros written ahead end (0: none written yet)
    _zeros_end = 0          # as _ahead_end, but 0 also after a failure to write them
    _packs = 0              # packs running: no zeros while ZODB's packer reads the file
    _ahead_failed = False
    _pool_class = _FreshReadPool

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._in_place = _writes_in_place(self._file.fileno())

    def _defers(self, size):
        # Overwriting zeros written (and synced) ahead allocates nothing on a file system
        # that writes in place; on a copy-on-write one a full disk could refuse it, and
        # so could a limit on this process's file sizes (RLIMIT_FSIZE, read at each
        # commit: a system call of 0.5 us here, where a write is 2.3).
        end = self._pos + size
        return self._in_place and end <= self._zeros_end and _within_size_limit(end)

    def _sync(self):
        _fdatasync(self._file.fileno())

    def _finish_finish(self, tid):
        super()._finish_finish(tid)
        if self._ahead_end - self._pos < AHEAD // 4 and not self._packs:
            self._write_ahead()

    def _write_ahead(self):
        """Write AHEAD zeros at the end of the file (after any still unused) and sync them;
        called under the commit lock, after a commit, so nothing else writes the file."""
        start = None
        try:
            start = max(self._pos, os.fstat(self._file.fileno()).st_size)
            if self._unbuffered:
                _pwrite_all(self._file.fileno(), _ZEROS, start)
            else:
                self._file.seek(start)
                self._file.write(_ZEROS)
                self._file.flush()
            _fdatasync(self._file.fileno())
        except (OSError, ValueError) as exc:
            # The commit before this is whole and synced; only zeros are lost.  Commits
            # append from here (try again once another AHEAD bytes were committed).
            self._ahead_end = self._pos + AHEAD
            self._zeros_end = 0
            if start is not None:
                try:
                    self._file.truncate(start)
                except (OSError, ValueError):
                    pass
            if not self._ahead_failed:
                self._ahead_failed = True
                log.warning("ackqueue: cannot write space ahead in queue file %r (%s); "
                            "commits go on, each growing the file", self._file_name, exc)
            return
        self._ahead_end = self._zeros_end = start + AHEAD

    def _abort(self):
        # A transaction aborted after its vote wrote it: FileStorage cuts the file at the
        # last commit's end, the zeros with it, and the next commit writes them again.
        # (One aborted before, on a conflict say, left them where they were.)
        written = bool(self._nextpos) and self._voted is None
        super()._abort()
        if written:
            self._ahead_end = self._zeros_end = 0

    def _cut_ahead(self):
        """Cut the zeros off (the commit lock held, or no commit under way)."""
        if self._is_read_only or getattr(self, "_file", None) is None:
            return
        try:
            with self._lock:
                if os.fstat(self._file.fileno()).st_size > self._pos:
                    self._file.truncate(self._pos)
        except (OSError, ValueError):         # closed already, or the file went away
            pass
        self._ahead_end = self._zeros_end = 0

    def pack(self, t, referencesf, gc=None):
        self._commit_lock.acquire()
        try:
            self._packs += 1
            self._cut_ahead()
        finally:
            self._commit_lock.release()
        try:
            return super().pack(t, referencesf, gc)
        finally:
            self._packs -= 1
            self._ahead_end = self._zeros_end = 0   # the next commit writes ahead anew

    def close(self):
        self._cut_ahead()
        super().close()


_ZEROS = bytes(AHEAD)

# File systems that overwrite a file's written blocks in place, where a write over bytes
# already written cannot fail for want of space (see SyncedFileStorage._defers).  Not
# copy-on-write or log-structured ones (btrfs, ZFS, f2fs, bcachefs), nor network ones,
# whose server may be either.
_IN_PLACE_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "tmpfs"})


def _writes_in_place(fd, mountinfo="/proc/self/mountinfo"):
    """Whether open file fd is on a file system of _IN_PLACE_FILE_SYSTEMS, as Linux's
    mountinfo says for its device; False wherever that cannot be told."""
    try:
        dev = os.fstat(fd).st_dev
        wanted = f"{os.major(dev)}:{os.minor(dev)}"
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and "-" in fields:
                    return fields[fields.index("-", 6) + 1] in _IN_PLACE_FILE_SYSTEMS
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return False


try:
    import resource as _resource
except ImportError:                 # Windows: no pwrite, so nothing is deferred there
    _resource = None


def _within_size_limit(end):
    """Whether this process may write a file up to end bytes (RLIMIT_FSIZE)."""
    if _resource is None:
        return False
    limit = _resource.getrlimit(_resource.RLIMIT_FSIZE)[0]
    return limit == _resource.RLIM_INFINITY or end <= limit


class OSDurableFileStorage(WatchedFileStorage):
    """A FileStorage whose commits are written to the operating system but not fsync'd:
    they survive the process (a crash, SIGKILL) but not the machine (power loss, an OS
    crash can lose the latest commits; FileStorage truncates a torn tail on open)."""

    def _sync(self):
        pass                # written to the OS by the flush before it: that is all


def check_durability(durability):
    if not isinstance(durability, str):
        raise TypeError(f"durability must be a str, not {type(durability).__name__}")
    if durability not in DURABILITIES:
        raise ValueError(f"durability must be one of {DURABILITIES}, not {durability!r}")
    return durability





def open_file_storage(path, durability="fsync", repair=False):
    """A FileStorage for path, with clear errors (also used by ackqueue server).
    durability "fsync" fsyncs every commit; "os" leaves writing back to the OS.  A torn
    tail is cut first, and damage in the middle refused unless repair (ackqueue.torn_tail)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"cannot create queue file {path!r}: directory {directory!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"queue path {path!r} is a directory, not a queue file")
    _check_regular(path)
    cls = (SyncedFileStorage if check_durability(durability) == "fsync"
           else OSDurableFileStorage)
    had_tmp = os.path.exists(path + ".tmp")
    if os.path.exists(path):
        _check_tail(path, repair)
    try:
        # pack_keep_old=False: after a pack FileStorage would keep the whole pre-pack file
        # as FILE.old (until the next pack), doubling the disk a queue uses at the moment
        # it should shrink.  ackqueue never reads it: a pack only drops acknowledged
        # messages and superseded revisions, and the swap to the packed file is atomic.
        with _index_warning_explained(path):
            storage = cls(path, create=not os.path.exists(path), pack_keep_old=False)
    except zc.lockfile.LockError:
        raise _locked_error(path) from None
    except FileStorageFormatError:
        _remove_stale_lock(path, had_tmp)
        raise NotAQueueFile(
            f"{path!r} is not a ZODB FileStorage file, so it cannot hold a queue "
            "(choose another path; ackqueue never overwrites a file it does not recognise)"
        ) from None
    except PermissionError as exc:
        _remove_stale_lock(path, had_tmp)
        raise PermissionError(exc.errno, f"cannot open queue file {path!r}: {exc.strerror}",
                              path) from None
    except Exception as exc:
        _remove_stale_lock(path, had_tmp)
        raise StorageError(f"cannot open queue file {path!r}: it is damaged or unreadable "
                           f"({type(exc).__name__}: {exc}); the file was left as it is"
                           ) from exc
    return storage


class _StaleIndexExplained(logging.Filter):
    """Drops FileStorage's "Ignoring index for PATH" for the file being opened, logging
    what it means in its place: the .index beside the file does not match it (it is the
    one written when the file was created, when no process closed the file since, or the
    index of a file since replaced), so FileStorage rebuilds it by reading the whole file
    (and writes it); the index is only a cache, no data is lost."""

    IGNORED = "Ignoring index for %s"

    def __init__(self, path):
        super().__init__()
        self.path = os.path.abspath(path)

    def filter(self, record):
        if record.msg != self.IGNORED or record.args != (self.path,):
            return True
        # INFO, as the cut of the zeros such a process leaves (ackqueue.torn_tail): what a
        # crash leaves behind, handled, with nothing for anyone to do.
        log.info("ackqueue: queue file %r was not closed cleanly (or was replaced): its "
                 ".index is out of date, so it is rebuilt from the file; nothing is lost",
                 self.path)
        return False


@contextlib.contextmanager
def _index_warning_explained(path):
    """While FileStorage opens path: its stale-index warning explained in ackqueue's words
    (ZODB's line reads as an alarm, and is the normal aftermath of a crash)."""
    zodb_log = logging.getLogger("ZODB.FileStorage")
    explained = _StaleIndexExplained(path)
    zodb_log.addFilter(explained)
    try:
        yield
    finally:
        zodb_log.removeFilter(explained)


def _check_regular(path):
    """Refuse what is not a regular file (a device, a FIFO: /dev/null failed deep in
    ZODB).  An empty file is adopted as a new queue file, with a WARNING naming it: it is
    what a crash while FileStorage created the file leaves, and what a power cut leaves
    when the file's first bytes had not reached the disk (its .lock and .tmp may or may
    not have survived), so refusing it would make such a queue unopenable; it holds
    nothing that adopting it could lose."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise NotAQueueFile(f"{path!r} is not a regular file, so it cannot hold a queue "
                            "(choose the path of a queue file, or a new one)")
    if st.st_size == 0:
        log.warning("ackqueue: %r is an empty file (as a crash while creating a queue file "
                    "leaves it); making it a new, empty queue file", path)


def _locked_error(path):
    held = f"queue file {path!r} is already open in another process{pid_note(path)}"
    url = lock_holder(path)[1]
    if url is not None and url.startswith("unix://"):
        return QueueLocked(
            f"{held}, which shares it with the processes that open the same path: "
            f"AckQueue(path={path!r}, name=...) and the ackqueue commands reach its queues "
            f"through that process (at {url}); repair needs the file closed")
    if url is not None and url.startswith("zeo://"):
        return QueueLocked(
            f"{held}: a queue server (ZEO) serves it at {url}. Open its queues there, as "
            f"AckQueue(path={url!r}) or ackqueue ls {url}")
    if url is not None:
        return QueueLocked(
            f"{held}: ackqueue serve, the queue service, serves it at {url}. Open its "
            f"queues there, as AckQueue(path={url!r}, name=...) or ackqueue ls {url}")
    return QueueLocked(
        f"{held}. A queue file is open in one process at a time; to share its queues "
        f"between processes, serve it with the queue service (ackqueue serve {path}, "
        f"listening on {SHARING_URL}) and open them in every process as "
        f"AckQueue(path={SHARING_URL!r}, name=...)")


def _check_tail(path, repair=False):
    """ackqueue.torn_tail.check_tail under the file's lock (FileStorage's own .lock), so that
    a file another process is writing is never cut."""
    had_lock = os.path.exists(path + ".lock")
    try:
        lock = zc.lockfile.LockFile(path + ".lock")
    except zc.lockfile.LockError:
        raise _locked_error(path) from None
    try:
        return check_tail(path, repair)
    except BaseException:
        lock.close()
        lock = None
        if not had_lock:
            _remove_stale_lock(path)
        raise
    finally:
        if lock is not None:
            lock.close()


def repair(path):
    """Make the queue file at path open again after damage in its middle (a StorageError
    that names the offset): cut the file at the damage, keeping the cut bytes beside it as
    ``PATH.torn-<time>`` (the transactions after the damage are lost to the queue, and
    kept there).  Also cuts a torn tail.  The file must not be open anywhere.  Returns the
    name of the file keeping the cut bytes, or None when there was nothing to cut."""
    path = os.path.realpath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no queue file at {path!r}")
    return _check_tail(path, repair=True)


def pid_note(path):
    """" (pid N)" naming the process that holds the queue file path, or "" if unknown."""
    pid = lock_holder(path)[0]
    return f" (pid {pid})" if pid else ""


def lock_holder(path):
    """(pid, url) of the process holding the queue file path, as its lock file says: pid
    as FileStorage wrote it (None if unknown), url where it serves the file (None unless
    it recorded one with note_holder)."""
    try:
        with open(path + ".lock") as f:
            fields = f.read().split()
    except OSError:
        return None, None
    pid = fields[0] if fields else None
    url = fields[1] if len(fields) > 1 and "://" in fields[1] else None
    return pid, url


def note_holder(path, url):
    """Record in the lock file of the queue file path, which this process holds, the url
    where it serves it (after the pid FileStorage wrote there), so that a process refused
    the file is told where to reach its queues.  The next process to take the lock
    rewrites the lock file as it takes it, so a url does not outlive its holder's hold
    (but for that instant).  Best effort: the url only improves an error message, so a
    lock file it cannot write is left as it is."""
    try:
        with open(path + ".lock", "a") as f:
            f.write(f"{url}\n")
    except OSError:
        pass


def _remove_stale_lock(path, had_tmp=True):
    # FileStorage takes its lock before it reads the file; when reading fails it raises
    # without closing, leaving the lock held (until the half-made storage is garbage
    # collected, which a kept exception delays) and a .lock file behind.  The lock is ours,
    # so removing its file is safe, and the next open locks a fresh one.  The scratch
    # .tmp file it made goes too, unless it was there before.
    leftovers = [".lock"] if had_tmp else [".lock", ".tmp"]
    for suffix in leftovers:
        try:
            os.remove(path + suffix)
        except OSError:
            pass

