"""The queue file's storage stats its file only when the file's directory changed
(filestorage.WatchedFileStorage): every way of taking the file away from its path changes the
directory, and each must still refuse the next commit.  Real files and transactions; the
storage's wall clock is moved a second ahead so that directory stamps count as settled
(a stamp younger than SETTLE_NS is never trusted), instead of sleeping."""
import os
import time

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from ackqueue import QueueFileGone
from ackqueue.filestorage import COARSE_SETTLE_NS, SETTLE_NS, open_file_storage


class Opened:
    def __init__(self, path, clock_ahead_ns=10 * SETTLE_NS):
        self.storage = open_file_storage(str(path), "fsync")
        self.storage._time_ns = lambda: time.time_ns() + clock_ahead_ns
        self.db = ZODB.DB(self.storage)
        self.tm = transaction.TransactionManager()
        self.conn = self.db.open(transaction_manager=self.tm)
        self.commit(n=0)

    def commit(self, **values):
        self.tm.begin()
        self.conn.root().setdefault("obj", PersistentMapping()).update(values)
        self.tm.commit()

    def close(self):
        self.tm.abort()
        self.db.close()


@pytest.fixture
def opened(tmp_path):
    (tmp_path / "dir").mkdir()
    o = Opened(tmp_path / "dir" / "q.fs")
    yield o
    o.close()


def test_a_settled_directory_is_remembered_and_commits_go_on(opened):
    opened.commit(n=1)
    assert opened.storage._dir_seen is not None
    seen = opened.storage._dir_seen
    for i in range(5):
        opened.commit(n=i)
    assert opened.storage._dir_seen == seen


def _refused(opened, what):
    with pytest.raises(QueueFileGone) as caught:
        opened.commit(n=99)
    assert what in str(caught.value)
    opened.tm.abort()


def test_deleted_after_the_stamp_was_remembered(opened):
    opened.commit(n=1)
    assert opened.storage._dir_seen is not None
    os.remove(opened.storage._file_name)
    _refused(opened, "was deleted")


def test_replaced_after_the_stamp_was_remembered(opened, tmp_path):
    opened.commit(n=1)
    assert opened.storage._dir_seen is not None
    other = tmp_path / "dir" / "other"
    other.write_bytes(b"not a queue")
    os.replace(other, opened.storage._file_name)
    _refused(opened, "was replaced by another file")


def test_moved_to_another_directory(opened, tmp_path):
    opened.commit(n=1)
    os.rename(opened.storage._file_name, tmp_path / "moved.fs")
    _refused(opened, "was deleted")


def test_its_directory_renamed(opened, tmp_path):
    opened.commit(n=1)
    os.rename(tmp_path / "dir", tmp_path / "dir2")
    _refused(opened, "was deleted")


def test_another_file_in_the_directory_only_makes_it_look_again(opened, tmp_path):
    opened.commit(n=1)
    seen = opened.storage._dir_seen
    (tmp_path / "dir" / "sibling").write_bytes(b"x")
    opened.commit(n=2)                  # looked at the file again: still the open one
    assert opened.storage._dir_seen not in (None, seen)


def test_a_directory_changed_just_now_is_not_trusted(tmp_path):
    (tmp_path / "dir").mkdir()
    o = Opened(tmp_path / "dir" / "q.fs", clock_ahead_ns=0)
    try:
        (tmp_path / "dir" / "sibling").write_bytes(b"x")    # changed within SETTLE_NS
        o.commit(n=1)
        assert o.storage._dir_seen is None
        os.remove(o.storage._file_name)
        _refused(o, "was deleted")
    finally:
        o.close()


def test_whole_second_times_wait_for_the_coarse_settle(tmp_path):
    # A file system that keeps times in whole seconds (ext3, HFS+, FAT) could leave a
    # directory's stamp as it was after a change in the same second: such a stamp is
    # trusted only once COARSE_SETTLE_NS old.  The directory's mtime is set to a whole
    # second with utime (its ctime becomes now); the storage's clock is moved instead of
    # sleeping.
    (tmp_path / "dir").mkdir()
    o = Opened(tmp_path / "dir" / "q.fs")
    try:
        folder = tmp_path / "dir"
        before = o.storage._dir_seen            # the stamp remembered at the first commit
        whole = (time.time_ns() // 1_000_000_000 - 5) * 1_000_000_000
        os.utime(folder, ns=(whole, whole))
        newest = max(os.stat(folder).st_mtime_ns, os.stat(folder).st_ctime_ns)
        o.storage._time_ns = lambda: newest + 10 * SETTLE_NS     # fine-grained: settled
        o.commit(n=1)
        assert o.storage._dir_seen == before                    # coarse: not yet
        o.storage._time_ns = lambda: newest + COARSE_SETTLE_NS
        o.commit(n=2)
        assert o.storage._dir_seen[2] == whole                  # now remembered
        os.remove(o.storage._file_name)
        _refused(o, "was deleted")
    finally:
        o.close()


# -- through the queue: a file deleted or replaced while open, and a pack's new file ----

@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_queue_file_deleted_or_replaced_while_open_refuses_writes(tmp_path, how):
    from ackqueue import AckQueue, QueueFileGone, StorageError
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    try:
        q.put("before")
        m = q.get_message()
        if how == "deleted":
            os.remove(path)
        else:
            other = AckQueue(path=tmp_path / "other.fs")
            other.put("other")
            other.close()
            os.replace(tmp_path / "other.fs", path)
        with pytest.raises(QueueFileGone) as caught:
            q.put("after")
        assert isinstance(caught.value, StorageError)
        assert str(path) in str(caught.value) and how in str(caught.value)
        with pytest.raises(QueueFileGone):      # and so is every later write: an ack too
            q.ack(m)
        with pytest.raises(QueueFileGone):
            q.put("later")
    finally:
        q.close()
    if how == "replaced":       # the file put in its place is left as it was
        with AckQueue(path=path) as again:
            assert again.get(block=False) == "other"
            again.task_done()


def test_after_a_pack_the_new_file_is_the_one_watched(tmp_path):
    """A pack replaces the open file by the packed one: the check compares the path with
    the new open file (read once per file object), so writes go on, and a deletion of
    the packed file is still caught."""
    from ackqueue import AckQueue, QueueFileGone
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    try:
        q.put_many(range(10))
        for _ in range(5):
            q.ack(q.get())
        before = os.stat(path).st_ino
        q.pack()
        assert os.stat(path).st_ino != before       # the packed file is another file
        q.put("after the pack")                     # refused if the old file were watched
        os.remove(path)
        with pytest.raises(QueueFileGone):
            q.put("after the deletion")
    finally:
        q.close()
