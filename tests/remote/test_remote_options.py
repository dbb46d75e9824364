"""The remote drop-in's queue options through a real service: the
codec recorded with the queue, dead letters (max_receives, dead_letter), dedup_window, and
clock (refused: it cannot travel).  The service is the ``ackqueue serve`` console script."""
import itertools
import json
import urllib.request

import pytest

pytest.importorskip("aiohttp")

from ackqueue import (AckQueue, AckQueueError, CodecMismatch, DuplicateMessage,  # noqa: E402
                      Empty)

from service_proc import Service                       # noqa: E402

_names = itertools.count()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote-options")
    s = Service(d / "shared.fs", d / "service.log")
    yield s
    assert s.stop() == 0


@pytest.fixture
def q(shared):
    opened = []

    def make(**kwargs):
        kwargs.setdefault("name", f"o{next(_names)}")
        x = AckQueue(path=kwargs.pop("path", shared.url), **kwargs)
        opened.append(x)
        return x
    yield make
    for x in opened:
        x.close()


def _browse(url, name):
    with urllib.request.urlopen(f"{url}/v1/queues/{name}/browse") as r:
        return json.load(r)["messages"]


# -- the codec ------------------------------------------------------------------------------

def test_the_codec_is_recorded_with_the_queue_and_a_second_client_agrees(q, shared):
    producer = q(codec="json")
    producer.put({"a": [1, 2]})
    consumer = q(name=producer.name)             # codec=None: the recorded one
    assert consumer._state.codec == "json"
    consumer.put(("a", 1))                        # encoded as JSON too: a list comes back
    assert [m["encoding"] for m in _browse(shared.url, producer.name)] == ["json", "json"]
    assert consumer.get(timeout=10) == {"a": [1, 2]}
    assert consumer.get(timeout=10) == ["a", 1]
    consumer.task_done()
    consumer.task_done()
    with pytest.raises(CodecMismatch) as info:
        q(name=producer.name, codec="pickle")
    assert "json" in str(info.value)


def test_the_codec_survives_a_restart_and_binds_the_embedded_queue(own_service, tmp_path):
    s = own_service()
    a = AckQueue(path=s.url, name="jobs", codec="str")
    a.put("hello")
    a.close()
    s.stop()
    s.start()
    with pytest.raises(CodecMismatch):
        AckQueue(path=s.url, name="jobs", codec="bytes")
    b = AckQueue(path=s.url, name="jobs")
    assert b._state.codec == "str" and b.get(timeout=10) == "hello"
    b.task_done()
    b.close()
    assert s.stop() == 0
    with pytest.raises(CodecMismatch):                # recorded in the file itself
        AckQueue(path=str(tmp_path / "q.fs"), name="jobs", codec="json")


def test_a_default_codec_client_first_does_not_bind_the_queue(q):
    first = q()                                   # pickle, the default: not recorded
    first.put(b"raw")
    second = q(name=first.name, codec="bytes")    # as an embedded queue: now recorded
    assert second._state.codec == "bytes"
    with pytest.raises(CodecMismatch):
        q(name=first.name, codec="json")


# -- dead letters -----------------------------------------------------------------------------

def test_max_receives_moves_a_message_to_the_dead_letter_queue(q):
    dead = q()
    work = q(max_receives=2, dead_letter=dead.name)
    work.put("poison")
    work.put("fine")
    for _ in range(2):
        m = work.get_message(timeout=10)
        assert m.body == "poison"
        work.nack(m)
    assert work.get(timeout=10) == "fine"        # the third receive moved "poison" out
    work.task_done()
    with pytest.raises(Empty):
        work.get(timeout=0.2)
    m = dead.get_message(timeout=10)
    assert m.body == "poison"
    dead.ack(m)
    assert work.stats()["dead_lettered"] == 1


def test_max_receives_without_a_dead_letter_queue_drops(q):
    work = q(max_receives=1)
    work.put("once")
    work.nack(work.get_message(timeout=10))
    with pytest.raises(Empty):
        work.get(timeout=0.2)
    assert work.stats()["dead_lettered"] == 1


def test_a_dead_letter_name_the_service_cannot_take_is_refused(q):
    with pytest.raises(ValueError, match="dead-letter"):
        q(max_receives=2, dead_letter="no spaces&here")
    work = q()
    work.put("x")
    with pytest.raises(AckQueueError, match="dead_letter"):     # the service says why
        work.get(timeout=1, max_receives=2, dead_letter="no spaces&here")


def test_a_per_get_dead_letter_override(q):
    dead = q()
    work = q()
    work.put("x")
    work.nack(work.get_message(timeout=10))
    with pytest.raises(Empty):
        work.get(timeout=0.2, max_receives=1, dead_letter=dead.name)
    assert dead.get(timeout=10) == "x"
    dead.task_done()


# -- dedup_window and clock ----------------------------------------------------------------

def test_dedup_window_travels_with_the_put(q):
    short = q(dedup_window=0)
    short.put("a", dedup_id="k")
    short.put("b", dedup_id="k")                 # the window is over at once
    normal = q(name=short.name)
    normal.put("c", dedup_id="j")
    with pytest.raises(DuplicateMessage):
        normal.put("d", dedup_id="j")
    assert short.qsize() == 3


def test_clock_is_refused_with_the_reason(shared):
    with pytest.raises(ValueError) as info:
        AckQueue(path=shared.url, name="clocked", clock=lambda: 0.0)
    assert "clock" in str(info.value) and "service" in str(info.value)
