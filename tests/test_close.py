"""Closing a queue: two queues on one database close in either order and the other goes
on working; every method of a closed queue says it is closed; a join() waiting in another
thread ends when the queue closes.
"""
import threading

import pytest

from ackqueue import AckQueue
from helpers_reliability import BOUND, drain_items as drain


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
