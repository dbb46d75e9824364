"""acks="deferred": ack returns at once, becomes durable with the next commit or by itself
within the committer's delay, flush() waits for it; a crash can only bring a message back.

Crashes are real SIGKILLs of real child processes; the committer's clock is replaced to
decide when it commits by itself (nothing here sleeps and asserts a time)."""
import json
import signal
import threading
import time

import pytest

from ackqueue import AckQueue, Empty, NotSupported

from helpers_reliability import BOUND, FakeClock, drain_messages, run_child
from zeo_server import Server

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")


class FrozenClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


def freeze(q):
    """Stop the committer from committing deferred acks by itself (until the clock moves)."""
    clock = FrozenClock()
    q._database.committer._monotonic = clock
    return clock


def test_acks_option_is_checked():
    with pytest.raises(ValueError, match="acks must be 'durable'"):
        AckQueue(acks="lazy")
    with pytest.raises(NotSupported, match="ack_with_next_get"):
        AckQueue(path="http://127.0.0.1:9/", acks="deferred")


def test_a_deferred_ack_returns_before_its_commit_and_rides_on_the_next_one(tmp_path):
    q = AckQueue(path=str(tmp_path / "q.fs"), acks="deferred")
    try:
        freeze(q)
        committer = q._database.committer
        q.put("a")
        q.put("b")
        item = q.get()
        before = committer.commits
        q.ack(item)
        assert committer.commits == before          # returned without a commit
        assert q.get_nowait() == "b"                # "a" is gone from this process's view
        with pytest.raises(Empty):
            q.get_nowait()
        q.put("c")                                  # one commit carries the put and the ack
        assert committer.commits == before + 1
        assert q.stats()["acked"] == 1
    finally:
        q.close()


def test_the_committer_commits_deferred_acks_by_itself_when_due(tmp_path):
    q = AckQueue(path=str(tmp_path / "q.fs"), acks="deferred")
    try:
        clock = freeze(q)
        committer = q._database.committer
        q.put("a")
        q.ack(q.get())
        ticket = q._state.deferred_acks._tickets[-1]
        assert not committer.due(clock.now)
        assert not committer.due(clock.now + committer.defer_delay / 2)
        assert committer.due(clock.now + committer.defer_delay)
        before = committer.commits
        assert not ticket._done.is_set()
        clock.now += committer.defer_delay           # nobody else commits: the thread does
        assert ticket._done.wait(BOUND)
        assert ticket.error is None
        assert committer.commits == before + 1
        assert q.unfinished_tasks == 0
    finally:
        q.close()


def test_flush_task_done_ack_many_and_join(tmp_path):
    q = AckQueue(path=str(tmp_path / "q.fs"), acks="deferred")
    try:
        clock = freeze(q)
        committer = q._database.committer
        q.put_many(range(5))
        a, b, c, d, e = (q.get() for _ in range(5))
        before = committer.commits
        q.ack_many([a, b])
        q.task_done()                                # the oldest not yet acked: c
        assert committer.commits == before
        assert q.unfinished_tasks == 5               # not durable yet
        q.flush()
        assert committer.commits == before + 1
        assert q.unfinished_tasks == 2
        q.ack(d)
        q.ack(e)
        clock.now += committer.defer_delay           # the committer commits them itself
        q.join()                                     # and join waits for that commit
        assert q.unfinished_tasks == 0
        q.flush()                                    # nothing deferred: returns
    finally:
        q.close()


def test_a_deferred_ack_inside_a_transaction_rolls_back_with_it(tmp_path):
    q = AckQueue(path=str(tmp_path / "q.fs"), acks="deferred")
    try:
        freeze(q)
        q.put("a")
        item = q.get()
        with pytest.raises(RuntimeError):
            with q.transaction():
                q.ack(item)
                raise RuntimeError("roll back")
        assert getattr(q._state, "deferred_acks", None) is None   # nothing was deferred
        q.nack(item)                                 # still held: the ack rolled back
        assert q.get_nowait() == "a"
    finally:
        q.close()


def test_close_flushes_and_no_thread_end_or_deadline_gives_back(tmp_path):
    path = str(tmp_path / "q.fs")
    clock = FakeClock(time.time())     # real epoch: the reopened queue's retention
    q = AckQueue(path=path, acks="deferred", clock=clock, visibility_timeout=5)
    freeze(q)
    q.put_many(["x", "y", "z"])
    q.ack(q.get())                       # "x": its deadline passes with its ack deferred

    def worker():
        q.ack(q.get())                   # "y": its thread ends with its ack deferred
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    clock.advance(10)
    assert q.qsize() == 1                # qsize gives back what is due: neither is
    assert q.get_nowait() == "z"
    q.close()                            # flushes: both acks are durable ("z" comes back)
    with AckQueue(path=path) as again:
        assert [m.body for m in drain_messages(again)] == ["z"]


CHILD = """
    import json, os, signal, sys
    from ackqueue import AckQueue
    path, mode = sys.argv[1], sys.argv[2]
    if path.startswith("zeo://"):         # the test put the items; acks ride on gets
        q = AckQueue(path=path, ack_with_next_get=True)
    else:
        q = AckQueue(path=path, acks="deferred")
        q.put_many(range(50))
    if mode == "hold":                    # the committer never commits deferred acks alone
        q._database.committer._monotonic = lambda: 100.0
    got = [q.get(timeout=30) for _ in range(20)]
    q.ack_many(got[:5])
    for item in got[5:10]:
        q.ack(item)
    if mode == "flush":
        q.flush()
    print(json.dumps({"acked": got[:10], "held": got[10:]}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("mode", ["hold", "default", "flush"])
def test_sigkill_right_after_deferred_acks_loses_nothing(tmp_path, mode):
    path = tmp_path / "q.fs"
    proc = run_child(CHILD, path, mode)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    told = json.loads(proc.stdout)
    acked, held = told["acked"], told["held"]
    assert acked == list(range(10)) and held == list(range(10, 20))
    with AckQueue(path=str(path)) as q:
        back = [m.body for m in drain_messages(q)]
    came_back = [i for i in acked if i in back]
    # Nothing lost: every message not acked is there, once; nothing else came back.
    assert sorted(set(back) - set(acked)) == list(range(10, 50))
    assert len(back) == len(set(back))
    if mode == "hold":        # the acks were never committed: each comes back
        assert came_back == acked
    elif mode == "flush":     # flush made them durable: none comes back
        assert came_back == []
    else:                     # the crash raced the committer: each is gone or back
        print(f"default delay: {len(came_back)} of 10 deferred acks came back")


def test_deferred_acks_through_a_server(tmp_path):
    srv = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        q = AckQueue(path=srv.url, acks="deferred")
        try:
            clock = freeze(q)
            q.put_many(["a", "b", "c"])
            first = q.get()
            q.ack(first)
            ticket = q._state.deferred_acks._tickets[-1]
            clock.now += q._database.committer.defer_delay
            assert ticket._done.wait(BOUND) and ticket.error is None
            q.ack(q.get())
            q.flush()
            assert q.unfinished_tasks == 1
        finally:
            q.close()
        with AckQueue(path=srv.url) as again:
            assert [m.body for m in drain_messages(again)] == ["c"]
    finally:
        srv.stop()


def test_a_deferred_ack_that_fails_to_commit_gives_back_and_flush_raises(tmp_path):
    from ackqueue.errors import QueueFileGone
    path = tmp_path / "q.fs"
    q = AckQueue(path=str(path), acks="deferred")
    try:
        freeze(q)
        q.put("a")
        item = q.get()
        q.ack(item)                      # returns; its commit comes later
        path.unlink()                    # the commit will be refused (a real failure)
        with pytest.raises(QueueFileGone):
            q.flush()
        assert q.get_nowait() == "a"     # given back: delivered again, not lost
        q.flush()                        # the error was reported once
    finally:
        q.close()


# ack_with_next_get=True through a server: a deferred ack whose window is long enough for
# a consumer that keeps up to send it with its next get's claim.

def test_ack_with_next_get_is_for_a_queue_shared_with_other_processes(tmp_path):
    path = str(tmp_path / "q.fs")
    for where in ({"path": path}, {}):
        with pytest.raises(ValueError, match="ack_with_next_get=True applies to a queue "
                                             "shared with other processes"):
            AckQueue(ack_with_next_get=True, **where)
    with pytest.raises(TypeError, match="ack_with_next_get must be True or False"):
        AckQueue(ack_with_next_get="yes")
    with AckQueue(path=path) as q:        # the refused open released the file
        q.put("x")


def test_ack_with_next_get_through_a_server_rides_on_the_next_claim(tmp_path):
    from ackqueue.deferred import NEXT_GET_WINDOW
    srv = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        q = AckQueue(path=srv.url, ack_with_next_get=True)
        try:
            assert q.acks == "deferred" and q.ack_window == NEXT_GET_WINDOW
            clock = freeze(q)
            committer = q._database.committer
            q.put_many(["a", "b", "c"])
            q.ack(q.get())
            ticket = q._state.deferred_acks._tickets[-1]
            # Not committed alone after the committer's few ms, only after the window:
            assert not committer.due(clock.now + committer.defer_delay)
            assert committer.due(clock.now + NEXT_GET_WINDOW)
            before = committer.commits
            assert not ticket._done.is_set()
            b = q.get()                         # its claim's commit carries the ack
            assert b == "b"
            assert ticket._done.wait(BOUND) and ticket.error is None
            assert committer.commits == before + 1
            with AckQueue(path=srv.url) as other:
                assert other.stats()["acked"] == 1
            q.ack(b)                            # no get follows: committed when due
            ticket = q._state.deferred_acks._tickets[-1]
            clock.now += NEXT_GET_WINDOW
            assert ticket._done.wait(BOUND) and ticket.error is None
            q.ack(q.get())
        finally:
            q.close()                           # flushes the last one
        with AckQueue(path=srv.url) as again:
            assert again.stats()["acked"] == 3
            assert again.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
    finally:
        srv.stop()


@pytest.mark.parametrize("mode", ["hold", "flush"])
def test_sigkill_right_after_acks_with_next_get_through_a_server_loses_nothing(tmp_path,
                                                                              mode):
    srv = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        url = f"{srv.url}?lease_timeout=1"
        with AckQueue(path=url) as q:
            q.put_many(range(30))
            proc = run_child(CHILD, url, mode)
            assert proc.returncode == -signal.SIGKILL, proc.stderr
            told = json.loads(proc.stdout)
            acked, held = told["acked"], told["held"]
            assert acked == list(range(10)) and held == list(range(10, 20))
            # What the dead process held comes back when its lease ends.
            back = [q.get_message(timeout=30) for _ in range(30 if mode == "hold" else 20)]
            bodies = [m.body for m in back]
            assert len(bodies) == len(set(bodies))
            if mode == "hold":        # the acks never reached the server: each comes back
                assert sorted(bodies) == list(range(30))
            else:                     # flush made them durable: none comes back
                assert sorted(bodies) == list(range(10, 30))
            q.ack_many(back)
            with pytest.raises(Empty):
                q.get(timeout=0.2)
    finally:
        srv.stop()


def test_an_explicit_durable_ack_mode_and_ack_with_next_get_are_refused_together():
    """ack_with_next_get=True makes an ack return at once; an explicit acks='durable' says
    the opposite, so the pair is refused rather than one silently overriding the other."""
    for path in ("zeo://127.0.0.1:9", "http://127.0.0.1:9/"):
        with pytest.raises(ValueError, match="contradicts ack_with_next_get"):
            AckQueue(path=path, acks="durable", ack_with_next_get=True)
    q = AckQueue(acks="durable")                    # alone, as before
    try:
        assert q.acks == "durable"
    finally:
        q.close()
    q = AckQueue()                                  # the default is durable
    try:
        assert q.acks == "durable"
    finally:
        q.close()
