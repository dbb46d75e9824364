"""Message ids (sequence numbers): increasing in put order and never reused, in a
dead-letter queue too, after a reopen, and after a SIGKILLed process (dedup ids too).

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.

Crashes are real child processes that SIGKILL themselves.
"""
import signal

import pytest

import ackqueue
from ackqueue import AckQueue, Empty

from helpers_reliability import FakeClock
from queue_env import bodies, drain_messages, run_child


def test_ids_increase_in_put_order_and_are_never_reused(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    seen = []
    q.put("a")
    q.put("b", priority=900)                      # delivered first, but put second
    q.put("c", delay=5)
    seen += q.put_many(["d", "e"])
    clock.advance(5)
    messages = drain_messages(q)
    by_body = {m.body: m.id for m in messages}
    order = [by_body[b] for b in "abcde"]
    assert order == sorted(order) and len(set(order)) == 5
    assert by_body["d"] == seen[0] and by_body["e"] == seen[1]
    q.ack_many(messages)
    q.put("f")
    f = q.get_message()
    assert f.id > max(order)
    q.ack(f)
    q.put("g")
    assert q.purge() == 1
    q.put("h")
    h = q.peek()
    assert h.id > f.id + 1                        # g's number was not given again
    assert h.sequence_number == int(h.id)


def test_ids_in_a_dead_letter_queue_are_never_reused(env):
    dlq = env.open(name="dlq", shared=True)
    q = env.open(shared=True, max_receives=1, dead_letter="dlq")
    dlq.put("own-1")
    q.put("moved")
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get_nowait()
    assert dlq.qsize() == 2
    dlq.put("own-2")
    messages = drain_messages(dlq)
    assert bodies(messages) == ["own-1", "moved", "own-2"]
    ids = [m.id for m in messages]
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_ids_are_never_reused_after_reopen(tmp_path):
    path = tmp_path / "seq.fs"
    with AckQueue(path=path) as q:
        ids = q.put_many(["a", "b", "c"])
        q.ack_many(q.get_messages(3))
        assert q.unfinished_tasks == 0
    with AckQueue(path=path) as q:
        q.put("d")
        m = q.get_message()
        assert m.id > max(ids)
        q.ack(m)
        q.put("e")
        assert q.purge() == 1
    with AckQueue(path=path) as q:
        q.put("f")
        assert q.peek().id > m.id + 1


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_ids_and_dedup_ids_survive_a_sigkilled_process(tmp_path):
    path = tmp_path / "killed.fs"
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        q.put_many(["a", "b", "c"])
        q.put("d", dedup_id="once")
        messages = q.get_messages(4)
        assert [m.body for m in messages] == ["a", "b", "c", "d"], messages
        q.ack_many(messages)
        print(int(max(m.id for m in messages)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    last_id = int(proc.stdout)
    with AckQueue(path=path) as q:
        assert q.qsize() == 0 and q.unfinished_tasks == 0
        with pytest.raises(ackqueue.DuplicateMessage):
            q.put("d again", dedup_id="once")
        q.put("e")
        assert q.peek().id > last_id
