"""ackqueue through its queue service: `ackqueue serve` on loopback, the native API (/v1)
over one keep-alive connection per process through ackqueue.remote.http (the remote drop-in's
HTTP/1.1 client: one write per request, one buffer per answer).

One message at a time: put is ``POST /v1/queues/bench/messages`` with the pickled item as
the body (``Content-Type: application/x-python-pickle``: the service only checks that it
starts as a pickle); get is ``POST /v1/queues/bench/receive?max=1&wait=W`` answered in
frames (``Accept: application/vnd.ackqueue.frames``: one frame of JSON metadata, one of
the body); ack(handle) does not send anything: the receipt rides on the next receive
(``receive?ack=RECEIPT``), which the service makes durable before that receive returns.
close() (and flush()) sends the receipts still pending with ``POST .../ack``.
Batches: put_batch sends up to 1000 frames to ``POST .../batch`` (one commit);
get_many(n) is one receive with max=n.
"""
import os
import pickle
import re
import select
import subprocess
import time
from urllib.parse import quote

from benchmarks.common import REPO, SHARED_QUEUE_NAME, Timeout
from benchmarks.contenders.base import Adapter, SharedContender
from benchmarks.contenders.zeo import ackqueue_command
from benchmarks.children import stop_server

FRAMES = "application/vnd.ackqueue.frames"
PICKLE = "application/x-python-pickle"
START_TIMEOUT = 60
STOP_TIMEOUT = 60
MAX_WAIT = 20.0                       # the service's long poll is at most 60 s


def encode_frames(parts):
    out = bytearray()
    for p in parts:
        out += len(p).to_bytes(4, "big")
        out += p
    return bytes(out)


def decode_frames(data):
    parts, i = [], 0
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        parts.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return parts


class ServiceServer:
    """`ackqueue serve DIR/service.fs --port 0` (fsync'd commits, the default) in a child
    process; the port is read from its "listening on" line; stderr goes to DIR/service.log.
    cpu() is the server's CPU seconds so far (psutil), for CPU seconds / wall seconds."""

    def __init__(self, directory, *extra):
        self.path = os.path.join(directory, "service.fs")
        self.log_path = os.path.join(directory, "service.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ackqueue_command() + ["serve", self.path, "--port", "0", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=REPO)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ackqueue serve did not start: {line!r}; log: "
                               f"{self.log_tail()}")
        self.host, self.port = found.group(1), int(found.group(2))
        self.url = f"http://{self.host}:{self.port}"
        import psutil
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self):
        t = self.ps.cpu_times()
        return t.user + t.system

    def log_tail(self, chars=1500):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def stop(self):
        """SIGTERM, wait; returns {"exit_code", "log_errors"} (never raises)."""
        code = stop_server(self.proc, (self.proc.stdout, self.log), STOP_TIMEOUT)
        errors = [line for line in self.log_tail(100000).splitlines()
                  if " ERROR " in line or "Traceback" in line]
        return {"exit_code": code, "log_errors": errors[:20], "log_error_count": len(errors)}


class Handle:
    __slots__ = ("receipt", "body")

    def __init__(self, receipt, body):
        self.receipt, self.body = receipt, body


class ServiceAdapter(Adapter):
    """One persistent keep-alive connection to the service (see the module docstring)."""

    batch_method = ("POST /batch with up to 1000 frames (one commit); one receive with "
                    "max=n, answered in frames; the acks ride on the next receive")
    acks_ride = True

    def __init__(self, url, name=SHARED_QUEUE_NAME, client=None):
        m = re.match(r"http://([\d.]+):(\d+)", url)
        self.host, self.port = m.group(1), int(m.group(2))
        self.base = f"/v1/queues/{name}"
        self.client = client or f"bench-{os.getpid()}"
        self.pending = []              # receipts acknowledged, not yet sent
        from ackqueue.remote.http import Connection
        self.conn = Connection(self.host, self.port, MAX_WAIT + 30)
        self.requests = 0

    def _call(self, method, url, body=None, headers=None):
        h = {"X-Client-Id": self.client}
        if headers:
            h.update(headers)
        status, answer, data = self.conn.request(method, url, body, h)
        self.requests += 1
        if status != 200:
            raise RuntimeError(f"{method} {url}: {status} {data[:300]!r}")
        return answer, data

    def put(self, item):
        self._call("POST", self.base + "/messages", pickle.dumps(item, protocol=5),
                   {"Content-Type": PICKLE})

    def put_batch(self, items):
        for i in range(0, len(items), 1000):
            body = encode_frames([pickle.dumps(it, protocol=5) for it in items[i:i + 1000]])
            self._call("POST", self.base + "/batch?encoding=pickle", body,
                       {"Content-Type": FRAMES})

    def get_many(self, n, timeout):
        """Up to n handles (a long poll of at most timeout seconds; [] when none came); the
        receipts acknowledged since the last request ride on this one."""
        url = f"{self.base}/receive?max={n}&wait={min(timeout, MAX_WAIT):g}"
        if self.pending:
            url += "&ack=" + quote(",".join(self.pending), safe=",")
        _, data = self._call("POST", url, headers={"Accept": FRAMES})
        self.pending = []
        parts = decode_frames(data)
        import json
        return [Handle(json.loads(parts[k])["receipt"], parts[k + 1])
                for k in range(0, len(parts), 2)]

    def get(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            got = self.get_many(1, max(0.0, deadline - time.monotonic()))
            if got:
                return got[0]
            if time.monotonic() >= deadline:
                return None

    def item(self, handle):
        return pickle.loads(handle.body)

    def ack(self, handle):
        self.pending.append(handle.receipt)

    def ack_many(self, handles):
        self.pending.extend(h.receipt for h in handles)

    def flush(self):
        """Send the receipts still pending (durable when this returns)."""
        if self.pending:
            self._call("POST", self.base + "/ack?receipt="
                       + quote(",".join(self.pending), safe=","))
            self.pending = []

    def get_ack_batch(self, n, timeout):
        out = []
        while len(out) < n:
            got = self.get_many(n - len(out), timeout)
            if not got:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            self.ack_many(got)
            out += got
        self.flush()
        return out

    def qsize(self):
        import json
        _, data = self._call("GET", self.base)
        stats = json.loads(data)["stats"]
        return stats.get("ready", stats.get("qsize"))

    def close(self):
        try:
            self.flush()
        finally:
            self.conn.close()


def start_server(directory):
    """provision(): one `ackqueue serve` per run, on a fresh file."""
    server = ServiceServer(directory)
    return server.url, server


SHARED = SharedContender(
    "ackqueue-service", "ackqueue (service)", "ackqueue", "blocking",
    "one `ackqueue serve` per run on a fresh file (FileStorage, every commit fsync'd); "
    "every process keeps one keep-alive connection (ackqueue.remote.http) and uses the native API: "
    "put (the pickled item as the body), receive (long poll, frames), the ack riding on "
    "the next receive", start_server, lambda location, mode: ServiceAdapter(location),
    scenarios=("service",))
