"""put(priority=...): higher levels first, FIFO (or LIFO) within a level, a nack back to its
place in its level, AckPriorityQueue ordering by level then item value, bad priorities
refused, and the order kept across a reopen.  put() itself returns None.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from ackqueue import AckLifoQueue, AckPriorityQueue, AckQueue, QueueKindMismatch

from queue_env import bodies, drain_messages


def test_put_returns_none(env):
    q = env.open()
    assert q.put("x") is None
    assert q.put("y", True, None, priority=5, delay=0, retention=None, dedup_id=None,
                 attributes=None) is None


def test_priority_higher_first_fifo_within_a_level(env):
    q = env.open()
    for item, prio in [("a", 1), ("b", 5), ("c", 5), ("d", 1), ("e", None), ("f", 1000),
                       ("g", 0)]:
        if prio is None:
            q.put(item)                           # the default priority is 100
        else:
            q.put(item, priority=prio)
    messages = drain_messages(q)
    assert bodies(messages) == ["f", "e", "b", "c", "a", "d", "g"]
    assert [m.priority for m in messages] == [1000, 100, 5, 5, 1, 1, 0]


def test_priority_nack_returns_to_its_place_in_its_level(env):
    q = env.open()
    q.put("low", priority=1)
    q.put("h1", priority=9)
    q.put("h2", priority=9)
    m = q.get_message()
    assert m.body == "h1"
    q.nack(m)
    again = q.get_message(block=False)
    assert (again.body, again.receive_count, again.priority) == ("h1", 2, 9)
    assert bodies(drain_messages(q)) == ["h2", "low"]


@pytest.mark.parametrize("make_lifo", ["class", "keyword"])
def test_priority_in_a_lifo_queue_is_lifo_within_a_level(env, make_lifo):
    q = env.open(AckLifoQueue) if make_lifo == "class" else env.open(lifo=True)
    q.put("a", priority=100)
    q.put("b", priority=100)
    q.put("c", priority=200)
    q.put("d", priority=200)
    q.put("e", priority=50)
    assert bodies(drain_messages(q)) == ["d", "c", "b", "a", "e"]


def test_lifo_keyword_is_the_same_queue_kind_as_ack_lifo_queue(tmp_path):
    path = tmp_path / "lifo.fs"
    with AckLifoQueue(path=path) as q:
        for i in (1, 2, 3):
            q.put(i)
    with AckQueue(path=path, lifo=True) as q:     # no QueueKindMismatch: the same kind
        assert [q.get_nowait() for _ in range(3)] == [3, 2, 1]
    with pytest.raises(QueueKindMismatch):
        AckQueue(path=path)                       # but it is not a FIFO queue


def test_priority_queue_orders_by_level_then_item_value(env):
    q = env.open(AckPriorityQueue)
    q.put((2, "b"), priority=5)
    q.put((1, "a"), priority=1)
    q.put((3, "c"), priority=5)
    q.put((0, "z"), priority=1)
    q.put((9, "top"), priority=7)
    assert bodies(drain_messages(q)) == [(9, "top"), (2, "b"), (3, "c"), (0, "z"), (1, "a")]


@pytest.mark.parametrize("prio,exc", [(-1, ValueError), (1001, ValueError),
                                      (10**6, ValueError), (1.0, TypeError),
                                      ("5", TypeError), (True, TypeError),
                                      (False, TypeError), (None, TypeError)])
def test_bad_priority_is_refused_and_nothing_is_put(env, prio, exc):
    q = env.open()
    q.put("kept")
    with pytest.raises(exc):
        q.put("x", priority=prio)
    with pytest.raises(exc):
        q.put_many(["y", "z"], priority=prio)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    assert bodies(drain_messages(q)) == ["kept"]


def test_priority_survives_reopen(tmp_path):
    path = tmp_path / "prio.fs"
    with AckQueue(path=path) as q:
        q.put("low", priority=1)
        q.put("mid")
        q.put("high", priority=900)
        q.put("mid2")
        held = q.get_message()                    # "high", held at close: given back
        assert held.body == "high"
    with AckQueue(path=path) as q:
        messages = drain_messages(q)
        assert bodies(messages) == ["high", "mid", "mid2", "low"]
        assert [m.priority for m in messages] == [900, 100, 100, 1]


def test_priority_queue_order_survives_reopen(tmp_path):
    path = tmp_path / "pq.fs"
    with AckPriorityQueue(path=path) as q:
        q.put_many([5, 3, 9])
        q.put(1, priority=1)
        q.put(7, priority=200)
    with AckPriorityQueue(path=path) as q:
        assert q.peek().body == 7
        assert bodies(drain_messages(q)) == [7, 3, 5, 9, 1]
