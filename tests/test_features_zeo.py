"""The queue features through a real queue server (``ackqueue server``, the console script,
one for the module): priorities, delays, dedup, attributes, dead letters and redrive,
peek, put_many/get_many/ack_many, counts, queues() and purge.  Select them with
``-k TestZeo``.

Time is a fake clock that the tests advance; real waits are failure bounds and short
timeouts that must expire.
"""
import signal

import pytest

import ackqueue
from ackqueue import AckQueue, Empty, MessageId, NotHeld

from helpers_reliability import FakeClock
from queue_env import SHORT, COUNT_KEYS, bodies, count, counts_of
from zeo_server import Server


@pytest.fixture(scope="module")
def zeo_server(tmp_path_factory):
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("needs SIGKILL")
    d = tmp_path_factory.mktemp("zeo")
    srv = Server(d / "shared.fs", d / "server.log")
    yield srv
    srv.stop()


@pytest.fixture
def zeo(zeo_server, request):
    """open(name_suffix="", **kwargs): a queue on the server, named after the test."""
    opened = []
    base = request.node.name.replace("[", "-").replace("]", "")

    def open_(suffix="", **kwargs):
        q = AckQueue(path=zeo_server.url, name=base + suffix, **kwargs)
        opened.append(q)
        return q

    open_.url = zeo_server.url
    open_.base = base
    yield open_
    for q in reversed(opened):
        q.close()


class TestZeo:
    WAIT = 30

    def test_zeo_priority_order(self, zeo):
        q = zeo()
        for item, prio in [("a", 1), ("b", 5), ("c", 5), ("d", None), ("e", 1000)]:
            if prio is None:
                q.put(item)
            else:
                q.put(item, priority=prio)
        messages = [q.get_message(timeout=self.WAIT) for _ in range(5)]
        assert bodies(messages) == ["e", "d", "b", "c", "a"]
        assert [m.priority for m in messages] == [1000, 100, 5, 5, 1]
        with pytest.raises(ValueError):
            q.put("x", priority=1001)
        with pytest.raises(TypeError):
            q.put("x", priority=True)

    def test_zeo_delay(self, zeo):
        clock = FakeClock()
        q = zeo(clock=clock)
        q.put("later", delay=10)
        q.put("now")
        assert counts_of(q) == count(ready=1, delayed=1)
        assert q.get(timeout=self.WAIT) == "now"
        with pytest.raises(Empty):
            q.get(block=False)
        clock.advance(9)
        with pytest.raises(Empty):
            q.get(timeout=SHORT)
        clock.advance(1)
        m = q.get_message(timeout=self.WAIT)
        assert (m.body, m.receive_count) == ("later", 1)

    def test_zeo_delayed_message_is_visible_to_a_nonblocking_get_once_due(self, zeo):
        """As on memory and file queues, get(block=False) and counts() apply the clock
        themselves: once clock() reaches put time + delay the message is ready."""
        clock = FakeClock()
        q = zeo(clock=clock)
        q.put("later", delay=10)
        clock.advance(10)
        assert counts_of(q) == count(ready=1), "still counted as delayed once due"
        assert q.get(block=False) == "later"

    def test_zeo_dedup(self, zeo):
        clock = FakeClock()
        q = zeo(clock=clock, dedup_window=60)
        other = zeo("-other", clock=clock)
        q.put("first", dedup_id="d1")
        q.ack(q.get_message(timeout=self.WAIT))
        clock.advance(30)
        with pytest.raises(ackqueue.DuplicateMessage):
            q.put("second", dedup_id="d1")
        other.put("elsewhere", dedup_id="d1")     # another queue: independent
        with pytest.raises(ackqueue.DuplicateMessage):
            q.put_many(["x", "y"], dedup_ids=["d2", "d2"])
        assert q.qsize() == 0 and q.unfinished_tasks == 0
        clock.advance(31)
        q.put("second", dedup_id="d1")
        assert q.get(timeout=self.WAIT) == "second"

    def test_zeo_attributes(self, zeo):
        q = zeo()
        q.put("x", attributes={"a": "1", "b": "2"})
        q.put("y")
        x = q.get_message(timeout=self.WAIT)
        y = q.get_message(timeout=self.WAIT)
        assert x.attributes == {"a": "1", "b": "2"}
        assert y.attributes == {}
        with pytest.raises(ValueError):
            q.put("z", attributes={f"k{i}": "v" for i in range(11)})

    def test_zeo_dead_letters_via_nack_and_redrive(self, zeo):
        dlq_name = zeo.base + "-dlq"
        q = zeo(max_receives=2, dead_letter=dlq_name)
        q.put("poison")
        q.put("fine")
        first = q.get_message(timeout=self.WAIT)
        q.nack(first)
        second = q.get_message(timeout=self.WAIT)
        assert (second.body, second.receive_count) == ("poison", 2)
        q.nack(second)
        m = q.get_message(block=False)
        assert m.body == "fine"
        q.ack(m)
        with pytest.raises(Empty):
            q.get(block=False)
        assert q.stats()["dead_lettered"] == 1
        dlq = zeo("-dlq")
        dead = dlq.peek()
        assert dead is not None
        assert (dead.body, dead.receive_count) == ("poison", 2)
        assert dead.sequence_number == first.sequence_number
        assert dead.dead_letter_source == q.name
        listing = ackqueue.queues(zeo.url)
        assert {k: listing[dlq_name][k] for k in COUNT_KEYS} == count(ready=1)
        assert dlq.redrive() == 1
        back = q.get_message(timeout=self.WAIT)
        assert (back.body, back.receive_count) == ("poison", 1)
        assert back.sequence_number == first.sequence_number
        q.ack(back)

    def test_zeo_peek(self, zeo):
        q = zeo()
        assert q.peek() is None
        q.put("a")
        q.put("b", priority=500)
        p = q.peek()
        assert (p.body, p.receive_count) == ("b", 0)
        assert q.qsize() == 2 and q.peek().id == p.id
        m = q.get_message(timeout=self.WAIT)
        assert (m.id, m.receive_count) == (p.id, 1)
        assert q.peek().body == "a"

    def test_zeo_put_many_get_many_ack_many(self, zeo):
        q = zeo()
        ids = q.put_many(["a", "b", "c", "d"])
        assert len(ids) == 4 and ids == sorted(ids)
        assert all(isinstance(i, MessageId) for i in ids)
        got = q.get_many(3, timeout=self.WAIT)
        assert got == ["a", "b", "c"]
        messages = q.get_messages(5, timeout=self.WAIT)
        assert bodies(messages) == ["d"] and messages[0].id == ids[3]
        with pytest.raises(NotHeld):
            q.ack_many(got + [MessageId(10**9)])
        assert q.unfinished_tasks == 4
        q.ack_many(got + messages)
        assert q.unfinished_tasks == 0
        with pytest.raises(Empty):
            q.get_many(2, block=False)

    def test_zeo_get_many_claims_its_batch_in_shared_commits(self, zeo):
        q = zeo()
        q.put_many([f"m{i}" for i in range(20)])
        committer = q._database.committer
        before = committer.commits
        got = q.get_many(20, timeout=self.WAIT)
        assert got == [f"m{i}" for i in range(20)]
        # The first claim waits alone; the other 19 are submitted together and share
        # commits (one claim per commit would be 20).
        assert committer.commits - before <= 5
        assert counts_of(q) == count(ready=0, in_flight=20, delayed=0)
        q.ack_many(got)
        assert q.unfinished_tasks == 0

    def test_zeo_counts_and_queues(self, zeo):
        clock = FakeClock()
        q = zeo(clock=clock)
        q.put_many(["a", "b", "c"])
        q.put("later", delay=60)
        held = q.get_message(timeout=self.WAIT)
        assert counts_of(q) == count(ready=2, in_flight=1, delayed=1)
        listing = ackqueue.queues(zeo.url)
        assert {k: listing[q.name][k] for k in COUNT_KEYS} == count(ready=2, in_flight=1,
                                                                    delayed=1)
        q.ack(held)
        st = q.stats()
        assert (st["put"], st["acked"]) == (4, 1)
        assert q.purge() == 3
        assert counts_of(q) == count()
