"""put_many: one commit for the batch, ids and delivery in order, each item with the
batch's priority, delay, retention and attributes, dedup ids aligned with the items,
and nothing put when one item cannot be pickled.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

import ackqueue
from ackqueue import AckPriorityQueue, MessageId, UnpicklableItem

from helpers_reliability import FakeClock
from queue_env import bodies, count, counts_of, drain_messages


def test_put_many_returns_ids_in_order_and_delivers_in_order(env):
    q = env.open()
    q.put("before")
    ids = q.put_many(["a", "b", "c"])
    assert isinstance(ids, list) and len(ids) == 3
    assert all(isinstance(i, MessageId) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == 3
    first = q.get_message()
    assert first.body == "before" and first.id < ids[0]
    messages = drain_messages(q)
    assert bodies(messages) == ["a", "b", "c"]
    assert [m.id for m in messages] == ids
    assert q.put_many([]) == []


def test_put_many_is_one_commit(env):
    q = env.open()
    q.put("warm-up")
    committer = q._database.committer
    before = committer.commits
    q.put_many(list(range(50)))
    assert committer.commits - before == 1
    assert q.qsize() == 51


def test_put_many_applies_priority_delay_retention_and_attributes_to_each(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("plain")
    q.put_many(["x", "y"], priority=300, delay=5, retention=100, attributes={"batch": "1"})
    assert counts_of(q) == count(ready=1, delayed=2)
    clock.advance(5)
    messages = drain_messages(q)
    assert bodies(messages) == ["x", "y", "plain"]
    assert [m.priority for m in messages] == [300, 300, 100]
    assert [m.attributes for m in messages] == [{"batch": "1"}, {"batch": "1"}, {}]
    for m in messages:
        q.nack(m)
    clock.advance(100)                            # past the batch's retention
    assert bodies(drain_messages(q)) == ["plain"]
    assert q.stats()["expired"] == 2


def test_put_many_in_a_priority_queue(env):
    q = env.open(AckPriorityQueue)
    ids = q.put_many([(3, "c"), (1, "a"), (2, "b")])
    q.put_many([(9, "z")], priority=500)
    assert bodies(drain_messages(q)) == [(9, "z"), (1, "a"), (2, "b"), (3, "c")]
    assert ids == sorted(ids)


def test_put_many_dedup_ids(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("old", dedup_id="k1")
    before = q.stats()
    with pytest.raises(ackqueue.DuplicateMessage):            # a duplicate of an earlier put
        q.put_many(["a", "b", "c"], dedup_ids=["k2", "k1", None])
    with pytest.raises(ackqueue.DuplicateMessage):            # a duplicate within the batch
        q.put_many(["a", "b", "c"], dedup_ids=["k3", None, "k3"])
    assert q.stats() == before and q.qsize() == 1             # nothing of either batch put
    # ... and the refused batches' ids were not taken:
    ids = q.put_many(["a", "b", "c"], dedup_ids=["k2", None, "k3"])
    assert len(ids) == 3
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("again", dedup_id="k3")
    assert bodies(drain_messages(q)) == ["old", "a", "b", "c"]


def test_put_many_dedup_ids_must_align_with_items(env):
    q = env.open()
    with pytest.raises((ValueError, TypeError)):
        q.put_many(["a", "b"], dedup_ids=["x"])
    assert counts_of(q) == count()


def test_put_many_dedup_ids_must_be_a_list_not_a_str(env):
    """dedup_ids is a list aligned with items; a str (a likely slip for one id) must not be
    taken as one id per character."""
    q = env.open()
    with pytest.raises((TypeError, ValueError)):
        q.put_many(["a", "b"], dedup_ids="xy")
    assert counts_of(q) == count()


@pytest.mark.parametrize("batch", [["a", lambda: 0, "c"],          # texts beside it
                                   [{"n": 1}, lambda: 0, (2, 3)]])  # all to be pickled
def test_put_many_with_an_unpicklable_item_puts_nothing(env, batch):
    q = env.open()
    with pytest.raises(UnpicklableItem, match="'function' item"):
        q.put_many(batch)
    assert counts_of(q) == count() and q.unfinished_tasks == 0
