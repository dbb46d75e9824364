"""The queue file's commits gather their records in memory (filestorage.MemoryScratchFileStorage):
what they write must be the FileStorage file that FileStorage itself would write."""
import os

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.FileStorage import FileStorage
from ZODB.scripts import fstest

from ackqueue.filestorage import SCRATCH_KEPT, open_file_storage


class _FailsAtVote:
    """A second resource of a transaction that refuses at the vote, after the storage
    voted: the storage's tpc_abort then takes back what its vote wrote to the file."""

    def __init__(self, tm):
        self.transaction_manager = tm

    def sortKey(self):
        return "~ after the storage"

    def tpc_begin(self, txn):
        pass

    def commit(self, txn):
        pass

    def tpc_vote(self, txn):
        raise RuntimeError("refused at the vote")

    def tpc_abort(self, txn):
        pass

    def abort(self, txn):
        pass


def _scratch_size(storage):
    with storage._tfile.getbuffer() as view:
        return view.nbytes


def test_commits_of_every_kind_write_a_valid_file(tmp_path):
    path = str(tmp_path / "q.fs")
    storage = open_file_storage(path)
    db = ZODB.DB(storage)
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    root = conn.root()
    with tm:
        root["small"] = PersistentMapping(n=1)
    with tm:
        root["large"] = PersistentMapping(blob=b"x" * (3 * SCRATCH_KEPT))
    assert _scratch_size(storage) <= SCRATCH_KEPT     # the large commit's buffer went
    # A commit refused after the storage voted leaves nothing in the file.
    tm.begin()
    root["small"]["n"] = 2
    tm.get().join(_FailsAtVote(tm))
    with pytest.raises(RuntimeError, match="refused at the vote"):
        tm.commit()
    tm.abort()
    with tm:
        root["small"]["n"] = 3
    with tm:
        root["small"]["n"] = 4
    # Undo reads records back from the transaction being built: here, the scratch.
    last = db.undoLog(0, 1)[0]["id"]
    db.undo(last, tm.get())
    tm.commit()
    db.close()

    assert os.path.getsize(path + ".tmp") == 0        # nothing was written through it
    fstest.check(path)                               # raises on any damage
    plain = ZODB.DB(FileStorage(path, read_only=True))
    try:
        reader = plain.open()
        assert reader.root()["small"]["n"] == 3      # 2 was refused, 4 undone
        assert reader.root()["large"]["blob"] == b"x" * (3 * SCRATCH_KEPT)
    finally:
        plain.close()


def test_a_queue_reopens_with_what_its_commits_wrote(tmp_path):
    from ackqueue import AckQueue
    path = str(tmp_path / "q.fs")
    q = AckQueue(path=path)
    q.put_many(list(range(300)))
    for _ in range(100):
        q.ack(q.get())
    q.put(b"y" * (2 * SCRATCH_KEPT))
    q.close()
    fstest.check(path)
    q = AckQueue(path=path)
    try:
        assert q.qsize() == 201
        got = q.get_many(300, timeout=5)
        assert got[:200] == list(range(100, 300)) and got[200] == b"y" * (2 * SCRATCH_KEPT)
        q.ack_many(got)
    finally:
        q.close()
