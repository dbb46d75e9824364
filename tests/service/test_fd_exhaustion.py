"""The service out of file descriptors, and its caps on unauthenticated idle connections:
the real console script started under a low RLIMIT_NOFILE, flooded with a few hundred
idle TCP connections from this process.  Its log stays a few lines (no traceback per
failed accept), /health answers during the flood or once it is released, and it serves
normally afterwards, without a restart.  Waits are bounded failure limits, never
synchronization; the rate-limited log and the backoff are also tested with injected time."""
import errno
import json
import logging
import resource
import select
import socket
import subprocess
import time

import pytest

pytest.importorskip("aiohttp")

from ackqueue.service.config import ConfigError, parse             # noqa: E402
from ackqueue.service.gate import default_caps                     # noqa: E402
from ackqueue.service.listener import Backoff, RateLimitedLog      # noqa: E402
from tests.service.test_service import START_TIMEOUT, Service, until       # noqa: E402
from tests.zeo_server import console_script                        # noqa: E402

NOFILE = 64             # the service's descriptor limit
FLOOD = 300             # idle connections, far more than NOFILE
MAX_LOG_LINES = 40      # the old accept loop wrote thousands of tracebacks a second
BOUND = 30.0            # failure bound of every wait


class LimitedService(Service):
    """The service started with RLIMIT_NOFILE lowered to NOFILE in the child only."""

    def start(self):
        def limit():
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, min(hard, NOFILE)))
        args = [console_script(), "serve"] + (
            ["--memory"] if self.path is None else [self.path]) + ["--port", "0"] + self.extra
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     preexec_fn=limit)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        if "listening on http://127.0.0.1:" not in line:
            self.proc.kill()
            raise RuntimeError(f"the service did not start: {line!r}\n{self.read_log()}")
        self.port = int(line.split("127.0.0.1:")[1].split()[0])

    def log_lines(self):
        return self.read_log().splitlines()


@pytest.fixture
def limited(tmp_path):
    started = []

    def start(*extra):
        s = LimitedService(tmp_path / "q.fs", "--threads", "4", *extra, log_dir=tmp_path)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


def flood(port, n=FLOOD, source="127.0.0.1"):
    """n connections that never send anything (non-blocking connects: a full backlog
    does not hold the test up)."""
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.bind((source, 0))
        sock.setblocking(False)
        if sock.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS):
            sock.close()
            continue
        socks.append(sock)
    return socks


def release(socks):
    for sock in socks:
        sock.close()


def wait_closed(socks, closed, at_least, limit=BOUND):
    """Wait until at least at_least of socks were closed by the service (bound); closed:
    the set of those seen closed so far, updated."""
    end = time.monotonic() + limit
    while len(closed) < at_least:
        assert time.monotonic() < end, f"only {len(closed)} of {len(socks)} closed"
        live = [sock for sock in socks if sock not in closed]
        for sock in select.select(live, [], [], 0.2)[0]:
            try:
                if sock.recv(1) == b"":
                    closed.add(sock)
            except OSError:                  # reset
                closed.add(sock)


def capped_flood(port, held, n=FLOOD, batch=50):
    """n idle connections, opened batch by batch once the service has closed all but held
    of those before: a batch stays under the listening backlog, beyond which the kernel
    may drop a connection the client takes as made (then it is never closed)."""
    socks, closed = [], set()
    while len(socks) < n:
        socks += flood(port, batch)
        wait_closed(socks, closed, len(socks) - held)
    return socks


def health(port, source="127.0.0.1"):
    """/health's document, or None when the connection was closed or timed out."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2,
                                        source_address=(source, 0))
    except OSError:
        return None
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return json.loads(body) if head.startswith(b"HTTP/1.1 200") else None


def answers(port, source="127.0.0.1", limit=BOUND):
    """/health's document, asked again until it answers (bound)."""
    found = []
    until(lambda: found.append(health(port, source)) or found[-1] is not None, limit)
    return found[-1]


def assert_quiet(s):
    lines = s.log_lines()
    assert len(lines) <= MAX_LOG_LINES, "\n".join(lines[:60])
    assert not any("Traceback" in line for line in lines), "\n".join(lines[:60])
    return lines


def serves_normally(s):
    mid = s.put("jobs", b"after the flood")
    [m] = s.receive("jobs", "c1")
    assert m["id"] == mid
    status, _ = s.call("POST", f"/v1/queues/jobs/ack?receipt={m['receipt']}",
                       headers={"X-Client-Id": "c1"})
    assert status == 200


def test_an_idle_flood_is_capped_and_health_answers_during_it(limited):
    s = limited()
    assert "4 per address" in s.read_log()          # caps derived from NOFILE
    # all but the 4 a client address may hold are closed at once
    socks = capped_flood(s.port, held=4)
    try:
        assert answers(s.port, source="127.0.0.2")["status"] == "ok"   # another address
        assert answers(s.port)["status"] == "ok"                       # the same address
        lines = assert_quiet(s)
        assert any("(--max-idle-per-address)" in line for line in lines), lines
    finally:
        release(socks)
    serves_normally(s)
    s.stop()
    assert_quiet(s)


def test_out_of_descriptors_accepts_back_off_and_the_service_recovers(limited):
    # caps beyond the limit: the idle connections take every descriptor
    s = limited("--max-idle-connections", "1000", "--max-idle-per-address", "1000",
                "--header-timeout", "1")
    socks = flood(s.port)
    try:
        until(lambda: "too many open files (EMFILE)" in s.read_log(), BOUND)
        # held while the header timeout closes idle connections at least once
        until(lambda: "within 1 s (--header-timeout)" in s.read_log(), BOUND)
        assert_quiet(s)
    finally:
        release(socks)
    assert answers(s.port)["status"] == "ok"
    serves_normally(s)
    s.stop()
    assert_quiet(s)


def test_the_header_timeout_closes_connections_that_sent_no_request(limited):
    s = limited("--header-timeout", "1")
    working = socket.create_connection(("127.0.0.1", s.port), timeout=BOUND)
    idle = socket.create_connection(("127.0.0.1", s.port), timeout=BOUND)
    t0 = time.monotonic()
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    working.sendall(request)
    assert working.recv(65536).startswith(b"HTTP/1.1 200")
    assert idle.recv(1) == b""                       # closed by the service
    assert time.monotonic() - t0 >= 0.9              # by the header timeout
    working.sendall(request)                         # a client that asked stays
    assert working.recv(65536).startswith(b"HTTP/1.1 200")
    working.close()
    idle.close()
    s.stop()


def closed_now(socks):
    """Which of socks the service has closed already (no wait)."""
    readable = select.select(socks, [], [], 0)[0]
    return [sock for sock in readable if sock.recv(1) == b""]


def test_with_auth_only_authenticated_connections_escape_the_caps(limited, tmp_path):
    token = "t0ken-0123456789abcdef"
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"clients": {"w": {"secret": token,
                                                  "rights": {"*": ["read", "write"]}}}}))
    s = limited("--auth", str(auth), "--max-idle-per-address", "2",
                "--header-timeout", "60")
    anonymous = socket.create_connection(("127.0.0.1", s.port), timeout=BOUND)
    signed_in = socket.create_connection(("127.0.0.1", s.port), timeout=BOUND)
    anonymous.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert anonymous.recv(65536).startswith(b"HTTP/1.1 200")
    signed_in.sendall(f"GET /v1/queues HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {token}\r\n\r\n".encode())
    assert signed_in.recv(65536).startswith(b"HTTP/1.1 200")
    # /health proves nothing: that connection counts as idle and unauthenticated again,
    # the authenticated one does not; so of two more, the second passes the cap of 2
    more = [socket.create_connection(("127.0.0.1", s.port), timeout=BOUND)
            for _ in range(2)]
    # accepted after those two (the backlog is first in, first out), from another
    # address: once it is answered, their fate is decided
    assert answers(s.port, source="127.0.0.2")["status"] == "ok"
    assert closed_now(more) == [more[1]]
    assert closed_now([anonymous, signed_in]) == []
    release(more + [anonymous, signed_in])
    s.stop()


def test_the_caps_come_from_the_config_file_and_the_command_line_wins(limited, tmp_path):
    cfg = tmp_path / "c.ini"
    cfg.write_text("max_idle_connections = 6\nmax_idle_per_address = 3\n"
                   "header_timeout = 7\n")
    s = limited("--config", str(cfg), "--max-idle-per-address", "2")
    assert ("at most 6 unauthenticated idle connections, 2 per address; a new connection "
            "has 7 s") in s.read_log()
    s.stop()
    with pytest.raises(ConfigError, match="header_timeout"):
        parse("header_timeout = 0\n")


# -- the parts, with injected time ----------------------------------------------------------

class FakeLater:
    """call_later that records, run by hand."""

    def __init__(self):
        self.pending = []

    def __call__(self, delay, fn, *args):
        handle = _Handle(fn, args)
        self.pending.append(handle)
        return handle

    def run(self):
        due, self.pending = self.pending, []
        for handle in due:
            if not handle.cancelled:
                handle.fn(*handle.args)


class _Handle:
    def __init__(self, fn, args):
        self.fn, self.args, self.cancelled = fn, args, False

    def cancel(self):
        self.cancelled = True


def test_the_rate_limited_log_writes_one_line_per_interval_with_a_count(caplog):
    later = FakeLater()
    notes = RateLimitedLog(logging.getLogger("test.fds"), 5.0, call_later=later)
    key = "accept failed: too many open files (EMFILE)"
    with caplog.at_level(logging.INFO, "test.fds"):
        for _ in range(1533):
            notes.note(key)
        later.run()                      # the first window ends
        later.run()                      # a quiet window: nothing more, the window closes
        notes.note(key)                  # a new event is written at once
        notes.note(key)
        notes.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"ackqueue serve: {key}",
        f"ackqueue serve: {key}; 1,532 more in the last 5 s",
        f"ackqueue serve: {key}",
        f"ackqueue serve: {key}; 1 more before stopping"]
    assert later.pending == [] or all(h.cancelled for h in later.pending)


def test_the_backoff_doubles_up_to_its_cap_and_resets():
    b = Backoff(0.01, 1.0)
    delays = [b.next() for _ in range(9)]
    assert delays == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.01


def test_the_default_caps_leave_headroom_below_the_descriptor_limit():
    assert default_caps(64, 4) == (8, 4)
    total, per_address = default_caps(1024, 64)
    assert total + 32 + 64 < 1024 and per_address == total // 2
    assert default_caps(None, 64) == default_caps(1 << 20, 64)
