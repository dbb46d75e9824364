"""Issue 25: failures found by trying the product by hand, each with the test that
failed before its fix."""
import json
import threading

import pytest

from ackqueue import AckQueue
from helpers_reliability import BOUND, FakeClock, drain_items as drain, run_child


# -- 1. a thread that dies of an exception gives back, whatever threading.excepthook is --

def _silent_hook(args):
    """An application's own hook that reports elsewhere and never chains."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("when", ["none", "before", "after"])
def test_thread_dying_gives_back_at_head_whatever_the_excepthook(tmp_path, monkeypatch,
                                                                  when):
    if when == "before":
        monkeypatch.setattr(threading, "excepthook", _silent_hook)
    q = AckQueue(path=tmp_path / "q.fs", clock=FakeClock())   # plain queue.Queue code
    if when == "after":
        monkeypatch.setattr(threading, "excepthook", _silent_hook)
    try:
        for item in ("job", "next"):
            q.put(item)
        seen = []

        def worker():
            seen.append(q.get())
            raise RuntimeError("worker failed while holding an item")

        t = threading.Thread(target=worker)
        t.start()
        t.join(BOUND)
        assert not t.is_alive() and seen == ["job"]
        # A get looks at ended threads first: no waiting, and the clock never moved.
        m = q.get_message(block=False)
        assert (m.body, m.receive_count) == ("job", 2)
        assert drain(q) == ["next"]
    finally:
        q.close()


@pytest.mark.parametrize("when", ["before-import", "after-creation"])
def test_thread_dying_gives_back_with_an_app_hook_in_a_fresh_process(tmp_path, when):
    # A fresh interpreter: the hook really is installed before ackqueue is imported.
    proc = run_child("""
        import json, sys, threading
        reported = []
        def app_hook(args):
            reported.append(type(args.exc_value).__name__)
        if sys.argv[2] == "before-import":
            threading.excepthook = app_hook
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        if sys.argv[2] == "after-creation":
            threading.excepthook = app_hook
        q.put("job")
        q.put("later")
        def worker():
            q.get()
            raise RuntimeError("worker failed")
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        m = q.get_message(block=False)
        print(json.dumps({"body": m.body, "count": m.receive_count, "hook": reported}))
    """, tmp_path / "q.fs", when)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"body": "job", "count": 2, "hook": ["RuntimeError"]}


# -- 7. found by trying the product by hand --------------------------------------------

@pytest.mark.parametrize("first", ["file-queue", "db-queue"])
def test_close_in_either_order_with_a_queue_on_the_same_db(tmp_path, first):
    path = tmp_path / "q.fs"
    q = AckQueue(path=path)
    other = AckQueue(db=q.db, name="other")
    other.put("x")
    q.put("y")
    one, two = (q, other) if first == "file-queue" else (other, q)
    one.close()
    two.put("z")                                  # the second one still works
    two.close()
    assert not (tmp_path / "q.fs.lock").exists() or _unlocked(path)
    with AckQueue(path=path, name="other") as again:
        expected = ["x", "z"] if two is other else ["x"]
        assert drain(again) == expected
    with AckQueue(path=path) as again:
        assert drain(again) == (["y", "z"] if two is q else ["y"])


def _unlocked(path):
    import zc.lockfile
    lock = zc.lockfile.LockFile(str(path) + ".lock")
    lock.close()
    return True


AFTER_CLOSE = [
    ("put", lambda q: q.put(1)), ("get", lambda q: q.get()),
    ("get_nowait", lambda q: q.get_nowait()), ("qsize", lambda q: q.qsize()),
    ("empty", lambda q: q.empty()), ("full", lambda q: q.full()),
    ("counts", lambda q: q.counts()), ("stats", lambda q: q.stats()),
    ("unfinished_tasks", lambda q: q.unfinished_tasks), ("join", lambda q: q.join()),
    ("task_done", lambda q: q.task_done()), ("peek", lambda q: q.peek()),
    ("browse", lambda q: q.browse()), ("ack", lambda q: q.ack("a")),
    ("transaction", lambda q: q.transaction()), ("connect", lambda q: q.connect()),
    ("purge", lambda q: q.purge()), ("next_ready_at", lambda q: q.next_ready_at()),
]


@pytest.mark.parametrize("call", [c[1] for c in AFTER_CLOSE], ids=[c[0] for c in AFTER_CLOSE])
def test_every_method_after_close_says_closed(call):
    q = AckQueue()
    q.put("a")
    q.put("b")
    q.get()                                       # unfinished items: join would wait
    q.close()
    with pytest.raises(ValueError, match="is closed"):
        call(q)


def test_join_in_another_thread_ends_when_the_queue_closes():
    q = AckQueue()
    q.put("a")
    errors = []

    def joiner():
        try:
            q.join()
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=joiner)
    t.start()          # waiting in join() or not yet there: either way it must end
    q.close()
    t.join(BOUND)
    assert not t.is_alive() and "is closed" in str(errors[0])


def test_timeouts_as_the_standard_library_takes_them():
    import queue
    # A bounded queue: queue.Queue checks a put's timeout only when it may have to wait;
    # AckQueue refuses a blocking put's negative timeout even unbounded (a bug caught early).
    for q in (queue.Queue(maxsize=5), AckQueue(maxsize=5)):
        with pytest.raises(queue.Empty):
            q.get(block=False, timeout=-1)        # not blocking: the timeout is ignored
        with pytest.raises(queue.Empty):
            q.get(timeout=True)                   # a bool is an int: one second
        q.put("a", block=False, timeout=-1)
        q.put("b", timeout=True)
        assert q.get(block=False, timeout=-1) == "a"
        assert q.get(timeout=False) == "b"        # False: 0 s, and "b" is there
        with pytest.raises(ValueError, match="non-negative"):
            q.get(timeout=-1)
        with pytest.raises(ValueError, match="non-negative"):
            q.put("c", timeout=-1)


def test_task_done_with_nothing_held_says_what_is_wrong():
    q = AckQueue()
    for item in ("a", "b", "c"):
        q.put(item)
    with pytest.raises(ValueError) as info:
        q.task_done()
    assert "too many times" not in str(info.value)
    assert "3 unfinished" in str(info.value) and "get()" in str(info.value)
    q.get()
    q.task_done()
    q.get(), q.get()
    q.task_done(), q.task_done()
    with pytest.raises(ValueError, match="called too many times"):
        q.task_done()                            # now it really is too many


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_what_is_not_a_regular_file_is_refused_with_its_path(tmp_path, target):
    import os
    from ackqueue import NotAQueueFile
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    before = set(os.listdir(tmp_path))
    with pytest.raises(NotAQueueFile, match=f"{target!r} is not a regular file"):
        AckQueue(path=target)
    assert set(os.listdir(tmp_path)) == before


def test_an_empty_file_is_adopted_with_a_warning(tmp_path, caplog):
    # What a crash while creating a queue file (or a power cut before its first bytes
    # reached the disk) leaves: adopted, never refused, but not silently.
    import logging
    path = tmp_path / "empty.fs"
    path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="ackqueue.filestorage"):
        with AckQueue(path=path) as q:
            q.put("x")
    assert any(str(path) in r.getMessage() and "empty file" in r.getMessage()
               for r in caplog.records)
    with AckQueue(path=path) as q:
        assert drain(q) == ["x"]


def test_unreachable_server_warns_once_and_unresolvable_fails_at_once(caplog):
    import logging
    import socket
    from ackqueue import ServerUnavailable
    with pytest.raises(ServerUnavailable, match="'no-such-host.invalid' cannot be resolved"):
        AckQueue(path="zeo://no-such-host.invalid:8100?wait_timeout=30")
    with socket.socket() as s:               # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="ackqueue.zeo.client"):
        with pytest.raises(ServerUnavailable):
            AckQueue(path=f"zeo://127.0.0.1:{port}?wait_timeout=1.5")
        waiting = [r for r in caplog.records if "waiting up to" in r.getMessage()]
        assert len(waiting) == 1 and f"127.0.0.1:{port}" in waiting[0].getMessage()
        caplog.clear()
        with pytest.raises(ServerUnavailable):       # too short a wait to announce
            AckQueue(path=f"zeo://127.0.0.1:{port}?wait_timeout=0.5")
        assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]
