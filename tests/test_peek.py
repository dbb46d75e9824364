"""peek(): the next message a get would receive, without side effects, following priority
and leaving out delayed and in-flight messages, in LIFO and priority queues too; a peeked
message cannot be acknowledged.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from ackqueue import AckLifoQueue, AckPriorityQueue, Message, NotHeld

from helpers_reliability import FakeClock
from queue_env import counts_of


def test_peek_has_no_side_effects(env):
    q = env.open()
    assert q.peek() is None
    q.put("a", attributes={"x": "y"})
    q.put("b", priority=50)
    before = (q.qsize(), counts_of(q), q.stats(), q.unfinished_tasks)
    p = q.peek()
    assert isinstance(p, Message)
    assert (p.body, p.receive_count, p.attributes, p.priority) == ("a", 0, {"x": "y"}, 100)
    again = q.peek()
    assert (again.id, again.body, again.receive_count) == (p.id, "a", 0)
    assert (q.qsize(), counts_of(q), q.stats(), q.unfinished_tasks) == before
    m = q.get_message()
    assert m.id == p.id and m.receive_count == 1
    assert q.peek().body == "b"
    q.nack(m)
    p = q.peek()
    assert (p.id, p.receive_count) == (m.id, 1)   # the receives so far, unchanged by peek
    assert q.get_message().receive_count == 2


def test_peek_follows_priority_and_ignores_delayed_and_in_flight(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("hidden", priority=900, delay=10)
    q.put("low", priority=1)
    q.put("high", priority=500)
    assert q.peek().body == "high"
    held = q.get_message()
    assert q.peek().body == "low"
    clock.advance(10)
    assert q.peek().body == "hidden"
    q.nack(held)
    assert q.peek().body == "hidden"
    assert q.qsize() == 3


def test_peek_in_lifo_and_priority_queues(env):
    lifo = env.open(AckLifoQueue, name="lifo", shared=True)
    lifo.put("first")
    lifo.put("last")
    assert lifo.peek().body == "last"
    assert lifo.get() == "last"
    prio = env.open(AckPriorityQueue, name="prio", shared=True)
    prio.put(5)
    prio.put(2)
    prio.put(9, priority=1)
    assert prio.peek().body == 2
    assert prio.get() == 2


def test_peeked_message_cannot_be_acknowledged(env):
    q = env.open()
    q.put("a")
    p = q.peek()
    with pytest.raises(NotHeld):
        q.ack(p)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
