"""Issue 25, the points left after the first hardening round: each test failed before its
fix (see the commit that added it)."""
import os
import socket
import subprocess

import pytest

from zeo_server import console_script


# -- 7a. ackqueue server: one clear line for what stops it, and nothing created -------------

def _run_server(*args, timeout=60):
    return subprocess.run([console_script(), "server", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _one_clear_line(proc):
    assert proc.returncode not in (0, None), proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def test_server_port_in_use_is_one_line_and_creates_nothing(tmp_path):
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _run_server(tmp_path / "q.fs", "--listen", f"127.0.0.1:{port}")
    finally:
        taken.close()
    line = _one_clear_line(proc)
    assert f"127.0.0.1:{port}" in line and "in use" in line, line
    assert os.listdir(tmp_path) == []


def test_server_on_a_file_another_process_holds(tmp_path):
    from zeo_server import Server
    path = tmp_path / "q.fs"
    first = Server(path, tmp_path / "first.log")
    try:
        before = sorted(os.listdir(tmp_path))
        proc = _run_server(path, "--listen", "127.0.0.1:0")
        line = _one_clear_line(proc)
        assert str(path) in line and f"pid {first.proc.pid}" in line, line
        # Its advice is not to run the command that just failed.
        assert "(ackqueue server" not in line, line
        assert first.url.replace("zeo://", "") in line or "zeo://" in line, line
        assert sorted(os.listdir(tmp_path)) == before
    finally:
        assert first.stop() == 0


def test_server_in_a_missing_directory(tmp_path):
    path = tmp_path / "nowhere" / "q.fs"
    line = _one_clear_line(_run_server(path, "--listen", "127.0.0.1:0"))
    assert str(path.parent) in line and "does not exist" in line, line
    assert os.listdir(tmp_path) == []


def test_server_on_a_file_that_is_not_a_queue(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a queue\n")
    line = _one_clear_line(_run_server(path, "--listen", "127.0.0.1:0"))
    assert str(path) in line and "not a ZODB FileStorage file" in line, line
    assert os.listdir(tmp_path) == ["notes.txt"]
    assert path.read_text() == "not a queue\n"


# -- 7b. the queue file deleted or replaced while open ----------------------------------------

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


# -- 7c. a 50 MB item: no warning about large records ----------------------------------------

def _big_item():
    return os.urandom(1 << 20) * 50          # 50 MB, not compressible below ZODB's 16 MB


def test_a_50mb_item_round_trips_without_a_warning(tmp_path, caplog, recwarn):
    from ackqueue import AckQueue
    from ackqueue import store
    item = _big_item()
    path = tmp_path / "q.fs"
    with caplog.at_level("WARNING"):
        with AckQueue(path=path) as q:
            q.put(item)
            q.put("small")
        with AckQueue(path=path) as q:        # read back from the file, not the put's cache
            assert q.get(timeout=60) == item
            q.task_done()
            assert q.get(block=False) == "small"
            q.task_done()
            assert q.qsize() == 0
    assert [str(w.message)[:200] for w in recwarn] == []
    assert [r.getMessage()[:200] for r in caplog.records if r.levelno >= 30] == []
    assert store.BODY_PART < 16 << 20      # ZODB warns from 16 MB per record


def test_a_format2_file_is_migrated_and_its_large_bodies_read(tmp_path):
    """Format 3 splits large bodies into parts; a format-2 file's single Body records still
    read, and the file records format 3 after its first open."""
    import transaction
    import ZODB
    from ackqueue import AckQueue, store
    from ackqueue.filestorage import open_file_storage
    path = str(tmp_path / "q.fs")
    item = os.urandom(100_000)
    with AckQueue(path=path) as q:
        q.put(item)
    db = ZODB.DB(open_file_storage(path))    # make it a format-2 file: one Body record
    with db.transaction() as conn:
        catalog = conn.root()[store.ROOT_KEY]
        rec = catalog.queues["default"] if "default" in catalog.queues else \
            next(iter(catalog.queues.values()))
        seq, body = next(iter(rec.bodies.items()))
        assert body.parts is None and body.data is not None
        catalog.format = 2
    db.close()
    transaction.abort()
    with AckQueue(path=path) as q:
        assert q.get(block=False) == item
        q.task_done()
    db = ZODB.DB(open_file_storage(path))
    with db.transaction() as conn:
        assert conn.root()[store.ROOT_KEY].format == store.FORMAT     # migrated on open
    db.close()


# -- 5. packing through a server while clients work ------------------------------------------

PACK_CLIENT = """
import sys, threading
from ackqueue import AckQueue, maintenance
q = AckQueue(path=sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()                       # all clients ask at once
try:
    maintenance.pack(q._database, keep_seconds=float(sys.argv[2]))
    print("packed", flush=True)
except Exception as exc:
    print("failed", type(exc).__name__, str(exc).replace(chr(10), " "), flush=True)
q.close()
"""


@pytest.mark.parametrize("keep_seconds", [0.0, 1.0])
def test_packs_through_a_server_while_clients_work(tmp_path, caplog, keep_seconds):
    import threading
    from ackqueue import AckQueue
    from zeo_server import Server, kill, read_line, spawn
    caplog.set_level("WARNING")
    server = Server(tmp_path / "q.fs", tmp_path / "server.log")
    q = AckQueue(path=server.url)
    clients = []
    try:
        for n in range(300):                      # live data for the pack to copy
            q.put(os.urandom(20_000))
        stop, errors, cycles = threading.Event(), [], [0]

        def work():
            try:
                while not stop.is_set():
                    q.put("x")
                    q.get(timeout=60)
                    q.task_done()
                    cycles[0] += 1
            except BaseException as exc:          # reported below
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(2)]
        for t in workers:
            t.start()
        for round_ in range(3):
            clients = [spawn(PACK_CLIENT, server.url, keep_seconds) for _ in range(3)]
            for c in clients:
                assert read_line(c) == "ready"
            for c in clients:
                c.stdin.write("go\n")
                c.stdin.flush()
            answers = [read_line(c, timeout=120) for c in clients]
            for c in clients:
                c.stdin.close()
                err = c.stderr.read()
                c.wait(60)
                assert "Traceback" not in err and "ERROR" not in err, err
            assert answers == ["packed"] * 3, answers
        stop.set()
        for t in workers:
            t.join(120)
        assert not errors, errors
        assert cycles[0] > 0
        assert q.qsize() == 300
    finally:
        for c in clients:
            kill(c)
        q.close()
        assert server.stop() == 0
    log = server.read_log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert [r.getMessage() for r in caplog.records
            if r.levelno >= 40 or r.exc_info] == []      # the working clients logged none
    # Several clients asking at once is one pack: each request started one, or waited for
    # the one in progress; never two at a time.
    started = log.count("ackqueue server: packing")
    joined = log.count("ackqueue server: a pack is in progress")
    assert started + joined == 9 and started >= 3, log[-3000:]
