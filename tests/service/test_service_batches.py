"""The service's routes for stream processors (ackqueue/service/leased_batches.py), against a
real ``ackqueue serve``: a leased batch part reads the same messages again until its
stream commits it, also after the service is SIGKILLed and restarted; a commit is
cumulative and idempotent, and remembered across a restart; a lease that runs out gives
its messages back, also one that ran out while the service was down; and rows put twice
under the same dedup ids are stored once."""
import time

import pytest

from ackqueue import AckQueue
from ackqueue.spark.client import Client, ServiceError
from service_proc import Service


@pytest.fixture
def service(tmp_path):
    svc = Service(tmp_path / "q.fs", tmp_path / "service.log")
    yield svc
    assert svc.stop() == 0


def ids(got):
    return [h["id"] for h, _ in got]


def test_a_part_is_read_again_the_same_until_committed(service):
    q = AckQueue(path=service.url, name="in")
    q.put_many([f"m{i}" for i in range(10)])
    c = Client(service.url)
    first = c.read_batch("in", "s1", 1, 0, 4, 60)
    again = c.read_batch("in", "s1", 1, 0, 4, 60)
    other = c.read_batch("in", "s1", 1, 1, 4, 60)
    assert ids(first) == ids(again) and len(first) == 4
    assert [p for _, p in first] == [b"m0", b"m1", b"m2", b"m3"]
    assert not set(ids(first)) & set(ids(other))
    assert [h["receive_count"] for h, _ in again] == [2] * 4      # each read counts
    # The leased messages stay in the queue, in flight under their parts' holds.
    assert q.counts() == {"ready": 2, "in_flight": 8, "delayed": 0}
    assert c.commit("in", "s1", 1) == {"acked": 8, "committed": 1}
    assert c.commit("in", "s1", 1) == {"acked": 0, "committed": 1}   # idempotent
    assert c.read_batch("in", "s1", 1, 0, 4, 60) == []               # committed: nothing
    assert q.counts() == {"ready": 2, "in_flight": 0, "delayed": 0}
    c.close()


def test_a_lease_that_runs_out_gives_the_messages_back(service):
    q = AckQueue(path=service.url, name="in")
    q.put_many(["a", "b"])
    c = Client(service.url)
    assert len(c.read_batch("in", "s2", 1, 0, 10, 0.2)) == 2
    # The service's sweep puts them back (the wait is a failure bound, not a timing).
    assert sorted(q.get(timeout=30) for _ in range(2)) == ["a", "b"]
    assert len(c.read_batch("in", "s2", 1, 0, 10, 60)) == 0     # taken afresh: none left
    c.close()


def read_all(c, stream, parts):
    return {part: c.read_batch("in", stream, 1, part, 3, 60) for part in parts}


def test_a_part_read_before_a_sigkill_is_read_the_same_after_the_restart(service):
    q = AckQueue(path=service.url, name="in")
    q.put_many([f"m{i}" for i in range(8)], attributes={"k": "v"}, priority=5)
    q.close()
    c = Client(service.url)
    before = read_all(c, "s3", [0, 1])
    service.kill()
    service.start()
    assert c.counts("in")["ready"] == 2         # the leased ones did not come back
    assert c.streams("in") == {"s3": {"committed": -1, "parts": 2, "messages": 6}}
    after = read_all(c, "s3", [1, 0])           # in another order: each its own
    for part in range(2):
        assert [(h["id"], h["attributes"], h["priority"], p) for h, p in after[part]] == [
            (h["id"], h["attributes"], h["priority"], p) for h, p in before[part]]
        assert [h["receive_count"] for h, _ in after[part]] == [2, 2, 2]
    assert c.counts("in")["ready"] == 2
    assert c.commit("in", "s3", 1) == {"acked": 6, "committed": 1}
    service.kill()
    service.start()
    assert c.commit("in", "s3", 1) == {"acked": 0, "committed": 1}    # remembered
    assert c.streams("in") == {"s3": {"committed": 1, "parts": 0, "messages": 0}}
    assert c.read_batch("in", "s3", 1, 0, 3, 60) == []
    q = AckQueue(path=service.url, name="in")
    assert sorted(q.get(timeout=10) for _ in range(2)) == ["m6", "m7"]
    assert q.qsize() == 0
    q.close()
    c.close()


def test_a_lease_that_ran_out_while_the_service_was_down_is_given_back_at_start(service):
    q = AckQueue(path=service.url, name="in")
    q.put_many(["a", "b", "c"])
    q.close()
    c = Client(service.url)
    assert len(c.read_batch("in", "s4", 1, 0, 2, 0.5)) == 2
    answered = time.time()
    service.kill()
    while time.time() <= answered + 0.5:      # past the lease's deadline (wall clock)
        time.sleep(0.1)
    service.start()                           # expires run-out leases before it listens
    q = AckQueue(path=service.url, name="in")
    assert q.counts() == {"ready": 3, "in_flight": 0, "delayed": 0}
    assert sorted(q.get(timeout=10) for _ in range(3)) == ["a", "b", "c"]
    q.close()
    c.close()


def test_rows_put_twice_are_stored_once(service):
    c = Client(service.url)
    rows = [b"x", b"y", b"z"]
    assert c.put_rows("out", rows[:2], ["d0", "d1"], [100, 100], [None, {"k": "v"}],
                      "str", 3600) == {"put": 2, "duplicates": 0}
    # A replay, in another order and with one more row: only the new one is put.
    assert c.put_rows("out", rows[::-1], ["d2", "d1", "d0"], [100] * 3, [None] * 3,
                      "str", 3600) == {"put": 1, "duplicates": 2}
    q = AckQueue(path=service.url, name="out")
    assert sorted(q.get(timeout=10) for _ in range(3)) == ["x", "y", "z"]
    with pytest.raises(ServiceError, match="400"):
        c.put_rows("out", [b"w"], [""], [100], [None], "str", 3600)
    c.close()


def test_a_part_keeps_its_messages_in_flight_across_a_sigkill_and_gives_them_back_in_place(
        service):
    q = AckQueue(path=service.url, name="in")
    q.put_many(["a", "b", "c"])
    q.close()
    c = Client(service.url)
    got = c.read_batch("in", "s5", 1, 0, 2, 600)
    assert c.counts("in")["ready"] == 1 and c.counts("in")["in_flight"] == 2
    service.kill()
    service.start()
    stats = c.counts("in")
    assert stats["ready"] == 1 and stats["in_flight"] == 2, stats     # still held
    again = c.read_batch("in", "s5", 1, 0, 2, 0.3)     # the replay: a lease of 0.3 s now
    assert [(h["id"], h["receive_count"], p) for h, p in again] == [
        (h["id"], 2, p) for h, p in got]
    deadline = time.monotonic() + 30          # a failure bound, not a timing
    while c.counts("in")["ready"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    q = AckQueue(path=service.url, name="in")
    back = q.get_messages(3, timeout=30)
    # Given back at their original place, with their ids, both reads counted.
    assert [(int(m.id), m.body, m.receive_count) for m in back] == [
        (h["id"], p.decode(), 3) for h, p in got] + [(got[-1][0]["id"] + 1, "c", 1)]
    q.ack_many(back)
    q.close()
    c.close()


def test_the_columnar_answer_holds_what_the_per_message_answer_holds(service):
    import array
    q = AckQueue(path=service.url, name="cols")
    q.put_many(["héllo", "b"], attributes={"k": "v"}, priority=7)
    q.put(b"\x00\xff")
    q.put({"j": 1})
    q.close()
    c = Client(service.url)
    first = c.read_batch("cols", "s6", 1, 0, 10, 60)
    head, offsets, data = c.read_columns("cols", "s6", 1, 0, 10, 60)    # the replay
    ends = array.array("q")
    ends.frombytes(offsets)
    payloads = [data[a:b] for a, b in zip(ends, ends[1:])]
    assert len(first) == 4 and ends[0] == 0 and ends[-1] == len(data)
    assert head["ids"] == [h["id"] for h, _ in first]
    assert payloads == [p for _, p in first]
    assert head["receive_counts"] == [h["receive_count"] + 1 for h, _ in first]
    for key, column in (("encoding", "encodings"), ("priority", "priorities"),
                        ("attributes", "attributes"), ("sent_at", "sent_at")):
        assert head[column] == [h[key] for h, _ in first], key
    # No attributes at all: a null column.
    AckQueue(path=service.url, name="cols").put("plain")
    assert c.read_columns("cols", "s6", 2, 0, 10, 60)[0]["attributes"] is None
    with pytest.raises(ServiceError, match="400"):
        c._read("cols", "s6", 3, 0, 1, 60, None, None, format="rows")
    c.close()
