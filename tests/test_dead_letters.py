"""Dead letters: a message received max_receives times (by nacks or passed visibility
deadlines) moves to the dead-letter queue, or is dropped without one; get() can override
the policy; redrive() moves dead letters back with a fresh receive count; all of it kept
across a reopen, and a poison message that kills its consumer is dead-lettered.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts
checks deadlines itself); real waits are only short timeouts that must expire and
failure bounds.
Crashes are real child processes that SIGKILL themselves.
"""
import signal

import pytest

import ackqueue
from ackqueue import AckQueue, Empty, StaleAck

from helpers_reliability import FakeClock
from queue_env import COUNT_KEYS, bodies, count, counts_of, drain_messages, run_child


def test_dead_letter_after_max_receives_with_nacks(env):
    clock = FakeClock()
    q = env.open(shared=True, clock=clock, max_receives=2, dead_letter="dlq")
    q.put("poison")
    q.put("fine")
    first = q.get_message()
    original_seq = first.sequence_number
    first_at = clock()
    q.nack(first)
    clock.advance(1)
    second = q.get_message()
    assert (second.body, second.receive_count) == ("poison", 2)
    q.nack(second)
    clock.advance(1)
    m = q.get_message(block=False)                # the third delivery would exceed 2
    assert m.body == "fine"
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats()["dead_lettered"] == 1
    q.ack(m)
    assert counts_of(q) == count()

    dlq = env.open(name="dlq", shared=True, clock=clock)
    assert dlq.qsize() == 1
    assert counts_of(dlq) == count(ready=1)
    dead = dlq.peek()
    assert dead.body == "poison"
    assert dead.receive_count == 2
    assert dead.first_received == first_at
    assert dead.last_received == first_at + 1
    assert dead.sequence_number == original_seq
    assert dead.dead_letter_source == "default"
    assert dead.queue == "dlq"
    listing = ackqueue.queues(env.where)
    assert {k: listing["dlq"][k] for k in COUNT_KEYS} == count(ready=1)
    assert {k: listing["default"][k] for k in COUNT_KEYS} == count()


def test_dead_letter_queue_opened_right_after_the_move_sees_it(env):
    """The get that moves the message returns (Empty) before anything else touches the
    storage; a dead-letter queue opened right then must already hold the message."""
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put("poison")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 1, "the freshly opened dead-letter queue misses the moved message"
    assert dlq.peek().body == "poison"


def test_dead_letter_queue_already_open_receives_the_move(env):
    dlq = env.open(name="dlq", shared=True)
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put("poison")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    assert dlq.qsize() == 1, "the open dead-letter queue did not receive the moved message"
    m = dlq.get_message(block=False)
    assert (m.body, m.dead_letter_source) == ("poison", "default")
    assert dlq.redrive() == 0                     # in flight in the dead-letter queue
    dlq.nack(m)
    assert dlq.redrive() == 1
    back = q.get_message(block=False)             # q is open: it receives the redrive
    assert (back.body, back.receive_count) == ("poison", 1)


def test_dead_letter_receive_count_carries_on_in_the_dead_letter_queue(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put("poison")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 1
    m = dlq.get_message(block=False)
    assert m.body == "poison"
    assert m.receive_count == 2                   # kept (1), plus this delivery
    assert m.dead_letter_source == "default"
    dlq.ack(m)
    assert dlq.unfinished_tasks == 0


def test_dead_letter_after_visibility_deadlines(env):
    clock = FakeClock()
    q = env.open(shared=True, clock=clock, visibility_timeout=5, max_receives=2,
                 dead_letter="dlq")
    q.put("slow")
    m1 = q.get_message()
    clock.advance(5)
    m2 = q.get_message(block=False)
    assert m2.id == m1.id and m2.receive_count == 2
    clock.advance(5)
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(StaleAck):
        q.ack(m2)
    dlq = env.open(name="dlq", shared=True, clock=clock)
    assert dlq.qsize() == 1
    dead = dlq.peek()
    assert (dead.body, dead.receive_count, dead.dead_letter_source) == ("slow", 2, "default")
    assert dead.sequence_number == m1.sequence_number


def test_dead_letter_without_a_dead_letter_queue_drops_the_message(env):
    q = env.open(shared=True, max_receives=1)
    q.put("poison")
    q.put("fine")
    q.nack(q.get_message())
    m = q.get_message(block=False)
    assert m.body == "fine"
    q.ack(m)
    with pytest.raises(Empty):
        q.get_nowait()
    st = q.stats()
    assert st["dead_lettered"] == 1
    assert counts_of(q) == count()
    assert q.unfinished_tasks == 0
    listing = ackqueue.queues(env.where)
    assert set(listing) == {"default"}


def test_get_overrides_the_dead_letter_policy(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put("a")
    q.nack(q.get_message())
    m = q.get_message(block=False, max_receives=5)    # the override lets it through
    assert (m.body, m.receive_count) == ("a", 2)
    q.nack(m)
    # a policy given only at get time: to another dead-letter queue
    m = q.get_message(block=False, max_receives=3, dead_letter="other-dlq")
    assert m.receive_count == 3
    q.nack(m)
    with pytest.raises(Empty):
        q.get(block=False, max_receives=3, dead_letter="other-dlq")
    other = env.open(name="other-dlq", shared=True)
    assert other.qsize() == 1
    dead = other.peek()
    assert (dead.body, dead.receive_count, dead.dead_letter_source) == ("a", 3, "default")


def test_get_many_applies_the_queue_dead_letter_policy(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put_many(["a", "b", "c"])
    for m in q.get_messages(2):
        q.nack(m)
    got = q.get_messages(5, block=False)          # a and b are dead-lettered on the way
    assert bodies(got) == ["c"]
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 2
    assert bodies(drain_messages(dlq)) == ["a", "b"]
    assert q.stats()["dead_lettered"] == 2


def test_get_sets_a_dead_letter_policy_on_a_queue_without_one(env):
    q = env.open(shared=True)
    q.put("a")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_message(block=False, max_receives=1, dead_letter="dlq")
    assert q.stats()["dead_lettered"] == 1
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 1
    assert dlq.peek().body == "a"


def test_redrive_moves_dead_letters_back_with_a_fresh_receive_count(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    other = env.open(name="other", shared=True, max_receives=1, dead_letter="dlq")
    for item in ("p1", "p2"):
        q.put(item)
    other.put("o1")
    seqs = {}
    for queue_ in (q, q, other):
        m = queue_.get_message()
        seqs[m.body] = m.sequence_number
        queue_.nack(m)
    for queue_ in (q, other):
        with pytest.raises(Empty):
            queue_.get_nowait()
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 3
    assert dlq.qsize() == 3
    assert q.redrive() == 0                       # nothing dead-lettered in q itself
    assert dlq.redrive() == 3
    assert dlq.qsize() == 0 and counts_of(dlq) == count()
    back = drain_messages(q)
    assert bodies(back) == ["p1", "p2"]
    assert [m.receive_count for m in back] == [1, 1]
    assert [m.sequence_number for m in back] == [seqs["p1"], seqs["p2"]]
    assert all(m.dead_letter_source is None and m.queue == "default" for m in back)
    o = other.get_message(block=False)
    assert (o.body, o.receive_count, o.sequence_number) == ("o1", 1, seqs["o1"])
    q.ack_many(back)
    other.ack(o)
    assert q.unfinished_tasks == 0 and other.unfinished_tasks == 0


def test_redrive_leaves_dead_letters_in_flight(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put_many(["a", "b"])
    for _ in range(2):
        q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 2
    held = dlq.get_message()
    assert held.body == "a"
    assert dlq.redrive() == 1                     # only "b", the ready one
    assert q.get_nowait() == "b"
    dlq.nack(held)
    assert dlq.redrive() == 1
    m = q.get_message(block=False)
    assert (m.body, m.receive_count) == ("a", 1)


def test_redriven_message_can_be_dead_lettered_again(env):
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    q.put("x")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    dlq = env.open(name="dlq", shared=True)
    assert dlq.qsize() == 1
    seq = dlq.peek().sequence_number
    assert dlq.redrive() == 1
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    assert dlq.qsize() == 1
    dead = dlq.peek()
    assert (dead.body, dead.receive_count, dead.sequence_number) == ("x", 1, seq)
    assert q.stats()["dead_lettered"] == 2


def test_dead_letters_survive_reopen(tmp_path):
    path = tmp_path / "dlq.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock, max_receives=2, dead_letter="dlq") as q:
        q.put("poison")
        m = q.get_message()
        seq = m.sequence_number
        q.nack(m)
    # the receive count is durable: the second receive happens after a reopen
    with AckQueue(path=path, clock=clock, max_receives=2, dead_letter="dlq") as q:
        m = q.get_message()
        assert m.receive_count == 2
        q.nack(m)
    with AckQueue(path=path, clock=clock, max_receives=2, dead_letter="dlq") as q:
        with pytest.raises(Empty):
            q.get_nowait()
        assert q.stats()["dead_lettered"] == 1
    listing = ackqueue.queues(str(path))
    assert {k: listing["dlq"][k] for k in COUNT_KEYS} == count(ready=1)
    with AckQueue(path=path, name="dlq", clock=clock) as dlq:
        dead = dlq.peek()
        assert (dead.body, dead.receive_count) == ("poison", 2)
        assert (dead.sequence_number, dead.dead_letter_source) == (seq, "default")
        assert dlq.redrive() == 1
    with AckQueue(path=path, clock=clock) as q:
        m = q.get_message(block=False)
        assert (m.body, m.receive_count, m.sequence_number) == ("poison", 1, seq)


POISON_CHILD = """
    import os, signal, sys
    from ackqueue import AckQueue, Empty
    q = AckQueue(path=sys.argv[1], max_receives=2, dead_letter="dlq")
    try:
        m = q.get_message(block=False)
    except Empty:
        print("empty", flush=True)
        sys.exit(0)
    print(m.body, m.receive_count, m.sequence_number, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_poison_message_that_kills_its_consumer_is_dead_lettered(tmp_path):
    path = tmp_path / "poison.fs"
    with AckQueue(path=path) as q:
        q.put("poison")
        seq = q.peek().sequence_number
    for attempt in (1, 2):
        proc = run_child(POISON_CHILD, path)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert proc.stdout.split() == ["poison", str(attempt), str(seq)], proc.stdout
    with AckQueue(path=path, max_receives=2, dead_letter="dlq") as q:
        with pytest.raises(Empty):
            q.get(block=False)
        assert q.stats()["dead_lettered"] == 1
        with AckQueue(path=path, name="dlq") as dlq:
            dead = dlq.peek()
            assert dead is not None, "the poison message is not in the dead-letter queue"
            assert (dead.body, dead.receive_count) == ("poison", 2)
            assert (dead.sequence_number, dead.dead_letter_source) == (seq, "default")
    proc = run_child(POISON_CHILD, path)          # and a new consumer is not killed again
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "empty"
