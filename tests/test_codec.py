"""One rule for bodies (ackqueue.codec): a str is stored as text, bytes as bytes, each
marked as such, anything else pickled; a queue's codec is stored with it.

Real storages only: in memory, on a file, and through a real server (the console script).
"""
import pickle

import pytest

from ackqueue import (AckPriorityQueue, AckQueue, CodecMismatch, EncodingRefused,
                      QueueKindMismatch)
from ackqueue import codec

from zeo_server import Server


@pytest.fixture(params=["memory", "file"])
def where(request, tmp_path):
    return None if request.param == "memory" else str(tmp_path / "q.fs")


class Str(str):
    """A str subclass: pickled, so that its type comes back."""


def stored(q):
    return [m.body for m in q.browse()]


def test_the_default_rule_marks_text_and_bytes_and_pickles_the_rest(where):
    items = ["héllo", b"\x00\xff", {"n": 1}, Str("kept"), "", b""]
    with AckQueue(path=where) as q:
        for item in items:
            q.put(item)
        bodies = stored(q)
        assert [codec.kind(b) for b in bodies] == [
            "str", "bytes", "pickle", "pickle", "str", "bytes"]
        assert bodies[0] == b"\x01" + "héllo".encode()      # text a non-Python reader reads
        assert bodies[1] == b"\x02\x00\xff"
        got = [q.get(block=False) for _ in items]
        assert got == items and type(got[3]) is Str and type(got[0]) is str
        for _ in items:
            q.task_done()


@pytest.mark.parametrize("name, good, bad", [
    ("json", [{"a": [1, 2.5, None]}, "s", 3], [object(), {1, 2}]),
    ("str", ["only text"], [b"bytes", 3]),
    ("bytes", [b"only bytes", bytearray(b"ba")], ["text", 3]),
])
def test_a_queue_codec_encodes_what_it_allows_and_refuses_the_rest(where, name, good, bad):
    with AckQueue(path=where, codec=name) as q:
        for item in bad:
            with pytest.raises(TypeError):
                q.put(item)
        assert q.qsize() == 0, "a refused put stores nothing"
        q.put_many(good)
        assert {codec.kind(b) for b in stored(q)} == {"str" if name == "str" else name}
        got = [q.get(block=False) for _ in good]
        assert got == [bytes(x) if isinstance(x, bytearray) else x for x in good]
        for _ in good:
            q.task_done()


def test_an_unknown_codec_is_refused():
    with pytest.raises(ValueError, match="unknown codec"):
        AckQueue(codec="yaml")


def test_the_codec_is_stored_with_the_queue_so_producers_and_consumers_agree(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, name="events", codec="json") as q:
        q.put({"kind": "created"})
        with pytest.raises(CodecMismatch):
            AckQueue(db=q.db, name="events", codec="pickle")   # same process, other codec
    with AckQueue(path=path, name="events") as q:              # no codec: the stored one
        q.put([1, 2])
        assert [codec.kind(b) for b in stored(q)] == ["json", "json"]
        assert q.get(block=False) == {"kind": "created"}
        q.task_done()
    with pytest.raises(CodecMismatch, match="codec='json'") as caught:
        AckQueue(path=path, name="events", codec="pickle")
    assert isinstance(caught.value, QueueKindMismatch)
    with AckQueue(path=path, name="other") as q:                # default: nothing stored
        q.put("x")
    with AckQueue(path=path, name="other", codec="str") as q:   # first codec given: kept
        q.put("y")
    with pytest.raises(CodecMismatch):
        AckQueue(path=path, name="other", codec="bytes")


def test_a_pickle_queue_takes_and_decodes_every_encoding(where):
    with AckQueue(path=where) as q:
        q.put_many([pickle.dumps({"from": "afar"}), codec.mark("bytes", b"raw"),
                    codec.mark("json", b"[1]")], encoded=True)
        q.put("text")
        assert [q.get(block=False) for _ in range(4)] == [{"from": "afar"}, b"raw", [1],
                                                          "text"]
        for _ in range(4):
            q.task_done()


@pytest.mark.parametrize("name", ["str", "bytes", "json"])
def test_a_queue_of_another_codec_takes_bodies_of_its_own_encoding_only(where, name):
    own = {"str": codec.mark("str", b"ok"), "bytes": codec.mark("bytes", b"ok"),
           "json": codec.mark("json", b'"ok"')}
    with AckQueue(path=where, codec=name) as q:
        for other, body in list(own.items()) + [("pickle", pickle.dumps("ok"))]:
            if other == name:
                continue
            with pytest.raises(EncodingRefused, match=f"codec '{name}'") as info:
                q.put_many([own[name], body], encoded=True)
            assert (info.value.codec, info.value.encoding, info.value.index) == (
                name, other, 1)
        assert q.qsize() == 0                         # nothing of a refused batch
        q.put_many([own[name]], encoded=True)
        assert q.get(block=False) in ("ok", b"ok")
        q.task_done()


def test_a_priority_queue_orders_text_items_by_value(where):
    with AckPriorityQueue(path=where) as q:
        q.put_many(["pear", "apple", "fig"])
        assert [q.get(block=False) for _ in range(3)] == ["apple", "fig", "pear"]
        for _ in range(3):
            q.task_done()


def test_through_a_server_the_stored_codec_binds_every_process(tmp_path):
    srv = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    try:
        with AckQueue(path=srv.url, name="j", codec="json") as q:
            q.put({"a": 1})
        with AckQueue(path=srv.url, name="j") as q:
            assert q.get(timeout=30) == {"a": 1}
            q.task_done()
        from ackqueue import database
        database._close_all()                       # a fresh client reads the record again
        with pytest.raises(CodecMismatch):
            AckQueue(path=srv.url, name="j", codec="str")
    finally:
        srv.stop()
