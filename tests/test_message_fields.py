"""The fields of a Message (id, body, receive_count, sent_at, deadline, priority, queue,
attributes, first_received, last_received, sequence_number, dead_letter_source), and the
receive history kept across a reopen.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
from ackqueue import AckQueue, MessageId

from helpers_reliability import FakeClock


def test_message_fields(env):
    clock = FakeClock()
    q = env.open(name="jobs", shared=True, clock=clock)
    put_at = clock()
    q.put({"k": 1}, priority=7, attributes={"a": "b"})
    clock.advance(1)
    m = q.get_message(visibility_timeout=30)
    assert isinstance(m.id, MessageId)
    assert m.body == {"k": 1}
    assert m.receive_count == 1
    assert m.sent_at == put_at
    assert m.deadline == put_at + 31
    assert m.priority == 7
    assert m.queue == "jobs"
    assert m.attributes == {"a": "b"}
    assert m.first_received == put_at + 1
    assert m.last_received == put_at + 1
    assert m.sequence_number == int(m.id) and type(m.sequence_number) is int
    assert m.dead_letter_source is None
    q.nack(m)
    clock.advance(2)
    again = q.get_message()
    assert again.receive_count == 2
    assert again.first_received == put_at + 1
    assert again.last_received == put_at + 3
    assert again.deadline is None
    assert again.sequence_number == m.sequence_number and again.id == m.id


def test_receive_history_survives_reopen(tmp_path):
    path = tmp_path / "hist.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("x")
        first = clock()
        q.nack(q.get_message())
        clock.advance(1)
        q.get_message()                           # held at close: given back
    clock.advance(1)
    with AckQueue(path=path, clock=clock) as q:
        m = q.get_message()
        assert m.receive_count == 3
        assert m.first_received == first
        assert m.last_received == first + 2
