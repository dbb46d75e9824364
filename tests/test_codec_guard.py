"""A queue whose codec is not "pickle" never unpickles, and never takes a pickle.

The payload of every test is a real one: a pickle whose __reduce__ calls open(path, "w"),
so that unpickling it creates a file.  Each test first proves the payload live (it does
create its file when a pickle queue reads it), then checks that a queue with codec "json",
"str" or "bytes" refuses to store it (the embedded queue, ZEO, the service's native,
batch, Sasquatch and SQS routes) and refuses to read it when it is already there (put
before the codec was recorded): PickleRefused naming the message, nothing created, the
message left for the dead-letter rule."""
import json
import pickle

import pytest

from ackqueue import (AckQueue, Empty, EncodingRefused, PickleRefused, UnreadableItem,
                      codec)
from ackqueue.connection import UNREADABLE_DELAY

NON_PICKLE = ["json", "str", "bytes"]


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


class Creates:
    """An item whose pickle creates path when it is unpickled (and runs nothing else)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def payload(path):
    return pickle.dumps(Creates(path), protocol=pickle.HIGHEST_PROTOCOL)


def test_the_payload_is_live(tmp_path):
    marker = tmp_path / "ran"
    with AckQueue(path=str(tmp_path / "q.fs")) as q:      # codec "pickle": unpickles
        q.put_many([payload(marker)], encoded=True)
        q.get(block=False).close()
        q.task_done()
    assert marker.exists()


@pytest.mark.parametrize("name", NON_PICKLE)
def test_a_queue_of_another_codec_refuses_a_pickle_put(tmp_path, name):
    marker = tmp_path / "ran"
    with AckQueue(path=str(tmp_path / "q.fs"), codec=name) as q:
        with pytest.raises(EncodingRefused, match=f"codec '{name}'"):
            q.put_many([payload(marker)], encoded=True)
        assert q.qsize() == 0
    assert not marker.exists()


def put_before_the_codec(path, marker, name="jobs"):
    """A file whose queue holds the payload, put while the queue recorded no codec."""
    with AckQueue(path=path, name=name) as q:
        [mid] = q.put_many([payload(marker)], encoded=True)
    return int(mid)


@pytest.mark.parametrize("name", NON_PICKLE)
def test_a_pickle_already_stored_is_refused_unread_and_set_aside(tmp_path, name):
    path, marker, clock = str(tmp_path / "q.fs"), tmp_path / "ran", Clock()
    mid = put_before_the_codec(path, marker)
    with AckQueue(path=path, name="jobs", codec=name, clock=clock) as q:
        q.put({"json": "ok"} if name == "json" else "ok" if name == "str" else b"ok")
        with pytest.raises(PickleRefused) as info:
            q.get(block=False)
        assert (info.value.message_id, info.value.queue, info.value.codec) == (
            mid, "jobs", name)
        assert f"message {mid} of queue 'jobs'" in str(info.value)
        assert isinstance(info.value, UnreadableItem)
        assert q.get(block=False) is not None         # the messages behind it still come
        q.task_done()
        assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 1}   # set aside
        clock.now += UNREADABLE_DELAY + 1
        with pytest.raises(PickleRefused):
            q.get(block=False)                        # and refused again, never read
        assert q.peek() is None                       # (set aside: nothing is ready)
        [seen] = q.browse()
        assert seen.body == payload(marker) and seen.state == "delayed"
        with pytest.raises(PickleRefused):
            seen.item
    with AckQueue(path=path, name="jobs") as q:       # reopened: the codec is recorded
        assert q.codec == name
    assert not marker.exists()


def test_a_refused_pickle_reaches_the_dead_letter_queue(tmp_path):
    path, marker, clock = str(tmp_path / "q.fs"), tmp_path / "ran", Clock()
    mid = put_before_the_codec(path, marker)
    with AckQueue(path=path, name="jobs", codec="json", clock=clock, max_receives=2,
                  dead_letter="jobs.dead") as q:
        for _ in range(2):
            with pytest.raises(PickleRefused):
                q.get(block=False)
            clock.now += UNREADABLE_DELAY + 1
        with pytest.raises(Empty):
            q.get(block=False)                        # moved instead of delivered a third time
        with AckQueue(db=q.db, name="jobs.dead") as dead:
            [m] = list(dead.browse())
            assert (int(m.id), m.body, m.dead_letter_source) == (mid, payload(marker), "jobs")
    assert not marker.exists()


def test_a_priority_queue_of_another_codec_does_not_unpickle_to_order(tmp_path):
    from ackqueue import AckPriorityQueue
    path, marker = str(tmp_path / "q.fs"), tmp_path / "ran"
    with AckPriorityQueue(path=path, name="p") as q:
        q.put((0, Creates(marker)))      # (a pickle queue reads its own copy to order it)
    marker.unlink()
    with AckPriorityQueue(path=path, name="p", codec="json") as q:
        with pytest.raises(PickleRefused):            # opening ordered it unread, too
            q.get(block=False)
    assert not marker.exists()


# -- through ZEO ---------------------------------------------------------------------------

def test_through_zeo_a_json_consumer_never_unpickles(server, tmp_path):
    marker = tmp_path / "ran"
    with AckQueue(path=server.url, name="z") as q:
        [mid] = q.put_many([payload(marker)], encoded=True)
    from ackqueue import database
    database._close_all()                              # a fresh client, as another process
    with AckQueue(path=server.url, name="z", codec="json") as q:
        with pytest.raises(PickleRefused) as info:
            q.get(timeout=30)
        assert info.value.message_id == int(mid)
        with pytest.raises(EncodingRefused):
            q.put_many([payload(marker)], encoded=True)
    assert not marker.exists()


# -- through the service -------------------------------------------------------------------

def call(svc, method, url, body=None, headers=None):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    try:
        c.request(method, url, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if "json" in r.getheader("Content-Type", "")
                          else data)
    finally:
        c.close()


def refused(answer, name):
    assert answer["error"]["code"] == "UnsupportedEncoding", answer
    assert answer["error"]["codec"] == name and f"codec '{name}'" in answer["error"]["message"]


@pytest.mark.parametrize("name", NON_PICKLE)
def test_the_service_refuses_a_pickle_on_every_put_route(own_service, tmp_path, name):
    svc, marker = own_service(), tmp_path / "ran"
    body = payload(marker)
    assert call(svc, "PUT", f"/v1/queues/jobs/codec?codec={name}")[0] == 200
    status, answer = call(svc, "POST", "/v1/queues/jobs/messages", body,
                          {"Content-Type": "application/x-python-pickle"})
    assert status == 415
    refused(answer, name)
    status, answer = call(svc, "POST", "/v1/queues/jobs/messages?encoding=pickle", body)
    assert status == 415
    from ackqueue.frames import FRAMES, encode_frames
    status, answer = call(svc, "POST", "/v1/queues/jobs/batch?encoding=pickle",
                          encode_frames([body]), {"Content-Type": FRAMES})
    assert status == 415
    refused(answer, name)
    import base64
    doc = {"puts": [{"queue": "jobs", "encoding": "pickle",
                     "body": base64.b64encode(body).decode()}]}
    status, answer = call(svc, "POST", "/v1/batch", json.dumps(doc),
                          {"Content-Type": "application/json"})
    assert status == 415 and answer["error"]["code"] == "UnsupportedEncoding", answer
    assert "puts[0]" in answer["error"]["message"]
    with AckQueue(path=svc.url, name="jobs") as q:
        assert q.qsize() == 0
        with pytest.raises(EncodingRefused):          # the remote drop-in's raw put too
            q.put_many([body], encoded=True)
    assert not marker.exists()


def test_through_the_service_a_json_client_never_unpickles(own_service, tmp_path):
    path, marker = str(tmp_path / "q.fs"), tmp_path / "ran"
    mid = put_before_the_codec(path, marker)
    svc = own_service()
    with AckQueue(path=svc.url, name="jobs", codec="json") as q:
        q.put({"after": 1})
        with pytest.raises(PickleRefused) as info:
            q.get(timeout=30)
        assert info.value.message_id == mid and "never unpickles" in str(info.value)
        assert q.get(timeout=30) == {"after": 1}      # the one behind it still comes
        q.task_done()
    with AckQueue(path=svc.url, name="jobs") as q:    # a client without codec= too
        status, _ = call(svc, "POST", "/v1/queues/jobs/messages?visibility_timeout=0",
                         b"1", {"Content-Type": "application/json"})
        assert status == 200
        assert q.get(timeout=30) == 1
        q.task_done()
        [seen] = [m for m in q.browse() if int(m.id) == mid]
        with pytest.raises(PickleRefused):
            seen.item
    assert not marker.exists()


def test_text_fronts_store_text_as_the_queues_codec(own_service):
    """SQS and Sasquatch send strings: a json queue stores JSON text as JSON and refuses
    any other; a str queue stores it as text."""
    svc = own_service()
    assert call(svc, "PUT", "/v1/queues/j/codec?codec=json")[0] == 200
    send = {"Content-Type": "application/json"}
    status, answer = call(svc, "POST", "/send",
                          json.dumps({"queue_name": "j", "message_body": "not json"}), send)
    assert status == 415 and answer["error"]["code"] == "UnsupportedEncoding", answer
    status, _ = call(svc, "POST", "/send",
                     json.dumps({"queue_name": "j", "message_body": '{"a": 1}'}), send)
    assert status == 200
    from sqs_helpers import client
    sqs = client(svc.url)
    url = sqs.create_queue(QueueName="j")["QueueUrl"]
    with pytest.raises(Exception, match="codec 'json'"):
        sqs.send_message(QueueUrl=url, MessageBody="not json either")
    sqs.send_message(QueueUrl=url, MessageBody="[2]")
    with AckQueue(path=svc.url, name="j", codec="json") as q:
        assert q.get_many(10, timeout=30) == [{"a": 1}, [2]]
        q.task_done()
        q.task_done()
        assert q.qsize() == 0
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", [])
    assert got == []


def test_a_pickle_stays_bytes_in_a_raw_read(tmp_path):
    """What the service and the Spark source read (get_many(raw=True), browse's body) is
    the stored bytes, never unpickled, whatever the codec."""
    path, marker = str(tmp_path / "q.fs"), tmp_path / "ran"
    put_before_the_codec(path, marker)
    with AckQueue(path=path, name="jobs") as q:
        [m] = q.get_messages(1, block=False, raw=True)
        assert codec.kind(m.body) == "pickle" and m.body == payload(marker)
        q.ack(m)
    assert not marker.exists()
