"""The store's file format: a file written by format 1 opens and drains with today's code;
a file of a newer format is refused and left as it is; older formats are migrated on open.

tests/data/format1.fs was written by tests/data/make_format1.py with the code of format 1
(see that script for what it holds).  Persistent classes are pickled into files by their
module path (ackqueue.store.Catalog, ackqueue.store.QueueRecord, ackqueue.segments.Msg,
...): moving or renaming one breaks every existing file, and these tests are what catch
it.  A change to the layout must keep them passing, unchanged: read format 1, or bump
store.FORMAT and migrate it on open (store.MIGRATIONS).

Every test opens a copy in tmp_path, never the committed file.
"""
import hashlib
import os
import pickle
import shutil

import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage

from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, DuplicateMessage, Empty,
                      StorageError, UnsupportedFormat, queues, store)
from ackqueue import segments

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
FIXTURE = os.path.join(DATA, "format1.fs")
T0 = 1_767_225_600.0            # the fixed clock of make_format1.py
BIG = bytes(range(256)) * 40    # its large body


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def copy(tmp_path):
    """A copy of the format-1 fixture (its path, a str)."""
    path = str(tmp_path / "format1.fs")
    shutil.copyfile(FIXTURE, path)
    return path


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def edit_catalog(path, change):
    """change(catalog) in one commit, with plain ZODB (as another program would)."""
    db = ZODB.DB(FileStorage(path))
    try:
        conn = db.open()
        change(conn.root()[store.ROOT_KEY])
        transaction.commit()
        conn.close()
    finally:
        db.close()


def read_catalog(path, read):
    """read(catalog) with plain ZODB, read-only."""
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        conn = db.open()
        try:
            return read(conn.root()[store.ROOT_KEY])
        finally:
            conn.close()
    finally:
        db.close()


def drain(q):
    """Every ready message (get_message + ack), in delivery order."""
    got = []
    while True:
        try:
            m = q.get_message(block=False)
        except Empty:
            return got
        q.ack(m)
        got.append(m)


# -- the format-1 file opens and drains --------------------------------------------------

def check_jobs(path, clock):
    with AckQueue(path=path, name="jobs", clock=clock) as q:
        assert q.counts() == {"ready": 5, "in_flight": 0, "delayed": 1}
        stats = q.stats()
        assert (stats["put"], stats["acked"], stats["given_back"]) == (7, 1, 1)
        assert q.unfinished_tasks == 6
        got = drain(q)
        assert [m.body for m in got] == ["b", "a", "d", BIG, "c"]
        b, a, d, big, c = got
        assert [m.id for m in got] == [3, 2, 5, 6, 4]
        assert [m.priority for m in got] == [900, 100, 100, 100, 10]
        assert [m.sent_at for m in got] == [T0 + 2, T0 + 1, T0 + 4, T0 + 5, T0 + 3]
        # b was received once and given back (nack) before the file was closed
        assert (b.receive_count, b.first_received, b.last_received) == (2, T0 + 7, clock.now)
        assert [m.receive_count for m in got[1:]] == [1, 1, 1, 1]
        assert c.attributes == {"tenant": "acme", "kind": "c"}
        assert [m.attributes for m in got[:4]] == [{}, {}, {}, {}]
        assert all(m.dead_letter_source is None for m in got)
        # the dedup id put at T0 + 4 refuses until T0 + 304 (the default 300 s window)
        with pytest.raises(DuplicateMessage):
            q.put("d again", dedup_id="order-17")
        # "later" (delay 60 at T0 + 6) becomes ready at T0 + 66
        clock.now = T0 + 100
        later = q.get_message(block=False)
        assert (later.body, later.id, later.sent_at, later.receive_count) == (
            "later", 7, T0 + 6, 1)
        q.ack(later)
        clock.now = T0 + 400
        q.put("d again", dedup_id="order-17")
        again = q.get_message(block=False)
        assert again.body == "d again" and again.id > 7      # numbers are never reused
        q.ack(again)
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
        assert q.unfinished_tasks == 0


def check_work(path, clock):
    with AckQueue(path=path, name="work", max_receives=2, dead_letter="work-dead",
                  clock=clock) as q:
        # "held" was in flight when its process ended (os._exit): it is back
        assert q.counts() == {"ready": 2, "in_flight": 0, "delayed": 0}
        stats = q.stats()
        assert (stats["recovered"], stats["dead_lettered"], stats["put"]) == (1, 1, 3)
        held, after = drain(q)
        assert (held.body, held.id, held.receive_count, held.first_received) == (
            "held", 2, 2, T0 + 40)
        assert (after.body, after.id, after.receive_count) == ("after", 3, 1)
    with AckQueue(path=path, name="work-dead", clock=clock) as q:
        [dead] = drain(q)
        assert dead.body == "poison"
        assert dead.dead_letter_source == "work"
        assert (dead.id, dead.sequence_number, dead.sent_at) == (1, 1, T0 + 10)
        assert (dead.receive_count, dead.first_received) == (3, T0 + 11)


def check_stack_and_prio(path, clock):
    with AckLifoQueue(path=path, name="stack", clock=clock) as q:
        got = drain(q)
        assert [m.body for m in got] == ["urgent", 3, 2, 1]
        assert [m.priority for m in got] == [500, 100, 100, 100]
    with AckPriorityQueue(path=path, name="prio", clock=clock) as q:
        got = drain(q)
        assert [m.body for m in got] == [(5, "z"), (1, "a"), (2, "b"), (3, "c")]
        assert got[0].priority == 900


def check_all(path):
    clock = Clock(T0 + 50)
    check_jobs(path, clock)
    check_work(path, clock)
    check_stack_and_prio(path, clock)
    counts = queues(path)
    assert sorted(counts) == ["jobs", "prio", "stack", "work", "work-dead"]
    assert all(c == {"ready": 0, "in_flight": 0, "delayed": 0} for c in counts.values())


def test_a_format1_file_holds_what_make_format1_wrote_in_todays_classes(copy):
    # Read with plain ZODB: a moved or renamed class would load as a Broken object here.
    def shapes(catalog):
        jobs = catalog.queues["jobs"]
        return {
            "catalog": type(catalog), "format": catalog.format,
            "queues": sorted(catalog.queues), "record": type(jobs),
            "kinds": {n: r.kind for n, r in catalog.queues.items()},
            "messages": type(jobs.messages), "ready": type(jobs.ready),
            "msg": type(jobs.messages[3]), "counts": type(jobs.counts),
            "next_seq": type(jobs.next_seq), "body": type(jobs.bodies[6]),
            "big": jobs.bodies[6].data, "delayed": dict(jobs.delayed),
            "dedup": dict(jobs.dedup), "inflight": dict(catalog.queues["work"].inflight),
        }
    found = read_catalog(copy, shapes)
    assert pickle.loads(found.pop("big")) == BIG
    assert found == {
        "catalog": store.Catalog, "format": 1,
        "queues": ["jobs", "prio", "stack", "work", "work-dead"], "record": store.QueueRecord,
        "kinds": {"jobs": "fifo", "prio": "value", "stack": "lifo", "work": "fifo",
                  "work-dead": "fifo"},
        "messages": segments.MessageIndex, "ready": segments.KeySet, "msg": segments.Msg,
        "counts": store.Counters, "next_seq": store.SeqCounter, "body": store.Body,
        "delayed": {7: T0 + 66}, "dedup": {"order-17": T0 + 304}, "inflight": {2: 0.0},
    }


def test_a_format1_file_opens_and_drains_with_todays_code(copy):
    check_all(copy)
    assert read_catalog(copy, lambda c: c.format) == store.FORMAT


# -- a newer format is refused, the file left as it is ---------------------------------

def newer(path):
    edit_catalog(path, lambda c: setattr(c, "format", store.FORMAT + 1))
    return digest(path)


def check_refusal(error, where):
    message = str(error)
    assert where in message
    assert f"format {store.FORMAT + 1}" in message and f"format {store.FORMAT}" in message
    assert "upgrade ackqueue" in message
    assert (error.found, error.supported) == (store.FORMAT + 1, store.FORMAT)


def test_a_file_of_a_newer_format_is_refused_by_path_and_left_untouched(copy):
    before = newer(copy)
    for attempt in range(2):                # nothing of the first refusal stays open
        with pytest.raises(UnsupportedFormat) as caught:
            AckQueue(path=copy, name="jobs")
        check_refusal(caught.value, copy)
    assert isinstance(caught.value, StorageError)
    with pytest.raises(UnsupportedFormat):
        queues(copy)
    assert digest(copy) == before
    # Not locked either: plain ZODB opens it, and once its format is back, so does ackqueue.
    edit_catalog(copy, lambda c: setattr(c, "format", store.FORMAT))
    check_all(copy)


def test_a_file_of_a_newer_format_is_refused_through_an_application_db(copy):
    before = newer(copy)
    db = ZODB.DB(FileStorage(copy))
    try:
        with pytest.raises(UnsupportedFormat) as caught:
            AckQueue(db=db, name="jobs")
        check_refusal(caught.value, copy)
    finally:
        db.close()
    assert digest(copy) == before


def test_a_file_of_a_newer_format_is_refused_through_a_server(copy, tmp_path):
    from zeo_server import Server
    before = newer(copy)
    srv = Server(copy, tmp_path / "server.log")
    try:
        with pytest.raises(UnsupportedFormat) as caught:
            AckQueue(path=srv.url, name="jobs")
        check_refusal(caught.value, srv.url)
    finally:
        assert srv.stop() == 0
    assert digest(copy) == before


def test_a_format_that_is_not_a_version_number_is_refused(copy):
    edit_catalog(copy, lambda c: setattr(c, "format", "2.0"))
    before = digest(copy)
    with pytest.raises(UnsupportedFormat, match="does not recognise") as caught:
        AckQueue(path=copy, name="jobs")
    assert copy in str(caught.value) and caught.value.found == "2.0"
    assert digest(copy) == before


# -- older formats are migrated on open ------------------------------------------------

def test_every_format_before_this_one_has_a_migration():
    assert sorted(store.MIGRATIONS) == list(range(1, store.FORMAT))


def test_an_older_format_is_migrated_on_open_once_and_recorded(copy, monkeypatch):
    # A synthetic format 2 whose migration from format 1 adds a table to the catalog.
    ran = []

    def to_2(root):
        ran.append(root[store.ROOT_KEY].format)
        root[store.ROOT_KEY].added_by_2 = store.OOBTree()

    monkeypatch.setattr(store, "FORMAT", 2)
    monkeypatch.setattr(store, "MIGRATIONS", {1: to_2})
    check_all(copy)
    assert ran == [1]                       # once, at the first open
    assert read_catalog(copy, lambda c: (c.format, type(c.added_by_2))) == (
        2, store.OOBTree)


def test_a_failed_migration_writes_nothing(copy, monkeypatch):
    def broken(root):
        root[store.ROOT_KEY].half_done = True
        raise RuntimeError("migration failed")

    monkeypatch.setattr(store, "FORMAT", 2)
    monkeypatch.setattr(store, "MIGRATIONS", {1: broken})
    before = digest(copy)
    with pytest.raises(RuntimeError, match="migration failed"):
        AckQueue(path=copy, name="jobs")
    assert digest(copy) == before
    assert read_catalog(copy, lambda c: (c.format, hasattr(c, "half_done"))) == (1, False)


def test_a_format_without_a_migration_path_is_refused(copy, monkeypatch):
    monkeypatch.setattr(store, "FORMAT", 3)
    monkeypatch.setattr(store, "MIGRATIONS", {1: lambda root: None})
    before = digest(copy)
    with pytest.raises(UnsupportedFormat, match="no migration from format 2") as caught:
        AckQueue(path=copy, name="jobs")
    assert copy in str(caught.value) and (caught.value.found, caught.value.supported) == (1, 3)
    assert digest(copy) == before


def test_a_catalog_that_records_no_format_is_read_as_format1_and_then_records_it(copy):
    edit_catalog(copy, lambda c: delattr(c, "format"))
    assert read_catalog(copy, lambda c: hasattr(c, "format")) is False
    check_all(copy)               # read as format 1, migrated to today's format
    assert read_catalog(copy, lambda c: c.format) == store.FORMAT

