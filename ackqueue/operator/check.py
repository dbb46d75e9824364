"""``ackqueue check PATH``: read every transaction and data record of a FileStorage file
and report damage, changing nothing.

The file is opened for reading only (no lock, no index written): ZODB's own FileIterator
walks the transactions and their data records, and ZODB's ObjectReader unpickles each
record's class and state.  Damage is what stops the walk before the end of the file (a
transaction header, length or data record that does not add up: ZODB logs it and stops)
and any record whose pickle does not load; each is reported with its byte offset.  Zeros
alone after the last transaction are not damage: a synced queue file keeps them written
ahead of its commits while open, and a process that did not close it left them (the next
open cuts them); the report counts them."""
import logging
import os
from dataclasses import dataclass, field

from ZODB.broken import find_global
from ZODB.FileStorage.FileStorage import FileIterator, FileStorageFormatError
from ZODB.serialize import ObjectReader
from ZODB.utils import oid_repr

from .. import torn_tail


@dataclass
class Damage:
    offset: int
    what: str

    def as_dict(self):
        return {"offset": self.offset, "what": self.what}


@dataclass
class CheckReport:
    path: str
    size: int
    transactions: int = 0
    records: int = 0
    damage: list = field(default_factory=list)
    zeros_after: int = 0        # bytes of zeros after the last transaction (not damage)

    @property
    def ok(self):
        return not self.damage

    def as_dict(self):
        return {"path": self.path, "size": self.size, "transactions": self.transactions,
                "records": self.records, "ok": self.ok, "zeros_after": self.zeros_after,
                "damage": [d.as_dict() for d in self.damage]}


class _Reader(ObjectReader):
    """ZODB's ObjectReader without a connection: a reference to another object loads as
    its reference (the record is read, nothing is fetched)."""

    def __init__(self):
        super().__init__(None, None, lambda conn, module, name: find_global(module, name))

    def _persistent_load(self, reference):
        return reference


class _Warnings(logging.Handler):
    """The warnings ZODB's FileIterator logs where it stops reading a damaged file."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_file(path, progress=None):
    """Read every record of the FileStorage file at path; returns a CheckReport.
    progress(offset) is called now and then with the offset reached.  Raises OSError for
    a missing or unreadable file, ValueError for a file that is not a FileStorage."""
    size = os.path.getsize(path)
    report = CheckReport(path, size)
    reader = _Reader()
    warnings = _Warnings()
    fs_log = logging.getLogger("ZODB.FileStorage")
    serialize_log = logging.getLogger("ZODB.serialize")
    old_propagate = fs_log.propagate, serialize_log.propagate
    fs_log.addHandler(warnings)
    fs_log.propagate = serialize_log.propagate = False   # report, do not print them
    serialize_log.addHandler(logging.NullHandler())
    try:
        try:
            iterator = FileIterator(path)
        except FileStorageFormatError:
            raise ValueError(f"{path!r} is not a ZODB FileStorage file") from None
        reached = 4                                   # after the file's magic number
        try:
            for txn in iterator:
                report.transactions += 1
                for record in txn:
                    report.records += 1
                    _check_record(reader, record, report)
                reached = txn._tend + 8
                if progress is not None and report.transactions % 200 == 0:
                    progress(reached)
        except Exception as exc:                       # a header ZODB cannot even parse
            report.damage.append(Damage(reached, f"unreadable transaction "
                                                 f"({type(exc).__name__}: {exc})"))
        finally:
            iterator.close()
        if reached < size and not report.damage and _zeros_from(path, reached, size):
            # Space a synced queue file writes ahead of its commits (a process that did
            # not close it left them): no data, and the next open cuts them.
            report.zeros_after = size - reached
        elif reached < size and not report.damage:
            said = "; ".join(warnings.messages) or "the transactions stop here"
            report.damage.append(Damage(reached, f"{size - reached} bytes after the last "
                                                 f"readable transaction: {said}"))
        elif warnings.messages and not report.damage:
            report.damage.append(Damage(reached, "; ".join(warnings.messages)))
    finally:
        fs_log.removeHandler(warnings)
        fs_log.propagate, serialize_log.propagate = old_propagate
    if progress is not None:
        progress(size)
    return report


def _zeros_from(path, pos, size):
    with open(path, "rb") as f:
        return torn_tail.zeros_from(f, pos, size)


def _check_record(reader, record, report):
    if record.data is None:                   # an undone creation: no state to read
        return
    try:
        reader.getClassName(record.data)
        reader.getState(record.data)
    except Exception as exc:
        cause = exc.__cause__ or exc
        report.damage.append(Damage(record.pos, f"object {oid_repr(record.oid)}: its "
                                                f"pickle does not load "
                                                f"({type(cause).__name__}: {cause})"))
