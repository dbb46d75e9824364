"""One queue file, many processes: the same AckQueue(path=...) line in every process.

The process that holds the file serves it to the others over a Unix socket beside it
(ackqueue.owner); the others are clients of it, with the service drop-in's guarantees.
Every process here is a real one (a child python, multiprocessing's spawn, forkserver and
fork), and every crash a real SIGKILL.  Waits are bounds on a failure, never timings."""
import multiprocessing
import os
import signal
import stat
import time

import pytest

from ackqueue import AckQueue, Empty, StaleAck
from ackqueue.shared import files
from zeo_server import kill, read_line, spawn

pytestmark = pytest.mark.skipif(not files.available(),
                                reason="sharing a file needs Unix sockets")

BOUND = 60              # seconds: a failure bound only

HOLDER = """
    import sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="jobs")
    q.put_many([f"item-{i}" for i in range(int(sys.argv[2]))])
    print("open", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "counts":
            print(q.qsize(), q.unfinished_tasks, flush=True)
        elif cmd.startswith("put "):
            q.put(cmd[4:])
            print("ok", flush=True)
        elif cmd == "exit":
            break
    q.close()
    print("closed", flush=True)
    """


def _holder(path, items=3, **kwargs):
    proc = spawn(HOLDER, path, items, **kwargs)
    assert read_line(proc, BOUND) == "open"
    return proc


def _wait_until(condition, failure):
    """Wait for condition() to hold, up to BOUND seconds (a bound on a failure only)."""
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def _ask(proc, line):
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return read_line(proc, BOUND)


def test_a_second_process_opening_the_same_path_is_a_client_of_the_holder(tmp_path):
    path = str(tmp_path / "q.fs")
    holder = _holder(path)
    try:
        sock = files.socket_path(os.path.realpath(path))
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600      # this user's processes only
        with AckQueue(path=path, name="jobs") as q:
            assert "(shared)" in repr(q)
            assert q.get(timeout=BOUND) == "item-0"
            q.task_done()
            q.put("from the client")
            assert _ask(holder, "counts") == "3 3"    # item-1, item-2, from the client
            assert _ask(holder, "put from the holder") == "ok"
            got = [q.get(timeout=BOUND) for _ in range(4)]
            assert got == ["item-1", "item-2", "from the client", "from the holder"]
            for _ in got:
                q.task_done()
            assert _ask(holder, "counts") == "0 0"
        assert _ask(holder, "exit") == "closed"
        assert holder.wait(BOUND) == 0
        assert not os.path.exists(sock)               # the owner took its socket away
    finally:
        kill(holder)


def test_the_owner_sigkilled_a_client_takes_the_file_over_and_nothing_acked_comes_back(
        tmp_path):
    path = str(tmp_path / "q.fs")
    holder = _holder(path, 50)
    q = AckQueue(path=path, name="jobs")
    try:
        acked = []
        for _ in range(10):
            acked.append(q.get(timeout=BOUND))
            q.task_done()
        held = q.get(timeout=BOUND)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(BOUND)
        # The owner is gone with the delivery it handed out: it comes back (at least once),
        # and this client's ack of it is refused rather than taken as done.
        with pytest.raises(StaleAck):
            q.task_done()
        rest = []
        while True:
            try:
                rest.append(q.get(timeout=1))
            except Empty:
                break
            q.task_done()
        assert not set(acked) & set(rest)
        assert sorted(acked + rest) == sorted(f"item-{i}" for i in range(50))
        assert held in rest
    finally:
        q.close()
        kill(holder)
    assert not os.path.exists(files.socket_path(os.path.realpath(path)))
    with AckQueue(path=path, name="jobs") as q:       # this process's own file again
        assert "(shared)" not in repr(q)
        assert q.qsize() == 0 and q.unfinished_tasks == 0


def test_a_stale_socket_of_a_killed_owner_is_replaced_by_the_next_holder(tmp_path):
    path = str(tmp_path / "q.fs")
    holder = _holder(path, 2)
    sock = files.socket_path(os.path.realpath(path))
    kill(holder)
    assert stat.S_ISSOCK(os.stat(sock).st_mode)        # left behind by the SIGKILL
    with AckQueue(path=path, name="jobs") as q:
        assert "(shared)" not in repr(q)
        client = spawn("""
            import sys
            from ackqueue import AckQueue
            with AckQueue(path=sys.argv[1], name="jobs") as q:
                print(q.get(timeout=60), flush=True)
                q.task_done()
            """, path)
        try:
            assert read_line(client, BOUND) == "item-0"
            assert client.wait(BOUND) == 0
        finally:
            kill(client)
        assert q.get(timeout=BOUND) == "item-1"
        q.task_done()


def test_a_client_killed_holding_an_item_gives_it_back_at_its_place(tmp_path):
    """The owner hears a client's death when its last connection closes: what it held
    goes back at once, at its original place."""
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, name="jobs") as q:
        q.put_many(["a", "b"])
        client = spawn("""
            import sys, time
            from ackqueue import AckQueue
            q = AckQueue(path=sys.argv[1], name="jobs")
            print(q.get(timeout=60), flush=True)
            time.sleep(120)
            """, path)
        try:
            assert read_line(client, BOUND) == "a"
            assert q.qsize() == 1 and q.unfinished_tasks == 2
        finally:
            kill(client)
        _wait_until(lambda: q.qsize() >= 2, "the killed client's item never came back")
        assert [q.get(timeout=BOUND), q.get(timeout=BOUND)] == ["a", "b"]
        q.task_done()
        q.task_done()
        assert q.unfinished_tasks == 0


def test_the_owner_closing_hands_the_file_over_and_its_clients_carry_on(tmp_path):
    path = str(tmp_path / "q.fs")
    holder = _holder(path, 5)
    try:
        with AckQueue(path=path, name="jobs") as q:
            assert q.get(timeout=BOUND) == "item-0"
            q.task_done()
            assert _ask(holder, "exit") == "closed"
            assert holder.wait(BOUND) == 0
            q.put("after the owner went")            # retried until this process serves it
            got = []
            while True:
                try:
                    got.append(q.get(timeout=1))
                except Empty:
                    break
                q.task_done()
            assert got == [f"item-{i}" for i in range(1, 5)] + ["after the owner went"]
    finally:
        kill(holder)


# -- processes as users write them ---------------------------------------------------------

def _drain_into(q, out):
    n = []
    while True:
        try:
            item = q.get(timeout=2)
        except Empty:
            break
        n.append(item)
        q.task_done()
    out.put(n)
    q.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_queue_passed_to_processes_reopens_there_as_a_client(tmp_path, method):
    """spawn and forkserver pickle the queue (it travels as its path, name and options);
    fork copies it, and the child must not write through the parent's file handle."""
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    ctx = multiprocessing.get_context(method)
    with AckQueue(path=str(tmp_path / "q.fs"), name="jobs") as q:
        q.put_many(range(60))
        out = ctx.Queue()
        procs = [ctx.Process(target=_drain_into, args=(q, out)) for _ in range(3)]
        for p in procs:
            p.start()
        got = [out.get(timeout=BOUND) for _ in procs]
        for p in procs:
            p.join(BOUND)
            assert p.exitcode == 0
        assert sorted(x for part in got for x in part) == list(range(60))
        assert q.qsize() == 0 and q.unfinished_tasks == 0


_pool_queue = None


def _pool_init(q):
    global _pool_queue
    _pool_queue = q


def _pool_task(n):
    done = []
    for _ in range(n):
        try:
            item = _pool_queue.get(timeout=2)
        except Empty:
            break
        done.append(item)
        _pool_queue.task_done()
    return done


def test_a_pool_whose_workers_are_replaced_drains_the_queue_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with AckQueue(path=str(tmp_path / "q.fs"), name="jobs") as q:
        q.put_many(range(200))
        with ctx.Pool(4, initializer=_pool_init, initargs=(q,), maxtasksperchild=5) as pool:
            parts = pool.map(_pool_task, [10] * 20, chunksize=1)
        done = [x for part in parts for x in part]
        assert sorted(done) == list(range(200))          # each once: every ack returned
        assert q.qsize() == 0 and q.unfinished_tasks == 0


def test_a_queue_in_memory_cannot_travel_to_another_process():
    with AckQueue() as q:
        with pytest.raises(TypeError, match="cannot be pickled"):
            multiprocessing.reduction.ForkingPickler.dumps(q)


def test_a_forked_child_cannot_use_its_parents_queue_in_memory():
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork here")
    with AckQueue() as q:
        q.put("x")
        pid = os.fork()
        if pid == 0:                                   # the child
            try:
                q.get(timeout=1)
                code = 1
            except ValueError as exc:
                code = 0 if "before a fork" in str(exc) else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert q.get(timeout=1) == "x"                 # the parent's queue is untouched
        q.task_done()


# -- faults with real processes ------------------------------------------------------------

PRODUCER = """
    import sys
    from ackqueue import AckQueue
    path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with AckQueue(path=path, name="jobs") as q:
        for i in range(first, first + count):
            q.put(i)
    """

CONSUMER = """
    import os, sys, time
    from ackqueue import AckQueue, Empty, StaleAck
    path, log, done = sys.argv[1], sys.argv[2], sys.argv[3]
    with AckQueue(path=path, name="jobs") as q, open(log, "w") as out:
        while True:
            try:
                item = q.get(timeout=1)
            except Empty:
                if os.path.exists(done):
                    break
                continue
            out.write(f"got {item} {time.time()!r}\\n")
            out.flush()
            try:
                q.task_done()
            except StaleAck:
                # Handed out by the owner that was killed: it comes back; or acknowledged
                # by a first attempt whose answer that owner took with it.
                continue
            out.write(f"acked {item} {time.time()!r}\\n")
            out.flush()
    """


def _lines(path):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def test_two_producers_and_two_consumers_lose_nothing_when_the_owner_is_sigkilled(tmp_path):
    """Every process opens the same path; the first (a holder doing nothing else) is
    SIGKILLed once items flow: a client takes the file over, every item is acknowledged,
    none comes back after its ack returned, and the queue drains."""
    path = str(tmp_path / "q.fs")
    done = str(tmp_path / "done")
    holder = _holder(path, 0)
    logs = [str(tmp_path / f"consumer{k}.log") for k in range(2)]
    consumers = [spawn(CONSUMER, path, log, done) for log in logs]
    producers = [spawn(PRODUCER, path, k * 300, 300) for k in range(2)]
    procs = consumers + producers
    try:
        _wait_until(lambda: sum(len(_lines(f)) for f in logs) >= 100,   # items are flowing
                    "no item went through")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(BOUND)
        for p in producers:
            assert p.wait(BOUND * 2) == 0, p.stderr.read()
        open(done, "w").close()
        for p in consumers:
            assert p.wait(BOUND * 2) == 0, p.stderr.read()
    finally:
        for p in procs + [holder]:
            kill(p)
    events = [(float(at), what, int(item)) for log in logs for what, item, at in _lines(log)]
    acked = {}
    for at, what, item in events:
        if what == "acked":
            acked[item] = min(at, acked.get(item, at))
    # None received again after an ack of it returned; every item received at least once
    # (an ack whose first attempt went with the killed owner may answer StaleAck even
    # though it was made: that item is received once and never again).
    assert [item for at, what, item in events
            if what == "got" and item in acked and at > acked[item]] == []
    assert {item for _, what, item in events if what == "got"} == set(range(600))
    with AckQueue(path=path, name="jobs") as q:
        assert q.qsize() == 0 and q.unfinished_tasks == 0


def test_a_client_thread_that_dies_holding_an_item_gives_it_back(tmp_path, monkeypatch):
    """The embedded rule, in a client: a thread that ends by an exception holding an item
    gives it back (within about a second), at its place."""
    import threading
    monkeypatch.setattr(threading, "excepthook", lambda args: None)   # its traceback
    path = str(tmp_path / "q.fs")
    holder = _holder(path, 2)
    try:
        with AckQueue(path=path, name="jobs") as q:
            got = []

            def worker():
                got.append(q.get(timeout=BOUND))
                raise RuntimeError("the worker dies holding its item")
            t = threading.Thread(target=worker)
            t.start()
            t.join(BOUND)
            assert got == ["item-0"]
            _wait_until(lambda: q.qsize() >= 2, "the dead thread's item never came back")
            assert q.get(timeout=BOUND) == "item-0"      # given back, at its place
            q.task_done()
            assert q.get(timeout=BOUND) == "item-1"
            q.task_done()
    finally:
        kill(holder)


def test_ackqueue_serve_share_file_serves_the_same_path_beside_http(tmp_path):
    """ackqueue serve FILE --share-file: processes that open FILE itself are clients of the
    service's process over the lean wire, on the same queues as its HTTP clients."""
    pytest.importorskip("aiohttp")
    from service_proc import Service
    path = str(tmp_path / "q.fs")
    service = Service(path, tmp_path / "service.log", "--share-file")
    try:
        with AckQueue(path=path, name="jobs") as by_path, \
                AckQueue(path=service.url, name="jobs") as by_url:
            assert "(shared)" in repr(by_path)
            by_path.put("from the path")
            assert by_url.get(timeout=BOUND) == "from the path"
            by_url.task_done()
            by_url.put("from http")
            assert by_path.get(timeout=BOUND) == "from http"
            by_path.task_done()
            assert by_url.qsize() == 0 and by_path.unfinished_tasks == 0
    finally:
        assert service.stop() == 0
    assert not os.path.exists(files.socket_path(os.path.realpath(path)))


def test_what_a_client_cannot_do_is_refused_saying_why(tmp_path):
    from ackqueue import AckLifoQueue, AckPriorityQueue, NotSupported
    path = str(tmp_path / "q.fs")
    holder = _holder(path, 0)
    try:
        with pytest.raises(NotSupported, match="priority="):
            AckPriorityQueue(path=path, name="by-value")
        with pytest.raises(ValueError, match="clock="):
            AckQueue(path=path, name="jobs", clock=lambda: 0.0)
        with AckQueue(path=path, name="jobs") as q:
            with pytest.raises(NotSupported, match="transaction"):
                with q.transaction():
                    pass
        with AckLifoQueue(path=path, name="stack") as s:   # LIFO works, ordered by the holder
            s.put_many(["a", "b", "c"])
            assert [s.get(timeout=BOUND) for _ in range(3)] == ["c", "b", "a"]
            for _ in range(3):
                s.task_done()
    finally:
        kill(holder)


def test_a_queue_file_no_other_process_joined_leaves_no_thread_nor_socket(tmp_path):
    """The owner a lone process starts with its file (a socket and an accept thread) is
    gone with the file's last queue."""
    import threading
    path = str(tmp_path / "q.fs")
    for _ in range(3):
        with AckQueue(path=path, name="jobs") as q:
            assert os.path.exists(files.socket_path(os.path.realpath(path)))
            q.put("x")
            assert q.get() == "x"
            q.task_done()
    assert not os.path.exists(files.socket_path(os.path.realpath(path)))
    mine = f"ackqueue-owner {os.path.realpath(path)}"         # its accept thread's name
    _wait_until(lambda: all(t.name != mine for t in threading.enumerate()),
                "an owner thread outlived its file")
