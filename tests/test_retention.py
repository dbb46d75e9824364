"""Retention: a message not processed within its queue's (or its put's) retention is never
delivered and leaves the counts; one in flight can still be acknowledged, and is removed
if given back; defaults, limits, and retention kept across a reopen.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
One bounded wait is for the retention sweep of the reaper thread.
"""
import time

import pytest

from ackqueue import AckQueue, Empty

from helpers_reliability import FakeClock
from queue_env import (BOUND, SHORT, DEFAULT_RETENTION, MAX_RETENTION, bodies, count,
                       counts_of, drain_messages)


def test_retention_expires_an_unprocessed_message(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("short", retention=10)
    q.put("long")
    clock.advance(9)
    assert q.peek().body == "short"
    clock.advance(2)
    assert q.peek().body == "long"                # never delivered (nor shown) again
    assert bodies(drain_messages(q)) == ["long"]
    assert q.stats()["expired"] == 1


def test_a_batch_past_its_retention_is_never_delivered_and_the_rest_is(env):
    """put_many's messages, kept in memory as a batch until received: peek shows them,
    a get_many stops at the first one past its retention, and only the live ones are
    delivered, redelivered after a nack, and acknowledged."""
    clock = FakeClock()
    q = env.open(clock=clock)
    ids = q.put_many(["a", "b", "c"], retention=10)
    q.put_many(["d", "e"])
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert q.peek().body == "a"
    clock.advance(11)
    assert q.peek().body == "d"
    got = q.get_many(10, timeout=SHORT)
    assert got == ["d", "e"]
    q.nack(got[0])
    again = q.get_messages(10, timeout=SHORT)
    assert [(m.body, m.receive_count) for m in again] == [("d", 2)]
    q.ack_many(again + [got[1]])
    assert counts_of(q) == count()
    stats = q.stats()
    assert (stats["expired"], stats["acked"], stats["redelivered"]) == (3, 2, 1)


def test_expired_messages_leave_the_counts_at_the_next_sweep(env):
    """A message past its retention is never delivered; counts drop it at the next sweep
    (at most a minute apart; the queue's own clock moving a minute on triggers one)."""
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("short", retention=10)
    q.put("long")
    clock.advance(9)
    assert q.qsize() == 2
    clock.advance(61)
    end = time.monotonic() + BOUND
    while q.qsize() != 1:            # the reaper thread sweeps within a second
        assert time.monotonic() < end, "no sweep removed the expired message"
        time.sleep(0.01)
    assert counts_of(q) == count(ready=1)
    assert q.stats()["expired"] == 1
    assert bodies(drain_messages(q)) == ["long"]


def test_retention_default_is_four_days(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("a")
    clock.advance(DEFAULT_RETENTION - 1)
    assert q.peek().body == "a"
    clock.advance(2)
    assert q.peek() is None
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats()["expired"] == 1


def test_retention_of_the_queue_and_per_put_override(env):
    clock = FakeClock()
    q = env.open(clock=clock, retention=60)
    q.put("queue-default")
    q.put("longer", retention=120)
    q.put("shorter", retention=30)
    clock.advance(31)                             # "shorter" expired
    assert q.peek().body == "queue-default"
    clock.advance(30)                             # 61 s: "queue-default" expired
    assert q.peek().body == "longer"
    clock.advance(60)                             # 121 s: "longer" expired
    assert q.peek() is None
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats()["expired"] == 3


def test_a_put_without_options_uses_the_queue_retention_in_force(env):
    """A put without options reuses one PutOptions, made again when the queue's
    retention or dedup window was changed since."""
    clock = FakeClock()
    q = env.open(clock=clock, retention=60)
    q.put("first")
    q.retention = 30.0
    q.put("second")
    clock.advance(31)                             # "second" expired, "first" not
    assert [m.body for m in (q.get_message(block=False),)] == ["first"]
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats()["expired"] == 1


def test_retention_of_a_delayed_message_counts_from_put_time(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("never", delay=20, retention=10)
    clock.advance(21)
    with pytest.raises(Empty):
        q.get_nowait()
    assert counts_of(q) == count()
    assert q.stats()["expired"] == 1


def test_in_flight_message_past_retention_can_still_be_acked(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("job", retention=10)
    m = q.get_message()
    clock.advance(20)
    q.ack(m)
    st = q.stats()
    assert st["acked"] == 1 and st["expired"] == 0
    assert q.unfinished_tasks == 0


@pytest.mark.parametrize("how", ["nack", "deadline"])
def test_in_flight_message_given_back_after_retention_is_removed(env, how):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("job", retention=10)
    q.put("other", retention=1000)
    m = q.get_message(visibility_timeout=15 if how == "deadline" else None)
    assert m.body == "job"
    clock.advance(15)
    if how == "nack":
        q.nack(m)
    assert q.qsize() == 1
    assert bodies(drain_messages(q)) == ["other"]
    assert q.stats()["expired"] == 1
    assert counts_of(q) == count(in_flight=1)     # "other" is held now


def test_retention_survives_reopen(tmp_path):
    path = tmp_path / "retention.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("short", retention=10)
        q.put("long", retention=100)
    clock.advance(11)
    with AckQueue(path=path, clock=clock) as q:
        assert bodies(drain_messages(q)) == ["long"]
        assert q.stats()["expired"] == 1


@pytest.mark.parametrize("retention", [0, -1, MAX_RETENTION + 0.5, 10**9, float("nan")])
def test_bad_retention_is_refused(env, retention):
    q = env.open()
    with pytest.raises(ValueError):
        q.put("x", retention=retention)
    with pytest.raises(ValueError):
        q.put_many(["x"], retention=retention)
    assert counts_of(q) == count()
    q.put("ok", retention=MAX_RETENTION)
    assert q.qsize() == 1
