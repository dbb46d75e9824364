"""The durable leases of stream processors' batch parts (ackqueue/service/streams.py), on a
real queue file in this process, with an injected clock: a leased part is read back the
same after the file is reopened, a run-out lease puts its messages back, a commit is
cumulative, idempotent and remembered, and a part failing its processor is halved and
then dead-lettered; parts of one stream are read at once, a commit alone.
(tests/service/test_service_batches.py does the same through a real service that is
SIGKILLed and restarted.)"""
import threading

import pytest

from ackqueue import AckQueue, codec
from ackqueue.service.streams import Book, StreamLock


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "q.fs")


def payloads(held):
    return [codec.payload(h.body) for h in held]


def fill(path, items, **opts):
    q = AckQueue(path=path, name="in", codec="str")
    q.put_many(items, **opts)
    return q


def test_a_leased_part_reads_the_same_after_the_file_is_reopened(path):
    q = fill(path, [f"m{i}" for i in range(6)], attributes={"k": "v"}, priority=7)
    book = Book(Clock())
    first, extra = book.lease(q, "s", (1, 0), 4, 30)
    assert extra == 0 and payloads(first) == [b"m0", b"m1", b"m2", b"m3"]
    assert q.counts() == {"ready": 2, "in_flight": 4, "delayed": 0}   # held, in flight
    q.close()

    q = AckQueue(path=path, name="in", codec="str")
    again = Book(Clock())
    assert again.load(q.db) == 1
    got, extra = again.lease(q, "s", (1, 0), 4, 30)
    assert extra == 1
    assert [(h.id, h.body, h.priority, h.attributes) for h in got] == [
        (h.id, h.body, 7, {"k": "v"}) for h in first]
    assert sorted(q.get_many(2, timeout=10)) == ["m4", "m5"]   # the others, once
    q.close()


def test_a_lease_that_runs_out_puts_its_messages_back(path):
    clock = Clock()
    q = fill(path, ["a", "b", "c"])
    book = Book(clock)
    assert len(book.lease(q, "s", (1, 0), 2, 10)[0]) == 2
    clock.now += 9.9
    assert book.expire_all(lambda name: q) == []          # not yet
    assert book.lease(q, "s", (1, 0), 2, 10)[1] == 1      # a replay renews it: 10 s more
    clock.now += 10.0
    assert book.expire_all(lambda name: q) == [("in", "s", 2)]
    assert q.qsize() == 3 and book.count() == (0, 0)
    q.close()
    q = AckQueue(path=path, name="in", codec="str")
    assert Book(clock).load(q.db) == 0                    # the record is gone for good
    assert sorted(q.get_many(3, timeout=10)) == ["a", "b", "c"]
    q.close()


def test_a_commit_is_cumulative_idempotent_and_remembered(path):
    q = fill(path, [str(i) for i in range(5)])
    book = Book(Clock())
    for key in [(1, 0), (1, 1), (2, 0)]:
        book.lease(q, "s", key, 1, 30)
    assert book.commit(q, "s", 1) == (2, 1)
    assert book.commit(q, "s", 1) == (0, 1)
    assert book.commit(q, "s", 0) == (0, 1)               # never goes back
    assert book.lease(q, "s", (1, 0), 1, 30) == ([], 0)   # committed: nothing
    q.close()
    q = AckQueue(path=path, name="in", codec="str")
    again = Book(Clock())
    assert again.load(q.db) == 1                          # part (2, 0) still leased
    assert again.lease(q, "s", (1, 1), 1, 30) == ([], 0)
    assert payloads(again.lease(q, "s", (2, 0), 1, 30)[0]) == [b"2"]
    assert again.commit(q, "s", 2) == (1, 2)
    assert q.qsize() == 2
    q.close()


def test_a_part_failing_each_time_is_halved_then_dead_lettered(path):
    q = fill(path, ["poison", "fine"])
    dead = AckQueue(path=path, name="dead", codec="str")
    book = Book(Clock())
    both, _ = book.lease(q, "s", (1, 0), 2, 30, max_receives=2, dead_letter=dead)
    assert book.lease(q, "s", (1, 0), 2, 30, max_receives=2, dead_letter=dead)[1] == 1
    # The third read: halved, "fine" back in the queue, "poison" kept under a fresh count.
    kept, extra = book.lease(q, "s", (1, 0), 2, 30, max_receives=2, dead_letter=dead)
    assert [(h.id, h.body) for h in kept] == [(h.id, h.body) for h in both[:1]]
    assert extra == 0 and kept[0].receive_count == 3        # every read counts
    assert q.qsize() == 1
    book.lease(q, "s", (1, 0), 2, 30, max_receives=2, dead_letter=dead)
    assert book.lease(q, "s", (1, 0), 2, 30, max_receives=2, dead_letter=dead) == ([], 0)
    assert dead.get(timeout=10) == "poison" and q.get(timeout=10) == "fine"
    assert book.lease(q, "s", (1, 0), 2, 30)[0] == []     # the part stays empty
    dead.close()
    q.close()


def test_parts_of_a_stream_are_read_at_once_and_a_commit_waits_for_them():
    lock = StreamLock()
    events = []
    inside = threading.Event()

    def other_part():
        with lock.part((1, 1)):
            events.append("part 1 in")
            inside.set()

    def whole():
        with lock.whole():
            events.append("whole")

    with lock.part((1, 0)):
        t = threading.Thread(target=other_part)
        t.start()
        assert inside.wait(30)                # entered while part 0 is held
        w = threading.Thread(target=whole)
        w.start()
        t.join(30)
        events.append("part 0 out")
    w.join(30)
    assert events == ["part 1 in", "part 0 out", "whole"]


# -- the messages stay in the queue, in flight under a durable hold (ackqueue.holds) ------

def test_leased_messages_are_in_flight_and_keep_their_place_when_the_lease_runs_out(path):
    clock = Clock()
    q = fill(path, ["a", "b", "c"])
    ids = [int(m.id) for m in q.browse()]
    book = Book(clock)
    got, _ = book.lease(q, "s", (1, 0), 2, 10)
    assert [h.id for h in got] == ids[:2]
    assert q.counts() == {"ready": 1, "in_flight": 2, "delayed": 0}
    clock.now += 10.0
    assert book.expire_all(lambda name: q) == [("in", "s", 2)]
    # Back at their original place, with their ids, and the lease's receive counted.
    back = q.get_messages(3, timeout=10)
    assert [(int(m.id), m.body, m.receive_count) for m in back] == [
        (ids[0], "a", 2), (ids[1], "b", 2), (ids[2], "c", 1)]
    q.close()


def test_the_queue_gives_a_hold_back_at_its_deadline_by_itself(path):
    qclock = Clock()
    q = AckQueue(path=path, name="in", codec="str", clock=qclock)
    q.put_many(["a", "b", "c"])
    book = Book(Clock())                      # the book's clock stands still
    got, _ = book.lease(q, "s", (1, 0), 2, 10)
    qclock.now += 10.0                        # the queue's visibility deadline passes
    back = q.get_messages(3, timeout=10)
    assert [(int(m.id), m.receive_count) for m in back][:2] == [(h.id, 2) for h in got]
    assert [m.body for m in back] == ["a", "b", "c"]
    # The part's messages are gone from its hold: a later read of it takes afresh.
    q.ack_many(back)
    assert book.lease(q, "s", (1, 0), 2, 10) == ([], 0)
    q.close()


def test_a_leased_part_is_in_flight_after_the_file_is_reopened_and_its_receives_counted(
        path):
    q = fill(path, ["a", "b", "c"])
    first, _ = Book(Clock()).lease(q, "s", (1, 0), 2, 30)
    q.close()
    q = AckQueue(path=path, name="in", codec="str")     # the queue's recovery at open
    assert q.counts() == {"ready": 1, "in_flight": 2, "delayed": 0}
    assert q.get_many(3, block=False) == ["c"]          # the held ones are not ready
    book = Book(Clock())
    book.load(q.db)
    again, extra = book.lease(q, "s", (1, 0), 2, 30)
    assert extra == 1
    assert [(h.id, h.body, h.receive_count) for h in again] == [
        (h.id, h.body, 2) for h in first]
    assert book.commit(q, "s", 1) == (2, 1)
    assert q.counts() == {"ready": 0, "in_flight": 1, "delayed": 0}   # "c", got above
    q.close()


def test_a_lease_writes_no_copy_of_the_bodies(path):
    marker = "body-written-once-"
    q = fill(path, [f"{marker}{i}" for i in range(40)])
    q.close()

    def copies():
        with open(path, "rb") as f:
            return f.read().count(marker.encode())
    assert copies() == 40
    q = AckQueue(path=path, name="in", codec="str")
    book = Book(Clock())
    assert len(book.lease(q, "s", (1, 0), 40, 30)[0]) == 40
    assert book.lease(q, "s", (1, 0), 40, 30)[1] == 1             # a replay
    q.close()
    assert copies() == 40             # the record names ids; the bodies stay where they are
