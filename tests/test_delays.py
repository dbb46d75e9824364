"""put(delay=...): a message invisible until the clock reaches its put time plus its delay,
then in its priority's place; bad delays refused; delays kept across a reopen.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
"""
import pytest

from ackqueue import AckQueue, Empty

from helpers_reliability import FakeClock
from queue_env import SHORT, bodies, count, counts_of, drain_messages


def test_delay_invisible_until_clock_reaches_put_time_plus_delay(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("later", delay=10)
    q.put("now")
    assert q.qsize() == 1
    assert counts_of(q) == count(ready=1, delayed=1)
    m = q.get_message(block=False)
    assert m.body == "now"
    q.ack(m)
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(timeout=SHORT)                      # the fake clock does not move meanwhile
    assert q.peek() is None
    clock.advance(9)
    with pytest.raises(Empty):
        q.get_nowait()
    assert counts_of(q) == count(delayed=1)
    clock.advance(1)                              # exactly put time + delay: visible
    assert counts_of(q) == count(ready=1)
    m = q.get_message(block=False)
    assert (m.body, m.receive_count) == ("later", 1)


def test_delayed_high_priority_goes_first_once_visible(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("a")
    q.put("urgent", priority=500, delay=5)
    q.put("b")
    clock.advance(5)
    assert bodies(drain_messages(q)) == ["urgent", "a", "b"]


@pytest.mark.parametrize("delay", [-1, -0.001, float("nan")])
def test_bad_delay_is_refused(env, delay):
    q = env.open()
    with pytest.raises(ValueError):
        q.put("x", delay=delay)
    with pytest.raises(ValueError):
        q.put_many(["x"], delay=delay)
    assert counts_of(q) == count()


def test_delay_survives_reopen(tmp_path):
    path = tmp_path / "delay.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("later", delay=30)
        q.put("now")
    with AckQueue(path=path, clock=clock) as q:
        assert counts_of(q) == count(ready=1, delayed=1)
        assert bodies(drain_messages(q)) == ["now"]
        clock.advance(29)
        assert q.peek() is None
        clock.advance(1)
        assert q.get_nowait() == "later"
