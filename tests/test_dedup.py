"""put(dedup_id=...): a second put of the same id within the queue's dedup window is refused
(DuplicateMessage), also after an ack; per queue; a rolled-back put's id is not kept; the
window is kept across a reopen.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
"""
import pytest

import ackqueue
from ackqueue import AckQueue, AckQueueError

from helpers_reliability import FakeClock
from queue_env import DEFAULT_DEDUP_WINDOW, bodies, count, counts_of, drain_messages


def test_dedup_id_refuses_a_second_put_within_the_window(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    assert issubclass(ackqueue.DuplicateMessage, AckQueueError)
    q.put("first", dedup_id="order-1")
    before = q.stats()
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("second", dedup_id="order-1")
    assert q.stats() == before                    # the queue is unchanged
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    q.put("other id", dedup_id="order-2")
    q.put("no id")
    q.put("no id")                                # no dedup_id: never a duplicate
    assert bodies(drain_messages(q)) == ["first", "other id", "no id", "no id"]


def test_dedup_holds_after_ack_and_ends_with_the_default_window(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("first", dedup_id="d")
    q.ack(q.get_message())                        # acknowledged: still a duplicate
    clock.advance(DEFAULT_DEDUP_WINDOW - 1)
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("again", dedup_id="d")
    assert q.qsize() == 0 and q.unfinished_tasks == 0
    clock.advance(2)                              # past the window
    q.put("again", dedup_id="d")
    assert q.get_nowait() == "again"
    with pytest.raises(ackqueue.DuplicateMessage):  # and the new put starts a new window
        q.put("third", dedup_id="d")


def test_dedup_window_keyword(env):
    clock = FakeClock()
    q = env.open(clock=clock, dedup_window=10)
    q.put("a", dedup_id="x")
    clock.advance(9)
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("b", dedup_id="x")
    clock.advance(2)
    q.put("b", dedup_id="x")
    assert bodies(drain_messages(q)) == ["a", "b"]


def test_dedup_is_per_queue(env):
    clock = FakeClock()
    a = env.open(name="a", shared=True, clock=clock)
    b = env.open(name="b", shared=True, clock=clock)
    a.put("in a", dedup_id="same")
    b.put("in b", dedup_id="same")
    assert a.qsize() == 1 and b.qsize() == 1


@pytest.mark.parametrize("dedup_id,exc", [("", ValueError), ("x" * 129, ValueError),
                                          (5, TypeError), (b"bytes", TypeError)])
def test_bad_dedup_id_is_refused(env, dedup_id, exc):
    q = env.open()
    with pytest.raises(exc):
        q.put("x", dedup_id=dedup_id)
    assert counts_of(q) == count()
    q.put("ok", dedup_id="y" * 128)               # 128 characters is allowed
    assert q.qsize() == 1


def test_dedup_id_of_a_rolled_back_put_is_not_kept(env):
    q = env.open()
    with pytest.raises(RuntimeError):
        with q.transaction():
            q.put("x", dedup_id="tx")
            raise RuntimeError("roll back")
    assert q.qsize() == 0
    q.put("x", dedup_id="tx")                     # the rolled-back put left no trace
    assert q.get_nowait() == "x"


def test_dedup_survives_reopen_within_the_window(tmp_path):
    path = tmp_path / "dedup.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("first", dedup_id="once")
        q.ack(q.get_message())
    clock.advance(100)
    with AckQueue(path=path, clock=clock) as q:
        with pytest.raises(ackqueue.DuplicateMessage):
            q.put("again", dedup_id="once")
        assert q.qsize() == 0
    clock.advance(DEFAULT_DEDUP_WINDOW)
    with AckQueue(path=path, clock=clock) as q:
        q.put("again", dedup_id="once")
        assert q.get_nowait() == "again"
