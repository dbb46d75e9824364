"""Crash and multi-process behaviour, with real files and real child processes.

Each child is ``python -c SCRIPT`` with the queue file's path as argv[1]; it kills itself
with SIGKILL (no atexit, no close) where a crash is wanted.
"""
import json
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from ackqueue import AckQueue, Empty, QueueLocked

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

CHILD_TIMEOUT = 60      # a failure bound only; each child takes well under a second


def run_child(script, *args):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)


@pytest.mark.parametrize("policy", [False, True], ids=["no-policy", "max_receives"])
def test_sigkill_after_partial_acks_redelivers_unacked_in_fifo_order(tmp_path, policy):
    path = tmp_path / "jobs.fs"
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1], max_receives=int(sys.argv[2]) or None)
        for i in range(50):
            q.put(i)
        got = [q.get() for _ in range(10)]
        assert got == list(range(10)), got
        for item in got[:5]:
            q.ack(item)
        print("acked", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, path, 5 if policy else 0)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "acked"

    with AckQueue(path=path) as q:
        assert q.qsize() == 45
        assert q.unfinished_tasks == 45
        messages = [q.get_message(block=False) for _ in range(45)]
        with pytest.raises(Empty):
            q.get_nowait()
        assert [m.body for m in messages] == list(range(5, 50))
        redelivered = {m.body: m.receive_count for m in messages[:5]}
        # Without a dead-letter policy a get writes nothing (a crash gives the item back
        # anyway), so the crashed receives are not counted; with max_receives the receive
        # count is durable before get returns, so each redelivery is the second receive.
        assert redelivered == {i: 2 if policy else 1 for i in range(5, 10)}
        assert all(m.receive_count == 1 for m in messages[5:])
        for m in messages:
            q.ack(m)
        assert q.unfinished_tasks == 0

    with AckQueue(path=path) as q:        # the acks of the reopened queue are durable too
        assert q.qsize() == 0 and q.unfinished_tasks == 0


def test_sigkill_inside_transaction_rolls_back(tmp_path):
    path = tmp_path / "txn.fs"
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        q.put("first")
        q.put("second")
        with q.transaction():
            item = q.get()
            assert item == "first", item
            q.put("new-1")
            q.put("new-2")
            print("in-txn", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        print("not reached", flush=True)
    """, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "in-txn"

    with AckQueue(path=path) as q:
        assert q.qsize() == 2
        assert q.unfinished_tasks == 2
        m = q.get_message(block=False)
        assert m.body == "first"
        assert m.receive_count >= 1
        assert q.get_nowait() == "second"
        with pytest.raises(Empty):
            q.get_nowait()


def test_a_second_process_is_a_client_of_the_holder_and_a_killed_holder_loses_nothing(
        tmp_path):
    """A second process that opens the file reaches it through the holder
    (ackqueue.shared); what it put there is in the file once the holder is SIGKILLed."""
    path = tmp_path / "locked.fs"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from ackqueue import AckQueue
            q = AckQueue(path=sys.argv[1])
            q.put("held")
            print("ready", flush=True)
            time.sleep(120)
        """), str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT)
        assert ready, "child did not open the queue in time"
        assert child.stdout.readline().strip() == "ready"
        client = AckQueue(path=path)
        assert "(shared)" in repr(client) and client.qsize() == 1
        client.put("from the client")
    finally:
        child.kill()
        child.wait(CHILD_TIMEOUT)
        child.stdout.close()
        child.stderr.close()
    client.close()        # its process took the file over when the holder died; now let go

    # Once the holder is gone the file opens, with what both put.
    with AckQueue(path=path) as q:
        assert "(shared)" not in repr(q)
        assert [q.get_nowait(), q.get_nowait()] == ["held", "from the client"]


def test_thread_dying_of_exception_gives_back_in_plain_code(tmp_path):
    # pytest replaces threading.excepthook during tests, so this runs in a child process.
    proc = run_child("""
        import json, sys, threading, time
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        q.put("job")
        q.put("later")
        seen = []
        def worker():
            seen.append(q.get())
            raise RuntimeError("worker failed")
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        start = time.monotonic()
        m = q.get_message(timeout=5)
        elapsed = time.monotonic() - start
        print(json.dumps({"worker": seen, "body": m.body, "count": m.receive_count,
                          "elapsed": elapsed, "left": q.qsize()}), flush=True)
    """, tmp_path / "plain.fs")
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeError: worker failed" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["worker"] == ["job"]
    assert result["body"] == "job"            # back at its original place, before "later"
    assert result["count"] == 2
    assert result["elapsed"] < 1.0
    assert result["left"] == 1


def test_durability_os_survives_a_sigkilled_process(tmp_path):
    """durability="os" skips fsync: commits reach the OS, so a killed process loses
    nothing (a power cut could lose the latest commits; that is not tested here)."""
    path = tmp_path / "os.fs"
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1], durability="os")
        for i in range(20):
            q.put(i)
        for _ in range(5):
            q.ack(q.get())
        q.get()                                   # in flight when the process dies
        print("ok", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "ok"
    with AckQueue(path=path) as q:
        assert [q.get(block=False) for _ in range(15)] == list(range(5, 20))
        with pytest.raises(Empty):
            q.get_nowait()


def test_durability_is_checked(tmp_path):
    with pytest.raises(ValueError, match="durability must be one of"):
        AckQueue(path=tmp_path / "x.fs", durability="never")
    with pytest.raises(ValueError, match="applies to a queue file"):
        AckQueue(durability="os")
    with AckQueue(path=tmp_path / "y.fs", durability="os"):
        with pytest.raises(ValueError, match="already open in this process"):
            AckQueue(path=tmp_path / "y.fs", durability="fsync")
        AckQueue(path=tmp_path / "y.fs").close()       # no preference: shares the open file
