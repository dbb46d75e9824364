"""change_visibility(): extends, sets or shortens a delivery's deadline (by message, item or
id); zero or less gives it back now; a stale or unheld delivery is refused.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
"""
import pytest

from ackqueue import MessageId, NotHeld, StaleAck

from helpers_reliability import FakeClock
from queue_env import count, counts_of


@pytest.mark.parametrize("form", ["message", "item", "id"])
def test_change_visibility_extends_the_deadline(env, form):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put(["job"])
    m = q.get_message(visibility_timeout=10)
    ref = {"message": m, "item": m.body, "id": m.id}[form]
    clock.advance(5)
    q.change_visibility(ref, 30)                  # new deadline: now + 30 = start + 35
    clock.advance(6)                              # past the old deadline (start + 11)
    assert q.qsize() == 0
    assert counts_of(q) == count(in_flight=1)
    clock.advance(23)                             # start + 34
    assert q.qsize() == 0
    clock.advance(1)                              # start + 35
    assert q.qsize() == 1
    again = q.get_message(block=False)
    assert again.id == m.id and again.receive_count == 2
    with pytest.raises(StaleAck):
        q.ack(m)
    q.ack(again)


def test_change_visibility_sets_a_deadline_where_there_was_none(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("job")
    m = q.get_message()
    assert m.deadline is None
    q.change_visibility(m, 10)
    clock.advance(9)
    assert q.qsize() == 0
    clock.advance(1)
    assert q.qsize() == 1


def test_change_visibility_can_shorten_the_deadline(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("job")
    m = q.get_message(visibility_timeout=100)
    q.change_visibility(m, 2)
    clock.advance(2)
    assert q.qsize() == 1


@pytest.mark.parametrize("seconds", [0, -1])
def test_change_visibility_to_zero_gives_back_now(env, seconds):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("a")
    q.put("b")
    m = q.get_message(visibility_timeout=60)
    q.change_visibility(m, seconds)
    assert q.qsize() == 2
    assert counts_of(q) == count(ready=2)
    again = q.get_message(block=False)
    assert (again.body, again.receive_count) == ("a", 2)     # at its original place
    with pytest.raises(NotHeld):
        q.ack(m)
    q.ack(again)


def test_change_visibility_of_a_stale_or_unheld_delivery(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("a")
    m = q.get_message(visibility_timeout=5)
    clock.advance(5)
    assert q.qsize() == 1                         # given back at its deadline
    with pytest.raises(StaleAck):
        q.change_visibility(m, 30)
    assert q.qsize() == 1
    with pytest.raises(NotHeld):
        q.change_visibility(MessageId(99999), 30)
    again = q.get_message(block=False)
    q.ack(again)
    with pytest.raises(NotHeld):
        q.change_visibility(again, 30)            # acknowledged
