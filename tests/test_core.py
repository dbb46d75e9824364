"""Core semantics of AckQueue, AckLifoQueue and AckPriorityQueue, in memory and on a file.

Deterministic: deadlines use an injected fake clock (every get/qsize checks them), a thread
tells the queue as it ends and the next get/qsize looks, and timeouts are only failure
bounds."""
import pickle
import threading

import pytest

import ackqueue
from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, AckQueueError, Empty, Full,
                      Message, MessageId, NotAQueueFile, NotHeld, QueueKindMismatch,
                      StaleAck, UnpicklableItem)
from helpers_reliability import FakeClock, drain_items as drain

BOUND = 5   # seconds: a failure bound for waits that should end at once


@pytest.fixture(params=["memory", "file"])
def backend(request):
    return request.param


@pytest.fixture
def make(backend, tmp_path):
    """make(cls=AckQueue, **kwargs): a queue on the test's backend, closed at teardown."""
    opened = []

    def make(cls=AckQueue, maxsize=0, **kwargs):
        if backend == "file":
            kwargs.setdefault("path", tmp_path / "q.fs")
        q = cls(maxsize, **kwargs)
        opened.append(q)
        return q

    make.backend = backend
    yield make
    for q in reversed(opened):
        q.close()


def run_thread(target):
    """Run target in a thread and return what it returned (re-raising what it raised)."""
    result = {}

    def body():
        try:
            result["value"] = target()
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(BOUND)
    assert not t.is_alive()
    if "error" in result:
        raise result["error"]
    return result.get("value")


# -- basics -------------------------------------------------------------------------------

def test_put_get_ack_basics(make):
    q = make()
    assert q.empty() and q.qsize() == 0 and q.unfinished_tasks == 0
    for item in ("a", "b", "c", "d"):
        q.put(item)
    assert q.qsize() == 4 and q.unfinished_tasks == 4

    a = q.get()
    assert a == "a"
    assert q.qsize() == 3 and q.unfinished_tasks == 4      # in flight, not yet finished
    q.ack(a)
    assert q.unfinished_tasks == 3

    m = q.get_message()
    assert isinstance(m, Message)
    assert m.body == "b" and m.receive_count == 1 and isinstance(m.id, MessageId)
    assert m.deadline is None
    q.ack(m)

    m = q.get_message()
    assert m.body == "c"
    q.ack(m.id)                                             # ack by MessageId
    assert q.unfinished_tasks == 1

    assert q.get_nowait() == "d"
    q.task_done()
    assert q.unfinished_tasks == 0 and q.empty()
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(timeout=0.01)


def test_unpicklable_item_leaves_queue_unchanged(make):
    q = make()
    q.put("kept")
    with pytest.raises(UnpicklableItem) as info:
        q.put(lambda: 0)
    assert isinstance(info.value, TypeError)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    with q.transaction():
        with pytest.raises(UnpicklableItem):
            q.put(lambda: 0)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    assert drain(q) == ["kept"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("how", ["give_back", "after_ack"])
def test_thread_dying_while_holding_gives_back_at_original_place(make, how):
    if how == "give_back":
        q = make(thread_exit="give_back")
    else:
        q = make()
        q.put("warm-up")
        q.ack(q.get())              # the queue has acknowledged: ended threads give back
    for item in ("job", "next", "last"):
        q.put(item)
    seen = []

    def worker():
        seen.append(q.get())
        raise RuntimeError("worker failed while holding an item")

    t = threading.Thread(target=worker)
    t.start()
    t.join(BOUND)
    assert not t.is_alive() and seen == ["job"]

    m = q.get_message(block=False)          # checked on every get: no waiting needed
    assert m.body == "job" and m.receive_count == 2
    assert drain(q) == ["next", "last"]
    assert q.unfinished_tasks == 3


def test_thread_returning_normally_gives_back_once_acknowledging(make):
    q = make()
    q.put("x")
    q.ack(q.get())
    q.put("job")
    q.put("next")
    assert run_thread(q.get) == "job"       # the thread ends without acking
    m = q.get_message(block=False)
    assert m.body == "job" and m.receive_count == 2


def test_an_ending_thread_tells_the_queue_and_the_reaper_finds_one_that_did_not(make):
    """A get looks for ended threads' holdings only when a thread has told that it ended
    (as its locals are dropped); the reaper still finds, every REAP_INTERVAL, the holdings
    of a thread that never told."""
    from ackqueue import connection
    q = make()
    q.ack((q.put("x"), q.get())[1])
    for item in ("told", "untold", "last"):
        q.put(item)
    assert run_thread(q.get) == "told"
    assert q.get_nowait() == "told"         # told as it ended: the next get gives it back

    def silent_get():
        item = q.get()
        connection._end_watches.watch.states.clear()    # this thread will not tell
        return item

    assert run_thread(silent_get) == "untold"
    got = [q.get(timeout=BOUND) for _ in range(2)]      # "last", and "untold" once reaped
    assert sorted(got) == ["last", "untold"]
    with pytest.raises(Empty):
        q.get_nowait()


# -- visibility timeouts ------------------------------------------------------------------

def test_visibility_expiry_redelivers_and_late_ack_is_stale(make):
    clock = FakeClock()
    q = make(clock=clock)
    q.put("job")

    m_a = q.get_message(visibility_timeout=10)      # thread A: the main thread
    item_a = m_a.body
    assert m_a.deadline == clock() + 10
    clock.advance(9)
    assert q.qsize() == 0                           # not yet due
    clock.advance(2)
    assert q.qsize() == 1                           # given back at the deadline

    got = threading.Event()
    may_ack = threading.Event()
    b_result = {}

    def thread_b():
        m = q.get_message(block=False)
        b_result["message"] = (m.body, m.receive_count)
        got.set()
        may_ack.wait(BOUND)
        q.ack(m)
        b_result["acked"] = True

    b = threading.Thread(target=thread_b)
    b.start()
    try:
        assert got.wait(BOUND)
        assert b_result["message"] == ("job", 2)

        with pytest.raises(StaleAck):
            q.ack(item_a)                           # A's late ack
        with pytest.raises(StaleAck):
            q.ack(m_a)                              # ... by Message too
        with pytest.raises(StaleAck):
            q.nack(m_a)
        # B still holds it: nothing removed, nothing given back.
        assert q.unfinished_tasks == 1 and q.qsize() == 0
    finally:
        may_ack.set()
        b.join(BOUND)
    assert b_result.get("acked") is True
    assert q.unfinished_tasks == 0 and q.qsize() == 0


def test_default_visibility_timeout(make):
    clock = FakeClock()
    q = make(clock=clock, visibility_timeout=3)
    q.put("a")
    q.put("b")
    assert q.get() == "a"
    clock.advance(3)
    m = q.get_message(block=False)
    assert m.body == "a" and m.receive_count == 2
    assert m.deadline == clock() + 3


# -- nack ---------------------------------------------------------------------------------

def test_nack_returns_item_to_original_place(make):
    q = make()
    for item in ("a", "b", "c"):
        q.put(item)
    a = q.get()
    b = q.get()
    q.nack(a)
    assert q.qsize() == 2 and q.unfinished_tasks == 3
    with pytest.raises(NotHeld):
        q.ack(a)                    # nacked: no longer held by this thread
    with pytest.raises(NotHeld):
        q.nack(a)
    m = q.get_message(block=False)
    assert m.body == "a" and m.receive_count == 2
    assert q.get_nowait() == "c"
    q.ack(b)
    q.ack(m)
    assert q.unfinished_tasks == 1


def test_nack_with_delay_invisible_until_clock_advances(make):
    clock = FakeClock()
    q = make(clock=clock)
    q.put("a")
    q.put("b")
    a = q.get()
    q.nack(a, delay=5)
    assert q.qsize() == 1 and q.unfinished_tasks == 2
    assert q.get_nowait() == "b"
    with pytest.raises(Empty):
        q.get_nowait()
    clock.advance(4.9)
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.qsize() == 0
    clock.advance(0.2)
    assert q.qsize() == 1
    m = q.get_message(block=False)
    assert m.body == "a" and m.receive_count == 2


# -- acknowledgement errors, task_done, join ---------------------------------------------

def test_ack_of_something_never_got_raises_not_held(make):
    q = make()
    q.put("x")
    with pytest.raises(NotHeld):
        q.ack("x")
    with pytest.raises(NotHeld):
        q.ack(MessageId(12345))
    with pytest.raises(NotHeld):
        q.nack("x")
    assert q.qsize() == 1 and q.unfinished_tasks == 1


def test_double_ack_raises(make):
    q = make()
    q.put("x")
    q.put("y")
    x = q.get()
    q.ack(x)
    with pytest.raises(NotHeld):
        q.ack(x)
    m = q.get_message()
    q.ack(m)
    with pytest.raises(NotHeld):          # StaleAck is a NotHeld
        q.ack(m)
    with pytest.raises(NotHeld):
        q.ack(m.id)
    assert q.unfinished_tasks == 0


def test_task_done_acknowledges_oldest_held_item_of_calling_thread(make):
    q = make()
    for item in ("a", "b", "c"):
        q.put(item)
    a = q.get()
    b = q.get()
    q.task_done()                           # acknowledges "a", the oldest held
    assert q.unfinished_tasks == 2
    with pytest.raises(NotHeld):
        q.ack(a)
    q.ack(b)
    assert q.unfinished_tasks == 1
    with pytest.raises(ValueError):
        q.task_done()                       # "c" is ready, not held
    assert q.qsize() == 1


def test_task_done_prefers_own_thread(make):
    q = make(thread_exit="give_back")
    for item in ("a", "b"):
        q.put(item)
    got = threading.Event()
    release = threading.Event()

    def other():
        q.get()                             # holds "a"
        got.set()
        release.wait(BOUND)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert got.wait(BOUND)
        mine = q.get()
        assert mine == "b"
        q.task_done()                       # acknowledges this thread's "b", not "a"
        with pytest.raises(NotHeld):
            q.ack(mine)
        assert q.unfinished_tasks == 1
    finally:
        release.set()
        t.join(BOUND)
    assert drain(q) == ["a"]                # given back when its thread ended


def test_join_returns_after_all_acked(make):
    q = make()
    q.put(1)
    q.put(2)
    joined = threading.Event()
    joiner = threading.Thread(target=lambda: (q.join(), joined.set()))
    joiner.start()
    try:
        assert not joined.wait(0.05)
        q.ack(q.get())
        assert not joined.wait(0.05)
        q.get()
        q.task_done()
        assert joined.wait(BOUND)
    finally:
        joiner.join(BOUND)
    q.join()                                # nothing unfinished: returns at once


# -- transactions -------------------------------------------------------------------------

def test_transaction_commit(make):
    q = make()
    q.put("a")
    q.put("b")
    with q.transaction():
        assert q.get() == "a"
        q.put("p1")
        q.put("p2")
        assert q.qsize() == 1                # puts are not visible before the commit
    assert q.qsize() == 3
    assert q.unfinished_tasks == 3           # "a" acknowledged by the commit
    assert drain(q) == ["b", "p1", "p2"]


def test_transaction_rollback(make):
    q = make()
    q.put("a")
    q.put("b")
    with pytest.raises(RuntimeError, match="boom"):
        with q.transaction():
            assert q.get() == "a"
            q.put("p")
            raise RuntimeError("boom")
    assert q.qsize() == 2 and q.unfinished_tasks == 2
    m = q.get_message(block=False)
    assert m.body == "a" and m.receive_count == 2
    assert drain(q) == ["b"]


def test_transaction_ack_inside_commits(make):
    q = make()
    q.put("a")
    a = q.get()
    with q.transaction():
        q.ack(a)
        assert q.unfinished_tasks == 1       # settles at commit
    assert q.unfinished_tasks == 0


def test_nested_transaction_raises(make):
    q = make()
    q.put("a")
    with q.transaction():
        with pytest.raises(AckQueueError):
            q.transaction()
        assert q.get() == "a"
    assert q.unfinished_tasks == 0


# -- connections --------------------------------------------------------------------------

def test_connect_context_manager_gives_back_on_exit(make):
    q = make()
    q.put("a")
    q.put("b")
    with q.connect() as conn:
        assert conn.get() == "a"
        assert q.qsize() == 1
    assert q.qsize() == 2
    m = q.get_message(block=False)
    assert m.body == "a" and m.receive_count == 2

    with q.connect() as conn:
        m = conn.get_message()
        assert m.body == "b"
        conn.ack(m)
    assert q.unfinished_tasks == 1          # the "a" the main thread holds


# -- reopening (file only) ----------------------------------------------------------------

def test_reopen_after_close_keeps_items_and_order(tmp_path):
    path = tmp_path / "reopen.fs"
    q = AckQueue(path=path)
    for i in range(5):
        q.put(i)
    q.ack(q.get())
    assert q.get() == 1                     # held at close: given back
    q.close()
    with pytest.raises(ValueError):
        q.get_nowait()

    with AckQueue(path=path) as q:
        assert q.qsize() == 4 and q.unfinished_tasks == 4
        m = q.get_message()
        assert m.body == 1 and m.receive_count >= 1
        assert drain(q) == [2, 3, 4]


# -- LIFO and priority --------------------------------------------------------------------

def test_lifo_order_and_give_back(make):
    q = make(AckLifoQueue)
    for i in (1, 2, 3):
        q.put(i)
    three = q.get()
    assert three == 3
    q.put(4)
    assert q.get() == 4
    q.nack(three)                           # 3 back at its place: below 4's, above 2
    q.put(5)
    m = q.get_message()
    assert m.body == 5
    m = q.get_message()
    assert m.body == 3 and m.receive_count == 2
    assert q.unfinished_tasks == 5
    q.task_done()                           # acks the oldest held: 4
    assert q.unfinished_tasks == 4
    assert drain(q) == [2, 1]


def test_lifo_thread_give_back_original_place(make):
    q = make(AckLifoQueue, thread_exit="give_back")
    for i in (1, 2, 3):
        q.put(i)
    assert run_thread(q.get) == 3           # thread ends holding 3
    q.put(4)
    assert drain(q) == [4, 3, 2, 1]


def test_priority_order_and_give_back(make):
    q = make(AckPriorityQueue, thread_exit="give_back")
    for i in (5, 1, 3, 1):
        q.put(i)
    first = q.get_message()
    assert first.body == 1
    second = q.get_message()
    assert second.body == 1 and second.id > first.id      # ties in put order
    assert q.get() == 3
    q.nack(first)
    q.put(2)
    m = q.get_message()
    assert m.id == first.id and m.receive_count == 2
    assert run_thread(q.get) == 2           # ends holding 2: given back
    assert q.get() == 2
    q.put(4)
    assert drain(q) == [4, 5]


# -- errors -------------------------------------------------------------------------------

def test_path_in_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as info:
        AckQueue(path=missing / "q.fs")
    assert str(missing) in str(info.value)
    assert not missing.exists()


def test_not_a_filestorage_file(tmp_path):
    path = tmp_path / "x.fs"
    path.write_bytes(b"hello")
    with pytest.raises(NotAQueueFile):
        AckQueue(path=path)
    assert path.read_bytes() == b"hello"
    with pytest.raises(NotAQueueFile):      # and again: no stale lock left behind
        AckQueue(path=path)
    assert path.read_bytes() == b"hello"


def test_timeout_and_maxsize_validation(make):
    q = make()
    q.put("a")
    with pytest.raises(ValueError):
        q.get(timeout=-1)
    with pytest.raises(TypeError):
        q.get(timeout="x")
    with pytest.raises(ValueError):
        q.put("b", timeout=-1)
    with pytest.raises(TypeError):
        q.put("b", timeout="x")
    with pytest.raises(TypeError):
        make(maxsize="3")
    with pytest.raises(TypeError):
        AckQueue("3")
    assert q.qsize() == 1 and q.unfinished_tasks == 1     # nothing taken by the failures


def test_kind_mismatch(tmp_path):
    path = tmp_path / "kind.fs"
    q = AckQueue(path=path, name="jobs")
    q.put(1)
    with pytest.raises(QueueKindMismatch):
        AckLifoQueue(path=path, name="jobs")          # open in this process
    q.close()
    with pytest.raises(QueueKindMismatch):
        AckLifoQueue(path=path, name="jobs")          # on the file
    with pytest.raises(QueueKindMismatch):
        AckPriorityQueue(path=path, name="jobs")
    with AckLifoQueue(path=path, name="other") as other:   # other names are free
        other.put(1)
    with AckQueue(path=path, name="jobs") as q:
        assert q.get_nowait() == 1


# -- blocking -----------------------------------------------------------------------------

def test_blocked_get_wakes_when_another_thread_puts(make):
    q = make()
    started = threading.Event()
    result = {}

    def getter():
        started.set()
        try:
            result["item"] = q.get(timeout=BOUND)
        except Empty:  # pragma: no cover - the failure being tested for
            result["item"] = Empty

    t = threading.Thread(target=getter)
    t.start()
    assert started.wait(BOUND)
    run_thread(lambda: q.put("wake"))
    t.join(BOUND)
    assert not t.is_alive()
    assert result["item"] == "wake"


# -- more edges ---------------------------------------------------------------------------

def test_late_ack_before_redelivery_leaves_item_ready(make):
    clock = FakeClock()
    q = make(clock=clock)
    q.put("job")
    m = q.get_message(visibility_timeout=1)
    clock.advance(1)
    assert q.qsize() == 1                     # the deadline is applied on qsize/get
    with pytest.raises(StaleAck):
        q.ack(m.id)
    assert q.qsize() == 1 and q.unfinished_tasks == 1
    again = q.get_message(block=False)
    assert again.id == m.id and again.receive_count == 2
    q.ack(again)
    assert q.unfinished_tasks == 0


def test_maxsize_full(make):
    q = make(maxsize=2)
    q.put(1)
    q.put(2)
    assert q.full()
    with pytest.raises(Full):
        q.put_nowait(3)
    with pytest.raises(Full):
        q.put(3, timeout=0.01)
    q.ack(q.get())
    q.put_nowait(3)
    assert drain(q) == [2, 3]


@pytest.mark.parametrize("cls,expected", [(AckLifoQueue, [2, 4, 1, 3]),
                                          (AckPriorityQueue, [1, 2, 3, 4]),
                                          (AckQueue, [3, 1, 4, 2])])
def test_reopen_keeps_order_of_each_kind(tmp_path, cls, expected):
    path = tmp_path / "kinds.fs"
    with cls(path=path) as q:
        for i in (3, 1, 4, 2):
            q.put(i)
        q.get()                               # held at close: back at its place
    with cls(path=path) as q:
        assert drain(q) == expected


def test_delayed_nack_survives_reopen(tmp_path):
    path = tmp_path / "delay.fs"
    clock = FakeClock()
    with AckQueue(path=path, clock=clock) as q:
        q.put("a")
        q.put("b")
        q.nack(q.get(), delay=5)
    with AckQueue(path=path, clock=clock) as q:
        assert q.unfinished_tasks == 2
        assert drain(q) == ["b"]
        clock.advance(5)
        m = q.get_message(block=False)
        assert m.body == "a" and m.receive_count == 2


def test_rolled_back_transaction_on_file_leaves_nothing_after_reopen(tmp_path):
    path = tmp_path / "rb.fs"
    with AckQueue(path=path) as q:
        q.put("a")
        with pytest.raises(KeyError):
            with q.transaction():
                q.get()
                q.put("p")
                raise KeyError("x")
    with AckQueue(path=path) as q:
        assert drain(q) == ["a"]
        assert q.unfinished_tasks == 1


# -- shutdown (Python 3.13's Queue.shutdown, on every Python) -----------------------------

def test_shutdown_drains_then_raises_and_wakes_blocked_getters(make):
    q = make()
    q.put("a")
    q.shutdown()
    with pytest.raises(ackqueue.ShutDown):
        q.put("b")
    assert q.get_nowait() == "a"            # what is ready is still handed out
    with pytest.raises(ackqueue.ShutDown):
        q.get_nowait()

    q2 = make()
    started, outcome = threading.Event(), []

    def blocked_get():
        started.set()
        try:
            q2.get(timeout=5)
        except BaseException as exc:        # record what woke it
            outcome.append(type(exc))

    t = threading.Thread(target=blocked_get)
    t.start()
    started.wait()
    q2.shutdown()
    t.join(5)
    assert outcome == [ackqueue.ShutDown]


def test_shutdown_immediate_keeps_stored_items_for_the_next_open(make):
    q = make()
    q.put("a")
    q.shutdown(immediate=True)
    with pytest.raises(ackqueue.ShutDown):
        q.get_nowait()
    q.join()                                # returns at once after an immediate shutdown
    assert q.unfinished_tasks == 1          # nothing stored was deleted


def test_a_queue_file_of_ackqueue_0_1_is_upgraded_on_open(tmp_path):
    """Version 0.1 kept messages as MessageRecords in an LOBTree and the ready set in an
    LLTreeSet; opening such a file moves them to the merging indexes, in order."""
    import ZODB
    from BTrees.LLBTree import LLTreeSet
    from BTrees.LOBTree import LOBTree
    from ZODB.FileStorage import FileStorage

    from ackqueue import store

    path = str(tmp_path / "old.fs")
    db = ZODB.DB(FileStorage(path))
    with db.transaction() as conn:
        rec = store.ensure_queue(conn.root(), "default", store.FIFO)
        rec.messages, rec.ready = LOBTree(), LLTreeSet()      # the 0.1 layout
        for seq in (1, 2, 3):
            m = store.MessageRecord(seq, pickle.dumps(f"job{seq}"), 100, 0.0)
            m.receive_count = 1 if seq == 2 else 0
            rec.messages[seq] = m
            rec.ready.add(store.store_key(store.FIFO, 100, seq))
        rec.next_seq.advance_past(3)
        rec.counts.add(ready=3, put=3)
    db.close()

    with AckQueue(path=path) as q:
        messages = [q.get_message(block=False) for _ in range(3)]
        assert [m.body for m in messages] == ["job1", "job2", "job3"]
        assert [m.receive_count for m in messages] == [1, 2, 1]
        for m in messages:
            q.ack(m)
        q.put("new")
        assert q.get_message().id == 4             # numbering goes on after the old seqs


def test_a_ready_set_of_plain_segments_keeps_working(tmp_path):
    """Files written before the ready set had packed KeySegments keep a SegmentedIndex of
    64-key dict segments: it still opens in order, takes puts and acks, and merges."""
    import ZODB
    from ZODB.FileStorage import FileStorage

    from ackqueue import store
    from ackqueue.segments import KeySet, SegmentedIndex

    path = str(tmp_path / "plain.fs")
    with AckQueue(path=path) as q:
        q.put_many([f"job{i}" for i in range(100)])
    db = ZODB.DB(FileStorage(path))
    with db.transaction() as conn:
        rec = conn.root()[store.ROOT_KEY].queues["default"]
        assert isinstance(rec.ready, KeySet)
        plain = SegmentedIndex()                           # the earlier layout
        for key in rec.ready:
            plain.add(key)
        rec.ready = plain
    db.close()

    with AckQueue(path=path) as q:
        got = q.get_many(60)
        assert got == [f"job{i}" for i in range(60)]
        q.ack_many(got)
        q.put("new")
    with AckQueue(path=path) as q:
        assert q.qsize() == 41
        assert q.get() == "job60"
        with q._database.db.transaction() as conn:
            ready = conn.root()[store.ROOT_KEY].queues["default"].ready
            assert type(ready) is SegmentedIndex


@pytest.mark.parametrize("cls", [AckQueue, ackqueue.AckPriorityQueue])
def test_large_items_round_trip_and_leave_nothing_behind(tmp_path, cls):
    """Items above store.LARGE_BODY get a record of their own; they keep their order,
    survive a reopen, and their records go when they are acknowledged."""
    from ackqueue import store
    path = tmp_path / "big.fs"
    items = [(i, bytes([i]) * (store.LARGE_BODY * 3)) for i in range(3)] + [(3, b"small")]
    with cls(path=path) as q:
        for item in items:
            q.put(item)
    with cls(path=path) as q:
        got = [q.get(block=False) for _ in range(4)]
        assert got == items
        for item in got:
            q.ack(item)
        conn = q._database.db.open()
        rec = conn.root()[store.ROOT_KEY].queues["default"]
        assert len(rec.bodies) == 0 and len(rec.messages) == 0
        conn.close()
