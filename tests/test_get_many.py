"""get_many, get_messages and ack_many: up to n messages in order (newest first in a LIFO
queue), each handed out for its own ack, raw bytes on request, messages past their
retention stepped over, a batch interrupted while reading left ready, waiting for at least
one; ack_many of items, messages and ids in one commit, all or nothing.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
"""
import threading

import pytest

from ackqueue import AckLifoQueue, AckQueue, Empty, Message, NotHeld, StaleAck

from helpers_reliability import FakeClock
from queue_env import BOUND, SHORT, bodies, count, counts_of


def test_get_many_returns_up_to_n_in_order(env):
    q = env.open()
    q.put_many(["a", "b", "c", "d", "e"])
    first = q.get_many(3)
    assert first == ["a", "b", "c"]
    assert q.qsize() == 2 and q.unfinished_tasks == 5
    rest = q.get_many(10)
    assert rest == ["d", "e"]
    with pytest.raises(Empty):
        q.get_many(3, block=False)
    with pytest.raises(Empty):
        q.get_many(3, timeout=SHORT)
    q.ack_many(first + rest)
    assert q.unfinished_tasks == 0


def test_get_messages_returns_messages(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    ids = q.put_many(["a", "b", "c"])
    messages = q.get_messages(2, visibility_timeout=5)
    assert all(isinstance(m, Message) for m in messages)
    assert bodies(messages) == ["a", "b"]
    assert [m.id for m in messages] == ids[:2]
    assert [m.receive_count for m in messages] == [1, 1]
    assert all(m.deadline == clock() + 5 for m in messages)
    clock.advance(5)                              # both given back at their deadline
    assert q.qsize() == 3
    again = q.get_messages(5)
    assert bodies(again) == ["a", "b", "c"]
    assert [m.receive_count for m in again] == [2, 2, 1]
    with pytest.raises(StaleAck):
        q.ack(messages[0])


@pytest.mark.parametrize("items", [
    [{"n": i} for i in range(20)],                      # distinct objects: one pass
    [None, 7, 7, None, "x", b"y", {"n": 1}, 3.5],       # shared ones, texts, bytes
], ids=["distinct", "shared"])
def test_get_many_hands_out_each_item_for_its_own_ack(env, items):
    """Every item of a batch is held by its own delivery, whichever way the batch was
    handed out: acking them by identity, one by one, acks each message once."""
    q = env.open()
    q.put_many(items)
    got = q.get_many(len(items), timeout=SHORT)
    assert got == items
    for item in got:
        q.ack(item)
    with pytest.raises(NotHeld):
        q.ack(got[-1])
    assert counts_of(q) == count() and q.stats()["acked"] == len(items)


def test_get_many_raw_hands_out_the_stored_bytes(env):
    import pickle
    q = env.open()
    q.put_many([{"n": 1}, {"n": 2}, {"n": 3}])
    got = q.get_messages(3, timeout=SHORT, raw=True)
    assert [pickle.loads(m.body) for m in got] == [{"n": 1}, {"n": 2}, {"n": 3}]
    q.ack_many(got)
    assert counts_of(q) == count()


def test_get_many_steps_over_a_message_past_its_retention_in_its_batch(env):
    """A get_many takes its batch in one pass, which stops at a message past its
    retention: that one is taken out (expired), and the batch goes on after it."""
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put_many(["a", "b"])
    q.put("short", retention=10)
    q.put_many(["c", "d"])
    clock.advance(11)
    got = q.get_messages(10)
    assert bodies(got) == ["a", "b", "c", "d"]
    assert [m.receive_count for m in got] == [1, 1, 1, 1]
    assert q.stats()["expired"] == 1 and q.unfinished_tasks == 4
    q.ack_many(got)
    assert q.unfinished_tasks == 0


def test_a_get_many_interrupted_while_reading_leaves_its_whole_batch_ready(tmp_path):
    """A KeyboardInterrupt (any BaseException) while a get_many reads a message from the
    store, after it took others, delivers nothing: what it took goes back to its place,
    as a batch that cannot be handed out does (each taken message counted as received
    once more), and the message it could not read stays ready, uncounted."""
    path = tmp_path / "q.fs"
    with AckQueue(path=path) as q:
        ids = q.put_many(["a", "b", "c", "d"])
        q.nack(q.get())                           # "a": in memory as a received message
        arbiter = q._state.arbiter
        arbiter.meta.pop(int(ids[2]))             # "c": read from the store when taken
        own = q._conn()

        def interrupted(seq):
            raise KeyboardInterrupt
        own.load_meta = interrupted
        with pytest.raises(KeyboardInterrupt):
            q.get_many(10)
        del own.load_meta
        assert counts_of(q) == count(ready=4)
        got = q.get_messages(10, timeout=SHORT)
        assert bodies(got) == ["a", "b", "c", "d"]
        assert [m.receive_count for m in got] == [3, 2, 1, 1]
        q.ack_many(got)
        assert counts_of(q) == count()


def test_get_many_of_a_backlog_left_by_an_earlier_process(tmp_path):
    """Messages put before the queue was reopened are read from the store (not from
    this process's memory), batch after batch, in order."""
    path = tmp_path / "q.fs"
    with AckQueue(path=path) as q:
        q.put_many(range(150))
    with AckQueue(path=path) as q:
        first = q.get_messages(120)
        assert bodies(first) == list(range(120))
        assert [m.receive_count for m in first] == [1] * 120
        q.ack_many(first)
        assert q.get_many(100) == list(range(120, 150))
    with AckQueue(path=path) as q:
        assert q.qsize() == 30                  # the second batch was never acknowledged


def test_a_lifo_get_many_takes_the_newest_first(env):
    q = env.open(AckLifoQueue)
    q.put_many(range(5))
    assert q.get_many(3) == [4, 3, 2]
    assert q.get_many(3) == [1, 0]


def test_get_many_waits_for_at_least_one(env):
    q = env.open()
    result = {}
    started = threading.Event()

    def getter():
        started.set()
        try:
            result["items"] = q.get_many(5, timeout=BOUND)
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            result["items"] = exc

    t = threading.Thread(target=getter)
    t.start()
    assert started.wait(BOUND)
    q.put("wake")
    t.join(BOUND)
    assert not t.is_alive()
    assert result["items"] == ["wake"]


def test_ack_many_accepts_items_messages_and_ids_in_one_commit(env):
    q = env.open()
    q.put_many([["a"], ["b"], ["c"], ["d"]])
    item = q.get()
    m1 = q.get_message()
    m2 = q.get_message()
    committer = q._database.committer
    before = committer.commits
    q.ack_many([item, m1, m2.id])
    assert committer.commits - before == 1
    assert q.unfinished_tasks == 1
    st = q.stats()
    assert st["acked"] == 3
    assert counts_of(q) == count(ready=1)


def test_ack_many_is_all_or_nothing_when_one_is_not_held(env):
    q = env.open()
    q.put_many(["a", "b", "c"])
    ma, mb, mc = q.get_messages(3)
    q.ack(ma)
    with pytest.raises(NotHeld):
        q.ack_many([mb, ma, mc])                  # ma is already acknowledged
    assert q.unfinished_tasks == 2
    assert counts_of(q) == count(in_flight=2)
    q.ack(mb)                                     # both still held: neither was acked
    q.ack(mc)
    assert q.unfinished_tasks == 0


def test_ack_many_is_all_or_nothing_when_one_is_stale(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put_many(["a", "b", "c"])
    stale = q.get_message(visibility_timeout=5)
    live = q.get_messages(2)
    clock.advance(5)
    assert q.qsize() == 1                         # "a" was given back
    with pytest.raises(StaleAck):
        q.ack_many(live + [stale])
    assert q.unfinished_tasks == 3
    assert counts_of(q) == count(ready=1, in_flight=2)
    q.ack_many(live)
    assert q.unfinished_tasks == 1
