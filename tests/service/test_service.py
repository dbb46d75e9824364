"""The queue service (ackqueue serve) as a real child process, spoken to over HTTP.

Every test starts the console script on a free loopback port (--port 0, read back from
the line it prints) and stops it with a real signal.  Waits are bounded failure limits,
never synchronization."""
import base64
import http.client
import json
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import threading
import time

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue                      # noqa: E402
from tests.zeo_server import console_script        # noqa: E402

START_TIMEOUT = 30


class Service:
    def __init__(self, path, *extra, log_dir=None):
        self.path = None if path is None else str(path)
        self.extra = list(extra)
        self.log_path = os.path.join(str(log_dir), "service.log")
        self.start()

    def start(self):
        args = [console_script(), "serve"] + (
            ["--memory"] if self.path is None else [self.path]) + ["--port", "0"] + self.extra
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the service did not start: {line!r}\n{self.read_log()}")
        self.port = int(found.group(1))

    def read_log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        finally:
            self.proc.stdout.close()
            self.log.close()

    def conn(self, timeout=20):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def call(self, method, url, body=None, headers=None, conn=None):
        c = conn or self.conn()
        try:
            c.request(method, url, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            ctype = r.getheader("Content-Type", "")
            return r.status, (json.loads(data) if "json" in ctype else data)
        finally:
            if conn is None:
                c.close()

    def put(self, queue, body, **headers):
        status, doc = self.call("POST", f"/v1/queues/{queue}/messages", body, headers)
        assert status == 200, doc
        return doc["id"]

    def receive(self, queue, client, query="", conn=None):
        status, doc = self.call("POST", f"/v1/queues/{queue}/receive?{query}",
                                headers={"X-Client-Id": client}, conn=conn)
        assert status == 200, doc
        return doc["messages"]

    def health(self):
        return self.call("GET", "/health")[1]


@pytest.fixture
def service(tmp_path):
    started = []

    def start(*extra, path=tmp_path / "q.fs"):
        s = Service(path, *extra, log_dir=tmp_path)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop(signal.SIGKILL)


def body_of(m):
    return base64.b64decode(m["body"])


def until(check, limit=10.0):
    """Bounded poll of a condition the test cannot be told about (failure bound only)."""
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_round_trip_put_receive_ack(service):
    s = service()
    mid = s.put("jobs", b"\x00raw bytes\xff", **{"X-Attributes": '{"k": "v"}'})
    [m] = s.receive("jobs", "c1", "max=10")
    assert m["id"] == mid and body_of(m) == b"\x00raw bytes\xff"
    assert m["attributes"] == {"k": "v"} and m["receive_count"] == 1 and m["receipt"]
    status, doc = s.call("POST", f"/v1/queues/jobs/ack?receipt={m['receipt']}")
    assert (status, doc) == (200, {"acked": 1})
    assert s.receive("jobs", "c1") == []
    status, doc = s.call("GET", "/v1/queues/jobs")
    assert doc["stats"]["acked"] == 1 and doc["stats"]["ready"] == 0
    # Batch put in frames, receive in frames: bodies as bytes both ways.
    from ackqueue.frames import FRAMES, decode_frames, encode_frames
    status, doc = s.call("POST", "/v1/queues/jobs/batch", encode_frames([b"a", b"", b"c"]),
                         {"Content-Type": FRAMES})
    assert status == 200 and len(doc["ids"]) == 3
    status, data = s.call("POST", "/v1/queues/jobs/receive?max=5",
                          headers={"X-Client-Id": "c1", "Accept": FRAMES})
    parts = decode_frames(data)
    assert [p for p in parts[1::2]] == [b"a", b"", b"c"]
    metas = [json.loads(p) for p in parts[0::2]]
    assert [m["id"] for m in metas] == doc["ids"]
    status, out = s.call("DELETE", "/v1/queues/jobs/messages",
                         json.dumps({"receipts": [m["receipt"] for m in metas]}))
    assert (status, out) == (200, {"acked": 3})
    assert s.call("GET", "/v1/queues")[1]["queues"]["jobs"]["ready"] == 0
    assert s.stop() == 0


def test_long_poll_is_woken_by_a_put_from_another_client(service):
    s = service()
    result = {}

    def poll():
        began = time.monotonic()
        result["messages"] = s.receive("jobs", "waiter", "wait=20")
        result["took"] = time.monotonic() - began
    t = threading.Thread(target=poll)
    t.start()
    until(lambda: s.health()["long_polls"] == 1)
    s.put("jobs", b"wake up")
    t.join(15)
    assert not t.is_alive()
    assert [body_of(m) for m in result["messages"]] == [b"wake up"]
    assert result["took"] < 10          # woken by the put, not by its 20 s wait
    s.stop()


def test_200_idle_long_polls_hold_no_thread_each(service):
    s = service()
    conns = []
    for i in range(200):
        c = s.conn(timeout=30)
        c.request("POST", "/v1/queues/jobs/receive?wait=25",
                  headers={"X-Client-Id": f"poller-{i}"})
        conns.append(c)
    until(lambda: s.health()["long_polls"] == 200, 20)
    threads = s.health()["threads"]
    assert threads < 80, threads          # the pool is 64; 200 waits do not add 200
    status, doc = s.call("POST", "/v1/queues/jobs/batch",
                         __import__("ackqueue.frames", fromlist=["x"]).encode_frames(
                             [str(i).encode() for i in range(200)]))
    assert status == 200
    got = []
    for c in conns:
        r = c.getresponse()
        got += [body_of(m) for m in json.loads(r.read())["messages"]]
        c.close()
    assert sorted(got) == sorted(str(i).encode() for i in range(200))
    s.stop()


def test_disconnected_long_poll_holds_nothing(service):
    s = service()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/queues/jobs/receive?wait=25 HTTP/1.1\r\nHost: x\r\n"
                 b"X-Client-Id: leaver\r\nContent-Length: 0\r\n\r\n")
    until(lambda: s.health()["long_polls"] == 1)
    sock.close()
    until(lambda: s.health()["long_polls"] == 0)
    s.put("jobs", b"for the one still here")
    [m] = s.receive("jobs", "stayer")
    assert body_of(m) == b"for the one still here"
    s.stop()


def test_ack_rides_on_the_next_receive_and_is_durable_before_it_returns(service, tmp_path):
    s = service()
    for b in (b"one", b"two"):
        s.put("jobs", b)
    [m1] = s.receive("jobs", "c")
    [m2] = s.receive("jobs", "c", f"ack={m1['receipt']}")
    assert body_of(m2) == b"two"
    s.stop(signal.SIGKILL)            # right after the answer: the ack must be durable
    s = service()
    left = [body_of(m) for m in s.receive("jobs", "c", "max=10")]
    assert left == [b"two"]            # m1 acked for good; m2 came back
    s.stop()


def test_visibility_timeout_gives_back_and_old_receipt_is_stale(service):
    s = service()
    s.put("jobs", b"slow")
    [m] = s.receive("jobs", "a", "visibility_timeout=0.3")
    [again] = s.receive("jobs", "b", "wait=10")   # woken when the deadline passes
    assert again["id"] == m["id"] and again["receive_count"] == 2
    status, doc = s.call("POST", f"/v1/queues/jobs/ack?receipt={m['receipt']}")
    assert status == 409 and doc["error"]["code"] == "StaleReceipt"
    status, doc = s.call("POST", "/v1/queues/jobs/ack?receipt=9.forged")
    assert status == 410 and doc["error"]["code"] == "UnknownReceipt"
    status, doc = s.call("POST", f"/v1/queues/jobs/ack?receipt={again['receipt']}")
    assert status == 200
    s.stop()


def test_client_lease_expiry_gives_back(service):
    s = service("--lease-timeout", "1")
    s.put("jobs", b"held")
    [m] = s.receive("jobs", "quitter")
    began = time.monotonic()
    [again] = s.receive("jobs", "other", "wait=15")
    assert again["id"] == m["id"] and again["receive_count"] == 2
    assert 0.9 < time.monotonic() - began < 10
    status, doc = s.call("POST", f"/v1/queues/jobs/ack?receipt={m['receipt']}")
    assert status == 410                 # the ended lease took its receipts with it
    # Renewing keeps a lease alive across a quiet period longer than the timeout.
    s.put("jobs", b"kept")
    [k] = s.receive("jobs", "renewer", f"ack={again['receipt']}")
    for _ in range(6):
        assert s.call("POST", "/v1/leases/renewer")[0] == 200
        time.sleep(0.3)                  # quiet time, not synchronization
    assert s.call("POST", f"/v1/queues/jobs/ack?receipt={k['receipt']}")[0] == 200
    s.stop()


def test_idempotency_key_retry_returns_the_original_id(service):
    s = service()
    # The first attempt's client goes away before reading the answer: a real retry.
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/queues/jobs/messages HTTP/1.1\r\nHost: x\r\n"
                 b"Idempotency-Key: order-17\r\nContent-Length: 5\r\n\r\nfirst")
    sock.close()
    first = s.put("jobs", b"first", **{"Idempotency-Key": "order-17"})
    again = s.put("jobs", b"first", **{"Idempotency-Key": "order-17"})
    assert first == again
    status, doc = s.call("GET", "/v1/queues/jobs/browse")
    assert [m["id"] for m in doc["messages"]] == [first]
    # A plain dedup id that repeats is a conflict.
    status, doc = s.call("POST", "/v1/queues/jobs/messages?dedup_id=d1", b"x")
    assert status == 200
    status, doc = s.call("POST", "/v1/queues/jobs/messages?dedup_id=d1", b"x")
    assert status == 409 and doc["error"]["code"] == "DuplicateMessage"
    s.stop(signal.SIGKILL)
    s = service()                        # the key survives a crash of the service
    assert s.put("jobs", b"first", **{"Idempotency-Key": "order-17"}) == first
    s.stop()


def test_errors_are_json_without_tracebacks(service):
    s = service("--max-body", "1000")
    status, doc = s.call("POST", "/v1/queues/jobs/messages", b"x" * 1001)
    assert status == 413 and doc["error"]["code"] == "MessageSizeExceeded"
    assert s.call("POST", "/v1/queues/jobs/messages", b"x" * 1000)[0] == 200
    status, doc = s.call("GET", "/v1/nothing/here")
    assert status == 404 and doc["error"]["code"] == "NotFound"
    status, doc = s.call("GET", "/v1/queues/jobs/receive")
    assert status == 405 and doc["error"]["code"] == "MethodNotAllowed"
    for url in ("/v1/queues/jobs/receive?max=0", "/v1/queues/jobs/receive?wait=nan",
                "/v1/queues/bad%20name/receive", "/v1/queues/jobs/receive"):
        status, doc = s.call("POST", url, headers={"X-Client-Id": "c"} if "jobs/receive"
                             not in url or "?" in url else {})
        assert status == 400 and "Traceback" not in json.dumps(doc), (url, doc)
    status, doc = s.call("POST", "/v1/queues/jobs/messages?priority=5000", b"x")
    assert status == 400
    status, doc = s.call("POST", "/v1/queues/jobs/batch", b"\x00\x00\x00\x09abc")
    assert status == 400 and doc["error"]["code"] == "InvalidRequest"
    status, doc = s.call("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    s.stop()


def test_sigterm_closes_cleanly_and_python_reads_the_file(service, tmp_path):
    path = tmp_path / "q.fs"
    q = AckQueue(path=str(path), name="jobs")
    q.put({"from": "python"})
    q.close()
    s = service()
    [m] = s.receive("jobs", "c")
    assert m["encoding"] == "pickle"
    assert pickle.loads(body_of(m)) == {"from": "python"}   # the test unpickles, not the service
    s.call("POST", f"/v1/queues/jobs/ack?receipt={m['receipt']}")
    s.put("jobs", pickle.dumps(("from", "http", 1)),
          **{"Content-Type": "application/x-python-pickle"})
    os.remove(str(path) + ".index")
    assert s.stop(signal.SIGTERM) == 0
    assert os.path.exists(str(path) + ".index")               # written by a clean close
    q = AckQueue(path=str(path), name="jobs")
    assert q.get(block=False) == ("from", "http", 1)
    q.task_done()
    assert q.qsize() == 0
    q.close()


def test_sigkill_mid_traffic_loses_no_acknowledged_put_and_revives_no_ack(service):
    s = service()
    put_ok, acked_ok, stop = [], [], threading.Event()
    ack_sent = []           # acks sent whose answer may have been cut by the kill

    def producer():
        c = s.conn(timeout=10)
        i = 0
        while not stop.is_set():
            try:
                status, doc = s.call("POST", "/v1/queues/jobs/messages", b"m%d" % i, conn=c)
            except (OSError, http.client.HTTPException):
                return
            if status == 200:
                put_ok.append(doc["id"])
            i += 1

    def consumer():
        c = s.conn(timeout=10)
        pending = None
        while not stop.is_set():
            q = "max=1&wait=1" + (f"&ack={pending[1]}" if pending else "")
            if pending:
                ack_sent.append(pending[0])
            try:
                status, doc = s.call("POST", f"/v1/queues/jobs/receive?{q}",
                                     headers={"X-Client-Id": "consumer"}, conn=c)
            except (OSError, http.client.HTTPException):
                return
            if status != 200:
                return
            if pending:
                acked_ok.append(pending[0])     # the receive answered: that ack is durable
            pending = (doc["messages"][0]["id"], doc["messages"][0]["receipt"]) \
                if doc["messages"] else None

    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    until(lambda: len(acked_ok) >= 30 and len(put_ok) >= 60, 30)
    s.proc.kill()                                # SIGKILL in the middle of traffic
    s.proc.wait(10)
    stop.set()
    for t in threads:
        t.join(15)
    s = service()
    present = set()
    after = -1
    while True:
        status, doc = s.call("GET", f"/v1/queues/jobs/browse?after={after}&limit=100")
        present |= {m["id"] for m in doc["messages"]}
        if doc["next_after"] is None:
            break
        after = doc["next_after"]
    assert not present & set(acked_ok), "an acknowledged message came back"
    unsure = set(ack_sent) - set(acked_ok)       # at most the one cut by the kill
    assert len(unsure) <= 1
    assert set(put_ok) <= present | set(acked_ok) | unsure, "a put answered 200 was lost"
    s.stop()


def test_memory_mode_and_unix_socket(service, tmp_path):
    sock_path = str(tmp_path / "svc.sock")
    s = service("--socket", sock_path, path=None)
    s.put("mem", b"in memory")

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(sock_path)
    c = UnixConnection("localhost", timeout=10)
    [m] = s.receive("mem", "unix-client", conn=c)
    assert body_of(m) == b"in memory"
    c.close()
    assert s.stop() == 0


def test_one_rule_for_bodies_text_bytes_and_json_cross_fronts(service, tmp_path):
    """One rule for bodies: a str put by Python is text to an HTTP client, text sent over
    HTTP is a str to Python, bytes stay bytes, JSON is a JSON value; the service unpickles
    nothing (a body that claims to be a pickle is only checked to start as one)."""
    path = tmp_path / "q.fs"
    with AckQueue(path=str(path), name="jobs") as q:
        q.put("héllo from python")
        q.put(b"\x00\xffraw")
    s = service()
    got = s.receive("jobs", "c", "max=2")
    assert [(m["encoding"], body_of(m)) for m in got] == [
        ("str", "héllo from python".encode()), ("bytes", b"\x00\xffraw")]
    s.call("POST", "/v1/queues/jobs/ack?receipt=" + ",".join(m["receipt"] for m in got))
    s.put("jobs", "text from http".encode(), **{"Content-Type": "text/plain; charset=utf-8"})
    s.put("jobs", b'{"n": [1, 2]}', **{"Content-Type": "application/json"})
    s.put("jobs", b"\x01\x02")                              # no type: bytes
    status, doc = s.call("POST", "/v1/queues/jobs/messages?encoding=json", b"{not json")
    assert status == 400 and doc["error"]["code"] == "ValidationError"
    status, doc = s.call("POST", "/v1/queues/jobs/messages", b"not a pickle",
                         {"Content-Type": "application/x-python-pickle"})
    assert status == 400
    assert s.stop(signal.SIGTERM) == 0
    with AckQueue(path=str(path), name="jobs") as q:
        assert [q.get(block=False) for _ in range(3)] == [
            "text from http", {"n": [1, 2]}, b"\x01\x02"]
        for _ in range(3):
            q.task_done()
