"""Sasquatch's API on the service's port, against the real console script (ackqueue serve):
every endpoint's happy path and documented shape, its defaults and limits, validation
errors and their codes, _lifo queues, bodies crossing to Python, long polls, and the
--config file.  Waits are bounded failure limits, never synchronization."""
import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue                      # noqa: E402
from ackqueue.service.config import KEYS, generate, parse   # noqa: E402
from tests.service.test_service import Service             # noqa: E402
from tests.zeo_server import console_script        # noqa: E402


@pytest.fixture
def svc(tmp_path):
    s = Service(tmp_path / "q.fs", log_dir=tmp_path)
    yield s
    s.stop()


def post(s, path, doc, **headers):
    body = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    headers.setdefault("Content-Type", "application/json")
    return s.call("POST", path, body, headers)


def ok(s, path, doc):
    status, answer = post(s, path, doc)
    assert status == 200, answer
    return answer


def send(s, queue, body, **fields):
    return ok(s, "/send", dict(queue_name=queue, message_body=body, **fields))


def receive(s, queue, **fields):
    fields.setdefault("wait_time_seconds", 0)
    return ok(s, "/receive", dict(queue_name=queue, **fields))["messages"]


def error(s, path, doc, status, code, method="POST"):
    if method == "POST":
        got, answer = post(s, path, doc)
    else:
        got, answer = s.call(method, path)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert set(answer["error"]) == {"code", "message"} and answer["error"]["message"]
    return answer


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


def test_send_receive_delete_and_every_documented_shape(svc):
    sent = send(svc, "orders", "Hello, world!", priority=100,
                message_attributes={"content_type": "application/json",
                                    "correlation_id": "req-12345"})
    assert set(sent) == {"message_id", "md5_of_message_body", "sequence_number"}
    assert sent["md5_of_message_body"] == md5("Hello, world!")
    assert isinstance(sent["message_id"], str) and sent["sequence_number"] >= 1
    second = send(svc, "orders", "plain")
    assert second["sequence_number"] > sent["sequence_number"]

    [m] = receive(svc, "orders")
    assert m["message_id"] == sent["message_id"]
    assert m["message_body"] == "Hello, world!"
    assert m["md5_of_message_body"] == sent["md5_of_message_body"]
    assert m["priority"] == 100 and m["approximate_receive_count"] == 1
    assert m["sequence_number"] == sent["sequence_number"]
    assert abs(m["sent_timestamp"] - time.time()) < 3600
    assert isinstance(m["approximate_first_receive_timestamp"], int)
    assert m["message_attributes"] == {"content_type": "application/json",
                                       "correlation_id": "req-12345"}
    assert "message_body_encoding" not in m
    [m2] = receive(svc, "orders")
    assert "message_attributes" not in m2          # omitted when none were set

    assert ok(svc, "/queue_length", {"queue_name": "orders"}) == {
        "queue_name": "orders", "count": 0, "in_flight": 2}
    assert ok(svc, "/delete", {"receipt_handles": [m["receipt_handle"],
                                                   m2["receipt_handle"]]}) == {"deleted": 2}
    error(svc, "/delete", {"receipt_handles": [m["receipt_handle"]]}, 404, "NotFound")
    assert ok(svc, "/queue_length", {"queue_name": "orders"})["in_flight"] == 0
    # a queue never used: zero, and not created by asking
    assert ok(svc, "/queue_length", {"queue_name": "nothing"}) == {
        "queue_name": "nothing", "count": 0, "in_flight": 0}

    send(svc, "alerts", "disk-full")
    status, queues = svc.call("GET", "/queues")
    assert status == 200
    assert {"queue_name": "alerts", "count": 1, "in_flight": 0} in queues
    assert {"queue_name": "orders", "count": 0, "in_flight": 0} in queues
    assert "nothing" not in [q["queue_name"] for q in queues]

    status, health = svc.call("GET", "/health")
    assert status == 200 and health["status"] == "ok" and isinstance(health["version"], str)
    assert {"threads", "queues_open", "clients", "long_polls", "uptime"} <= set(health)

    status, stats = svc.call("GET", "/stats?format=json")
    assert status == 200 and stats["requests"]["/send"] == 3
    assert stats["messages_sent"] == 3 and stats["messages_deleted"] == 2
    status, stats2 = svc.call("GET", "/stats", headers={"Accept": "application/json"})
    assert status == 200 and stats2["requests"]["/receive"] == 2
    status, page = svc.call("GET", "/stats")
    assert status == 200 and isinstance(page, bytes) and b"<" in page   # the HTML page


def test_send_batch_validates_each_message_alone(svc):
    answer = ok(svc, "/send_batch", {"messages": [
        {"queue_name": "orders", "message_body": "order-1", "priority": 100},
        {"queue_name": "orders", "message_body": "order-2", "message_deduplication_id": "d1"},
        {"queue_name": "orders", "message_body": "order-3", "message_deduplication_id": "d1"},
        {"queue_name": "alerts", "message_body": "disk-full", "priority": 2000},
        {"queue_name": "alerts", "message_body": "fine", "priority": 200,
         "message_attributes": {"source": "web"}},
    ]})
    assert [s["index"] for s in answer["successful"]] in ([0, 1, 4], [0, 2, 4])
    failed = {f["index"]: f["error"]["code"] for f in answer["failed"]}
    assert failed[3] == "ValidationError"
    assert sorted(failed) in ([2, 3], [1, 3]) and "DuplicateMessage" in failed.values()
    assert all(set(s) == {"index", "message_id", "md5_of_message_body", "sequence_number"}
               for s in answer["successful"])
    assert ok(svc, "/queue_length", {"queue_name": "orders"})["count"] == 2
    [m] = receive(svc, "alerts")
    assert m["message_body"] == "fine" and m["message_attributes"] == {"source": "web"}
    error(svc, "/send_batch", {"messages": []}, 400, "ValidationError")
    error(svc, "/send_batch", {"messages": [{"queue_name": "a", "message_body": "x"}] * 11},
          400, "ValidationError")
    error(svc, "/send_batch", {}, 400, "InvalidRequest")


def test_priority_fifo_peek_shuffle_dedup_and_delay(svc):
    send(svc, "p", "low", priority=0)
    send(svc, "p", "first")
    send(svc, "p", "second")
    send(svc, "p", "high", priority=1000)
    send(svc, "p", "later", delay_seconds=600)
    for _ in range(2):                 # repeated peeks: the same message, nothing changes
        [peeked] = receive(svc, "p", peek=True)
        assert peeked["message_body"] == "high" and "receipt_handle" not in peeked
        assert peeked["approximate_receive_count"] == 0
    assert ok(svc, "/queue_length", {"queue_name": "p"}) == {
        "queue_name": "p", "count": 4, "in_flight": 0}
    shuffled = receive(svc, "p", peek=True, shuffle=True)
    assert len(shuffled) == 1 and shuffled[0]["message_body"] in {"low", "first", "second",
                                                                   "high"}
    got = receive(svc, "p", max_number_of_messages=10)
    assert [m["message_body"] for m in got] == ["high", "first", "second", "low"]  # 0 kept
    assert receive(svc, "q_empty_then", shuffle=True) == []
    send(svc, "p", "x", message_deduplication_id="abc123")
    error(svc, "/send", {"queue_name": "p", "message_body": "y",
                         "message_deduplication_id": "abc123"}, 409, "DuplicateMessage")
    send(svc, "other", "y", message_deduplication_id="abc123")     # scoped to its queue
    send(svc, "shuffled", "a")
    send(svc, "shuffled", "b")
    got = receive(svc, "shuffled", shuffle=True, max_number_of_messages=10)
    assert sorted(m["message_body"] for m in got) == ["a", "b"]


def test_change_visibility_release_and_extend(svc):
    send(svc, "v", "m")
    [m] = receive(svc, "v", visibility_timeout=600)
    assert receive(svc, "v") == []
    assert ok(svc, "/change_visibility", {"receipt_handles": [m["receipt_handle"]],
                                          "visibility_timeout": 900}) == {"result": "ok"}
    assert receive(svc, "v") == []
    ok(svc, "/change_visibility", {"receipt_handles": [m["receipt_handle"]],
                                   "visibility_timeout": -1})       # released now
    [again] = receive(svc, "v")
    assert again["message_id"] == m["message_id"]
    assert again["approximate_receive_count"] == 2
    # the first delivery's handle names nothing now
    error(svc, "/delete", {"receipt_handles": [m["receipt_handle"]]}, 404, "NotFound")
    error(svc, "/change_visibility", {"receipt_handles": [m["receipt_handle"]],
                                      "visibility_timeout": 5}, 404, "NotFound")
    error(svc, "/change_visibility", {"receipt_handles": [again["receipt_handle"]],
                                      "visibility_timeout": 43201}, 400, "ValidationError")
    error(svc, "/change_visibility", {"receipt_handles": [again["receipt_handle"]]},
          400, "InvalidRequest")
    # explicit visibility_timeout 0: received (counted) but stays visible
    send(svc, "zero", "z")
    [z1] = receive(svc, "zero", visibility_timeout=0)
    [z2] = receive(svc, "zero", visibility_timeout=0)
    assert (z1["approximate_receive_count"], z2["approximate_receive_count"]) == (1, 2)


def test_four_receives_then_dropped_or_dead_lettered(svc):
    send(svc, "poison", "bad")
    for n in range(1, 5):
        [m] = receive(svc, "poison", visibility_timeout=0)
        assert m["approximate_receive_count"] == n
    assert receive(svc, "poison", visibility_timeout=0) == []     # the 5th: dropped
    assert ok(svc, "/queue_length", {"queue_name": "poison"})["count"] == 0

    sent = send(svc, "work", "bad too")
    for _ in range(2):
        assert receive(svc, "work", visibility_timeout=0, max_receives=2,
                       dead_letter_queue_name="work-dlq")
    assert receive(svc, "work", visibility_timeout=0, max_receives=2,
                   dead_letter_queue_name="work-dlq") == []
    [dead] = receive(svc, "work-dlq")
    assert dead["message_body"] == "bad too"
    assert dead["sequence_number"] == sent["sequence_number"]
    error(svc, "/receive", {"queue_name": "work", "dead_letter_queue_name": "work"},
          400, "ValidationError")
    error(svc, "/receive", {"queue_name": "work", "max_receives": 11}, 400,
          "ValidationError")


def test_native_api_keeps_the_library_defaults_on_a_shared_queue(tmp_path):
    cfg = tmp_path / "small.ini"
    cfg.write_text("[queue]\nmax_queue_length = 3\n")
    s = Service(tmp_path / "q.fs", "--config", str(cfg), log_dir=tmp_path)
    try:
        for i in range(3):
            send(s, "jobs", f"m{i}")
        error(s, "/send", {"queue_name": "jobs", "message_body": "m3"}, 503, "QueueFull")
        answer = ok(s, "/send_batch", {"messages": [
            {"queue_name": "jobs", "message_body": "x"},
            {"queue_name": "roomy", "message_body": "y"}]})
        assert [f["error"]["code"] for f in answer["failed"]] == ["QueueFull"]
        assert [x["index"] for x in answer["successful"]] == [1]
        s.put("jobs", b"native")           # the native API: no Sasquatch limit
        assert ok(s, "/queue_length", {"queue_name": "jobs"})["count"] == 4
        # the native receive has no max_receives: given back 6 times, still there
        s.put("keep", b"k")
        for n in range(6):
            status, doc = s.call("POST", "/v1/queues/keep/receive?max=1", None,
                                 {"X-Client-Id": "c"})
            assert status == 200 and len(doc["messages"]) == 1, doc
            status, _ = s.call("POST", "/v1/queues/keep/nack?receipt="
                               + doc["messages"][0]["receipt"], None, {"X-Client-Id": "c"})
            assert status == 200
        assert ok(s, "/queue_length", {"queue_name": "keep"})["count"] == 1
    finally:
        s.stop()


def test_message_size_limits(tmp_path):
    s = Service(tmp_path / "q.fs", "--max-message-size", "1", log_dir=tmp_path)
    try:
        send(s, "big", "x" * 1024)
        error(s, "/send", {"queue_name": "big", "message_body": "x" * 1025}, 413,
              "MessageSizeExceeded")
        error(s, "/send", {"queue_name": "big", "message_body": "é" * 513}, 413,
              "MessageSizeExceeded")                  # counted in UTF-8 bytes
        status, doc = s.call("POST", "/enqueue?queue_name=big", b"y" * 1025)
        assert (status, doc["error"]["code"]) == (413, "MessageSizeExceeded")
        answer = ok(s, "/send_batch", {"messages": [
            {"queue_name": "big", "message_body": "x" * 1025},
            {"queue_name": "big", "message_body": "ok"}]})
        assert answer["failed"][0]["error"]["code"] == "MessageSizeExceeded"
        # a request body over the limit: 413 and the connection closed
        c = s.conn()
        c.request("POST", "/send", body=b"{" + b" " * 20000 + b"}",
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        doc = json.loads(r.read())
        assert r.status == 413 and doc["error"]["code"] == "MessageSizeExceeded"
        assert r.getheader("Connection", "").lower() == "close"
        c.close()
    finally:
        s.stop()


@pytest.mark.parametrize("path,doc,status,code", [
    ("/send", "not json", 400, "InvalidRequest"),
    ("/send", [1, 2], 400, "InvalidRequest"),
    ("/send", {"message_body": "x"}, 400, "InvalidRequest"),
    ("/send", {"queue_name": "q"}, 400, "InvalidRequest"),
    ("/send", {"queue_name": "q", "message_body": 5}, 400, "InvalidRequest"),
    ("/send", {"queue_name": "bad name!", "message_body": "x"}, 400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "priority": 1001}, 400,
     "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "priority": -1}, 400,
     "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "priority": "high"}, 400,
     "InvalidRequest"),
    ("/send", {"queue_name": "q", "message_body": "x", "delay_seconds": 43201}, 400,
     "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "message_retention_period": 59}, 400,
     "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x",
               "message_retention_period": 1209601}, 400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "message_deduplication_id": "a-b"},
     400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "message_deduplication_id": "a" * 129},
     400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x",
               "message_deduplication_time_period": 43201}, 400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x",
               "message_attributes": {str(i): "v" for i in range(11)}}, 400,
     "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "message_attributes": {"k" * 65: "v"}},
     400, "ValidationError"),
    ("/send", {"queue_name": "q", "message_body": "x", "message_attributes": {"k": "v" * 1025}},
     400, "ValidationError"),
    ("/receive", {}, 400, "InvalidRequest"),
    ("/receive", {"queue_name": "q", "visibility_timeout": 43201}, 400, "ValidationError"),
    ("/receive", {"queue_name": "q", "wait_time_seconds": 21}, 400, "ValidationError"),
    ("/receive", {"queue_name": "q", "max_number_of_messages": 0}, 400, "ValidationError"),
    ("/receive", {"queue_name": "q", "max_number_of_messages": 11}, 400, "ValidationError"),
    ("/receive", {"queue_name": "q", "peek": "yes"}, 400, "InvalidRequest"),
    ("/receive", {"queue_name": "q", "peek": True, "dead_letter_queue_name": "d"}, 400,
     "ValidationError"),
    ("/dequeue", {"queue_name": "q", "max_number_of_messages": 11}, 400, "ValidationError"),
    ("/delete", {}, 400, "InvalidRequest"),
    ("/delete", {"receipt_handles": []}, 400, "ValidationError"),
    ("/delete", {"receipt_handles": ["a"] * 11}, 400, "ValidationError"),
    ("/delete", {"receipt_handles": "a"}, 400, "InvalidRequest"),
    ("/delete", {"receipt_handles": ["no-such-handle"]}, 404, "NotFound"),
    ("/change_visibility", {"receipt_handles": ["x"], "visibility_timeout": -43201}, 400,
     "ValidationError"),
    ("/delete_all", {}, 400, "InvalidRequest"),
    ("/queue_length", {"queue_name": ""}, 400, "ValidationError"),
])
def test_validation_errors(svc, path, doc, status, code):
    error(svc, path, doc, status, code)


def test_methods_and_routes(svc):
    for path in ("/send", "/send_batch", "/receive", "/delete", "/change_visibility",
                 "/delete_all", "/queue_length", "/enqueue", "/dequeue"):
        error(svc, path, None, 405, "MethodNotAllowed", method="GET")
    for path in ("/queues", "/health"):
        got, answer = svc.call("POST", path)
        assert (got, answer["error"]["code"]) == (405, "MethodNotAllowed")
    error(svc, "/nowhere", None, 404, "NotFound", method="GET")


def test_legacy_enqueue_dequeue_and_delete_all(svc):
    status, sent = svc.call("POST", "/enqueue?queue_name=legacy&priority=7", "raw body")
    assert status == 200 and set(sent) == {"message_id", "md5_of_message_body",
                                           "sequence_number"}
    assert sent["md5_of_message_body"] == md5("raw body")
    [m] = ok(svc, "/dequeue", {"queue_name": "legacy", "wait_time_seconds": 0})["messages"]
    assert (m["message_body"], m["priority"]) == ("raw body", 7)
    status, doc = svc.call("POST", "/enqueue", "x")
    assert (status, doc["error"]["code"]) == (400, "InvalidRequest")
    for name in ("a", "b"):
        send(svc, name, "1")
        send(svc, name, "2")
    receive(svc, "a")                      # one in flight: purged too
    assert ok(svc, "/delete_all", {"queue_name": "a"})["result"] == "ok"
    assert ok(svc, "/queue_length", {"queue_name": "a"}) == {
        "queue_name": "a", "count": 0, "in_flight": 0}
    assert ok(svc, "/queue_length", {"queue_name": "b"})["count"] == 2
    ok(svc, "/delete_all", {"queue_name": "*"})
    assert ok(svc, "/delete_all", {"queue_name": "never_used"})["deleted"] == 0
    status, queues = svc.call("GET", "/queues")
    assert all(q["count"] == 0 and q["in_flight"] == 0 for q in queues)
    assert "never_used" not in [q["queue_name"] for q in queues]       # not created


def test_lifo_queues_and_kind_mismatch(svc):
    for body in ("one", "two", "three"):
        send(svc, "jobs_lifo", body)
    send(svc, "jobs_lifo", "urgent-but-old", priority=500)
    send(svc, "jobs_lifo", "four")
    got = receive(svc, "jobs_lifo", max_number_of_messages=10)
    assert [m["message_body"] for m in got] == ["urgent-but-old", "four", "three", "two",
                                                "one"]
    # the native API opens a queue FIFO: a _lifo name opened there first is FIFO, and
    # Sasquatch's API refuses it with the library's QueueKindMismatch as a 409
    svc.put("native_lifo", b"x")
    error(svc, "/send", {"queue_name": "native_lifo", "message_body": "y"}, 409,
          "QueueKindMismatch")
    error(svc, "/receive", {"queue_name": "native_lifo"}, 409, "QueueKindMismatch")
    # the native API on a queue Sasquatch opened as LIFO uses it as LIFO
    svc.put("jobs_lifo", b"n1", **{"Content-Type": "text/plain"})
    svc.put("jobs_lifo", b"n2", **{"Content-Type": "text/plain"})
    assert [m["message_body"] for m in receive(svc, "jobs_lifo", max_number_of_messages=2)] \
        == ["n2", "n1"]


def test_text_bodies_cross_to_python_and_back(tmp_path):
    path = tmp_path / "q.fs"
    s = Service(path, log_dir=tmp_path)
    send(s, "mixed", "héllo wörld")
    send(s, "mixed", '{"not": "parsed"}')
    assert s.stop() == 0
    q = AckQueue(path=str(path), name="mixed")
    try:
        first, second = q.get(timeout=5), q.get(timeout=5)
        assert (type(first), first, second) == (str, "héllo wörld", '{"not": "parsed"}')
        q.ack(first)
        q.ack(second)
        q.put("from python")
        q.put(b"\x00\xffbytes")
        q.put({"a": 1})
    finally:
        q.close()
    qj = AckQueue(path=str(path), name="json", codec="json")
    try:
        qj.put({"k": [1, 2]})
    finally:
        qj.close()
    s = Service(path, log_dir=tmp_path)
    try:
        got = receive(s, "mixed", max_number_of_messages=10)
        assert got[0]["message_body"] == "from python"
        assert "message_body_encoding" not in got[0]
        assert got[0]["md5_of_message_body"] == md5("from python")
        assert got[1]["message_body_encoding"] == "bytes"
        assert base64.b64decode(got[1]["message_body"]) == b"\x00\xffbytes"
        assert got[2]["message_body_encoding"] == "pickle"
        assert base64.b64decode(got[2]["message_body"]).startswith(b"\x80")
        [j] = receive(s, "json")
        assert j["message_body_encoding"] == "json"
        assert json.loads(j["message_body"]) == {"k": [1, 2]}
    finally:
        s.stop()


def test_long_poll_woken_by_a_send(svc):
    result = {}

    def poll():
        result["answer"] = post(svc, "/receive", {"queue_name": "lp",
                                                  "wait_time_seconds": 20})
    t = threading.Thread(target=poll)
    t.start()
    deadline = time.monotonic() + 15
    while svc.call("GET", "/health")[1]["long_polls"] < 1:    # the poll is waiting
        assert time.monotonic() < deadline, "the long poll never started waiting"
        time.sleep(0.05)
    send(svc, "lp", "wake up")
    t.join(15)                     # failure bound only: well under the 20 s wait
    assert not t.is_alive(), "the long poll was not woken by the send"
    status, doc = result["answer"]
    assert status == 200 and [m["message_body"] for m in doc["messages"]] == ["wake up"]


def test_disconnected_long_poll_ends_at_once(svc):
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
    body = json.dumps({"queue_name": "gone", "wait_time_seconds": 20}).encode()
    sock.sendall(b"POST /receive HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 15
    while svc.call("GET", "/health")[1]["long_polls"] < 1:
        assert time.monotonic() < deadline, "the long poll never started waiting"
        time.sleep(0.05)
    sock.close()
    deadline = time.monotonic() + 10           # far under the 20 s the poll asked for
    while svc.call("GET", "/health")[1]["long_polls"] != 0:
        assert time.monotonic() < deadline, "the disconnected long poll is still waiting"
        time.sleep(0.05)
    send(svc, "gone", "for the next one")        # not taken by the poll that left
    [m] = receive(svc, "gone")
    assert m["message_body"] == "for the next one"


# -- the config file --------------------------------------------------------------------------

def run_serve(*args, timeout=60):
    return subprocess.run([console_script(), "serve", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_bad_config_lists_every_error_and_opens_nothing(tmp_path):
    cfg = tmp_path / "bad.ini"
    cfg.write_text(
        "[server]\n"
        "port = 70000\n"                        # out of range
        "colour = blue\n"                       # unknown
        "[queue]\n"
        "max_queue_length = 0          # too small\n"
        "max_message_size_kb = 10241\n"
        "default_wait_time_seconds = 21\n"
        "default_priority = lots\n"             # not a number
        "[cleanup]\n"
        "max_queue_length = 10\n"               # duplicate, whatever its section
        "this line is nonsense\n"
        "memory = maybe\n")
    target = tmp_path / "never.fs"
    r = run_serve(str(target), "--config", str(cfg), "--port", "0")
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if "bad.ini:" in line]
    for number, word in ((2, "port"), (3, "unknown key 'colour'"), (5, "max_queue_length"),
                         (6, "max_message_size_kb"), (7, "default_wait_time_seconds"),
                         (8, "default_priority"), (10, "duplicate key 'max_queue_length'"),
                         (11, "not 'key = value'"), (12, "memory")):
        assert any(f"bad.ini:{number}:" in line and word in line for line in lines), \
            (number, word, r.stderr)
    assert len(lines) == 9, r.stderr
    assert not target.exists() and not list(tmp_path.glob("never.fs*"))
    assert "listening" not in r.stdout
    r = run_serve("--memory", "--config", str(tmp_path / "missing.ini"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_poison_max_receives_under_default_is_refused():
    with pytest.raises(Exception) as info:
        parse("default_max_receives = 5\npoison_max_receives = 4\n")
    assert "poison_max_receives" in str(info.value)


def test_generate_config_loads_back_and_the_command_line_overrides_it(tmp_path):
    r = run_serve("--generate-config")
    assert r.returncode == 0 and r.stdout == generate()
    values = parse(r.stdout)
    assert {k[1] for k in KEYS} == set(values)
    assert values["max_queue_length"] == 5000 and values["max_message_size_kb"] == 256
    assert values["default_visibility_timeout"] == 30 and values["port"] == 8080
    cfg = tmp_path / "gen.ini"
    text = r.stdout.replace("max_queue_length = 5000", "max_queue_length = 1")
    cfg.write_text(text)
    # the file says port 8080 and memory = false: the command line's --port 0 and PATH win
    s = Service(tmp_path / "q.fs", "--config", str(cfg), log_dir=tmp_path)
    try:
        send(s, "one", "a")
        error(s, "/send", {"queue_name": "one", "message_body": "b"}, 503, "QueueFull")
    finally:
        s.stop()
    s = Service(tmp_path / "q.fs", "--config", str(cfg), "--max-queue-length", "2",
                log_dir=tmp_path)
    try:
        send(s, "one", "b")
        error(s, "/send", {"queue_name": "one", "message_body": "c"}, 503, "QueueFull")
    finally:
        s.stop()
    assert os.path.exists(tmp_path / "q.fs")


def test_config_defaults_apply_to_sasquatch_requests(tmp_path):
    cfg = tmp_path / "d.ini"
    cfg.write_text("default_priority = 7\ndefault_max_receives = 1\n"
                   "default_visibility_timeout = 0\n")
    s = Service(tmp_path / "q.fs", "--config", str(cfg), log_dir=tmp_path)
    try:
        send(s, "d", "m")
        [m] = receive(s, "d")
        assert m["priority"] == 7
        [m] = receive(s, "d", peek=True)          # visibility 0: still visible
        assert receive(s, "d") == []              # the 2nd receive: over max_receives 1
    finally:
        s.stop()


def test_sigterm_stops_the_service_with_a_long_poll_waiting(svc):
    threading.Thread(target=lambda: post(svc, "/receive", {"queue_name": "w",
                                                           "wait_time_seconds": 20}),
                     daemon=True).start()
    deadline = time.monotonic() + 15
    while svc.call("GET", "/health")[1]["long_polls"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert svc.stop(signal.SIGTERM) == 0


def test_openapi_lists_sasquatch_endpoints(svc):
    status, doc = svc.call("GET", "/openapi.json")
    assert status == 200
    for path in ("/send", "/send_batch", "/receive", "/dequeue", "/delete",
                 "/change_visibility", "/delete_all", "/queue_length", "/enqueue"):
        assert "post" in doc["paths"][path]
    assert "get" in doc["paths"]["/queues"] and "/v1/queues" in doc["paths"]
