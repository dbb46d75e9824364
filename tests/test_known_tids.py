"""A queue file's storage takes the transaction id of an object's last record from what it
committed itself instead of reading it back (filestorage.KnownTidsFileStorage).  Conflicts
must still be seen, and a pack, which gives the file's positions to other records, must
not leave an id behind that the file no longer holds.  Real FileStorage files, real
transactions; the one instrument is a count of the headers store() reads."""
import io
import time

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.POSException import ConflictError
from ZODB.serialize import referencesf

from ackqueue import AckQueue
from ackqueue.filestorage import KNOWN_TIDS, SyncedFileStorage


class CountingStorage(SyncedFileStorage):
    """The synced queue file's storage, counting the record headers read from its file."""

    header_reads = 0

    def _read_data_header(self, pos, oid=None, _file=None):
        if _file is None:
            self.header_reads += 1
        return super()._read_data_header(pos, oid, _file)


def _open(path):
    storage = CountingStorage(str(path))
    db = ZODB.DB(storage)
    return storage, db


def _open_with_obj(path):
    """The storage and its DB, a connection with its own transaction manager, and a
    PersistentMapping committed at root["obj"]."""
    storage, db = _open(path)
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    tm.begin()
    obj = conn.root()["obj"] = PersistentMapping()
    tm.commit()
    return storage, db, tm, conn, obj


def _reopened_n(path):
    """root["obj"]["n"] as a fresh open of the closed file reads it."""
    _, db = _open(path)
    try:
        return db.open().root()["obj"]["n"]
    finally:
        db.close()


def _commit(conn, **values):
    conn.transaction_manager.begin()
    conn.root()["obj"].update(values)
    conn.transaction_manager.commit()


def test_store_reads_no_header_for_records_it_committed(tmp_path):
    storage, db, tm, conn, obj = _open_with_obj(tmp_path / "q.fs")
    before = storage.header_reads
    for i in range(20):
        _commit(conn, n=i)
    assert storage.header_reads == before
    db.close()
    # The file holds what was committed, read by a plain reopen.
    assert _reopened_n(tmp_path / "q.fs") == 19


def test_a_conflicting_commit_is_still_refused(tmp_path):
    storage, db = _open(tmp_path / "q.fs")
    tm1, tm2 = (transaction.TransactionManager() for _ in range(2))
    c1, c2 = db.open(transaction_manager=tm1), db.open(transaction_manager=tm2)
    tm1.begin()
    c1.root()["obj"] = PersistentMapping()
    tm1.commit()
    tm1.begin()
    c1.root()["obj"]["b"] = 2             # c1 changes the object as of the first record
    _commit(c2, a=1)                      # c2's record is now the last one
    with pytest.raises(ConflictError):
        tm1.commit()                      # PersistentMapping cannot merge
    tm1.abort()
    tm1.begin()
    assert dict(c1.root()["obj"]) == {"a": 1}
    tm1.abort()
    db.close()


def test_after_a_pack_ids_come_from_the_packed_file(tmp_path):
    storage, db = _open(tmp_path / "q.fs")
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    tm.begin()
    root = conn.root()
    root["obj"] = PersistentMapping()
    root["other"] = PersistentMapping()
    tm.commit()
    for i in range(30):
        _commit(conn, n=i)
    assert storage._known_tids          # filled by the commits
    storage.pack(time.time() + 1, referencesf)
    assert storage._known_tids == {}    # the packed file's positions are not those
    reads = storage.header_reads
    _commit(conn, n=100)                # read from the file once, then known again
    assert storage.header_reads == reads + 1
    _commit(conn, n=101)
    assert storage.header_reads == reads + 1
    # Another connection's stale view is still a conflict after the pack.
    tm2 = transaction.TransactionManager()
    c2 = db.open(transaction_manager=tm2)
    tm2.begin()
    c2.root()["obj"]["x"] = 1
    _commit(conn, n=102)
    with pytest.raises(ConflictError):
        tm2.commit()
    tm2.abort()
    db.close()
    assert _reopened_n(tmp_path / "q.fs") == 102


def test_an_undo_keeps_the_table_true(tmp_path):
    # Undo writes its records through the same commit (tpc_finish), each with the undo's
    # transaction id, which is what the table then holds.
    storage, db, tm, conn, obj = _open_with_obj(tmp_path / "q.fs")
    _commit(conn, n=1)
    _commit(conn, n=2)
    undo_id = db.undoLog(0, 1)[0]["id"]
    db.undo(undo_id)                      # writes obj's record n=1 again, a new txn
    transaction.commit()                  # (undo joins the thread's transaction)
    reads = storage.header_reads
    tm.begin()
    assert conn.root()["obj"]["n"] == 1
    tm.abort()
    _commit(conn, n=3)                    # no conflict with the undo's record
    assert storage.header_reads == reads  # its id was known
    db.close()
    assert _reopened_n(tmp_path / "q.fs") == 3


def test_the_table_is_bounded(tmp_path):
    storage, db = _open(tmp_path / "q.fs")
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    for start in range(0, KNOWN_TIDS * 2, 1000):    # more objects than the table holds
        tm.begin()
        conn.root()[start] = [PersistentMapping() for _ in range(1000)]
        tm.commit()
        assert 0 < len(storage._known_tids) <= KNOWN_TIDS
    tm.begin()
    conn.root()["more"] = [PersistentMapping() for _ in range(KNOWN_TIDS + 1)]  # in one
    tm.commit()
    assert len(storage._known_tids) == 0
    for item in conn.root()[0][:3]:        # ids read from the file again, then known
        _set(tm, item, x=1)
    assert len(storage._known_tids) == 3
    db.close()
    storage, db = _open(tmp_path / "q.fs")
    assert [item.get("x") for item in db.open().root()[0][:4]] == [1, 1, 1, None]
    db.close()


def _set(tm, mapping, **values):
    tm.begin()
    mapping.update(values)
    tm.commit()


def test_a_queue_file_round_trips_through_the_table(tmp_path):
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    for i in range(50):
        q.put(i)
        if i % 2:
            q.ack(q.get(timeout=5))
    q.close()
    q = AckQueue(path=path)
    assert [q.get(timeout=5) for _ in range(25)] == list(range(25, 50))
    q.close()


def test_the_file_is_written_unbuffered_and_stays_so_after_a_pack(tmp_path):
    # The vote and the finish write with pwrite (filestorage.MemoryScratchFileStorage): no
    # buffer may hold bytes of the file that a later commit writes, a pack's too.
    storage, db = _open(tmp_path / "q.fs")
    assert isinstance(storage._file, io.FileIO)
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    tm.begin()
    conn.root()["obj"] = PersistentMapping()
    tm.commit()
    for i in range(10):
        _commit(conn, n=i)
    storage.pack(time.time() + 1, referencesf)
    assert isinstance(storage._file, io.FileIO)
    _commit(conn, n=10)
    db.close()
    assert _reopened_n(tmp_path / "q.fs") == 10


def test_reads_through_the_storage_file_see_every_commit(tmp_path):
    # loadSerial (conflict resolution on a server reads old revisions with it) and the
    # header reads go through the file the commits are written to.
    storage, db, tm, conn, obj = _open_with_obj(tmp_path / "q.fs")
    revisions = []
    for i in range(30):
        _commit(conn, n=i)
        revisions.append((obj._p_serial, i))
        storage._known_tids.clear()       # the next store reads the header from the file
    assert [conn.oldstate(obj, serial)["data"]["n"] for serial, _ in revisions] == [
        i for _, i in revisions]
    db.close()
