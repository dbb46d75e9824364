"""Space: packing gives back the space of acknowledged messages and old
revisions, on a file, in memory and through a server, while the queue is in use, by hand
(ackqueue.maintenance.pack) or automatically (Database.enable_autopack).

Deterministic: no timed assertions; waits for real background threads are bounded loops of
tiny sleeps whose bound only turns a hang into a failure."""
import logging
import os
import threading
import time

import pytest

from ackqueue import AckQueue, Empty, StorageError, maintenance
from ackqueue.maintenance import (AUTOPACK_KEEP_SECONDS, DEFAULT_AUTOPACK_BYTES,
                                  DEFAULT_CHECK_INTERVAL, AutoPacker, PackReport,
                                  autopack_threshold)
from fs_records import data_size
from zeo_server import Server, read_line, spawn

BOUND = 60      # seconds: failure bound for background work that should finish promptly


def churn(q, messages, batch=100, singles=200):
    """Put and acknowledge `messages` messages: most in transactions of `batch`, the last
    `singles` one commit per put and per ack (the way most programs use a queue)."""
    n = 0
    while n < messages - singles:
        with q.transaction():
            for _ in range(batch):
                q.put(("done", n))
                n += 1
        with q.transaction():
            for _ in range(batch):
                q.ack(q.get_nowait())
    while n < messages:
        q.put(("done", n))
        n += 1
        q.ack(q.get_nowait())


def drain(q):
    items = []
    while True:
        try:
            item = q.get_nowait()
        except Empty:
            return items
        items.append(item)
        q.ack(item)


def wait_until(predicate, what):
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


KEPT = [("kept", i, "x" * 50) for i in range(40)]


# -- (a) a file shrinks back and keeps what is queued ------------------------------------

def test_pack_gives_back_the_space_and_keeps_every_queued_message(tmp_path):
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    churn(q, 3000)
    for item in KEPT:                       # the backlog that must survive, in order
        q.put(item)
    held = q.get_nowait()                   # one message in flight across the pack
    assert held == KEPT[0]
    with AckQueue(path=path, name="other") as other:
        churn(other, 300, singles=100)      # more traffic, on another queue of the file
    before = data_size(path)

    report = maintenance.pack(q._database)

    after = data_size(path)
    assert isinstance(report, PackReport)
    assert (report.size_before, report.size_after) == (before, after)
    assert report.freed == before - after and report.seconds >= 0
    assert report.storage == q._database.description
    assert after < before / 20, (before, after)
    # Nothing is left beside the file: no packed copy, no pre-pack .old copy.
    assert not os.path.exists(f"{path}.pack") and not os.path.exists(f"{path}.old")

    # As small as a fresh queue holding the same messages, written in one commit.
    fresh_path = tmp_path / "fresh.fs"
    with AckQueue(path=fresh_path) as fresh:
        with fresh.transaction():
            for item in KEPT:
                fresh.put(item)
        fresh_item = fresh.get_nowait()     # the same state: one in flight
    fresh_size = os.path.getsize(fresh_path)
    assert after < fresh_size * 1.5 + 4096, (after, fresh_size)

    # The queue works on: the held message is acked, the rest come in order.
    q.ack(held)
    assert fresh_item == held
    assert q.get_nowait() == KEPT[1]
    q.put("after pack")
    q.close()                               # KEPT[1] goes back (never acked)

    q = AckQueue(path=path)
    assert drain(q) == KEPT[1:] + ["after pack"]
    q.close()


def test_a_pack_that_finds_nothing_to_drop_changes_nothing(tmp_path):
    path = tmp_path / "q.fs"
    with AckQueue(path=path) as q:
        with q.transaction():
            for item in KEPT:
                q.put(item)
        maintenance.pack(q._database)
        report = maintenance.pack(q._database)      # nothing left to drop
        assert report.size_after == report.size_before == data_size(path)
        assert drain(q) == KEPT


# -- (b) packing while other threads work -------------------------------------------------

def test_pack_while_threads_put_get_and_ack(tmp_path):
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    churn(q, 2000)
    backlog = [("backlog", i) for i in range(500)]
    with q.transaction():
        for item in backlog:
            q.put(item)
    q.close()
    q = AckQueue(path=path)       # reopened: the backlog's bodies are read from the file

    stop = threading.Event()
    put, got, errors = [], [], []
    progress = threading.Semaphore(0)

    def producer():
        n = 0
        while not stop.is_set():
            if n % 5 == 0:
                with q.transaction():
                    items = [("new", n + i) for i in range(5)]
                    for item in items:
                        q.put(item)
                put.extend(items)
                n += 5
            else:
                q.put(("new", n))
                put.append(("new", n))
                n += 1
            progress.release()

    def consumer():
        while not stop.is_set() or q.qsize():
            try:
                item = q.get(timeout=0.05)
            except Empty:
                continue
            got.append(item)
            q.ack(item)
            progress.release()

    def guarded(target):
        def run():
            try:
                target()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(f)) for f in (producer, consumer, consumer)]
    for t in threads:
        t.start()
    reports = []
    try:
        for _ in range(3):
            for _ in range(300):             # let the workers move on between packs
                assert progress.acquire(timeout=BOUND), errors
            reports.append(maintenance.pack(q._database))
        for _ in range(300):
            assert progress.acquire(timeout=BOUND), errors
    finally:
        stop.set()
        for t in threads:
            t.join(BOUND)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    # Concurrent commits grow the file during a pack; packed idle, it is small again.
    assert maintenance.pack(q._database).size_after < reports[0].size_before / 5

    # Nothing lost, nothing delivered twice, and the queue still works.
    assert len(got) == len(set(got))
    assert sorted(got, key=repr) == sorted(backlog + put, key=repr)
    q.put("still works")
    assert q.get_nowait() == "still works"
    q.task_done()
    assert q.unfinished_tasks == 0
    q.close()
    with AckQueue(path=path) as q:
        assert q.qsize() == 0 and q.unfinished_tasks == 0


# -- (c) through a server --------------------------------------------------------------------

def test_pack_through_a_server_packs_the_servers_file(tmp_path):
    path = tmp_path / "shared.fs"
    server = Server(path, tmp_path / "server.log")
    try:
        q = AckQueue(path=server.url)
        churn(q, 300, singles=100)
        for item in KEPT:
            q.put(item)
        held = q.get_nowait()
        before = data_size(path)

        # Another thread keeps using the queue while the server packs.
        done, errors, extra = threading.Event(), [], []

        def worker():
            try:
                for n in range(50):
                    q.put(("extra", n))
                    extra.append(("extra", n))
                done.set()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
                done.set()
        t = threading.Thread(target=worker)
        t.start()
        report = maintenance.pack(q._database)
        t.join(BOUND)
        assert not errors, errors

        after = data_size(path)
        assert report.storage == f"server {server.url}"
        assert report.size_after < report.size_before / 5     # as the server reports them
        assert after < before / 5, (before, after)
        assert not os.path.exists(f"{path}.pack") and not os.path.exists(f"{path}.old")
        q.ack(held)
        assert drain(q) == KEPT[1:] + extra
        q.close()
    finally:
        server.stop()


# -- (d) the automatic policy -----------------------------------------------------------------

def test_autopack_packs_by_itself_and_stops_on_close(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ackqueue.maintenance")
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    database = q._database
    # keep_seconds=0: pack up to now (by default an automatic pack keeps the last minute).
    packer = database.enable_autopack(10**9, interval=0.01, keep_seconds=0)
    assert isinstance(packer, AutoPacker) and packer.alive
    for item in KEPT:
        q.put(item)
    with AckQueue(path=path, name="other") as other:
        churn(other, 1000, singles=300)     # grows the file, far below 10**9
    grown = data_size(path)
    assert grown > 200_000 and not packer.reports

    # A second call keeps the smaller threshold: a larger one changes nothing, a smaller
    # one makes the growth since the packer started (on the idle queue) enough to pack.
    assert database.enable_autopack(10**12) is packer and packer.threshold == 10**9
    assert database.enable_autopack(50_000) is packer and packer.threshold == 50_000
    wait_until(lambda: packer.reports, "an automatic pack")
    report = packer.reports[0]
    assert report.size_before >= grown and report.size_after < grown / 10
    assert data_size(path) < grown / 10
    # The packer thread logs right after it records the report: wait for the line too.
    wait_until(lambda: any("automatic pack" in r.getMessage() and r.levelno == logging.INFO
                           for r in caplog.records), "the automatic pack's log line")
    assert drain(q) == KEPT

    thread = packer._thread
    q.close()
    assert not packer.alive and thread not in threading.enumerate()
    with pytest.raises(StorageError):
        database.enable_autopack(1000)


def test_autopack_stays_until_the_last_queue_on_the_file_closes(tmp_path):
    a = AckQueue(path=tmp_path / "q.fs", name="a")
    b = AckQueue(path=tmp_path / "q.fs", name="b")
    assert a._database is b._database
    packer = a._database.enable_autopack(True)
    assert packer.threshold == DEFAULT_AUTOPACK_BYTES
    assert packer.keep_seconds == AUTOPACK_KEEP_SECONDS > 0
    assert packer.interval == DEFAULT_CHECK_INTERVAL
    a.close()
    assert packer.alive
    b.close()
    assert not packer.alive


# -- (e) the autopack= option ---------------------------------------------------------------

def test_autopack_threshold_validation():
    assert autopack_threshold(None) is None
    assert autopack_threshold(False) is None
    assert autopack_threshold(True) == DEFAULT_AUTOPACK_BYTES
    assert autopack_threshold(1) == 1
    assert autopack_threshold(10**12) == 10**12
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive"):
            autopack_threshold(bad)
    for bad in (1.5, 1e9, "256MB", b"1", [1]):
        with pytest.raises(TypeError, match="autopack must be None, a bool or an int"):
            autopack_threshold(bad)


def test_the_autopack_option_of_a_queue(tmp_path):
    path = tmp_path / "q.fs"
    with pytest.raises(TypeError, match="autopack"):
        AckQueue(path=path, autopack="256MB")
    with pytest.raises(ValueError, match="autopack"):
        AckQueue(path=path, autopack=0)
    with AckQueue(path=path, autopack=False) as q:
        assert q._database.autopacker is None
    with AckQueue(path=path, autopack=True) as q, \
            AckQueue(path=path, name="other", autopack=10**6) as other:
        assert q._database.autopacker.threshold == 10**6    # the smaller one
        assert q.pack().size_after == data_size(path)
        packer = other._database.autopacker
    assert not packer.alive


def test_pack_arguments_and_report():
    with AckQueue() as q:
        for bad in ("1", None, True):
            with pytest.raises(TypeError, match="keep_seconds"):
                maintenance.pack(q._database, keep_seconds=bad)
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match="keep_seconds"):
                maintenance.pack(q._database, keep_seconds=bad)
        with pytest.raises(ValueError):
            q._database.enable_autopack(None)
        report = maintenance.pack(q._database)
        with pytest.raises(Exception):
            report.seconds = 0              # frozen
    with pytest.raises(StorageError, match="closed"):
        maintenance.pack(q._database)


# -- (f) in memory --------------------------------------------------------------------------

def test_pack_in_memory_drops_old_revisions():
    q = AckQueue()
    storage = q._database.db.storage
    churn(q, 1000)
    for item in KEPT:
        q.put(item)
    before = storage.getSize()              # MappingStorage's estimate of what it holds
    report = maintenance.pack(q._database)
    assert report.size_before is None and report.size_after is None
    assert report.storage == "memory"
    assert storage.getSize() < before / 10
    # Packing again, even to an earlier time, is harmless.
    maintenance.pack(q._database, keep_seconds=3600)
    maintenance.pack(q._database)
    assert drain(q) == KEPT
    q.put("after")
    assert q.get_nowait() == "after"
    q.task_done()

    # The automatic policy watches MappingStorage's estimate of its size.
    packer = q._database.enable_autopack(10**9, interval=0.01, keep_seconds=0)
    churn(q, 1000)
    grown = storage.getSize()
    q._database.enable_autopack(1000)
    wait_until(lambda: packer.reports, "an automatic pack in memory")
    wait_until(lambda: not q._database.pack_lock.locked(), "the pack to finish")
    assert storage.getSize() < grown / 10
    q.close()
    assert not packer.alive


# -- a pack that fails leaves the queue as it was ---------------------------------------------

FULL_DISK_CHILD = """
import os, resource, signal, sys
from ackqueue import AckQueue, StorageError, maintenance
path = sys.argv[1]
q = AckQueue(path=path)
for n in range(300):
    q.put(("done", n))
    q.ack(q.get_nowait())
for n in range(20):
    q.put(("kept", n))
before = len(open(path, "rb").read().rstrip(b"\\0"))   # the data (zeros written ahead follow)
# A real write failure: files may not grow beyond 1 KB (EFBIG instead of SIGXFSZ), as
# when the disk is full.  The queue file is already larger, so the packed copy fails.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
try:
    maintenance.pack(q._database)
except StorageError as exc:
    error = exc
finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
print(type(error).__name__, type(error.__cause__).__name__)
print("free disk" in str(error) and "still usable" in str(error))
print(os.path.exists(path + ".pack"), len(open(path, "rb").read().rstrip(b"\\0")) == before)
q.put("after")
print([q.get_nowait() for _ in range(21)] == [("kept", n) for n in range(20)] + ["after"])
print(maintenance.pack(q._database).size_after < before)
q.close()
"""


def test_a_failed_pack_raises_storage_error_and_leaves_the_queue_usable(tmp_path):
    child = spawn(FULL_DISK_CHILD, tmp_path / "q.fs")
    try:
        assert read_line(child) == "StorageError OSError"
        assert read_line(child) == "True"               # the message says what to do
        assert read_line(child) == "False True"         # no .pack left, file unchanged
        assert read_line(child) == "True"               # every message, in order
        assert read_line(child) == "True"               # and packing works again
        assert child.wait(BOUND) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# -- packing through a server while clients work -------------------------------------

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
