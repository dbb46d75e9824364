"""The remote drop-in: `ackqueue serve` on loopback, AckQueue(path="http://...") in every
process (issue 23 point 8).  One put, one get (a long poll) and one ack request per item;
the service group-commits every client's requests (fsync'd)."""
import os
import re
import select
import subprocess

from benchmarks.common import REPO, SHARED_QUEUE_NAME
from benchmarks.contenders.ackqueue import AckQueueAdapter
from benchmarks.contenders.base import Contender, SharedContender
from benchmarks.contenders.zeo import ackqueue_command
from benchmarks.children import stop_server

START_TIMEOUT = 60             # failure bounds only
STOP_TIMEOUT = 60


class Service:
    """`ackqueue serve DIR/shared.fs --port 0` in a child process; the URL is parsed from
    the one line it prints; its stderr goes to DIR/service.log."""

    def __init__(self, directory):
        self.log_path = os.path.join(directory, "service.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ackqueue_command() + ["serve", os.path.join(directory, "shared.fs"),
                                  "--port", "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=REPO)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ackqueue serve did not start: {line!r}")
        self.url = found.group(0)

    def stop(self):
        """SIGTERM, wait; returns {"exit_code", "log_errors", ...} (never raises)."""
        code = stop_server(self.proc, (self.proc.stdout, self.log), STOP_TIMEOUT)
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        errors = [x for x in lines if re.search(r"ERROR|CRITICAL|Traceback", x)]
        return {"exit_code": code, "log_errors": errors[:20], "log_error_count": len(errors)}


def start_service(directory):
    """provision(): one service per run, on a fresh file."""
    service = Service(directory)
    return service.url, service


SHARED = SharedContender(
    "ackqueue-remote", "ackqueue (remote)", "ackqueue", "blocking",
    "one `ackqueue serve` per run on a fresh file (every commit fsync'd, requests of all "
    "clients group-committed); every process opens "
    f"AckQueue(path='http://127.0.0.1:PORT', name={SHARED_QUEUE_NAME!r}); get() is the "
    "service's long poll; put, get and ack one request each",
    start_service, lambda location, mode: AckQueueAdapter(None, url=location))

# The fewer-requests path: ack_with_next_get=True (an ack rides on the thread's next get,
# or is sent within 50 ms): two requests per item, but an ack is durable only by then.
SHARED_ACK_WITH_GET = SharedContender(
    "ackqueue-remote-ackget", "ackqueue (remote, ack with next get)", "ackqueue", "blocking",
    "as ackqueue (remote), with AckQueue(..., ack_with_next_get=True): ack() returns at "
    "once and the ack travels with the same thread's next get (durable before that get "
    "returns) or within 50 ms",
    start_service,
    lambda location, mode: AckQueueAdapter(None, url=location, ack_with_next_get=True))


class RemoteAckQueueAdapter(AckQueueAdapter):
    """(a)-(d) in one process: starts `ackqueue serve` on a fresh file in the run's
    directory, opens AckQueue(path="http://127.0.0.1:PORT", name=...), and stops the
    service (SIGTERM) after closing the queue.  The service's start is not timed."""

    def __init__(self, directory, **options):
        self.service = Service(directory)
        self.server_report = None
        try:
            super().__init__(directory, url=self.service.url, **options)
        except BaseException:
            self.server_report = self.service.stop()
            raise

    def close(self):
        try:
            super().close()
        finally:
            self.server_report = self.service.stop()


CONTENDER = Contender(
    "ackqueue-remote", "ackqueue (remote)", RemoteAckQueueAdapter,
    "the queue service: one `ackqueue serve` (ZODB FileStorage, every commit fsync'd, "
    "group-committed across requests) on loopback, started per run on a fresh file; the "
    "client opens AckQueue(path='http://127.0.0.1:PORT'); put and ack return once the "
    "service has committed", family="ackqueue", counts={"n": 500, "batch_n": 1000})
