"""The remote drop-in, AckQueue(path="http://HOST:PORT", name=...), against a real queue
service (the ``ackqueue serve`` console script in a child process).  Crashes are real
signals; a cut-off request is a real TCP connection closed by a forwarding proxy.  Waits
are bounded failure limits, never synchronization, and nothing asserts a duration."""
import itertools
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("aiohttp")

import ackqueue                                        # noqa: E402
from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, NotSupported,  # noqa: E402
                      ServerUnavailable, ShutDown, StaleAck)

from cutting_proxy import CuttingProxy                 # noqa: E402
from service_proc import Service                       # noqa: E402

_names = itertools.count()


def until(check, limit=15.0):
    """Bounded poll of a condition nothing can tell the test about (failure bound only)."""
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote")
    s = Service(d / "shared.fs", d / "service.log")
    yield s
    assert s.stop() == 0


@pytest.fixture
def q(shared):
    opened = []

    def make(*args, **kwargs):
        kwargs.setdefault("name", f"t{next(_names)}")
        x = AckQueue(*args, path=kwargs.pop("path", shared.url), **kwargs)
        opened.append(x)
        return x
    yield make
    for x in opened:
        x.close()


def child(code, url, name, *, stdout=subprocess.PIPE):
    """A Python child process running code with q = AckQueue(path=url, name=name)."""
    prelude = (f"import sys, time\nfrom ackqueue import AckQueue\n"
               f"q = AckQueue(path={url!r}, name={name!r})\n")
    return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)],
                            stdout=stdout, text=True)


class Point:
    """A picklable object of the test's own."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


# -- round trips ------------------------------------------------------------------------

def test_round_trip_and_the_same_file_embedded(own_service, tmp_path):
    s = own_service()
    items = [{"a": [1, 2.5, None]}, Point(3, 4), "text é", b"\x00bytes\xff", 7, None]
    r = AckQueue(path=s.url, name="jobs")
    for item in items:
        r.put(item)
    assert r.qsize() == len(items)
    got = [r.get(timeout=10) for _ in range(3)]
    assert got == items[:3]
    for _ in got:
        r.task_done()
    r.close()
    assert s.stop() == 0
    # The embedded queue on the service's file reads what the remote one put ...
    e = AckQueue(path=str(tmp_path / "q.fs"), name="jobs")
    assert [e.get(timeout=1) for _ in range(3)] == items[3:]
    e.ack_many([])
    for _ in range(3):
        e.task_done()
    e.put(Point(5, 6))
    e.put("from embedded")
    e.put(b"raw")
    e.close()
    # ... and the remote one reads what the embedded one put.
    s.start()
    r = AckQueue(path=s.url, name="jobs")
    try:
        got = [r.get(timeout=10) for _ in range(3)]
        assert got == [Point(5, 6), "from embedded", b"raw"]
        assert type(got[1]) is str and type(got[2]) is bytes
        r.ack_many(got)
        assert r.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
    finally:
        r.close()


def test_messages_batches_options(q):
    a = q()
    ids = a.put_many([1, "two", b"three", Point(4, 4)])
    assert len(ids) == 4
    got = a.get_many(10, timeout=10)
    assert got == [1, "two", b"three", Point(4, 4)]
    a.ack_many(got)
    a.put("hi", priority=300, attributes={"k": "v"})
    a.put("lo", priority=10)
    assert a.peek().body == "hi"
    m = a.get_message(timeout=10)
    assert (m.body, m.priority, m.attributes, m.receive_count) == ("hi", 300, {"k": "v"}, 1)
    a.ack(m)
    assert a.get(timeout=10) == "lo"
    a.task_done()
    st = a.stats()
    assert (st["put"], st["acked"], st["ready"], st["in_flight"]) == (6, 6, 0, 0)
    with pytest.raises(ackqueue.NotHeld):
        a.ack("lo")


def test_queues_lists_the_services_queues_with_their_counts(q, shared):
    a, b = q(), q()
    a.put_many(["x", "y", "z"])
    held = a.get(timeout=10)
    b.put("w", delay=60)
    listing = ackqueue.queues(shared.url)         # the public listing, through the service
    assert listing[a.name] == {"ready": 2, "in_flight": 1, "delayed": 0}
    assert listing[b.name] == {"ready": 0, "in_flight": 0, "delayed": 1}
    a.ack(held)
    assert ackqueue.queues(shared.url)[a.name]["in_flight"] == 0


def test_get_timeouts_and_nowait(q):
    a = q()
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        a.get(timeout=0.3)
    assert time.monotonic() - start >= 0.3       # it waited (on the long poll), not less
    with pytest.raises(queue.Empty):
        a.get_nowait()
    with pytest.raises(queue.Empty):
        a.get(block=False)
    with pytest.raises(ValueError):
        a.get(timeout=-1)
    a.put_nowait(1)
    assert a.get_nowait() == 1
    a.task_done()


def test_blocking_get_is_woken_by_a_put_from_another_process(q, shared):
    a = q()
    got, finish = [], threading.Event()

    def wait_for_one():
        got.append(a.get(timeout=30))
        a.task_done()
        finish.wait(30)
    t = threading.Thread(target=wait_for_one)
    t.start()
    try:
        time.sleep(0.3)
        assert not got                               # nothing to get yet: it waits
        p = child("q.put({'from': 'child'}); q.close()", shared.url, a.name)
        assert p.wait(30) == 0
        until(lambda: got)
    finally:
        finish.set()
        t.join(40)
    assert got == [{"from": "child"}]
    assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


def test_task_done_and_join(q):
    a = q()
    for i in range(3):
        a.put(i)
    done = threading.Event()
    joiner = threading.Thread(target=lambda: (a.join(), done.set()))
    x = a.get(timeout=10)
    joiner.start()
    time.sleep(0.3)
    assert not done.is_set()                         # items unacknowledged: join waits
    a.task_done()
    for _ in range(2):
        a.get(timeout=10)
        a.task_done()
    joiner.join(20)
    assert done.is_set() and x == 0
    with pytest.raises(ValueError):
        a.task_done()


def test_nack_redelivers(q):
    a = q()
    a.put("again")
    m = a.get_message(timeout=10)
    a.nack(m)
    m2 = a.get_message(timeout=10)
    assert m2.body == "again" and m2.receive_count == 2
    a.ack(m2)
    with pytest.raises(StaleAck):
        a.nack(m)                 # not held any more: NotHeld's StaleAck or NotHeld
    assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


def test_visibility_timeout_gives_back_and_late_ack_is_stale(q):
    a = q(visibility_timeout=0.5)
    a.put(Point(1, 1))
    m = a.get_message(timeout=10)
    assert m.deadline is not None
    until(lambda: a.counts()["ready"] == 1)          # the service gave it back
    with pytest.raises(StaleAck):
        a.ack(m)
    m2 = a.get_message(timeout=10)
    assert m2.body == Point(1, 1) and m2.receive_count == 2
    a.change_visibility(m2, 30)
    a.ack(m2)
    assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("how", ["exception", "ended after acknowledging"])
def test_a_thread_that_dies_holding_an_item_gives_it_back(q, how):
    a = q()
    a.put("held")
    if how == "ended after acknowledging":
        a.put("acked first")     # the thread acknowledges "held", then holds this

    def work():
        if how == "ended after acknowledging":
            a.get(timeout=10)
            a.task_done()                 # the program acknowledges on this queue
            a.get(timeout=10)
            return
        a.get(timeout=10)
        raise RuntimeError("the worker dies holding its item")

    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert not t.is_alive()
    # Given back by this process's background thread (within about a second).
    got = a.get(timeout=10)
    assert got == ("held" if how == "exception" else "acked first")
    a.task_done()
    assert a.counts()["in_flight"] == 0


def test_a_killed_client_process_gives_back_after_its_lease(own_service):
    s = own_service("--lease-timeout", "1")
    a = AckQueue(path=s.url, name="jobs")
    try:
        a.put_many(["a", "b", "c"])
        p = child("""
            got = [q.get(timeout=10), q.get(timeout=10)]
            print(",".join(got), flush=True)
            time.sleep(300)
        """, s.url, "jobs")
        line = p.stdout.readline().strip()
        assert line == "a,b"
        assert a.counts()["in_flight"] == 2
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        p.stdout.close()
        got = sorted(a.get(timeout=20) for _ in range(3))
        assert got == ["a", "b", "c"]
        a.ack_many(got)
        assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
    finally:
        a.close()


# -- the service going away -----------------------------------------------------------------

def test_a_put_cut_off_is_retried_and_stored_once(own_service):
    s = own_service()
    proxy = CuttingProxy(s.port)
    a = AckQueue(path=f"http://127.0.0.1:{proxy.port}", name="jobs")
    try:
        a.put("warm")                     # the connection is open and kept alive
        proxy.armed.set()
        a.put("once")                     # stored, answer cut, retried with its key
        assert proxy.cuts == 1
        assert a.counts()["ready"] == 2
        assert [a.get(timeout=10), a.get(timeout=10)] == ["warm", "once"]
        with pytest.raises(queue.Empty):
            a.get_nowait()
    finally:
        a.close()
        proxy.close()


def test_the_service_killed_and_restarted(own_service):
    s = own_service()
    a = AckQueue(path=s.url, name="jobs")
    finish = threading.Event()
    try:
        a.put("before")
        m = a.get_message(timeout=10)
        waiting, got_it = [], threading.Event()

        def wait_for_one():
            waiting.append(a.get(timeout=60))
            got_it.set()
            finish.wait(60)       # alive while the test acks: an ended thread gives back
        t = threading.Thread(target=wait_for_one)
        t.start()
        time.sleep(0.3)
        s.kill()                          # a long poll in progress, a delivery held
        putter = threading.Thread(target=lambda: a.put("during"))
        putter.start()                    # waits for the service (up to 30 s)
        time.sleep(0.5)
        assert putter.is_alive(), "a put returned while the service was down"
        s.start()                         # same port
        putter.join(40)
        assert not putter.is_alive(), "the put did not finish after the restart"
        assert got_it.wait(40), "the waiting get did not return after the restart"
        # The held delivery came back on restart (given back with the dead service), so
        # the waiting get may have it; its old receipt is stale either way.
        with pytest.raises(StaleAck):
            a.ack(m)
        rest = sorted(waiting + [a.get(timeout=10)])
        assert rest == ["before", "during"], (waiting, rest, a.counts())
        a.ack_many(rest)
        assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
    finally:
        finish.set()
        a.close()


def test_service_unavailable_after_the_wait_timeout(own_service):
    s = own_service()
    a = AckQueue(path=s.url + "?wait_timeout=0.5", name="jobs")
    try:
        s.kill()
        with pytest.raises(ServerUnavailable):
            a.put(1)
        with pytest.raises(ServerUnavailable):
            a.get(timeout=1)
    finally:
        a.close()
    with pytest.raises(ServerUnavailable):
        AckQueue(path=s.url + "?wait_timeout=0.3", name="jobs")


# -- maxsize, shutdown, the deferred ack -------------------------------------------------------

def test_maxsize_put_waits_for_room(q):
    a = q(2)
    a.put(1)
    a.put(2)
    assert a.full() and a.qsize() == 2 and not a.empty()
    with pytest.raises(queue.Full):
        a.put_nowait(3)
    with pytest.raises(queue.Full):
        a.put(3, timeout=0.2)
    done = []
    t = threading.Thread(target=lambda: (a.put(3, timeout=30), done.append(1)))
    t.start()
    time.sleep(0.3)
    assert not done
    assert a.get(timeout=10) == 1        # room: the blocked put goes on
    t.join(30)
    assert done == [1]
    assert [a.get(timeout=10), a.get(timeout=10)] == [2, 3]


def test_shutdown_wakes_a_blocked_get(q):
    a = q()
    out = []

    def wait():
        try:
            a.get()               # a long poll of 20 s is in progress when shutdown comes
        except ShutDown:
            out.append("shutdown")
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    a.shutdown()
    t.join(10)                    # failure bound, shorter than the long poll's 20 s
    assert out == ["shutdown"]
    with pytest.raises(ShutDown):
        a.put(1)


def test_ack_with_next_get(q):
    a = q(ack_with_next_get=True)
    plain = q(name=a.name)
    a.put_many([1, 2, 3])
    assert a.get(timeout=10) == 1
    a.task_done()                         # returns at once: the ack is deferred
    assert a.get(timeout=10) == 2         # ... and made durable by this get
    assert plain.stats()["acked"] >= 1
    a.task_done()                         # no get follows: flushed within ~50 ms
    until(lambda: plain.stats()["acked"] == 2)
    assert a.get(timeout=10) == 3
    a.task_done()
    a.close()                             # close makes the last one durable
    assert plain.stats()["acked"] == 3
    with pytest.raises(ValueError):
        AckQueue(ack_with_next_get=True)  # only for a queue shared with others


# -- what cannot work over the service -------------------------------------------------------

def test_clear_errors_for_what_the_service_cannot_do(q, shared):
    a = q()
    with pytest.raises(NotSupported, match="priority="):
        AckPriorityQueue(path=shared.url, name="prio")
    with pytest.raises(NotSupported, match="priority="):
        AckLifoQueue(path=shared.url, name="lifo")
    with pytest.raises(NotSupported, match="FIFO"):
        AckQueue(path=shared.url, name="lifo2", lifo=True)
    with pytest.raises(NotSupported):
        a.db
    with pytest.raises(TypeError):
        AckQueue(path=shared.url, db=object())
    assert isinstance(NotSupported("x"), (ackqueue.AckQueueError, NotImplementedError))
    # the queue still works after each refusal
    a.put(pickle.dumps(1))
    assert pickle.loads(a.get(timeout=10)) == 1
    a.task_done()


def _forked_worker(a, jobs):
    item = jobs.get(timeout=20)
    jobs.task_done()
    a.put(("done", item))     # on a's connection, which the parent is using meanwhile
    a.close()
    jobs.close()


def test_a_forked_child_uses_its_parents_queue_objects(q):
    import multiprocessing
    a, jobs = q(), q()
    a.put("warm")                              # the parent's connection to a is open
    assert a.get(timeout=10) == "warm"
    a.task_done()
    jobs.put("job")
    p = multiprocessing.get_context("fork").Process(target=_forked_worker, args=(a, jobs))
    p.start()
    try:
        assert a.get(timeout=30) == ("done", "job")   # a long poll while the child works
        a.task_done()
    finally:
        p.join(60)
    assert p.exitcode == 0
    assert a.counts() == jobs.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
    a.put("parent still works")
    assert a.get(timeout=10) == "parent still works"
    a.task_done()


def test_delay_dedup_purge_and_change_visibility(q):
    a = q()
    a.put("later", delay=0.5)
    assert a.counts()["delayed"] == 1
    with pytest.raises(queue.Empty):
        a.get_nowait()
    assert a.get(timeout=15) == "later"            # the long poll waits for its time
    a.task_done()
    a.put("one", dedup_id="k1")
    with pytest.raises(ackqueue.DuplicateMessage):
        a.put("one again", dedup_id="k1")
    m = a.get_message(timeout=10)
    a.change_visibility(m, 0)                      # given back now
    m2 = a.get_message(timeout=10)
    assert m2.body == "one" and m2.receive_count == 2
    with pytest.raises(StaleAck):
        a.ack(m)
    a.put_many(["x", "y"])
    assert a.purge() == 3
    with pytest.raises(StaleAck):
        a.ack(m2)                                  # purged while held
    assert a.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
