"""The service against oversized bodies and slow or vanished clients, at the socket level,
on the real console script, with and without --auth (whose middleware reads some bodies
for their queue names: the size and time checks come first).  Times are failure bounds;
the lower bounds show that a close came from the timeout under test, not from something
else."""
import json
import socket
import time

import pytest

pytest.importorskip("aiohttp")

from ackqueue.service.main import LINGER                        # noqa: E402
from tests.service.test_service import Service, until           # noqa: E402

SLACK = 3.0       # scheduling on a loaded 2-core machine


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(*extra):
        s = Service(tmp_path / "q.fs", *extra, log_dir=tmp_path)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


def connect(s):
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.settimeout(30)
    return sock


def read_until_closed(sock, limit):
    """(bytes received, seconds until the server closed); fails if it stays open."""
    sock.settimeout(limit)
    data, t0 = b"", time.monotonic()
    while True:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"the server kept the connection open for {limit} s; "
                                 f"got {data[:300]!r}") from None
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk


def parse(data):
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return status, headers, json.loads(body) if body else None


@pytest.mark.parametrize("path,length,sent", [
    ("/v1/queues/jobs/messages", 1001, b""),             # just over --max-body
    ("/v1/queues/jobs/messages", 50_000_000, b"x" * 100),  # part of a huge body sent
    ("/v1/queues/jobs/batch", 50_000_000, b""),          # over the batch limit
    ("/v1/queues/jobs/ack", 50_000_000, b"{"),
])
def test_a_body_over_the_limit_gets_413_and_the_connection_closed(serve, path, length, sent):
    s = serve("--max-body", "1000")
    sock = connect(s)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                 .encode() + sent)
    data, took = read_until_closed(sock, LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 413 and doc["error"]["code"] == "MessageSizeExceeded", data
    assert headers.get("connection", "").lower() == "close"
    sock.close()
    # the limit is exact, and the service goes on serving
    assert s.put("jobs", b"y" * 1000)
    s.stop()


def test_a_client_stalled_in_its_headers_or_idle_is_disconnected(serve):
    s = serve("--client-timeout", "1")
    stalled, idle = connect(s), connect(s)
    t0 = time.monotonic()
    stalled.sendall(b"POST /v1/queues/jobs/messages HTTP/1.1\r\nHost: x\r\n")   # no end
    for sock in (stalled, idle):
        data, _ = read_until_closed(sock, 1 + SLACK)
        assert data == b""
        sock.close()
    assert time.monotonic() - t0 >= 0.9
    s.stop()


def test_a_client_stalled_in_its_body_gets_408_and_is_disconnected(serve):
    s = serve("--client-timeout", "1")
    sock = connect(s)
    t0 = time.monotonic()
    sock.sendall(b"POST /v1/queues/jobs/messages HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 100\r\n\r\nonly ten b")
    assert s.health()["status"] == "ok"          # others are served meanwhile
    data, _ = read_until_closed(sock, 1 + LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 408 and doc["error"]["code"] == "RequestTimeout", data
    assert time.monotonic() - t0 >= 0.9
    sock.close()
    status, doc = s.call("GET", "/v1/queues/jobs")
    assert doc["stats"]["ready"] == 0            # nothing half-sent was stored
    s.stop()


def test_the_client_timeout_does_not_cut_a_long_poll(serve):
    s = serve("--client-timeout", "1")
    c = s.conn(timeout=30)
    t0 = time.monotonic()
    status, doc = s.call("POST", "/v1/queues/jobs/receive?wait=2.5",
                         headers={"X-Client-Id": "patient"}, conn=c)
    assert (status, doc) == (200, {"messages": []})
    assert time.monotonic() - t0 >= 2.4
    s.stop()


def test_a_disconnected_long_poll_stops_at_once_and_a_message_goes_elsewhere(serve):
    s = serve()
    sock = connect(s)
    sock.sendall(b"POST /v1/queues/jobs/receive?wait=50 HTTP/1.1\r\nHost: x\r\n"
                 b"X-Client-Id: leaver\r\nContent-Length: 0\r\n\r\n")
    until(lambda: s.health()["long_polls"] == 1)
    t0 = time.monotonic()
    sock.close()
    until(lambda: s.health()["long_polls"] == 0, 10)
    assert time.monotonic() - t0 < SLACK            # not the 50 s wait
    s.put("jobs", b"for the one still here")
    [m] = s.receive("jobs", "stayer")
    assert m["receive_count"] == 1
    s.stop()


# -- with --auth: the body's size and time checks come before the auth middleware reads it

ADMIN = "admin-secret-012345678"


@pytest.fixture
def serve_auth(tmp_path):
    from tests.service.test_service import Service
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {"root": {"secret": ADMIN,
                                                     "rights": {"*": ["admin"]}}}}))
    started = []

    def start(*extra):
        s = Service(tmp_path / "q.fs", "--auth", str(path), *extra, log_dir=tmp_path)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


@pytest.mark.parametrize("path", ["/send", "/send_batch", "/v1/batch"])
def test_with_auth_a_body_past_the_limit_gets_413_before_auth_reads_it(serve_auth, path):
    """The auth middleware reads these bodies for their queue names: before the fix it
    read a 50 MB body that never came (no size check, no timeout) and held the
    connection open."""
    from ackqueue.service.main import LINGER
    from tests.service.test_service_limits import SLACK, connect, parse, read_until_closed
    s = serve_auth("--client-timeout", "30")
    sock = connect(s)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
                 .encode() + b'{"queue_name": "jobs", ' + b" " * 100)
    data, _ = read_until_closed(sock, LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 413 and doc["error"]["code"] == "MessageSizeExceeded", data
    assert headers.get("connection", "").lower() == "close"
    sock.close()
    status, _ = s.call("POST", "/send", json.dumps({"queue_name": "jobs", "message_body": "x"}),
                       {"Authorization": f"Bearer {ADMIN}"})
    assert status == 200
    s.stop()


def test_with_auth_a_stalled_body_gets_408_before_auth_reads_it(serve_auth):
    from ackqueue.service.main import LINGER
    from tests.service.test_service_limits import SLACK, connect, parse, read_until_closed
    s = serve_auth("--client-timeout", "1")
    sock = connect(s)
    sock.sendall(f"POST /send HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                 .encode() + b'{"queue_n')
    data, _ = read_until_closed(sock, 1 + LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 408 and doc["error"]["code"] == "RequestTimeout", data
    sock.close()
    s.stop()
