"""counts(), stats() and purge(): ready, in-flight and delayed counts and the queue's
cumulative statistics, kept across a reopen; purge removes ready, delayed and in-flight
messages, and a purged in-flight message never comes back.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from ackqueue import AckQueue, Empty, StaleAck

from helpers_reliability import FakeClock
from queue_env import STATS_KEYS, count, counts_of


def test_counts_and_stats(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    assert counts_of(q) == count()
    st = q.stats()
    assert set(STATS_KEYS) <= set(st)
    assert {k: st[k] for k in STATS_KEYS} == dict.fromkeys(STATS_KEYS, 0)
    q.put_many(["a", "b", "c"])
    q.put("d", delay=10)
    m = q.get_message()
    assert counts_of(q) == count(ready=2, in_flight=1, delayed=1)
    q.nack(m)
    m = q.get_message()
    assert m.receive_count == 2
    q.ack(m)
    n = q.get_message(visibility_timeout=1)
    clock.advance(1)
    assert counts_of(q) == count(ready=2, delayed=1)
    n2 = q.get_message()
    assert n2.id == n.id
    q.ack(n2)
    st = q.stats()
    assert {k: st[k] for k in STATS_KEYS} == {
        "ready": 1, "in_flight": 0, "delayed": 1, "put": 4, "acked": 2,
        "redelivered": 2, "dead_lettered": 0, "expired": 0}
    clock.advance(10)
    assert counts_of(q) == count(ready=2)


def test_stats_survive_reopen(tmp_path):
    path = tmp_path / "stats.fs"
    with AckQueue(path=path) as q:
        q.put_many([1, 2, 3])
        q.ack(q.get_message())
        q.nack(q.get_message())
    with AckQueue(path=path) as q:
        st = q.stats()
        assert (st["put"], st["acked"], st["ready"], st["in_flight"]) == (3, 1, 2, 0)


def test_purge_removes_ready_delayed_and_in_flight_messages(env):
    """As SQS's PurgeQueue: in-flight deliveries end too; their late acks and
    give-backs are refused as stale."""
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put_many(["a", "b", "c", "d"])
    held = q.get_message()
    q.put("e", delay=10)
    assert q.purge() == 5
    assert q.qsize() == 0
    assert counts_of(q) == count()
    assert q.unfinished_tasks == 0
    clock.advance(10)
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(StaleAck, match="purged"):
        q.ack(held)
    with pytest.raises(StaleAck):
        q.nack(held)
    assert q.stats()["purged"] == 5
    assert q.purge() == 0
    q.put("f")
    assert q.get_message().id > held.id


def test_purge_ends_an_in_flight_message_so_it_never_comes_back(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put_many(["a", "b"])
    q.get_message(visibility_timeout=5)
    assert q.purge() == 2
    clock.advance(6)                              # past the purged delivery's deadline
    with pytest.raises(Empty):
        q.get_nowait()
    q.put("c")
    m = q.get_message(block=False)
    assert (m.body, m.receive_count) == ("c", 1)
    q.ack(m)
    q.join()                                      # nothing is left unacknowledged


def test_purge_survives_reopen(tmp_path):
    path = tmp_path / "purge.fs"
    with AckQueue(path=path) as q:
        q.put_many(["a", "b", "c"])
        assert q.purge() == 3
    with AckQueue(path=path) as q:
        assert q.qsize() == 0 and counts_of(q) == count() and q.unfinished_tasks == 0
