"""The queue features beyond queue.Queue: named queues, priorities, delays, retention,
deduplication, attributes, batches (put_many/get_many/ack_many), shuffled gets, dead
letters and redrive, peek, change_visibility, counts/stats/purge and sequence numbers.

Each point runs on a memory queue and a file queue (the ``env`` fixture), with reopen checks
for the file where persistence matters, and a smaller group runs through a real queue
server (select it with ``-k zeo``).

Deterministic: time is a fake clock that the tests advance (every get/qsize/counts checks
deadlines itself); real waits are only short timeouts that must expire, failure bounds, and
one bounded wait for the retention sweep of the reaper thread.
Crashes are real child processes that SIGKILL themselves.
"""
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import ZODB
from ZODB.MappingStorage import MappingStorage

import ackqueue
from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, AckQueueError, Empty,
                      Message, MessageId, NotHeld, QueueKindMismatch, StaleAck,
                      UnpicklableItem)

from zeo_server import Server
from helpers_reliability import FakeClock

BOUND = 5               # failure bound for waits that should end at once
CHILD_TIMEOUT = 60      # failure bound for a child process
SHORT = 0.05            # a real timeout that is expected to expire

DAY = 86400
DEFAULT_RETENTION = 4 * DAY
MAX_RETENTION = 14 * DAY
DEFAULT_DEDUP_WINDOW = 300
COUNT_KEYS = ("ready", "in_flight", "delayed")
STATS_KEYS = COUNT_KEYS + ("put", "acked", "redelivered", "dead_lettered", "expired")


# -- fixtures -----------------------------------------------------------------------------

class Env:
    """Queues on one backend.

    open(...) makes a queue: on the file backend always on the test's file; on the memory
    backend an independent in-memory queue (path=None), or, with shared=True, a queue in
    the test's one in-memory ZODB.DB, so that several named queues share a storage.
    ``where`` is what ackqueue.queues() takes for that storage."""

    def __init__(self, backend, tmp_path):
        self.backend = backend
        self.path = tmp_path / "q.fs"
        self.opened = []
        self._db = None

    @property
    def is_file(self):
        return self.backend == "file"

    @property
    def db(self):
        if self._db is None:
            self._db = ZODB.DB(MappingStorage())
        return self._db

    @property
    def where(self):
        return str(self.path) if self.is_file else self.db

    def open(self, cls=AckQueue, maxsize=0, *, shared=False, **kwargs):
        if self.is_file:
            kwargs.setdefault("path", self.path)
        elif shared:
            kwargs.setdefault("db", self.db)
        q = cls(maxsize, **kwargs)
        self.opened.append(q)
        return q

    def close_all(self):
        for q in reversed(self.opened):
            q.close()
        self.opened = []

    def teardown(self):
        self.close_all()
        if self._db is not None:
            self._db.close()


@pytest.fixture(params=["memory", "file"])
def env(request, tmp_path):
    e = Env(request.param, tmp_path)
    yield e
    e.teardown()


def drain_messages(q):
    got = []
    while True:
        try:
            got.append(q.get_message(block=False))
        except Empty:
            return got


def bodies(messages):
    return [m.body for m in messages]


def counts_of(q):
    c = q.counts()
    return {k: c[k] for k in COUNT_KEYS}


def count(ready=0, in_flight=0, delayed=0):
    return {"ready": ready, "in_flight": in_flight, "delayed": delayed}


def run_child(script, *args):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)


# == 1. named queues and ackqueue.queues() =================================================

def test_named_queues_in_one_storage_are_independent(env):
    a = env.open(name="a", shared=True)
    b = env.open(name="b", shared=True)
    a.put("a1")
    a.put("a2")
    b.put("b1")
    assert a.qsize() == 2 and b.qsize() == 1
    m = b.get_message(block=False)
    assert (m.body, m.queue) == ("b1", "b")
    with pytest.raises(Empty):
        b.get_nowait()
    with pytest.raises(NotHeld):
        a.ack(m)                                  # b's delivery is not a's to acknowledge
    b.ack(m)
    assert a.qsize() == 2 and a.unfinished_tasks == 2 and b.unfinished_tasks == 0
    assert bodies(drain_messages(a)) == ["a1", "a2"]


def test_queues_lists_every_queue_with_its_counts_while_open(env):
    clock = FakeClock()
    a = env.open(name="alpha", shared=True, clock=clock)
    b = env.open(name="beta", shared=True, clock=clock)
    a.put(1)
    a.put(2)
    a.put(3, delay=60)
    held = a.get_message(block=False)
    b.put("x")
    listing = ackqueue.queues(env.where)
    assert isinstance(listing, dict)
    assert set(listing) == {"alpha", "beta"}
    assert {k: listing["alpha"][k] for k in COUNT_KEYS} == count(ready=1, in_flight=1,
                                                                 delayed=1)
    assert {k: listing["beta"][k] for k in COUNT_KEYS} == count(ready=1)
    a.ack(held)
    listing = ackqueue.queues(env.where)
    assert {k: listing["alpha"][k] for k in COUNT_KEYS} == count(ready=1, delayed=1)


def test_queues_on_a_closed_file(tmp_path):
    path = tmp_path / "closed.fs"
    with AckQueue(path=path, name="jobs") as q:
        q.put("a")
        q.put("b")
        q.get()                                   # held at close: given back
    with AckQueue(path=path, name="other") as q:
        q.put("c")
    listing = ackqueue.queues(str(path))
    assert set(listing) == {"jobs", "other"}
    assert {k: listing["jobs"][k] for k in COUNT_KEYS} == count(ready=2)
    assert {k: listing["other"][k] for k in COUNT_KEYS} == count(ready=1)
    with AckQueue(path=path, name="jobs") as q:   # queues() left the file usable
        assert q.qsize() == 2


# == constructor ===========================================================================

def test_constructor_accepts_every_new_keyword(env):
    q = env.open(name="main", shared=True, lifo=False, max_receives=3, dead_letter="dlq",
                 retention=60, dedup_window=10, autopack=None, clock=FakeClock())
    q.put("x")
    assert q.get() == "x"


@pytest.mark.parametrize("kwargs,exc", [
    ({"retention": MAX_RETENTION + 1}, ValueError),
    ({"retention": 0}, ValueError),
    ({"retention": -5}, ValueError),
    ({"max_receives": 0}, ValueError),
    ({"max_receives": -1}, ValueError),
    ({"max_receives": "2"}, (TypeError, ValueError)),
    ({"max_receives": 1.5}, (TypeError, ValueError)),
    ({"dead_letter": "default"}, ValueError),                 # its own name
    ({"name": "jobs", "dead_letter": "jobs"}, ValueError),
])
def test_constructor_rejects_bad_policies(env, kwargs, exc):
    with pytest.raises(exc):
        env.open(**kwargs)


def test_constructor_accepts_the_longest_retention(env):
    q = env.open(retention=MAX_RETENTION)
    q.put("x")
    assert q.qsize() == 1


# == 2. put: priority ======================================================================

def test_put_returns_none(env):
    q = env.open()
    assert q.put("x") is None
    assert q.put("y", True, None, priority=5, delay=0, retention=None, dedup_id=None,
                 attributes=None) is None


def test_priority_higher_first_fifo_within_a_level(env):
    q = env.open()
    for item, prio in [("a", 1), ("b", 5), ("c", 5), ("d", 1), ("e", None), ("f", 1000),
                       ("g", 0)]:
        if prio is None:
            q.put(item)                           # the default priority is 100
        else:
            q.put(item, priority=prio)
    messages = drain_messages(q)
    assert bodies(messages) == ["f", "e", "b", "c", "a", "d", "g"]
    assert [m.priority for m in messages] == [1000, 100, 5, 5, 1, 1, 0]


def test_priority_nack_returns_to_its_place_in_its_level(env):
    q = env.open()
    q.put("low", priority=1)
    q.put("h1", priority=9)
    q.put("h2", priority=9)
    m = q.get_message()
    assert m.body == "h1"
    q.nack(m)
    again = q.get_message(block=False)
    assert (again.body, again.receive_count, again.priority) == ("h1", 2, 9)
    assert bodies(drain_messages(q)) == ["h2", "low"]


@pytest.mark.parametrize("make_lifo", ["class", "keyword"])
def test_priority_in_a_lifo_queue_is_lifo_within_a_level(env, make_lifo):
    q = env.open(AckLifoQueue) if make_lifo == "class" else env.open(lifo=True)
    q.put("a", priority=100)
    q.put("b", priority=100)
    q.put("c", priority=200)
    q.put("d", priority=200)
    q.put("e", priority=50)
    assert bodies(drain_messages(q)) == ["d", "c", "b", "a", "e"]


def test_lifo_keyword_is_the_same_queue_kind_as_ack_lifo_queue(tmp_path):
    path = tmp_path / "lifo.fs"
    with AckLifoQueue(path=path) as q:
        for i in (1, 2, 3):
            q.put(i)
    with AckQueue(path=path, lifo=True) as q:     # no QueueKindMismatch: the same kind
        assert [q.get_nowait() for _ in range(3)] == [3, 2, 1]
    with pytest.raises(QueueKindMismatch):
        AckQueue(path=path)                       # but it is not a FIFO queue


def test_priority_queue_orders_by_level_then_item_value(env):
    q = env.open(AckPriorityQueue)
    q.put((2, "b"), priority=5)
    q.put((1, "a"), priority=1)
    q.put((3, "c"), priority=5)
    q.put((0, "z"), priority=1)
    q.put((9, "top"), priority=7)
    assert bodies(drain_messages(q)) == [(9, "top"), (2, "b"), (3, "c"), (0, "z"), (1, "a")]


@pytest.mark.parametrize("prio,exc", [(-1, ValueError), (1001, ValueError),
                                      (10**6, ValueError), (1.0, TypeError),
                                      ("5", TypeError), (True, TypeError),
                                      (False, TypeError), (None, TypeError)])
def test_bad_priority_is_refused_and_nothing_is_put(env, prio, exc):
    q = env.open()
    q.put("kept")
    with pytest.raises(exc):
        q.put("x", priority=prio)
    with pytest.raises(exc):
        q.put_many(["y", "z"], priority=prio)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    assert bodies(drain_messages(q)) == ["kept"]


def test_priority_survives_reopen(tmp_path):
    path = tmp_path / "prio.fs"
    with AckQueue(path=path) as q:
        q.put("low", priority=1)
        q.put("mid")
        q.put("high", priority=900)
        q.put("mid2")
        held = q.get_message()                    # "high", held at close: given back
        assert held.body == "high"
    with AckQueue(path=path) as q:
        messages = drain_messages(q)
        assert bodies(messages) == ["high", "mid", "mid2", "low"]
        assert [m.priority for m in messages] == [900, 100, 100, 1]


def test_priority_queue_order_survives_reopen(tmp_path):
    path = tmp_path / "pq.fs"
    with AckPriorityQueue(path=path) as q:
        q.put_many([5, 3, 9])
        q.put(1, priority=1)
        q.put(7, priority=200)
    with AckPriorityQueue(path=path) as q:
        assert q.peek().body == 7
        assert bodies(drain_messages(q)) == [7, 3, 5, 9, 1]


# == 2. put: delay =========================================================================

def test_delay_invisible_until_clock_reaches_put_time_plus_delay(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("later", delay=10)
    q.put("now")
    assert q.qsize() == 1
    assert counts_of(q) == count(ready=1, delayed=1)
    m = q.get_message(block=False)
    assert m.body == "now"
    q.ack(m)
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(timeout=SHORT)                      # the fake clock does not move meanwhile
    assert q.peek() is None
    clock.advance(9)
    with pytest.raises(Empty):
        q.get_nowait()
    assert counts_of(q) == count(delayed=1)
    clock.advance(1)                              # exactly put time + delay: visible
    assert counts_of(q) == count(ready=1)
    m = q.get_message(block=False)
    assert (m.body, m.receive_count) == ("later", 1)


def test_delayed_high_priority_goes_first_once_visible(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("a")
    q.put("urgent", priority=500, delay=5)
    q.put("b")
    clock.advance(5)
    assert bodies(drain_messages(q)) == ["urgent", "a", "b"]


@pytest.mark.parametrize("delay", [-1, -0.001, float("nan")])
def test_bad_delay_is_refused(env, delay):
    q = env.open()
    with pytest.raises(ValueError):
        q.put("x", delay=delay)
    with pytest.raises(ValueError):
        q.put_many(["x"], delay=delay)
    assert counts_of(q) == count()


def test_delay_survives_reopen(tmp_path):
    path = tmp_path / "delay.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("later", delay=30)
        q.put("now")
    with AckQueue(path=path, clock=clock) as q:
        assert counts_of(q) == count(ready=1, delayed=1)
        assert bodies(drain_messages(q)) == ["now"]
        clock.advance(29)
        assert q.peek() is None
        clock.advance(1)
        assert q.get_nowait() == "later"


# == 2. put: retention =====================================================================

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


# == 2. put: dedup =========================================================================

def test_dedup_id_refuses_a_second_put_within_the_window(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    assert issubclass(ackqueue.DuplicateMessage, AckQueueError)
    q.put("first", dedup_id="order-1")
    before = q.stats()
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("second", dedup_id="order-1")
    assert q.stats() == before                    # the queue is unchanged
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    q.put("other id", dedup_id="order-2")
    q.put("no id")
    q.put("no id")                                # no dedup_id: never a duplicate
    assert bodies(drain_messages(q)) == ["first", "other id", "no id", "no id"]


def test_dedup_holds_after_ack_and_ends_with_the_default_window(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("first", dedup_id="d")
    q.ack(q.get_message())                        # acknowledged: still a duplicate
    clock.advance(DEFAULT_DEDUP_WINDOW - 1)
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("again", dedup_id="d")
    assert q.qsize() == 0 and q.unfinished_tasks == 0
    clock.advance(2)                              # past the window
    q.put("again", dedup_id="d")
    assert q.get_nowait() == "again"
    with pytest.raises(ackqueue.DuplicateMessage):  # and the new put starts a new window
        q.put("third", dedup_id="d")


def test_dedup_window_keyword(env):
    clock = FakeClock()
    q = env.open(clock=clock, dedup_window=10)
    q.put("a", dedup_id="x")
    clock.advance(9)
    with pytest.raises(ackqueue.DuplicateMessage):
        q.put("b", dedup_id="x")
    clock.advance(2)
    q.put("b", dedup_id="x")
    assert bodies(drain_messages(q)) == ["a", "b"]


def test_dedup_is_per_queue(env):
    clock = FakeClock()
    a = env.open(name="a", shared=True, clock=clock)
    b = env.open(name="b", shared=True, clock=clock)
    a.put("in a", dedup_id="same")
    b.put("in b", dedup_id="same")
    assert a.qsize() == 1 and b.qsize() == 1


@pytest.mark.parametrize("dedup_id,exc", [("", ValueError), ("x" * 129, ValueError),
                                          (5, TypeError), (b"bytes", TypeError)])
def test_bad_dedup_id_is_refused(env, dedup_id, exc):
    q = env.open()
    with pytest.raises(exc):
        q.put("x", dedup_id=dedup_id)
    assert counts_of(q) == count()
    q.put("ok", dedup_id="y" * 128)               # 128 characters is allowed
    assert q.qsize() == 1


def test_dedup_id_of_a_rolled_back_put_is_not_kept(env):
    q = env.open()
    with pytest.raises(RuntimeError):
        with q.transaction():
            q.put("x", dedup_id="tx")
            raise RuntimeError("roll back")
    assert q.qsize() == 0
    q.put("x", dedup_id="tx")                     # the rolled-back put left no trace
    assert q.get_nowait() == "x"


def test_dedup_survives_reopen_within_the_window(tmp_path):
    path = tmp_path / "dedup.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("first", dedup_id="once")
        q.ack(q.get_message())
    clock.advance(100)
    with AckQueue(path=path, clock=clock) as q:
        with pytest.raises(ackqueue.DuplicateMessage):
            q.put("again", dedup_id="once")
        assert q.qsize() == 0
    clock.advance(DEFAULT_DEDUP_WINDOW)
    with AckQueue(path=path, clock=clock) as q:
        q.put("again", dedup_id="once")
        assert q.get_nowait() == "again"


# == 2. put: attributes ====================================================================

def test_attributes_are_returned_on_the_message(env):
    q = env.open()
    attrs = {"trace": "abc", "kind": "email"}
    q.put("with", attributes=attrs)
    q.put("without")
    m = q.get_message()
    assert m.attributes == {"trace": "abc", "kind": "email"}
    assert isinstance(m.attributes, dict)
    n = q.get_message()
    assert n.attributes == {} and isinstance(n.attributes, dict)


def test_attributes_are_copied_at_put(env):
    q = env.open()
    attrs = {"k": "v"}
    q.put("x", attributes=attrs)
    attrs["k"] = "changed"
    attrs["new"] = "key"
    assert q.get_message().attributes == {"k": "v"}


def test_ten_attributes_are_allowed(env):
    q = env.open()
    attrs = {f"k{i}": f"v{i}" for i in range(10)}
    q.put("x", attributes=attrs)
    assert q.get_message().attributes == attrs


@pytest.mark.parametrize("attrs,exc", [
    ({f"k{i}": "v" for i in range(11)}, ValueError),
    ({1: "v"}, TypeError),
    ({"k": 1}, TypeError),
    ({"k": None}, TypeError),
    ({"k": b"v"}, TypeError),
    ([("k", "v")], TypeError),
    ("k=v", TypeError),
])
def test_bad_attributes_are_refused_and_nothing_is_put(env, attrs, exc):
    q = env.open()
    with pytest.raises(exc):
        q.put("x", attributes=attrs)
    with pytest.raises(exc):
        q.put_many(["x", "y"], attributes=attrs)
    assert counts_of(q) == count() and q.unfinished_tasks == 0


def test_attributes_survive_reopen(tmp_path):
    path = tmp_path / "attrs.fs"
    with AckQueue(path=path) as q:
        q.put("x", attributes={"a": "1", "b": "2"})
        q.put("y")
    with AckQueue(path=path) as q:
        x, y = q.get_message(), q.get_message()
        assert x.attributes == {"a": "1", "b": "2"}
        assert y.attributes == {}


# == 3. put_many ===========================================================================

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


# == 4. shuffle ============================================================================

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


# == 5. get_many / get_messages / ack_many =================================================

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


# == 6. Message fields =====================================================================

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


# == 7. dead letters =======================================================================

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


# == 8. peek ===============================================================================

def test_peek_has_no_side_effects(env):
    q = env.open()
    assert q.peek() is None
    q.put("a", attributes={"x": "y"})
    q.put("b", priority=50)
    before = (q.qsize(), counts_of(q), q.stats(), q.unfinished_tasks)
    p = q.peek()
    assert isinstance(p, Message)
    assert (p.body, p.receive_count, p.attributes, p.priority) == ("a", 0, {"x": "y"}, 100)
    again = q.peek()
    assert (again.id, again.body, again.receive_count) == (p.id, "a", 0)
    assert (q.qsize(), counts_of(q), q.stats(), q.unfinished_tasks) == before
    m = q.get_message()
    assert m.id == p.id and m.receive_count == 1
    assert q.peek().body == "b"
    q.nack(m)
    p = q.peek()
    assert (p.id, p.receive_count) == (m.id, 1)   # the receives so far, unchanged by peek
    assert q.get_message().receive_count == 2


def test_peek_follows_priority_and_ignores_delayed_and_in_flight(env):
    clock = FakeClock()
    q = env.open(clock=clock)
    q.put("hidden", priority=900, delay=10)
    q.put("low", priority=1)
    q.put("high", priority=500)
    assert q.peek().body == "high"
    held = q.get_message()
    assert q.peek().body == "low"
    clock.advance(10)
    assert q.peek().body == "hidden"
    q.nack(held)
    assert q.peek().body == "hidden"
    assert q.qsize() == 3


def test_peek_in_lifo_and_priority_queues(env):
    lifo = env.open(AckLifoQueue, name="lifo", shared=True)
    lifo.put("first")
    lifo.put("last")
    assert lifo.peek().body == "last"
    assert lifo.get() == "last"
    prio = env.open(AckPriorityQueue, name="prio", shared=True)
    prio.put(5)
    prio.put(2)
    prio.put(9, priority=1)
    assert prio.peek().body == 2
    assert prio.get() == 2


def test_peeked_message_cannot_be_acknowledged(env):
    q = env.open()
    q.put("a")
    p = q.peek()
    with pytest.raises(NotHeld):
        q.ack(p)
    assert q.qsize() == 1 and q.unfinished_tasks == 1


# == 9. change_visibility ==================================================================

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


# == 10. counts, stats, purge ==============================================================

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
    """As SQS's PurgeQueue (issue 22): in-flight deliveries end too; their late acks and
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


# == 11. sequence numbers ==================================================================

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


# == through a queue server (-k zeo) =======================================================

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
