"""A synced queue file (durability="fsync", storage.SyncedFileStorage) writes its commits
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
from ackqueue.storage import AHEAD, open_file_storage
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
