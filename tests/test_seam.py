"""The queue's public seams for the rooms that attach to it (the service, the CLI, Spark):
the non-blocking claim with its readiness notification, and the read-only browse.

Each runs on a real storage: in memory, on a file, and (where it matters) through a real
server started with the console script.  Time is injected (a fake clock) instead of slept.
"""
import asyncio
import threading

import pytest

from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, BrowsedMessage, Empty,
                      MessageId)
from ackqueue.browse import DELAYED, IN_FLIGHT, READY

from zeo_server import kill, read_line, spawn

WAIT = 30


class FakeClock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture(params=["memory", "file"])
def where(request, tmp_path):
    return None if request.param == "memory" else str(tmp_path / "q.fs")


# -- non-blocking claim and readiness ------------------------------------------------------

def test_a_listener_hears_puts_give_backs_and_delays_coming_due(where):
    clock = FakeClock()
    heard = []
    with AckQueue(path=where, clock=clock) as q:
        q.add_ready_listener(heard.append)
        with pytest.raises(Empty):
            q.get_nowait()
        assert q.next_ready_at() is None
        q.put("now")
        assert heard == [q.name]
        q.put("later", delay=10)
        assert len(heard) == 1, "a delayed put is not ready yet"
        assert q.next_ready_at() == clock.now + 10
        m = q.get_message(block=False, visibility_timeout=5)
        assert m.body == "now"
        assert q.next_ready_at() == clock.now + 5, "the in-flight deadline comes first"
        q.nack(m)
        assert len(heard) == 2
        assert q.get_nowait() == "now"
        q.task_done()
        clock.now += 10
        assert q.qsize() == 1             # the due delayed message is made ready ...
        assert len(heard) == 3            # ... and the listener told
        q.remove_ready_listener(heard.append)
        q.put("unheard")
        assert len(heard) == 3


def test_an_event_loop_waits_for_messages_without_a_thread_per_waiter(where):
    """200 coroutines wait for messages on one loop; one listener bridges the queue's
    readiness into the loop, and each waiter takes its message with get_nowait."""
    async def main(q):
        loop = asyncio.get_running_loop()
        events = set()                    # one per waiting coroutine

        def wake():
            for event in events:
                event.set()

        def listener(name):
            loop.call_soon_threadsafe(wake)

        q.add_ready_listener(listener)

        async def waiter():
            event = asyncio.Event()
            events.add(event)
            try:
                while True:
                    event.clear()
                    try:
                        return q.get_nowait()
                    except Empty:
                        await asyncio.wait_for(event.wait(), WAIT)
            finally:
                events.discard(event)

        threads_before = threading.active_count()
        waiters = [asyncio.ensure_future(waiter()) for _ in range(200)]
        await asyncio.sleep(0.05)
        assert threading.active_count() == threads_before
        producer = threading.Thread(target=lambda: [q.put(n) for n in range(200)])
        producer.start()
        got = await asyncio.wait_for(asyncio.gather(*waiters), WAIT)
        producer.join()
        q.remove_ready_listener(listener)
        return got

    with AckQueue(path=where) as q:
        assert sorted(asyncio.run(main(q))) == list(range(200))


def test_through_a_server_another_processs_put_reaches_the_listener(server):
    heard = threading.Event()
    with AckQueue(path=server.url, name="jobs") as q, \
            AckQueue(path=server.url, name="jobs") as same_process:
        q.add_ready_listener(lambda name: heard.set())
        with pytest.raises(Empty):
            q.get_nowait()
        child = spawn("""
            import sys
            from ackqueue import AckQueue
            with AckQueue(path=sys.argv[1], name="jobs") as q:
                q.put("from afar")
            print("put", flush=True)
            """, server.url)
        assert read_line(child) == "put"
        child.wait(WAIT)
        assert heard.wait(WAIT)
        assert same_process.get(timeout=WAIT) == "from afar"


# -- browse ----------------------------------------------------------------------------------

def states(q):
    return [(m.state, m.item) for m in q.browse()]


def test_browse_lists_every_message_with_its_state_and_changes_nothing(where):
    clock = FakeClock()
    with AckQueue(path=where, clock=clock) as q:
        q.put("a", attributes={"k": "v"})
        q.put("b")
        q.put("c", priority=500)
        q.put("d", delay=30)
        held = q.get_message(visibility_timeout=60)   # "c": the highest priority
        clock.now += 5
        before = q.counts()
        found = list(q.browse())
        assert all(isinstance(m, BrowsedMessage) for m in found)
        assert [(m.state, m.item) for m in found] == [
            (READY, "a"), (READY, "b"), (DELAYED, "d"), (IN_FLIGHT, "c")]
        a, _, d, c = found
        assert a.attributes == {"k": "v"} and a.receive_count == 0 and a.age == 5
        assert a.id == MessageId(1) and a.deadline is None and a.visible_at is None
        assert d.visible_at == clock.now - 5 + 30
        assert c.deadline == held.deadline and c.receive_count == 1 and c.priority == 500
        assert q.counts() == before, "browse changes nothing"
        assert q.get() == "a" and q.peek().body == "b"
        assert q.get_message().receive_count == 1, "browse counted no receive"


@pytest.mark.parametrize("cls, items, order", [
    (AckLifoQueue, [1, 2, 3], [3, 2, 1]),
    (AckPriorityQueue, [5, 1, 3], [1, 3, 5]),
])
def test_browse_follows_each_kinds_delivery_order(where, cls, items, order):
    with cls(path=where) as q:
        for item in items:
            q.put(item)
        assert [m.item for m in q.browse()] == order
        assert [q.get() for _ in items] == order


def test_browse_reads_a_large_queue_one_message_at_a_time(tmp_path):
    path = str(tmp_path / "big.fs")
    with AckQueue(path=path) as q:
        for start in range(0, 5000, 500):
            q.put_many(range(start, start + 500))
    with AckQueue(path=path) as q:
        it = q.browse()
        first = [next(it).item for _ in range(3)]
        assert first == [0, 1, 2]
        it.close()                        # an abandoned browse lets its snapshot go
        assert sum(1 for _ in q.browse()) == 5000
        assert q.qsize() == 5000


def test_browse_through_a_server_shows_every_processs_deliveries(server):
    with AckQueue(path=server.url) as q:
        q.put_many(["x", "y", "z"])
        child = spawn("""
            import sys, time
            from ackqueue import AckQueue
            q = AckQueue(path=sys.argv[1])
            print(q.get(visibility_timeout=300), flush=True)
            time.sleep(600)
            """, server.url)
        assert read_line(child) == "x"
        kill(child)                       # SIGKILL: "x" stays in flight under its lease
        assert states(q) == [(READY, "y"), (READY, "z"), (IN_FLIGHT, "x")]
        held = q.get_message(visibility_timeout=60)
        assert held.body == "y"
        found = list(q.browse())
        assert [(m.state, m.item) for m in found] == [
            (READY, "z"), (IN_FLIGHT, "y"), (IN_FLIGHT, "x")]
        assert found[1].deadline == held.deadline


# -- a connection that belongs to no thread ----------------------------------------------------

@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_connection_bound_to_no_thread_holds_across_threads_until_closed(where):
    clock = FakeClock()
    with AckQueue(path=where, clock=clock) as q:
        q.put_many(["a", "b", "c"])
        conn = q.connect(thread_bound=False)
        got = {}

        def receive():
            got["a"] = conn.get_message()
            got["b"] = conn.get_message(visibility_timeout=10)
            raise RuntimeError("the thread that received them dies")

        worker = threading.Thread(target=receive)
        worker.start()
        worker.join()
        assert q.get_nowait() == "c"          # "a" and "b" stay held by the connection
        q.task_done()
        clock.now += 11                       # "b"'s deadline passes: only "b" comes back
        assert q.get_nowait() == "b"
        q.task_done()
        conn.ack(got["a"])                    # acked from another thread than its receiver
        q.put("d")
        held = conn.get_message()
        conn.close()                          # closing gives back what it still holds
        assert q.get_nowait() == held.body == "d"
        q.task_done()
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


def test_a_thread_bound_connection_refuses_other_threads(where):
    with AckQueue(path=where) as q:
        conn = q.connect()
        errors = []
        t = threading.Thread(target=lambda: errors.append(
            pytest.raises(Exception, conn.get, block=False).value))
        t.start()
        t.join()
        assert "belongs to another thread" in str(errors[0])
        with pytest.raises(TypeError):
            q.connect(thread_bound="no")


def test_through_a_server_a_due_delayed_message_is_got_without_waiting(server):
    clock = FakeClock(__import__("time").time())
    with AckQueue(path=server.url, clock=clock) as q:
        q.put("later", delay=10)
        with pytest.raises(Empty):
            q.get_nowait()
        clock.now += 10
        assert q.get_nowait() == "later"
        q.task_done()


# -- the non-blocking put and ack (then=): an event loop changes a queue without a thread --

class Outcomes:
    """then= callbacks that record (error, thread) and let a test wait for them."""

    def __init__(self):
        self.got = []
        self.done = threading.Event()

    def __call__(self, error):
        self.got.append((error, threading.current_thread()))
        self.done.set()

    def wait(self):
        assert self.done.wait(WAIT), "then was never called"
        return self.got


def test_a_put_with_then_returns_at_once_and_is_visible_when_then_runs(where):
    with AckQueue(path=where) as q:
        seen_at_then = []

        def then(error):
            seen_at_then.append((error, q.counts()["ready"]))
            outcomes(error)
        outcomes = Outcomes()
        ids = q.put_many([b"\x80\x05K\x01."], encoded=True, then=then)   # pickle of 1
        assert [int(i) for i in ids] == [int(ids[0])]
        outcomes.wait()
        [(error, thread)] = outcomes.got
        assert error is None
        assert thread is not threading.current_thread(), "then runs in the committer"
        assert seen_at_then == [(None, 1)], "visible by the time then runs"
        assert q.get_nowait() == 1


def test_a_put_with_then_is_durable_when_then_runs(tmp_path):
    path = str(tmp_path / "q.fs")
    q = AckQueue(path=path)
    outcomes = Outcomes()
    q.put_many(["x", "y"], then=outcomes)
    assert outcomes.wait()[0][0] is None
    q.close()
    with AckQueue(path=path) as again:
        assert [again.get_nowait(), again.get_nowait()] == ["x", "y"]


def test_a_put_with_then_reports_a_duplicate_through_then(where):
    with AckQueue(path=where) as q:
        q.put("first", dedup_id="d")
        outcomes = Outcomes()
        q.put_many(["again"], dedup_ids=["d"], then=outcomes)
        [(error, _)] = outcomes.wait()
        assert type(error).__name__ == "DuplicateMessage"
        assert int(error.original_id) == int(q.peek().id)
        assert q.qsize() == 1


def test_a_put_with_then_never_waits_for_room(where):
    import queue as stdlib_queue
    with AckQueue(path=where, maxsize=1) as q:
        q.put("a")
        with pytest.raises(stdlib_queue.Full):
            q.put_many(["b"], then=Outcomes())
        assert q.qsize() == 1


def test_then_is_refused_inside_a_transaction_block(where):
    from ackqueue import AckQueueError
    with AckQueue(path=where) as q:
        q.put("a")
        with pytest.raises(AckQueueError, match="transaction"):
            with q.transaction():
                q.put_many(["b"], then=Outcomes())
        with pytest.raises(AckQueueError, match="transaction"):
            with q.transaction():
                item = q.get()
                q.ack_many([item], then=Outcomes())
        assert q.qsize() == 1, "both blocks rolled back"


def test_an_ack_with_then_returns_at_once_and_is_durable_when_then_runs(tmp_path):
    path = str(tmp_path / "q.fs")
    q = AckQueue(path=path)
    q.put_many(["a", "b"])
    a, b = q.get_message(), q.get_message()
    assert (a.body, b.body) == ("a", "b")          # b stays in flight, never acked
    outcomes = Outcomes()
    q.ack_many([a], then=outcomes)
    assert outcomes.wait()[0][0] is None
    assert q.unfinished_tasks == 1
    with pytest.raises(Exception, match="acknowledged already"):
        q.ack_many([a], then=Outcomes())          # StaleAck at once, nothing submitted
    q.close()                                      # b comes back on the next open
    with AckQueue(path=path) as again:
        assert again.get_nowait() == "b"
        with pytest.raises(Empty):
            again.get_nowait()


def test_an_ack_with_then_that_fails_to_commit_reports_it_and_keeps_the_message(tmp_path):
    from ackqueue.errors import QueueFileGone
    path = tmp_path / "q.fs"
    q = AckQueue(path=str(path))
    try:
        q.put("a")
        m = q.get_message()
        path.unlink()                    # the commit will be refused (a real failure)
        outcomes = Outcomes()
        q.ack_many([m], then=outcomes)
        [(error, _)] = outcomes.wait()
        assert isinstance(error, QueueFileGone)
        assert q.counts()["in_flight"] == 1, "not acknowledged: still in flight"
    finally:
        q.close()


def test_the_service_bridge_resolves_each_outcome_on_the_loop(where):
    from ackqueue.service.bridge import Bridge

    async def main():
        bridge = Bridge(asyncio.get_running_loop())
        with AckQueue(path=where) as q:
            ids = await bridge.durable(lambda then: q.put_many(["a", "b"], then=then))
            assert len(ids) == 2 and q.qsize() == 2
            q.put("d", dedup_id="k")
            with pytest.raises(Exception) as caught:
                await bridge.durable(lambda then: q.put_many(["e"], dedup_ids=["k"],
                                                             then=then))
            assert type(caught.value).__name__ == "DuplicateMessage"
            # Many outcomes from another thread, before the loop runs again: each future
            # gets its own.
            pairs = [bridge.pending() for _ in range(50)]
            errors = [None if k % 2 else ValueError(k) for k in range(50)]
            t = threading.Thread(target=lambda: [then(e) for (_, then), e in
                                                 zip(pairs, errors)])
            t.start()
            t.join()
            results = await asyncio.gather(*(f for f, _ in pairs))
            assert results == errors
            # Calls posted from another thread run on the loop, in order with outcomes.
            order, (last, then) = [], bridge.pending()
            t = threading.Thread(target=lambda: (
                bridge.call_soon(lambda tag: order.append((tag, threading.current_thread())),
                                 "call"),
                then(None)))
            t.start()
            t.join()
            await last
            assert order == [("call", threading.main_thread())]
    asyncio.run(main())


def test_a_group_commits_outcomes_reach_the_loop_in_one_wake_up(where):
    """Three puts committed as one group: their then= callbacks run while
    commit.settling() is true, the committer's group listener runs after them, and the
    bridge wakes the loop once for all three."""
    from ackqueue.commit import settling
    from ackqueue.service.bridge import Bridge

    class CountingBridge(Bridge):
        drains = 0

        def _drain(self):
            CountingBridge.drains += 1
            super()._drain()

    async def main():
        bridge = CountingBridge(asyncio.get_running_loop())
        with AckQueue(path=where) as q:
            committer = q._state.committer
            seen = []
            committer.add_group_listener(lambda: seen.append("group"))   # runs first
            bridge.attach(committer)
            pairs = [bridge.pending() for _ in range(3)]
            committer._baton.acquire()      # hold commits back so that the three group
            try:
                for k, (_, then) in enumerate(pairs):
                    def outcome(error, then=then, k=k):
                        seen.append((k, settling()))
                        then(error)
                    q.put_many([k], then=outcome)
            finally:
                committer._baton.release()
                with committer._cond:
                    committer._cond.notify()
            assert await asyncio.gather(*(f for f, _ in pairs)) == [None] * 3
            assert seen == [(0, True), (1, True), (2, True), "group"]
            assert CountingBridge.drains == 1
            assert not settling()
            committer.remove_group_listener(bridge.group_settled)
            committer.remove_group_listener(committer._group_listeners[0])
    asyncio.run(main())


# -- what a front that puts and receives for its clients uses -----------------------------

def test_put_options_made_once_serve_many_put_many_calls(where):
    with AckQueue(path=where, name="opts") as q:
        opts = q.put_options(priority=7, attributes={"k": "v"})
        q.put_many(["a"], options=opts)
        q.put_many([b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01b\x94."],
                   options=opts, encoded=True)
        got = q.get_messages(2, timeout=WAIT)
        assert [(m.body, m.priority, m.attributes) for m in got] == \
            [("a", 7, {"k": "v"}), ("b", 7, {"k": "v"})]
        q.ack_many(got)
        with pytest.raises(TypeError, match="not both"):
            q.put_many(["x"], options=opts, priority=3)
        with pytest.raises(TypeError, match="put_options"):
            q.put_many(["x"], options={"priority": 3})
        with pytest.raises(ValueError, match="priority"):
            q.put_options(priority=5000)
        assert q.qsize() == 0


def test_receive_policy_is_the_rule_a_get_applies(where):
    with AckQueue(path=where, name="rp") as q:
        assert q.receive_policy(None) is None
        with pytest.raises(ValueError, match="at least 1"):
            q.receive_policy(0)
        with pytest.raises(ValueError, match="another queue"):
            q.receive_policy(2, "rp")
        policy = q.receive_policy(1, "rp-dead")
        conn = q.connect(thread_bound=False)
        q.put("poison")
        [m] = conn.get_many(1, block=False, messages=True, policy=policy)
        conn.nack(m)          # received once: the next receive moves it, delivers nothing
        with pytest.raises(Empty):
            conn.get_many(1, block=False, policy=policy)
        conn.close()
        with AckQueue(db=q.db, name="rp-dead") as dead:
            assert dead.get(timeout=WAIT) == "poison"
            dead.task_done()


def test_a_receive_policy_may_send_a_message_to_the_back_of_its_own_queue(where):
    """As an SQS redrive policy may name the queue itself (the SQS front asks for it):
    the message received max_receives times goes to the back as a new message (its
    receive count kept, as a dead-letter queue's)."""
    with AckQueue(path=where, name="rp") as q:
        policy = q.receive_policy(1, "rp", to_itself=True)
        conn = q.connect(thread_bound=False)
        q.put_many(["poison", "next"])
        [m] = conn.get_many(1, block=False, messages=True, policy=policy)
        assert m.body == "poison"
        conn.nack(m)          # received once: the next receive moves it to the back
        got = conn.get_many(2, block=False, messages=True, policy=policy)
        assert [g.body for g in got] == ["next"]
        again = conn.get_many(1, timeout=WAIT, messages=True)
        assert [g.body for g in again] == ["poison"]
        assert again[0].id != m.id and again[0].dead_letter_source == "rp"
        for message in got + again:
            conn.ack(message)
        conn.close()
        assert q.qsize() == 0


def test_kind_says_how_the_queue_orders(tmp_path):
    for cls, kind in ((AckQueue, "fifo"), (AckLifoQueue, "lifo"), (AckPriorityQueue, "value")):
        with cls(path=str(tmp_path / f"{kind}.fs")) as q:
            assert q.kind == kind
