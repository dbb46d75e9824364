"""Named queues in one storage: each is independent of the others, and ackqueue.queues()
lists every queue with its counts, on an open storage and on a closed file.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

import ackqueue
from ackqueue import AckQueue, Empty, NotHeld

from helpers_reliability import FakeClock
from queue_env import COUNT_KEYS, bodies, count, drain_messages


def test_named_queues_in_one_storage_are_independent(env):
    a = env.open(name="a", shared=True)
    b = env.open(name="b", shared=True)
    a.put("a1")
    a.put("a2")
    b.put("b1")
    assert a.qsize() == 2 and b.qsize() == 1
    m = b.get_message(block=False)
    assert (m.body, m.queue) == ("b1", "b")
    with pytest.raises(Empty):
        b.get_nowait()
    with pytest.raises(NotHeld):
        a.ack(m)                                  # b's delivery is not a's to acknowledge
    b.ack(m)
    assert a.qsize() == 2 and a.unfinished_tasks == 2 and b.unfinished_tasks == 0
    assert bodies(drain_messages(a)) == ["a1", "a2"]


def test_queues_lists_every_queue_with_its_counts_while_open(env):
    clock = FakeClock()
    a = env.open(name="alpha", shared=True, clock=clock)
    b = env.open(name="beta", shared=True, clock=clock)
    a.put(1)
    a.put(2)
    a.put(3, delay=60)
    held = a.get_message(block=False)
    b.put("x")
    listing = ackqueue.queues(env.where)
    assert isinstance(listing, dict)
    assert set(listing) == {"alpha", "beta"}
    assert {k: listing["alpha"][k] for k in COUNT_KEYS} == count(ready=1, in_flight=1,
                                                                 delayed=1)
    assert {k: listing["beta"][k] for k in COUNT_KEYS} == count(ready=1)
    a.ack(held)
    listing = ackqueue.queues(env.where)
    assert {k: listing["alpha"][k] for k in COUNT_KEYS} == count(ready=1, delayed=1)


def test_queues_on_a_closed_file(tmp_path):
    path = tmp_path / "closed.fs"
    with AckQueue(path=path, name="jobs") as q:
        q.put("a")
        q.put("b")
        q.get()                                   # held at close: given back
    with AckQueue(path=path, name="other") as q:
        q.put("c")
    listing = ackqueue.queues(str(path))
    assert set(listing) == {"jobs", "other"}
    assert {k: listing["jobs"][k] for k in COUNT_KEYS} == count(ready=2)
    assert {k: listing["other"][k] for k in COUNT_KEYS} == count(ready=1)
    with AckQueue(path=path, name="jobs") as q:   # queues() left the file usable
        assert q.qsize() == 2
