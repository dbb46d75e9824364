"""Checking a FileStorage file's transactions before ZODB opens it: torn tails are cut,
damage in the middle is refused.

A power cut can leave bytes after a queue file's last whole transaction (a half-written
commit, zeros of a block the file system extended before writing it).  ZODB's read_index
copes with most of them but not all: a tail whose first bytes are an older transaction id
(zeros, say) is truncated but its tid is kept as the storage's last one (the first open
fails with ReadConflictError), and a tail whose status byte is not ASCII fails every open
(UnicodeDecodeError).  So before FileStorage reads the file, ackqueue walks the chain of
transaction records (header, data, the redundant length after each) from where the .index
says the file ended when it was last closed (from the start without a valid one) and
checks each against ZODB's own format (ZODB.FileStorage.format).  What follows the last
whole transaction is cut off and kept beside the file as ``FILE.torn-<time>``, with a
WARNING naming both.

A record that is not whole with whole transactions after it is damage in the middle of
the file, not a torn tail: cutting there would silently drop the messages after it, so
the open is refused (StorageError, naming the offset).  ``repair(path)`` (or
``AckQueue(path=..., repair=True)``) cuts at the damage instead, keeping the cut bytes
beside the file.  Whole transactions after the damage are found by the redundant length
at the end of the file, or by searching the rest of the file for a valid transaction
whose id begins like the last good one's (its first two bytes: written within about 45
days of it).
"""
import logging
import mmap
import os
import pickle
import struct
import time

from ZODB.FileStorage.format import TRANS_HDR, TRANS_HDR_LEN
from ZODB.FileStorage.FileStorage import packed_version

from .errors import StorageError

log = logging.getLogger(__name__)

__all__ = ["check_tail", "Damage"]

_U64 = struct.Struct(">Q")
_HEADER = struct.Struct(TRANS_HDR)
_VALID_STATUS = b" pu"     # committed, packed, undone ('c': not finished)


class Damage(StorageError):
    """A damaged transaction record in the middle of a queue file (whole ones follow)."""

    def __init__(self, message, offset, next_whole):
        super().__init__(message)
        self.offset = offset
        self.next_whole = next_whole


def _whole_at(data, pos, prev_tid):
    """(tid, end) of a whole transaction record starting at pos, else (None, reason)."""
    size = len(data)
    if pos + TRANS_HDR_LEN > size:
        return None, "a header cut short"
    tid, tl, status, ul, dl, el = _HEADER.unpack_from(data, pos)
    if prev_tid is not None and tid <= prev_tid:
        return None, "a transaction id not after the previous one"
    if status not in _VALID_STATUS:
        return None, f"status {status!r}"
    if tl < TRANS_HDR_LEN + ul + dl + el:
        return None, "a length shorter than its header"
    end = pos + tl + 8
    if end > size:
        return None, "a length past the end of the file"
    if _U64.unpack_from(data, pos + tl)[0] != tl:
        return None, "a redundant length that does not match"
    return tid, end


def _start(path, data):
    """(position, tid) to start the walk at: where the .index says the file ended when it
    was written, if a whole transaction ends there; else (4, None)."""
    try:
        with open(path + ".index", "rb") as f:
            pos = pickle.Unpickler(f).load()      # fsIndex.save writes the position first
    except Exception:
        return 4, None
    if not isinstance(pos, int) or not 4 < pos <= len(data):
        return 4, None
    tl = _U64.unpack_from(data, pos - 8)[0]
    begin = pos - 8 - tl
    if begin < 4:
        return 4, None
    tid, end = _whole_at(data, begin, None)
    if tid is None or end != pos:
        return 4, None
    return pos, tid


def _whole_after(data, pos, prev_tid):
    """The offset of a whole transaction after pos (later than prev_tid), or None."""
    size = len(data)
    if size - 8 > pos:
        tl = _U64.unpack_from(data, size - 8)[0]
        begin = size - 8 - tl
        if pos < begin and _whole_at(data, begin, prev_tid)[0] is not None:
            return begin
    if prev_tid is None:
        return None
    first = int.from_bytes(prev_tid[:2], "big")
    for prefix in {prev_tid[:2], ((first + 1) & 0xFFFF).to_bytes(2, "big")}:
        at = data.find(prefix, pos + 1)
        while at != -1:
            if _whole_at(data, at, prev_tid)[0] is not None:
                return at
            at = data.find(prefix, at + 1)
    return None


def _scan(path, f):
    """(size, offset of the first record that is not whole or None, why, whole after)."""
    size = os.fstat(f.fileno()).st_size
    if size <= 4:
        return size, None, None, None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != packed_version:
            return size, None, None, None          # not a FileStorage: ZODB says so
        pos, prev_tid = _start(path, data)
        while pos < size:
            tid, end = _whole_at(data, pos, prev_tid)
            if tid is None:
                return size, pos, end, _whole_after(data, pos, prev_tid)
            pos, prev_tid = end, tid
        return size, None, None, None


def _cut(path, f, pos, size, why):
    """Truncate the file at pos, keeping bytes pos..size in FILE.torn-<time>."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    kept = f"{path}.torn-{stamp}"
    n = 1
    while os.path.exists(kept):
        n += 1
        kept = f"{path}.torn-{stamp}-{n}"
    with open(kept, "xb") as out:
        f.seek(pos)
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    f.truncate(pos)
    f.flush()
    os.fsync(f.fileno())
    log.warning("ackqueue: queue file %r had %d bytes after its last whole transaction "
                "(%s at byte %d); cut them off and kept them in %r",
                path, size - pos, why, pos, kept)
    return kept


def zeros_from(f, pos, size):
    """Whether bytes pos..size of f are all zeros."""
    f.seek(pos)
    while pos < size:
        chunk = f.read(min(size - pos, 1 << 20))
        if not chunk or chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def check_tail(path, repair=False):
    """Cut a torn tail off the FileStorage file path (call it holding the file's lock).
    Damage followed by whole transactions raises Damage, unless repair is true: then the
    file is cut there too.  Returns the name of the file keeping the cut bytes, or None.

    Zeros alone after the last whole transaction are cut without being kept: they are
    the space a synced queue file writes ahead of its commits (filestorage.SyncedFileStorage),
    left by a process that did not close the file, and hold nothing."""
    with open(path, "r+b") as f:
        size, pos, why, after = _scan(path, f)
        if pos is None:
            return None
        if after is None and zeros_from(f, pos, size):
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
            log.info("ackqueue: queue file %r: cut the %d bytes of zeros after its last "
                     "transaction (space written ahead by a process that did not close it)",
                     path, size - pos)
            return None
        if after is not None and not repair:
            raise Damage(
                f"queue file {path!r} is damaged at byte {pos} ({why}), and whole "
                f"transactions follow it (from byte {after}): opening it would drop the "
                "messages they hold, so it was left as it is.  To keep what precedes the "
                "damage and cut the rest off (kept beside the file as "
                f"{os.path.basename(path)}.torn-<time>), run "
                f"python -c \"import ackqueue.filestorage; ackqueue.filestorage.repair({path!r})\" "
                "or open it once with AckQueue(path=..., repair=True)", pos, after)
        return _cut(path, f, pos, size, why)
