"""The service's routes for stream processors (ackqueue/service/batches.py), against a
real ``ackqueue serve``: a leased batch part reads the same messages again until its
stream commits it, a commit is cumulative and idempotent, a lease that runs out gives its
messages back, and rows put twice under the same dedup ids are stored once."""
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
    # The queue's own deadline gives them back; the next read of the part receives afresh.
    assert sorted(q.get(timeout=30) for _ in range(2)) == ["a", "b"]
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
