"""A synced queue file (durability="fsync", filestorage.SyncedFileStorage) writes its commits
into zeros written ahead of them and syncs them with fdatasync.  The zeros are never data:
closing cuts them, the next open after a crash cuts them without keeping a torn copy,
`ackqueue check` does not call them damage, FileStorage's readers never read them where a
commit has since written, and failing to write them (a full disk) only makes commits
grow the file again."""
import logging
import os
import signal

import pytest
import transaction
import ZODB
from persistent.mapping import PersistentMapping

from ackqueue import AckQueue
from ackqueue.operator.check import check_file
from ackqueue.filestorage import AHEAD, open_file_storage
from fs_records import data_size
from helpers_reliability import run_child

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")


def test_commits_go_into_zeros_written_ahead_and_close_cuts_them(tmp_path):
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    q.put("a")
    first_size = os.path.getsize(path)
    assert first_size >= data_size(path) + AHEAD * 3 // 4
    for n in range(20):
        q.put(("b", n))
    # The puts overwrote zeros: the file did not grow, its data did.
    assert os.path.getsize(path) == first_size
    data = open(path, "rb").read()
    end = data_size(path)
    assert data[end:] == bytes(len(data) - end)
    q.close()
    assert os.path.getsize(path) == end          # an ordinary FileStorage file again
    with AckQueue(path=path) as q:
        assert [q.get_nowait() for _ in range(21)] == ["a"] + [("b", n) for n in range(20)]


def test_readers_never_read_zeros_where_a_commit_has_since_written(tmp_path):
    """FileStorage's pooled readers buffer what they read: over zeros written ahead, a
    buffered block past the end would hold zeros where the next commit writes."""
    storage = open_file_storage(str(tmp_path / "db.fs"))
    db = ZODB.DB(storage)
    try:
        writer_tm, reader_tm = transaction.TransactionManager(), transaction.TransactionManager()
        writer, reader = db.open(writer_tm), db.open(reader_tm)
        for n in range(30):
            with writer_tm:
                writer.root()[n] = PersistentMapping(n=n, pad="x" * 100)
            with reader_tm:             # loads the new object: the last bytes written
                assert reader.root()[n]["n"] == n
    finally:
        db.close()


KILLED = """
    import os, signal, sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1])
    for n in range(300):
        q.put(("job", n, "x" * 300))
    for _ in range(100):
        q.ack(q.get())
    print("done", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_after_a_sigkill_the_zeros_are_cut_without_a_torn_copy(tmp_path, caplog):
    path = tmp_path / "q.fs"
    proc = run_child(KILLED, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    size, end = os.path.getsize(path), data_size(path)
    assert size > end                            # left with zeros after its data

    report = check_file(str(path))               # what `ackqueue check` reads
    assert report.ok, report.damage
    assert report.zeros_after == size - end

    with caplog.at_level(logging.INFO, logger="ackqueue"):
        with AckQueue(path=path) as q:
            assert [q.get_nowait()[1] for _ in range(200)] == list(range(100, 300))
            assert q.qsize() == 0
    assert not [n for n in os.listdir(tmp_path) if ".torn-" in n]
    # (ZODB itself says "Ignoring index": the one written when the file was created.)
    assert not [r for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("ackqueue")]
    assert data_size(path) == os.path.getsize(path)


NO_ROOM_AHEAD = """
    import os, resource, signal, sys
    from ackqueue import AckQueue
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a write past the limit: EFBIG
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), hard))
    q = AckQueue(path=sys.argv[1])
    for n in range(100):
        q.put(("job", n, "x" * 500))
    print(os.path.getsize(sys.argv[1]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_no_room_to_write_ahead_only_makes_commits_grow_the_file(tmp_path):
    """A real write failure (files may not grow past AHEAD / 2: EFBIG, as on a full
    disk): the zeros cannot be written, a WARNING says so once, and every commit still
    goes through, each growing the file."""
    path = tmp_path / "q.fs"
    proc = run_child(NO_ROOM_AHEAD, path, AHEAD // 2)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert int(proc.stdout) == os.path.getsize(path) == data_size(path) < AHEAD // 2
    assert proc.stderr.count("cannot write space ahead") == 1, proc.stderr
    with AckQueue(path=path) as q:
        assert [q.get_nowait()[1] for _ in range(100)] == list(range(100))


class _LooksAtVote:
    """A second resource of a transaction, voting after the storage: reads, at its own
    vote, what the storage file holds where the transaction goes (or refuses it)."""

    def __init__(self, tm, storage, refuse=False):
        self.transaction_manager = tm
        self.storage, self.refuse, self.seen = storage, refuse, None

    def sortKey(self):
        return "~ after the storage"

    def tpc_vote(self, txn):
        with open(self.storage._file_name, "rb") as f:
            f.seek(self.storage._pos)
            self.seen = f.read(self.storage._nextpos - self.storage._pos)
        if self.refuse:
            raise RuntimeError("refused at the vote")

    tpc_begin = commit = tpc_finish = tpc_abort = abort = lambda self, txn: None


def _commit_looking(tm, storage, change, refuse=False):
    tm.begin()
    change()
    looker = _LooksAtVote(tm, storage, refuse)
    tm.get().join(looker)
    if refuse:
        with pytest.raises(RuntimeError, match="refused at the vote"):
            tm.commit()
        tm.abort()
    else:
        tm.commit()
    return looker.seen


def _status(storage, pos):
    with open(storage._file_name, "rb") as f:
        f.seek(pos + 16)
        return f.read(1)


@pytest.mark.parametrize("durability", ["fsync", "os"])
def test_a_commit_into_zeros_ahead_is_written_whole_by_its_finish(tmp_path, durability):
    """Into zeros written ahead (durability="fsync") nothing can refuse the write for want
    of space, so the vote only makes the transaction and its finish writes it, status and
    all, with one write: between the two the file holds nothing of it.  A commit larger
    than the zeros left, and every commit of a file without them ("os"), is written at
    its vote, marked in progress, as FileStorage does, so that a full disk refuses it
    there, and so is every commit on a file system that may not write in place
    (copy-on-write, network: storage._writes_in_place).  A commit refused after the vote
    leaves the file as it was, zeros included."""
    path = str(tmp_path / "db.fs")
    storage = open_file_storage(path, durability)
    db = ZODB.DB(storage)
    try:
        tm = transaction.TransactionManager()
        root = db.open(transaction_manager=tm).root()
        with tm:
            root["a"] = PersistentMapping(n=0)

        deferred = durability == "fsync" and storage._in_place
        pos = storage._pos
        seen = _commit_looking(tm, storage, lambda: root["a"].update(n=1))
        if deferred:
            assert seen == bytes(len(seen))                 # zeros: not written yet
        else:
            assert seen[16:17] == b"c" and seen.rstrip(b"\0") == seen
        assert _status(storage, pos) == b" " and storage._pos > pos

        size = os.path.getsize(path)
        seen = _commit_looking(tm, storage, lambda: root["a"].update(n=2), refuse=True)
        assert os.path.getsize(path) == (size if deferred else storage._pos)
        pos = storage._pos
        seen = _commit_looking(tm, storage, lambda: root.update(big=b"x" * AHEAD))
        assert seen[16:17] == b"c"                          # larger than the zeros left
        assert _status(storage, pos) == b" "
        with tm:
            root["a"]["n"] = 3
    finally:
        db.close()
    with _reopened(path) as root:
        assert root["a"]["n"] == 3 and root["big"] == b"x" * AHEAD


class _reopened:
    """The root of the file at path, opened again."""

    def __init__(self, path):
        self.db = ZODB.DB(open_file_storage(path))

    def __enter__(self):
        return self.db.open().root()

    def __exit__(self, *exc):
        self.db.close()


KILLED_BETWEEN_VOTE_AND_FINISH = """
    import os, signal, sys
    import transaction, ZODB
    from persistent.mapping import PersistentMapping
    from ackqueue.filestorage import open_file_storage

    class KillsAtVote:                      # votes after the storage, then the process dies
        transaction_manager = transaction.manager
        def sortKey(self): return "~ after the storage"
        def tpc_vote(self, txn):
            print("voted", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        tpc_begin = commit = tpc_abort = abort = lambda self, txn: None

    db = ZODB.DB(open_file_storage(sys.argv[1]))
    root = db.open().root()
    root["a"] = PersistentMapping(n=1)
    transaction.commit()
    root["a"]["n"] = 2
    root["b"] = PersistentMapping(n=2)
    transaction.get().join(KillsAtVote())
    transaction.commit()
"""


def test_a_process_killed_between_a_vote_and_its_finish_leaves_the_file_as_before(
        tmp_path, caplog):
    path = tmp_path / "db.fs"
    proc = run_child(KILLED_BETWEEN_VOTE_AND_FINISH, path)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "voted\n", proc.stderr
    report = check_file(str(path))
    assert report.ok, report.damage
    with caplog.at_level(logging.INFO, logger="ackqueue"):
        with _reopened(str(path)) as root:
            assert root["a"]["n"] == 1 and "b" not in root
    assert not [n for n in os.listdir(tmp_path) if ".torn-" in n]
    assert not [r for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("ackqueue")]


def test_which_file_systems_write_in_place(tmp_path):
    """Told by the type mountinfo gives the file's device (after the optional fields and
    their "-"): nothing is deferred on a copy-on-write file system, on a device mountinfo
    does not list, or where there is no mountinfo to read."""
    from ackqueue.filestorage import _writes_in_place
    with open(tmp_path / "f", "wb") as f:
        dev = os.fstat(f.fileno()).st_dev
        device = f"{os.major(dev)}:{os.minor(dev)}"

        def told(*lines):
            info = tmp_path / "mountinfo"
            info.write_text("".join(line + "\n" for line in lines))
            return _writes_in_place(f.fileno(), str(info))

        other = "25 1 0:99 / /elsewhere rw - ext4 /dev/sdz rw"
        assert told(other, f"26 1 {device} / /data rw,relatime shared:1 - ext4 /dev/sda rw")
        assert told(f"26 1 {device} / /data rw - xfs /dev/sda rw")
        assert not told(f"26 1 {device} / /data rw shared:1 master:2 - btrfs /dev/sda rw")
        assert not told(f"26 1 {device} / /data rw - nfs4 server:/x rw")
        assert not told(other)
        assert not _writes_in_place(f.fileno(), str(tmp_path / "none"))
    assert not _writes_in_place(10 ** 6)              # not an open file
