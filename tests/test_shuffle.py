"""Shuffled gets (get(shuffle=True), get_many(shuffle=True)): not FIFO, and each message
delivered once.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from ackqueue import Empty

from queue_env import bodies


def test_shuffled_gets_are_not_fifo_and_deliver_each_message_once(env):
    q = env.open()
    n = 200
    q.put_many(list(range(n)))
    messages = [q.get_message(block=False, shuffle=True) for _ in range(n)]
    got = bodies(messages)
    q.ack_many(messages)
    assert got != list(range(n)), "shuffle=True delivered in FIFO order"
    assert sorted(got) == list(range(n)), "every message delivered exactly once"
    with pytest.raises(Empty):
        q.get(block=False, shuffle=True)
    assert q.unfinished_tasks == 0


def test_shuffled_get_and_get_many_of_items(env):
    q = env.open()
    q.put_many(list(range(100)))
    items = [q.get(shuffle=True) for _ in range(40)]
    items += q.get_many(100, shuffle=True)
    assert items[:40] != list(range(40))
    assert sorted(items) == list(range(100))
    q.ack_many(items)
    assert q.unfinished_tasks == 0
