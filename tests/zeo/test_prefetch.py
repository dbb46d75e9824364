"""prefetch=N through a real server (``ackqueue server``): one claim commit takes several
ready messages while the gets here keep up; the next gets receive them without a round
trip; what no get receives in time goes back to its place with its receive count undone;
a process killed while holding them gives them back at its lease's end.

The queue clock is injected (FakeClock) to decide when a message claimed ahead has waited
too long; crashes are real SIGKILLs of real child processes."""
import json
import signal
import threading

import pytest

from ackqueue import AckLifoQueue, AckPriorityQueue, AckQueue, Empty

from helpers_reliability import FakeClock
from zeo_server import kill, read_line, spawn

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

WAIT = 30               # failure bound for blocking gets that should return at once


def claim_commits(q):
    return q._database.committer.commits


def test_prefetch_option_is_checked(tmp_path):
    with pytest.raises(TypeError, match="prefetch must be an int"):
        AckQueue(prefetch="8")
    with pytest.raises(TypeError, match="prefetch must be an int"):
        AckQueue(prefetch=True)
    with pytest.raises(ValueError, match="at least 1"):
        AckQueue(prefetch=0)
    with pytest.raises(ValueError, match="shared through a server"):
        AckQueue(prefetch=4)                              # in memory: nothing to save
    with pytest.raises(ValueError, match="shared through a server"):
        AckQueue(path=str(tmp_path / "q.fs"), prefetch=4)
    AckQueue(path=str(tmp_path / "q.fs")).close()         # the refused open let it go
    with pytest.raises(ValueError, match="get_many"):
        AckQueue(path="http://127.0.0.1:9", prefetch=4)
    with pytest.raises(ValueError, match="FIFO queue"):
        AckLifoQueue(path="zeo://127.0.0.1:9", prefetch=4)
    with pytest.raises(ValueError, match="FIFO queue"):
        AckPriorityQueue(path="zeo://127.0.0.1:9", prefetch=4)
    AckQueue(prefetch=1).close()                          # the default, anywhere
    with pytest.raises(TypeError, match="prefetch_wait must be a number"):
        AckQueue(prefetch_wait="0.1")
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="prefetch_wait must be a finite number"):
            AckQueue(prefetch_wait=bad)
    with pytest.raises(ValueError, match="needs prefetch above 1"):
        AckQueue(prefetch_wait=0.1)


def test_gets_keep_fifo_order_with_fewer_claim_commits(server):
    with AckQueue(path=server.url, name="order") as producer:
        producer.put_many(list(range(40)))
    with AckQueue(path=server.url, name="order", prefetch=8) as q:
        before = claim_commits(q)
        got = [q.get(timeout=WAIT) for _ in range(40)]
        commits = claim_commits(q) - before
        assert got == list(range(40))
        # Batches of 1, 2, 4, 8, 8, 8, 8, 1: 8 claim commits where one per get made 40
        # (a lease beat may add one).
        assert commits <= 10, commits
        q.ack_many(got)
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


def test_messages_claimed_ahead_count_in_flight_and_in_qsize_here(server):
    with AckQueue(path=server.url, name="counts", prefetch=4) as q:
        q.put_many(list(range(10)))
        got = [q.get(timeout=WAIT) for _ in range(4)]     # claims of 1, 2 and 4
        assert got == [0, 1, 2, 3]
        # 4 received, 3 claimed ahead (4, 5, 6): the store has them in flight, a get
        # here finds them ready.
        assert q.counts() == {"ready": 3, "in_flight": 7, "delayed": 0}
        assert q.qsize() == 6
        with AckQueue(path=server.url, name="counts") as other:
            assert other.stats()["in_flight"] == 7
        q.ack_many(got)


def test_what_no_get_receives_in_time_goes_back_with_its_receive_count_undone(server):
    clock = FakeClock()
    with AckQueue(path=server.url, name="idle", prefetch=4, clock=clock) as q:
        q.put_many(list(range(10)))
        got = [q.get(timeout=WAIT) for _ in range(4)]
        q.ack_many(got)
        clock.advance(0.5)                 # within the second: still ahead
        assert q.counts()["in_flight"] == 3
        clock.advance(0.6)                 # past it: back at their places
        q.qsize()                          # a look at the queue gives them back
        assert q.counts() == {"ready": 6, "in_flight": 0, "delayed": 0}
        stats = q.stats()
        assert stats["redelivered"] == 0 and stats["given_back"] == 0
        m = q.get_message(timeout=WAIT)
        assert (m.body, m.receive_count) == (4, 1), "as if never claimed"
        q.ack(m)


def test_a_get_on_other_terms_receives_in_order_after_an_unclaim(server):
    with AckQueue(path=server.url, name="terms", prefetch=4) as q:
        q.put_many(list(range(10)))
        got = [q.get(timeout=WAIT) for _ in range(4)]         # 4, 5, 6 claimed ahead
        q.ack_many(got)
        m = q.get_message(timeout=WAIT, visibility_timeout=30)
        assert (m.body, m.receive_count) == (4, 1)
        assert m.deadline is not None, "claimed now, with this get's deadline"
        q.ack(m)
        assert [q.get(timeout=WAIT) for _ in range(5)] == [5, 6, 7, 8, 9]
        q.task_done()


def test_a_message_received_from_ahead_keeps_its_claims_deadline(server):
    clock = FakeClock()
    with AckQueue(path=server.url, name="deadline", prefetch=2, clock=clock,
                  visibility_timeout=20) as q:
        q.put_many(["a", "b", "c"])
        assert q.get_message(timeout=WAIT).body == "a"        # window 1
        claimed_at = clock()
        assert q.get_message(timeout=WAIT).body == "b"        # claims b and c
        clock.advance(0.5)                 # within a second (and a tenth of 20 s)
        m = q.get_message(timeout=WAIT)
        assert (m.body, m.receive_count) == ("c", 1)
        assert m.deadline == claimed_at + 20, "the deadline its claim set"


def test_close_gives_back_what_was_claimed_ahead(server):
    with AckQueue(path=server.url, name="close", prefetch=8) as q:
        q.put_many(list(range(10)))
        got = [q.get(timeout=WAIT) for _ in range(4)]
        q.ack_many(got)
    with AckQueue(path=server.url, name="close") as q:
        assert q.counts() == {"ready": 6, "in_flight": 0, "delayed": 0}
        back = [q.get_message(timeout=WAIT) for _ in range(6)]
        assert [(m.body, m.receive_count) for m in back] == [(i, 1) for i in range(4, 10)]
        q.ack_many(back)


KILLED = """
    import os, signal, sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="crash", prefetch=8)
    got = [q.get(timeout=30) for _ in range(4)]    # 4 received, 3 claimed ahead
    q.ack_many(got)
    print(" ".join(map(str, got)), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkilled_process_gives_back_what_it_claimed_ahead_at_its_lease_end(server):
    url = f"{server.url}?lease_timeout=1.5"
    with AckQueue(path=url, name="crash") as q:
        q.put_many(list(range(10)))
        child = spawn(KILLED, url)
        try:
            assert read_line(child) == "0 1 2 3"
            assert child.wait(WAIT) == -signal.SIGKILL
        finally:
            kill(child)
        back = [q.get_message(timeout=WAIT) for _ in range(6)]
        assert sorted(m.body for m in back) == list(range(4, 10)), "nothing lost"
        # What the dead process held ahead counts as received (it might have been):
        # at-least-once, as for any delivery of a process that died.
        assert {m.body: m.receive_count for m in back if m.receive_count > 1}.keys() \
            <= {4, 5, 6}
        q.ack_many(back)
        with pytest.raises(Empty):
            q.get(timeout=0.2)


CONSUMER = """
    import json, sys
    from ackqueue import AckQueue, Empty
    mode = sys.argv[2]
    options = ({"ack_with_next_get": True} if mode == "next-get" else
               {"ack_with_next_get": True, "prefetch_wait": 0.02} if mode == "batches" else
               {"acks": mode})
    q = AckQueue(path=sys.argv[1], name="pair", prefetch=8, **options)
    print("ready", flush=True)
    got = []
    while True:
        try:
            item = q.get(timeout=2.0)
        except Empty:
            break
        got.append(item)
        q.ack(item)
    q.close()
    print(json.dumps(got), flush=True)
"""


@pytest.mark.parametrize("acks", ["durable", "deferred", "next-get", "batches"])
def test_two_prefetching_consumer_processes_receive_each_message_once(server, acks):
    total = 300
    with AckQueue(path=server.url, name="pair") as q:
        q.put_many(list(range(total)))
        children = [spawn(CONSUMER, server.url, acks) for _ in range(2)]
        try:
            for child in children:
                assert read_line(child) == "ready"
            reports = [json.loads(read_line(child, timeout=120)) for child in children]
        finally:
            for child in children:
                kill(child)
        got = [item for r in reports for item in r]
        assert sorted(got) == list(range(total)), "each message received exactly once"
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
        assert q.stats()["redelivered"] == 0


def test_threads_of_one_process_share_what_was_claimed_ahead(server):
    total = 200
    with AckQueue(path=server.url, name="threads") as producer:
        producer.put_many(list(range(total)))
    with AckQueue(path=server.url, name="threads", prefetch=8) as q:
        got, lock = [], threading.Lock()

        def consume():
            while True:
                try:
                    item = q.get(timeout=2.0)
                except Empty:
                    return
                with lock:
                    got.append(item)
                q.ack(item)
        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 4)
        assert sorted(got) == list(range(total)), "each message received exactly once"
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
        assert q.stats()["redelivered"] == 0


def _waiting_for_a_batch(q):
    """Whether a get of q is waiting (on the queue's not_empty condition)."""
    return bool(q._state.not_empty._waiters)


def test_a_get_that_keeps_up_waits_for_a_batch_with_prefetch_wait(server):
    with AckQueue(path=server.url, name="batch", prefetch=8, prefetch_wait=WAIT) as q, \
            AckQueue(path=server.url, name="batch") as producer:
        producer.put("warm-up")
        q.ack(q.get(timeout=WAIT))         # a batch of 1: the next one may take 2
        producer.put("a")
        _waits_then_claims_two(q, lambda: producer.put("b"), "a", "b",
                               "one claim commit (and a lease beat)", 2)


def _waits_then_claims_two(q, put_second, first, second, commits_why, most_commits):
    """A get of q, with first ready and a batch of two to claim, waits for a second
    message; put_second() puts it; the get returns first, and second was claimed with it
    in one commit (at most most_commits commits of q's, commits_why says which)."""
    got, checked = [], threading.Event()

    def consume():
        got.append(q.get(timeout=WAIT))
        checked.wait(WAIT)
        q.ack(got[0])                       # in its own thread: its end would give it back

    getter = threading.Thread(target=consume)
    getter.start()
    for _ in range(3000):                   # until the get waits for a second message
        if _waiting_for_a_batch(q) or got:
            break
        getter.join(0.01)
    assert _waiting_for_a_batch(q) and not got, "the get waits for a batch"
    before = claim_commits(q)
    put_second()
    for _ in range(3000):
        if got:
            break
        getter.join(0.01)
    assert got == [first]
    item = q.get(timeout=WAIT)              # claimed with the first, in one commit
    assert item == second
    assert claim_commits(q) - before <= most_commits, commits_why
    checked.set()
    getter.join(WAIT)
    q.ack(item)
    assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


def test_prefetch_wait_never_outlasts_the_get(server):
    with AckQueue(path=server.url, name="short", prefetch=8, prefetch_wait=3600) as q:
        q.put_many(["warm-up", "a", "b"])
        q.ack(q.get(timeout=WAIT))         # the next claim may take 2, and 2 are ready
        got = [q.get(timeout=WAIT), q.get_nowait()]    # "b" from the batch
        assert got == ["a", "b"]
        q.ack_many(got)
        q.put("c")                          # a batch of 4 would wait for 3 more:
        got = [q.get_nowait()]              # a get that must not block does not wait
        q.put("d")
        got.append(q.get(timeout=0.05))     # one with a timeout waits until its end only
        assert got == ["c", "d"]
        q.ack_many(got)


def test_a_batch_wait_reads_the_store_once_enough_puts_have_come(server):
    """Every look at the store is a round trip once another process changed the queue, so
    a get waiting for 3 more messages reads it again after the third put, not after each."""
    with AckQueue(path=server.url, name="reads", prefetch=8, prefetch_wait=WAIT) as q, \
            AckQueue(path=server.url, name="reads") as producer:
        producer.put("warm-up")
        q.ack(q.get(timeout=WAIT))         # a batch of 1: the next one may take 2
        producer.put_many(["x", "y"])
        q.ack_many([q.get(timeout=WAIT), q.get_nowait()])   # both received: 4 next
        arbiter, reads = q._state.arbiter, []
        picks = arbiter._picks

        def counted(count, shuffle):
            reads.append(count)
            return picks(count, shuffle)
        arbiter._picks = counted
        producer.put("a")
        got = []

        def consume():
            got.append(q.get(timeout=WAIT))
            q.ack(got[0])                   # in its own thread: its end would give it back
        getter = threading.Thread(target=consume)
        getter.start()
        for item in ("b", "c", "d"):
            for _ in range(3000):           # until the get waits for the batch of 4
                if _waiting_for_a_batch(q):
                    break
                getter.join(0.01)
            assert _waiting_for_a_batch(q) and not got, "the get waits for a batch"
            signals = q._state.ready_signals
            producer.put(item)
            for _ in range(3000):           # until this process has heard of the put
                if q._state.ready_signals > signals or got:
                    break
                getter.join(0.01)
        getter.join(WAIT)
        assert got == ["a"]
        assert len(reads) == 2, "one read at the start of the wait, one after the third put"
        rest = [q.get_nowait() for _ in range(3)]     # claimed with "a", in one commit
        assert rest == ["b", "c", "d"]
        q.ack_many(rest)
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


RIVAL = """
import sys
from ackqueue import AckQueue
with AckQueue(path=sys.argv[1], name="lost") as q:
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "get":
            item = q.get(timeout=30)
            print(item, flush=True)
            q.ack(item)
        else:
            break
"""


def test_after_a_partly_lost_batch_a_waiting_consumer_still_waits_for_two(server):
    """Another process takes part of a batch: without prefetch_wait the next claim takes
    one message at once; with it, the next get still waits for a batch of two (claiming
    each new message alone only raced the other consumer's next batch for it)."""
    rival = spawn(RIVAL, server.url)
    try:
        assert read_line(rival) == "ready"
        with AckQueue(path=server.url, name="lost", prefetch=8, prefetch_wait=WAIT) as q:
            _partly_lost_then_waits_for_two(q, rival)
        rival.stdin.write("stop\n")
        rival.stdin.flush()
        assert rival.wait(WAIT) == 0
    finally:
        kill(rival)


def _partly_lost_then_waits_for_two(q, rival):
    q.put("warm-up")
    q.ack(q.get(timeout=WAIT))             # a batch of 1: the next one may take 2
    q.put_many(["a", "b"])
    arbiter = q._state.arbiter
    claim_picks = arbiter._claim_picks

    def rival_first(*args):                # the rival claims "a" between the pick and the claim
        arbiter._claim_picks = claim_picks
        rival.stdin.write("get\n")
        rival.stdin.flush()
        assert read_line(rival) == "a"
        return claim_picks(*args)
    arbiter._claim_picks = rival_first
    b = q.get(timeout=WAIT)
    assert b == "b"                         # "a" was lost: a partly lost batch
    q.ack(b)
    q.put("c")
    _waits_then_claims_two(q, lambda: q.put("d"), "c", "d",
                           "the put, one claim commit (and a lease beat)", 3)
