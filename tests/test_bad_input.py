"""Bad input and a hostile environment: each gives a clear error, and the queue stays usable
with nothing lost.

Covered: unpicklable items, an item that pickles but cannot be unpickled, an item over the
queue's max_item_size (put, put_many, in a transaction, on a connect() proxy, and through a
real queue server), wrong argument types, negative and NaN timeouts/delays, a corrupt
file, a foreign file, a read-only directory and a read-only file (run as an unprivileged
user in a child process when the tests run as root), a full disk (a child process whose
RLIMIT_FSIZE makes the real write fail with EFBIG), and a second process on an embedded
file (QueueLocked naming the pid).  README's "Reliability" table lists them."""
import json
import os
import pwd
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest
from ZODB.scripts import fstest

from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, AckQueueError, Empty, Full,
                      ItemTooLarge, NotAQueueFile, NotHeld, QueueLocked, ServerUnavailable,
                      StorageError, UnpicklableItem)
from helpers_reliability import (CHILD_TIMEOUT, FakeClock, drain_items, drain_messages,
                                 run_child)
from zeo_server import Server

NAN = float("nan")


@pytest.fixture(params=["memory", "file"])
def backend(request):
    return request.param


@pytest.fixture
def make(backend, tmp_path):
    """make(**kwargs): a queue on the test's backend; make.reopen(q) closes and reopens."""
    opened = []

    def make(**kwargs):
        if backend == "file":
            kwargs.setdefault("path", tmp_path / "q.fs")
        q = AckQueue(**kwargs)
        opened.append(q)
        return q

    def reopen(q):
        """The queue's content as the next open sees it (the same queue in memory)."""
        if backend == "memory":
            return q
        q.close()
        return make()

    make.backend = backend
    make.reopen = reopen
    yield make
    for q in reversed(opened):
        q.close()


def assert_intact(q, ready, held=()):
    """q holds exactly ready (in order) plus the held items, and still works: everything
    can be received and acknowledged, and a new item goes through."""
    assert q.qsize() == len(ready)
    assert q.unfinished_tasks == len(ready) + len(held)
    got = drain_items(q)
    assert got == list(ready)
    for item in list(held) + got:
        q.ack(item)
    assert q.unfinished_tasks == 0
    q.put("probe")
    assert q.get_nowait() == "probe"
    q.task_done()
    assert q.unfinished_tasks == 0 and q.qsize() == 0


# -- items that cannot be queued ----------------------------------------------------------

class _RaisesOnReduce:
    def __reduce__(self):
        raise RuntimeError("this object refuses to be pickled")


def _generator():
    yield 1


def _local_class_instance():
    class Local:
        pass
    return Local()


UNPICKLABLE = {
    "lambda": lambda: (lambda: 0),
    "lock": threading.Lock,
    "generator": _generator,
    "local class": _local_class_instance,
    "reduce raises": _RaisesOnReduce,
    "inside a list": lambda: ["fine", threading.Lock()],
}


@pytest.mark.parametrize("what", sorted(UNPICKLABLE))
def test_unpicklable_item_is_refused_and_nothing_changes(make, what):
    q = make(maxsize=3)
    q.put("a")
    q.put("b")
    held = q.get()                              # "a" in flight
    bad = UNPICKLABLE[what]()
    with pytest.raises(UnpicklableItem) as info:
        q.put(bad)
    assert isinstance(info.value, TypeError)
    assert type(bad).__name__ in str(info.value)
    with pytest.raises(UnpicklableItem):
        q.put_nowait(bad)
    # The failed puts took no room: c and d fit (b, c, d fill maxsize 3; the in-flight a
    # does not count), then Full.
    q.put_nowait("c")
    q.put_nowait("d")
    with pytest.raises(Full):
        q.put_nowait("e")
    # Inside a transaction the block goes on and commits what it did.
    with q.transaction():
        assert q.get() == "b"
        with pytest.raises(UnpicklableItem):
            q.put(bad)
        q.put("from-txn")
    q = make.reopen(q)
    if make.backend == "memory":
        assert_intact(q, ["c", "d", "from-txn"], held=[held])
    else:
        assert_intact(q, ["a", "c", "d", "from-txn"])   # "a" was held at close: back


class _Poison:
    """Pickles fine, but cannot be unpickled (as an item of a class the consumer lacks)."""

    def __reduce__(self):
        return (_explode, ())


def _explode():
    raise RuntimeError("cannot rebuild this item")


def test_item_that_cannot_be_unpickled_gives_a_clear_error_and_is_kept(make):
    q = make()
    q.put("first")
    q.put(_Poison())
    q.put("next")
    assert q.get() == "first"
    with pytest.raises(AckQueueError) as info:
        q.get_nowait()
    assert "cannot be unpickled" in str(info.value)
    assert "cannot rebuild this item" in str(info.value)
    assert q.unfinished_tasks == 3              # nothing lost, the bad one included
    q.task_done()                               # acknowledges "first", held since
    q = make.reopen(q)
    assert q.unfinished_tasks == 2              # the bad one and "next" are kept


def test_item_that_cannot_be_unpickled_does_not_block_the_items_behind_it(make):
    """It is set aside for a while (it used to go back to the head, so every get raised and
    the items behind it were never delivered), and it is kept, not dropped."""
    clock = FakeClock()
    q = make(clock=clock)
    q.put(_Poison())
    q.put("next")
    with pytest.raises(AckQueueError):
        q.get_nowait()
    assert q.get_nowait() == "next"
    q.task_done()
    assert q.unfinished_tasks == 1              # the bad item is kept
    clock.advance(3600)
    with pytest.raises(AckQueueError):          # ... and tried again later
        q.get_nowait()
    q = make.reopen(q)
    assert q.unfinished_tasks == 1


def test_get_many_sets_an_unreadable_item_aside_and_returns_the_rest(make):
    clock = FakeClock()
    q = make(clock=clock)
    q.put_many(["a", _Poison(), "b"])
    got = q.get_many(3)
    assert got == ["a", "b"]                    # the batch goes on without it
    q.ack_many(got)
    with pytest.raises(Empty):                  # set aside, not back at the head
        q.get_nowait()
    assert q.unfinished_tasks == 1              # ... and kept
    clock.advance(3600)
    with pytest.raises(AckQueueError, match="cannot be unpickled"):
        q.get_many(3)                           # alone in its batch: raised, as get does
    q = make.reopen(q)
    assert q.unfinished_tasks == 1


def _damage(path, change, name="default"):
    """Change queue name's record in the file at path behind the queue's back."""
    import ZODB
    from ZODB.FileStorage import FileStorage

    from ackqueue import store
    db = ZODB.DB(FileStorage(path))
    try:
        with db.transaction() as conn:
            change(conn.root()[store.ROOT_KEY].queues[name])
    finally:
        db.close()


def test_get_many_returns_its_batch_when_a_later_message_cannot_be_read(tmp_path):
    """A message whose stored record is damaged (here a tuple too short to be one) cannot
    be read: a batch that reaches it returns what it already took, instead of raising and
    leaving those messages in flight with nobody holding them."""
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(["a", "b", "c"])

    def garble(rec):
        rec.messages[2] = ("not a message",)
    _damage(path, garble)
    with AckQueue(path=path) as q:
        got = q.get_many(3)
        assert got == ["a"]
        q.ack_many(got)
        with pytest.raises(TypeError):          # the unreadable one is still at the head
            q.get_nowait()
        assert q.qsize() == 2


@pytest.mark.parametrize("what", ["record", "body"])
def test_a_message_missing_from_the_store_is_taken_out_and_the_queue_goes_on(
        tmp_path, caplog, what):
    """A message the ready set names but whose record (or, for a large item, whose body)
    is gone from the store can never be delivered: the get that reaches it logs an error,
    takes it out (stats()["missing"]) and delivers the next message, for good."""
    path = str(tmp_path / "q.fs")
    big = "b" * 10000                            # stored in a Body record of its own
    with AckQueue(path=path) as q:
        q.put_many(["a", big, "c", "d"])

    def remove(rec):
        if what == "record":
            del rec.messages[2]
        else:
            del rec.bodies[2]
    _damage(path, remove)
    with AckQueue(path=path) as q:
        assert q.qsize() == 4                    # nothing noticed before a get reaches it
        assert q.get_many(2) == ["a", "c"]       # a batch steps over it
        assert "message 2 of queue 'default' cannot be delivered" in caplog.text
        assert f"its {what} is missing" in caplog.text
        assert q.get() == "d"
        q.task_done(), q.task_done(), q.task_done()
        assert q.qsize() == 0 and q.unfinished_tasks == 0
        assert q.stats()["missing"] == 1
    with AckQueue(path=path) as q:               # taken out durably
        assert q.qsize() == 0
        assert q.stats()["missing"] == 1
        with pytest.raises(Empty):
            q.get_nowait()


def test_peek_and_get_step_over_a_missing_message(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(["a", "b"])
    _damage(path, lambda rec: rec.messages.__delitem__(1))
    with AckQueue(path=path) as q:
        assert q.peek().body == "b"
        assert q.stats()["missing"] == 1
        assert q.get() == "b"


@pytest.mark.parametrize("what", ["record", "body"])
def test_a_shared_queue_steps_over_a_missing_message(tmp_path, caplog, what):
    """Through a server: a process that finds a ready message without its record (or, for
    a large item, without its body) takes the entry out (durably, for every process) and
    delivers the next one."""
    import ZEO

    from ackqueue import codec, store
    big = "b" * 10000                            # stored in a Body record of its own
    server = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        with AckQueue(path=server.url) as q:
            q.put_many(["a", big, "c"])
            db = ZEO.DB(("127.0.0.1", server.port))
            try:
                with db.transaction() as conn:
                    rec = conn.root()[store.ROOT_KEY].queues["default"]
                    seq = next(s for s in rec.messages.keys()
                               if codec.decode(rec.body_of(s, rec.messages[s])) == big)
                    if what == "record":
                        del rec.messages[seq]
                    else:
                        del rec.bodies[seq]
            finally:
                db.close()
            assert q.get(timeout=10) == "a"
            assert q.get(timeout=10) == "c"
            q.task_done(), q.task_done()
            assert f"its {what} is missing" in caplog.text
            assert q.stats()["missing"] == 1
            with pytest.raises(Empty):
                q.get(timeout=0.2)
        with AckQueue(path=server.url) as q:
            assert q.qsize() == 0
    finally:
        server.stop()


# -- items over the queue's max_item_size -------------------------------------------------

def pickled_size(item):
    """The bytes the store keeps for item (what max_item_size limits): its encoding by the
    queue's codec (ackqueue.codec; by default a str is stored as marked UTF-8 text)."""
    from ackqueue import codec
    return len(codec.encode(item))


BIG = "x" * 1000
LIMIT = pickled_size(BIG)
OVER = BIG + "y"                        # one byte more pickled (checked below)


def test_the_boundary_items_are_one_byte_apart():
    assert pickled_size(OVER) == LIMIT + 1


def _assert_too_large(info, size, index=0):
    exc = info.value
    assert isinstance(exc, ValueError) and isinstance(exc, AckQueueError)
    assert (exc.size, exc.limit, exc.index) == (size, LIMIT, index)
    assert f"encodes to {size} bytes" in str(exc)
    assert f"max_item_size of {LIMIT} bytes" in str(exc)


def test_item_at_max_item_size_passes_and_one_byte_more_is_refused(make):
    q = make(maxsize=3, max_item_size=LIMIT)
    assert q.max_item_size == LIMIT
    q.put("before")
    q.put(BIG)                                  # exactly the limit: accepted
    for put in (q.put, q.put_nowait):
        with pytest.raises(ItemTooLarge) as info:
            put(OVER)
        _assert_too_large(info, LIMIT + 1)
        assert "nothing was put" in str(info.value)
    assert q.stats()["put"] == 2
    # The refused puts took no room: one more fits (maxsize 3), then Full.
    q.put_nowait("after")
    with pytest.raises(Full):
        q.put_nowait("e")
    q = make.reopen(q)
    assert_intact(q, ["before", BIG, "after"])


def test_put_many_with_an_item_over_max_item_size_puts_none_of_them(make):
    q = make(max_item_size=LIMIT)
    q.put("a")
    batch = ["b", BIG, OVER, "c"]
    with pytest.raises(ItemTooLarge) as info:
        q.put_many(batch, dedup_ids=["b", "big", "over", "c"])
    _assert_too_large(info, LIMIT + 1, index=2)
    assert "item 2 of 4" in str(info.value) and "none of them was put" in str(info.value)
    assert q.qsize() == 1 and q.stats()["put"] == 1
    # Nothing of the batch was recorded, its dedup ids included.
    q.put_many(["b", BIG, "c"], dedup_ids=["b", "big", "c"])
    q = make.reopen(q)
    assert_intact(q, ["a", "b", BIG, "c"])


def test_put_over_max_item_size_in_a_transaction_leaves_the_block_to_the_caller(make):
    q = make(max_item_size=LIMIT)
    for item in ("a", "b"):
        q.put(item)
    # Caught inside: the block goes on and commits what it did.
    with q.transaction():
        assert q.get() == "a"
        with pytest.raises(ItemTooLarge):
            q.put(OVER)
        with pytest.raises(ItemTooLarge):
            q.put_many(["fine", OVER])
        q.put("from-txn")
    # Let out of the block: it rolls back as a whole ("b" back, "lost" never put).
    with pytest.raises(ItemTooLarge):
        with q.transaction():
            assert q.get() == "b"
            q.put("lost")
            q.put(OVER)
    q = make.reopen(q)
    assert_intact(q, ["b", "from-txn"])


def test_connect_proxy_refuses_an_item_over_max_item_size(make):
    q = make(max_item_size=LIMIT)
    q.put("a")
    with q.connect() as conn:
        with pytest.raises(ItemTooLarge):
            conn.put(OVER)
        with pytest.raises(ItemTooLarge) as info:
            conn.put_many([OVER])
        assert info.value.index == 0
        conn.put(BIG)
    q = make.reopen(q)
    assert_intact(q, ["a", BIG])


@pytest.mark.parametrize("cls", [AckLifoQueue, AckPriorityQueue])
def test_every_queue_class_takes_max_item_size(tmp_path, cls):
    with cls(path=tmp_path / "q.fs", max_item_size=LIMIT) as q:
        with pytest.raises(ItemTooLarge):
            q.put(OVER)
        q.put(BIG)
        q.put("a")
    with cls(path=tmp_path / "q.fs") as q:
        assert sorted(drain_items(q)) == sorted(["a", BIG])


def test_stored_items_over_a_front_s_limit_are_still_delivered_given_back_and_redriven(
        make):
    """The limit is checked at put only: a larger item already stored (put with no limit,
    or by another process) is received, given back, dead-lettered and redriven as any."""
    q = make()                                  # no limit
    q.put(OVER)
    q.put("small")
    shared = {} if make.backend == "file" else {"db": q.db}
    strict = make(max_item_size=LIMIT, max_receives=2, dead_letter="dlq", **shared)
    for receive in (1, 2):
        m = strict.get_message()
        assert (m.body, m.receive_count) == (OVER, receive)
        strict.nack(m)
    assert strict.get() == "small"              # OVER moved to "dlq" on this get
    strict.task_done()
    dlq = make(name="dlq", max_item_size=LIMIT, **shared)
    assert dlq.redrive() == 1
    assert strict.get() == OVER
    strict.task_done()
    assert strict.unfinished_tasks == 0 and dlq.unfinished_tasks == 0


def test_queue_reopened_with_a_smaller_limit_delivers_what_it_holds(tmp_path):
    path = tmp_path / "q.fs"
    with AckQueue(path=path) as q:
        q.put(OVER)
    with AckQueue(path=path, max_item_size=LIMIT) as q:
        with pytest.raises(ItemTooLarge):
            q.put(OVER)
        assert q.get() == OVER
    with AckQueue(path=path, max_item_size=LIMIT) as q:      # held at close: back
        assert q.get() == OVER
        q.task_done()
        assert q.unfinished_tasks == 0


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_item_over_max_item_size_through_a_server(tmp_path):
    """The check runs in the client, before anything is sent: the server's queue is left
    as it was, and the client goes on."""
    server = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        with AckQueue(path=server.url, max_item_size=LIMIT) as q:
            q.put("a")
            q.put(BIG)
            with pytest.raises(ItemTooLarge) as info:
                q.put(OVER)
            _assert_too_large(info, LIMIT + 1)
            with pytest.raises(ItemTooLarge) as info:
                q.put_many(["b", OVER])
            _assert_too_large(info, LIMIT + 1, index=1)
            with q.transaction():
                with pytest.raises(ItemTooLarge):
                    q.put(OVER)
                q.put("from-txn")
            with AckQueue(path=server.url) as unlimited:   # another front, no limit
                unlimited.put(OVER)
            m = q.get_message(timeout=CHILD_TIMEOUT)       # "a", and a give-back of it
            q.nack(m)
        # A fresh client (every front closed) reads what the server holds.
        with AckQueue(path=server.url, max_item_size=LIMIT) as q:
            assert q.unfinished_tasks == 4
            got = [q.get(timeout=CHILD_TIMEOUT) for _ in range(4)]
            assert got == ["a", BIG, "from-txn", OVER]
            for item in got:
                q.ack(item)
            with pytest.raises(Empty):
                q.get_nowait()
            assert q.unfinished_tasks == 0
    finally:
        server.stop()


# -- wrong arguments ------------------------------------------------------------------------

BAD_CALLS = [
    # (id, call(q, held), exception, a word the message must contain)
    ("get timeout str", lambda q, h: q.get(timeout="x"), TypeError, "timeout"),
    ("get timeout negative", lambda q, h: q.get(timeout=-1), ValueError, "timeout"),
    ("get timeout -inf", lambda q, h: q.get(timeout=float("-inf")), ValueError, "timeout"),
    ("get timeout nan", lambda q, h: q.get(timeout=NAN), ValueError, "timeout"),
    ("get_message timeout nan", lambda q, h: q.get_message(timeout=NAN), ValueError,
     "timeout"),
    ("put timeout str", lambda q, h: q.put("z", timeout="x"), TypeError, "timeout"),
    ("put timeout negative", lambda q, h: q.put("z", timeout=-1), ValueError, "timeout"),
    ("put timeout nan", lambda q, h: q.put("z", timeout=NAN), ValueError, "timeout"),
    ("visibility negative", lambda q, h: q.get(visibility_timeout=-1), ValueError,
     "visibility_timeout"),
    ("visibility zero", lambda q, h: q.get(visibility_timeout=0), ValueError,
     "visibility_timeout"),
    ("visibility nan", lambda q, h: q.get(visibility_timeout=NAN), ValueError,
     "visibility_timeout"),
    ("visibility str", lambda q, h: q.get(visibility_timeout="x"), TypeError,
     "visibility_timeout"),
    ("get_message visibility negative",
     lambda q, h: q.get_message(visibility_timeout=-1), ValueError, "visibility_timeout"),
    # put() and get() without options take a shorter path: what only looks like a
    # default must still be refused there
    ("put delay False", lambda q, h: q.put("z", delay=False), TypeError, "delay"),
    ("put priority 100.0", lambda q, h: q.put("z", priority=100.0), TypeError, "priority"),
    ("put priority True", lambda q, h: q.put("z", priority=True), TypeError, "priority"),
    ("get shuffle None", lambda q, h: q.get(shuffle=None), TypeError, "shuffle"),
    ("nack delay negative", lambda q, h: q.nack(h, delay=-1), ValueError, "delay"),
    ("nack delay nan", lambda q, h: q.nack(h, delay=NAN), ValueError, "delay"),
    ("nack delay str", lambda q, h: q.nack(h, delay="x"), TypeError, "delay"),
    ("ack None", lambda q, h: q.ack(None), NotHeld, "None"),
    ("ack never got", lambda q, h: q.ack("b"), NotHeld, "'b'"),
    ("nack never got", lambda q, h: q.nack("b"), NotHeld, "'b'"),
    ("ack a number", lambda q, h: q.ack(12345), NotHeld, "12345"),
]


@pytest.mark.parametrize("call,exc,word", [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_wrong_argument_is_refused_and_nothing_changes(make, call, exc, word):
    q = make()
    for item in ("a", "b", "c"):
        q.put(item)
    held = q.get()
    with pytest.raises(exc) as info:
        call(q, held)
    assert word in str(info.value)
    assert_intact(q, ["b", "c"], held=[held])


def test_task_done_with_nothing_held_is_refused(make):
    q = make()
    q.put("a")
    with pytest.raises(ValueError):
        q.task_done()
    assert_intact(q, ["a"])


CONSTRUCTOR_CALLS = [
    ("maxsize str", {"maxsize": "3"}, TypeError, "maxsize"),
    ("maxsize float", {"maxsize": 3.0}, TypeError, "maxsize"),
    ("maxsize bool", {"maxsize": True}, TypeError, "maxsize"),
    ("visibility negative", {"visibility_timeout": -1}, ValueError, "visibility_timeout"),
    ("visibility nan", {"visibility_timeout": NAN}, ValueError, "visibility_timeout"),
    ("visibility str", {"visibility_timeout": "x"}, TypeError, "visibility_timeout"),
    ("name empty", {"name": ""}, TypeError, "name"),
    ("name int", {"name": 3}, TypeError, "name"),
    ("clock not callable", {"clock": 5}, TypeError, "clock"),
    ("thread_exit unknown", {"thread_exit": "sometimes"}, ValueError, "thread_exit"),
    ("db not a DB", {"db": "x"}, TypeError, "db"),
    ("durability unknown", {"durability": "always"}, ValueError, "durability"),
    ("durability int", {"durability": 3}, TypeError, "durability"),
    ("max_item_size str", {"max_item_size": "1024"}, TypeError, "max_item_size"),
    ("max_item_size float", {"max_item_size": 1024.0}, TypeError, "max_item_size"),
    ("max_item_size bool", {"max_item_size": True}, TypeError, "max_item_size"),
    ("max_item_size zero", {"max_item_size": 0}, ValueError, "max_item_size"),
    ("max_item_size negative", {"max_item_size": -1}, ValueError, "max_item_size"),
]


def _cases(calls):
    """(id, kwargs, exception, word[, mark]) tuples as parametrize cases."""
    return [pytest.param(*call[1:4], id=call[0], marks=call[4:]) for call in calls]


@pytest.mark.parametrize("kwargs,exc,word", _cases(CONSTRUCTOR_CALLS))
def test_wrong_constructor_argument_is_refused_and_the_file_stays_usable(
        tmp_path, kwargs, exc, word):
    path = tmp_path / "q.fs"
    with AckQueue(path=path) as q:
        q.put("kept")
    before = path.read_bytes()
    if "db" not in kwargs:
        kwargs = dict(kwargs, path=path)
    with pytest.raises(exc) as info:
        AckQueue(**kwargs)
    assert word in str(info.value)
    assert path.read_bytes() == before
    with AckQueue(path=path) as q:              # not left locked, nothing lost
        assert_intact(q, ["kept"])


def test_malformed_or_unreachable_server_address():
    for address in ("zeo://nohost", "zeo://127.0.0.1:notaport",
                    "zeo://127.0.0.1:1?wait_timeout=soon"):
        with pytest.raises(ValueError) as info:
            AckQueue(path=address)
        assert address in str(info.value)
    with socket.socket() as s:               # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"zeo://127.0.0.1:{port}?wait_timeout=0.5"
    with pytest.raises(ServerUnavailable) as info:
        AckQueue(path=address)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_wrong_path_types(tmp_path):
    with pytest.raises(TypeError, match="path"):
        AckQueue(path=3)
    with pytest.raises(TypeError):
        AckQueue(path=tmp_path / "a.fs", db=object())
    with pytest.raises(IsADirectoryError) as info:
        AckQueue(path=tmp_path)
    assert str(tmp_path) in str(info.value)
    assert sorted(os.listdir(tmp_path)) == []


# -- files that are not queue files ---------------------------------------------------------

def _queue_file(path, items):
    with AckQueue(path=path) as q:
        for item in items:
            q.put(item)
    os.remove(f"{path}.index")       # make the next open read the file itself


@pytest.mark.parametrize("content", [
    pytest.param(lambda rng: bytes(rng.getrandbits(8) for _ in range(4096)), id="random"),
    pytest.param(lambda rng: b"PK\x03\x04" + bytes(rng.getrandbits(8) for _ in range(500)),
                 id="zip-header"),
    pytest.param(lambda rng: "jobs to do:\n- one\n- two\n".encode(), id="text"),
    pytest.param(lambda rng: b"SQLite format 3\x00" + b"\x00" * 1000, id="sqlite"),
    pytest.param(lambda rng: b"FS2", id="three-bytes"),
])
def test_foreign_or_corrupt_file_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "q.fs"
    data = content(random.Random(7))
    path.write_bytes(data)
    for attempt in range(2):                     # the same clear error every time
        with pytest.raises(NotAQueueFile) as info:
            AckQueue(path=path)
        assert str(path) in str(info.value)
        assert path.read_bytes() == data
    assert os.listdir(tmp_path) == ["q.fs"]             # no lock, index or scratch file


def test_refused_foreign_file_leaves_no_stray_file(tmp_path):
    """(It used to leave FileStorage's empty scratch file, '<path>.tmp', beside it.)"""
    path = tmp_path / "notes.txt"
    path.write_text("not a queue\n")
    with pytest.raises(NotAQueueFile):
        AckQueue(path=path)
    assert os.listdir(tmp_path) == ["notes.txt"]


def _flip_inside_a_data_record(path):
    """Damage the header of a data record in the middle of a queue file."""
    data = bytearray(path.read_bytes())
    pos, ends = 4, []
    while pos < len(data):
        length = int.from_bytes(data[pos + 8:pos + 16], "big")
        ends.append((pos, pos + length + 8))
        pos += length + 8
    start, _ = ends[len(ends) // 2]
    # The first data record starts after the 23-byte transaction header and its user,
    # description and extension fields; the record's data length is bytes 34-41 of its
    # header.  A huge length makes the record claim to run past its transaction.
    ul, dl, el = (int.from_bytes(data[start + 17 + 2 * i:start + 19 + 2 * i], "big")
                  for i in range(3))
    record = start + 23 + ul + dl + el
    data[record + 34:record + 42] = b"\x7f" * 8
    path.write_bytes(bytes(data))
    return bytes(data)


def test_damaged_data_record_gives_a_clear_error_and_the_file_is_left_untouched(tmp_path):
    path = tmp_path / "q.fs"
    _queue_file(path, [f"item-{i}" for i in range(20)])
    damaged = _flip_inside_a_data_record(path)
    with pytest.raises(StorageError) as info:
        AckQueue(path=path)
    assert str(path) in str(info.value)
    assert "damaged" in str(info.value)
    assert path.read_bytes() == damaged


def _append_zeros(path):
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)                  # as a power cut can leave after the end


@pytest.mark.parametrize("damage", [_flip_inside_a_data_record, _append_zeros],
                         ids=["damaged record", "zeros after the end"])
def test_failed_open_does_not_leave_the_file_locked(tmp_path, damage):
    """An open that fails after FileStorage took the file's lock (a damaged record; ZODB.DB
    failing on the zeros a power cut leaves, see test_torn_writes) must release it: the
    next open in the same process, with the first error still referenced, must not raise
    QueueLocked naming this very process."""
    path = tmp_path / "q.fs"
    items = [f"item-{i}" for i in range(20)]
    _queue_file(path, items)
    damage(path)
    errors = []
    for attempt in range(2):
        try:
            q = AckQueue(path=path)
        except QueueLocked:
            raise
        except Exception as exc:       # kept, as a program that logs or reports it does
            errors.append(exc)
        else:
            with q:
                assert_intact(q, items)
            break
    if damage is _flip_inside_a_data_record:
        assert len(errors) == 2 and type(errors[0]) is type(errors[1])


# FileStorage alone treats this as a torn tail: it truncates the file there and the queue
# opens without error, silently missing every later message; ackqueue.torn_tail refuses it.
def test_damaged_transaction_header_in_the_middle_is_not_silently_truncated(tmp_path):
    path = tmp_path / "q.fs"
    items = [f"item-{i}" for i in range(20)]
    _queue_file(path, items)
    data = bytearray(path.read_bytes())
    pos, starts = 4, []
    while pos < len(data):
        starts.append(pos)
        pos += int.from_bytes(data[pos + 8:pos + 16], "big") + 8
    middle = starts[len(starts) // 2]
    data[middle + 8:middle + 16] = b"\xff" * 8        # its length field, damaged
    path.write_bytes(bytes(data))
    try:
        q = AckQueue(path=path)
    except AckQueueError as exc:      # a clear refusal that leaves the file alone is fine
        assert str(path) in str(exc) and f"at byte {middle}" in str(exc)
        assert path.read_bytes() == bytes(data)
        return
    with q:
        assert drain_items(q) == items              # or else nothing may be missing


# -- read-only locations (as an unprivileged user) --------------------------------------

READ_ONLY_CHILD = """
    import json, os, sys
    from ackqueue import AckQueue
    warm, uid, gid, probe_dir, *targets = sys.argv[1:]
    AckQueue(path=warm).close()        # every module the open needs is imported now
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    result = {"euid": os.geteuid()}
    try:
        open(os.path.join(probe_dir, "probe"), "w").close()
        result["probe"] = "written"
    except PermissionError:
        result["probe"] = "refused"
    for target in targets:
        try:
            AckQueue(path=target).close()
            result[target] = "opened"
        except Exception as exc:
            result[target] = [type(exc).__name__, str(exc)]
    print(json.dumps(result), flush=True)
"""


@pytest.fixture
def world_dir():
    """A directory every user can reach (pytest's tmp_path is private to its owner)."""
    path = tempfile.mkdtemp(prefix="ackqueue-ro-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    for root, dirs, files in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(path, ignore_errors=True)


def _unprivileged_ids():
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and there is no 'nobody' user to drop to")
    return nobody.pw_uid, nobody.pw_gid


def test_read_only_directory_and_read_only_file(world_dir):
    uid, gid = _unprivileged_ids()
    ro_dir = os.path.join(world_dir, "ro")
    os.mkdir(ro_dir)
    rw_dir = os.path.join(world_dir, "rw")
    os.mkdir(rw_dir)
    ro_file = os.path.join(rw_dir, "q.fs")
    _queue_file(ro_file, ["a", "b", "c"])
    os.remove(f"{ro_file}.lock")
    before = open(ro_file, "rb").read()
    os.chmod(ro_dir, 0o555)
    os.chmod(rw_dir, 0o777)
    os.chmod(ro_file, 0o444)
    new_file = os.path.join(ro_dir, "q.fs")
    warm = os.path.join(world_dir, "warm.fs")

    proc = run_child(READ_ONLY_CHILD, warm, uid, gid, ro_dir, new_file, ro_file)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    if result["probe"] != "refused":
        pytest.skip("the permission bits are not enforced for this user")

    for target in (new_file, ro_file):
        name, message = result[target]
        assert name == "PermissionError", result
        assert target in message
    assert os.listdir(ro_dir) == []                       # nothing created
    assert open(ro_file, "rb").read() == before           # nothing changed

    os.chmod(ro_file, 0o644)                              # the location is fixed: all there
    with AckQueue(path=ro_file) as q:
        assert_intact(q, ["a", "b", "c"])


# -- a full disk ------------------------------------------------------------------------------

FULL_DISK_CHILD = """
    import errno, json, os, resource, signal, sys
    from ackqueue import AckQueue, Empty

    path = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # an oversized write fails with EFBIG
    q = AckQueue(path=path)
    ready = [f"small-{i}-" + "x" * 2000 for i in range(20)]
    for item in ready:
        q.put(item)
    for _ in range(2):
        q.ack(q.get())
    ready = ready[2:]
    log = []

    def full(call):
        try:
            call()
        except OSError as exc:
            assert exc.errno == errno.EFBIG, exc
            log.append("EFBIG")
            return True
        log.append("ok")
        return False

    def check(held):
        assert q.qsize() == len(ready), (q.qsize(), len(ready))
        assert q.unfinished_tasks == len(ready) + held, (q.unfinished_tasks, len(ready))

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # 500 bytes past where the data ends (the file holds zeros written ahead after that:
    # filestorage.SyncedFileStorage; each transaction ends with its length, never zero).
    data_end = len(open(path, "rb").read().rstrip(b"\\0"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (data_end + 500, hard))

    # A put that does not fit: refused, and nothing half-visible.
    for _ in range(3):
        assert full(lambda: q.put("big-" + "y" * 5000))
        check(0)
    # An ack that does not fit: refused, the item is still held (and acked later).
    m = q.get_message()
    assert m.body == ready[0]
    ready.pop(0)
    check(1)
    if not full(lambda: q.ack(m)):
        m = None                    # it fitted: acknowledged for good
    check(1 if m else 0)
    # A transaction that does not fit: rolled back as a whole.
    def txn():
        with q.transaction():
            assert q.get() == ready[0]
            q.put("from-txn-" + "z" * 3000)
    assert full(txn)
    check(1 if m else 0)

    # Space again: everything works, the held item can be acknowledged.
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    if m is not None:
        q.ack(m)
    check(0)
    for i in range(3):
        q.put(f"after-{i}")
        ready.append(f"after-{i}")
    assert q.get() == ready.pop(0)
    q.task_done()
    check(0)
    print(json.dumps({"ready": ready, "log": log}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_full_disk_refuses_the_write_and_loses_nothing(tmp_path):
    pytest.importorskip("resource")
    path = tmp_path / "full.fs"
    proc = run_child(FULL_DISK_CHILD, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    result = json.loads(proc.stdout)
    assert result["log"][:3] == ["EFBIG"] * 3 and result["log"][-1] == "EFBIG"
    # A fresh process (this one) finds exactly what was committed, in order.
    with AckQueue(path=path) as q:
        assert q.unfinished_tasks == len(result["ready"])
        messages = drain_messages(q)
        assert [m.body for m in messages] == result["ready"]
    fstest.check(str(path))
    with AckQueue(path=path) as q:
        assert drain_items(q) == result["ready"]


# -- a second process on an embedded file -------------------------------------------------

HOLDER = """
    import sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1])
    q.put("a")
    q.put("b")
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "put":
            q.put(command[1])
            print("ok", q.qsize(), flush=True)
        elif command[0] == "ack":
            q.ack(q.get_nowait())
            print("ok", q.qsize(), flush=True)
        else:
            break
    q.close()
    print("closed", flush=True)
"""


def _line(proc):
    ready, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT)
    assert ready, "the holder process did not answer in time"
    return proc.stdout.readline().strip()


def test_a_second_process_on_a_held_file_is_its_client_and_the_holder_goes_on(tmp_path):
    """A second process that opens a file another process holds reaches its queues through
    that process (ackqueue.owner; test_shared_file has the rest); what needs the file itself
    (repair=True) is refused with QueueLocked naming the holder's pid."""
    path = tmp_path / "locked.fs"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert _line(holder) == "ready"
        with AckQueue(path=path) as q:
            assert "(shared)" in repr(q) and q.qsize() == 2
            q.put("c0")
        holder.stdin.write("put c1\n")
        holder.stdin.flush()
        assert _line(holder) == "ok 4"                  # the holder is undisturbed
        for attempt in range(2):
            with pytest.raises(QueueLocked) as info:
                AckQueue(path=path, repair=True)
            assert str(path) in str(info.value)
            assert f"pid {holder.pid}" in str(info.value)
        holder.stdin.write("ack\nexit\n")
        holder.stdin.flush()
        assert _line(holder) == "ok 3"
        assert _line(holder) == "closed"
        assert holder.wait(CHILD_TIMEOUT) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(CHILD_TIMEOUT)
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            stream.close()
    with AckQueue(path=path) as q:                    # once it is gone: all there
        assert_intact(q, ["b", "c0", "c1"])


# -- timeouts and task_done as queue.Queue takes them ---------------------------------

def test_timeouts_as_the_standard_library_takes_them():
    import queue
    # A bounded queue: queue.Queue checks a put's timeout only when it may have to wait;
    # AckQueue refuses a blocking put's negative timeout even unbounded (a bug caught early).
    for q in (queue.Queue(maxsize=5), AckQueue(maxsize=5)):
        with pytest.raises(queue.Empty):
            q.get(block=False, timeout=-1)        # not blocking: the timeout is ignored
        with pytest.raises(queue.Empty):
            q.get(timeout=True)                   # a bool is an int: one second
        q.put("a", block=False, timeout=-1)
        q.put("b", timeout=True)
        assert q.get(block=False, timeout=-1) == "a"
        assert q.get(timeout=False) == "b"        # False: 0 s, and "b" is there
        with pytest.raises(ValueError, match="non-negative"):
            q.get(timeout=-1)
        with pytest.raises(ValueError, match="non-negative"):
            q.put("c", timeout=-1)


def test_task_done_with_nothing_held_says_what_is_wrong():
    q = AckQueue()
    for item in ("a", "b", "c"):
        q.put(item)
    with pytest.raises(ValueError) as info:
        q.task_done()
    assert "too many times" not in str(info.value)
    assert "3 unfinished" in str(info.value) and "get()" in str(info.value)
    q.get()
    q.task_done()
    q.get(), q.get()
    q.task_done(), q.task_done()
    with pytest.raises(ValueError, match="called too many times"):
        q.task_done()                            # now it really is too many


# -- a server that cannot be reached or resolved ----------------------------------------

def test_unreachable_server_warns_once_and_unresolvable_fails_at_once(caplog):
    import logging
    import socket
    from ackqueue import ServerUnavailable
    with pytest.raises(ServerUnavailable, match="'no-such-host.invalid' cannot be resolved"):
        AckQueue(path="zeo://no-such-host.invalid:8100?wait_timeout=30")
    with socket.socket() as s:               # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="ackqueue.zeo.client"):
        with pytest.raises(ServerUnavailable):
            AckQueue(path=f"zeo://127.0.0.1:{port}?wait_timeout=1.5")
        waiting = [r for r in caplog.records if "waiting up to" in r.getMessage()]
        assert len(waiting) == 1 and f"127.0.0.1:{port}" in waiting[0].getMessage()
        caplog.clear()
        with pytest.raises(ServerUnavailable):       # too short a wait to announce
            AckQueue(path=f"zeo://127.0.0.1:{port}?wait_timeout=0.5")
        assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]
