"""The raw-bytes seam a server needs: put already-encoded bodies, receive stored bytes
without unpickling, and the original id of a duplicate dedup id."""
import pickle
import queue

import pytest

from ackqueue import AckPriorityQueue, AckQueue
from ackqueue.errors import DuplicateMessage


def test_encoded_put_is_got_as_the_item_and_raw_get_returns_the_bytes(tmp_path):
    path = str(tmp_path / "q.fs")
    q = AckQueue(path=path)
    body = pickle.dumps({"job": 1})
    ids = q.put_many([body, bytearray(b"not a pickle")], encoded=True)
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)
    q.put(("plain", 2))
    [m] = q.get_messages(1, block=False, raw=True)
    assert m.body == body and isinstance(m.body, bytes) and m.id == ids[0]
    [m2] = q.get_messages(1, block=False, raw=True)
    assert m2.body == b"not a pickle"        # never unpickled: no error, no set-aside
    q.ack_many([m, m2])
    [m3] = q.get_messages(1, block=False, raw=True)
    assert pickle.loads(m3.body) == ("plain", 2)
    q.nack(m3)
    q.close()
    q = AckQueue(path=path)                   # across a reopen: the same item
    assert q.get(block=False) == ("plain", 2)
    q.task_done()
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.close()


def test_encoded_body_stored_as_given_and_unpickled_by_a_normal_get():
    q = AckQueue()
    q.put_many([pickle.dumps([1, 2, 3])], encoded=True)
    assert q.get(block=False) == [1, 2, 3]


def test_raw_get_never_unpickles():
    q = AckQueue()
    q.put_many([b"\x80\x04cbuiltins\nexec\n"], encoded=True)   # a hostile pickle
    [m] = q.get_messages(1, block=False, raw=True)
    assert m.body.startswith(b"\x80\x04")


def test_encoded_refuses_non_bytes_and_value_queues():
    q = AckQueue()
    with pytest.raises(TypeError):
        q.put_many(["text"], encoded=True)
    assert q.counts()["ready"] == 0
    pq = AckPriorityQueue()
    with pytest.raises(ValueError):
        pq.put_many([pickle.dumps(1)], encoded=True)


def test_encoded_respects_max_item_size():
    from ackqueue.errors import ItemTooLarge
    q = AckQueue(max_item_size=10)
    with pytest.raises(ItemTooLarge):
        q.put_many([b"x" * 11], encoded=True)
    assert q.put_many([b"x" * 10], encoded=True)


def test_duplicate_names_the_original_id_durably(tmp_path):
    path = str(tmp_path / "q.fs")
    q = AckQueue(path=path)
    q.put("a")
    [first] = q.put_many(["b"], dedup_ids=["key-1"])
    with pytest.raises(DuplicateMessage) as info:
        q.put("c", dedup_id="key-1")
    assert info.value.original_id == first
    assert q.get(block=False) == "a"
    q.task_done()
    assert q.get(block=False) == "b"
    q.task_done()                              # acknowledged: the id is still known
    q.close()
    q = AckQueue(path=path)
    with pytest.raises(DuplicateMessage) as info:
        q.put("d", dedup_id="key-1")
    assert info.value.original_id == first
    q.close()


def test_pruned_dedup_id_forgets_its_original(tmp_path):
    now = [1000.0]
    q = AckQueue(clock=lambda: now[0], dedup_window=5)
    q.put("x", dedup_id="k")
    now[0] += 10
    q._state.sweep()        # the reaper's sweep, run now rather than waited for
    [again] = q.put_many(["y"], dedup_ids=["k"])   # the window passed: accepted
    with pytest.raises(DuplicateMessage) as info:
        q.put("z", dedup_id="k")
    assert info.value.original_id == again


def test_get_many_of_one():
    # The state returns a lone Holding for n == 1; get_many(1) used to fail iterating it.
    q = AckQueue()
    q.put("only")
    assert q.get_many(1, block=False) == ["only"]
    q.put("next")
    [m] = q.get_messages(1, block=False)
    assert m.body == "next"
