"""ackqueue through a queue server: `ackqueue server` on loopback, AckQueue("zeo://...")."""
import os
import re
import select
import subprocess
import sys
import time

from ZODB.utils import get_pickle_metadata

from benchmarks.common import REPO, SHARED_QUEUE_NAME
from benchmarks.contenders.ackqueue import AckQueueAdapter
from benchmarks.contenders.base import Contender, SharedContender
from benchmarks.children import stop_server

SERVER_START_TIMEOUT = 60             # failure bounds only
SERVER_STOP_TIMEOUT = 60
ZEO_COUNTS = {"n": 500, "batch_n": 1000}     # full-run counts of "ackqueue (zeo)" in (a)-(d)


def ackqueue_command():
    """The ackqueue console script installed beside this Python (or python -m ackqueue)."""
    script = os.path.join(os.path.dirname(sys.executable), "ackqueue")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "ackqueue"]


class ZeoServer:
    """`ackqueue server DIR/shared.fs --listen 127.0.0.1:0` in a child process; the URL is
    parsed from the one line it prints; its stderr (logging) goes to DIR/server.log."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "shared.fs")
        self.log_path = os.path.join(directory, "server.log")
        self.log = open(self.log_path, "ab")
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            ackqueue_command() + ["server", self.path, "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=REPO)
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVER_START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"zeo://[\w.\-]+:\d+", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ackqueue server did not start: {line!r}; log: "
                               f"{self.log_tail()}")
        self.url = found.group(0)
        self.start_s = time.perf_counter() - t

    def log_tail(self, chars=1500):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def log_lines(self, pattern):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        return [line for line in lines if re.search(pattern, line)]

    def stop(self):
        """SIGTERM, wait; returns {"exit_code", "log_problems"} (never raises)."""
        code = stop_server(self.proc, (self.proc.stdout, self.log), SERVER_STOP_TIMEOUT)
        errors = self.log_lines(r" (ERROR|CRITICAL) |Traceback")
        warns = self.log_lines(r" WARNING ")
        return {"exit_code": code, "log_errors": errors[:20], "log_error_count": len(errors),
                "log_warnings": warns[:5], "log_warning_count": len(warns)}


class ZeoAckQueueAdapter(AckQueueAdapter):
    """ackqueue through a queue server: starts `ackqueue server` on a fresh file in the
    run's directory, opens AckQueue(path="zeo://127.0.0.1:PORT", name=...), and stops the
    server (SIGTERM) after closing the queue.  The server's start is not timed."""

    def __init__(self, directory, **options):
        self.server = ZeoServer(directory)
        self.server_report = None
        try:
            super().__init__(directory, url=self.server.url, **options)
        except BaseException:
            self.server_report = self.server.stop()
            raise

    def close(self):
        try:
            super().close()
        finally:
            self.server_report = self.server.stop()


def start_server(directory):
    """provision() across processes: one server per run, on a fresh file."""
    server = ZeoServer(directory)
    return server.url, server


# Shared queues: every run starts its own `ackqueue server` on a fresh file.
# One-item commits through ZEO run at a few hundred per second here, so this contender
# gets smaller counts in (a)-(d) (ZEO_COUNTS; the table shows each contender's N).
CONTENDER = Contender(
    "ackqueue-zeo", "ackqueue (zeo)", ZeoAckQueueAdapter,
    "ZEO: one `ackqueue server` (ZODB FileStorage, every commit fsync'd by the server) "
    "on loopback, started per run on a fresh file; the client opens "
    "AckQueue(path='zeo://127.0.0.1:PORT'); put and ack return once the server has "
    "committed", family="ackqueue", counts=ZEO_COUNTS)

# Batched claims in one process: a consumer draining a backlog ((a)) claims up to 8
# messages per commit.
CONTENDER_PREFETCH = Contender(
    "ackqueue-zeo-prefetch", "ackqueue (zeo, prefetch 8)",
    lambda directory: ZeoAckQueueAdapter(directory, prefetch=8),
    "as ackqueue (zeo), opened with AckQueue(..., prefetch=8): while the gets keep up, one "
    "claim commit takes up to 8 ready messages for the next gets", family="ackqueue",
    counts=ZEO_COUNTS)

class RoundTrips:
    """Counts one process's calls to the ZEO server that wait for its answer, each a round
    trip: a commit's vote and tpc_finish, loads of objects the cache lacks, and any other
    call (tpc_begin and a commit's stores are sent without waiting).  It wraps the
    ClientStorage's own call paths, so it sees every such call ZODB and ackqueue make;
    its private attributes are reached here only, for diagnostics."""

    def __init__(self, storage):
        self.counts = {}
        self.loads_by_class = {}      # the class of each object loaded (load_before)
        storage._call = self._counted(storage._call, None)
        server = storage._server
        for name in ("load_before", "tpc_finish", "prefetch"):
            setattr(server, name, self._counted(getattr(server, name), name))
        server.load_before = self._classed(server.load_before)

    def _classed(self, load_before):
        by_class = self.loads_by_class

        def classed(*args, **kwargs):
            found = load_before(*args, **kwargs)
            if found is not None:
                try:
                    module, name = get_pickle_metadata(found[0])
                    name = f"{module}.{name}"
                except Exception:  # noqa: BLE001 - a diagnostic: never fail the load
                    name = "?"
                by_class[name] = by_class.get(name, 0) + 1
            return found
        return classed

    def _counted(self, call, name):
        counts = self.counts

        def counted(*args, **kwargs):
            key = name or args[0]
            counts[key] = counts.get(key, 0) + 1
            return call(*args, **kwargs)
        return counted

    def report(self):
        """{call name: count}, and "total" (prefetch: one call for a batch of loads,
        answered together, counted as one round trip)."""
        out = dict(self.counts)
        out["total"] = sum(self.counts.values())
        out["loads_by_class"] = dict(self.loads_by_class)
        return out


class CountingAdapter(AckQueueAdapter):
    """AckQueueAdapter on a zeo:// URL whose diagnostics add the process's round trips to
    the server (RoundTrips)."""

    def __init__(self, directory, **options):
        super().__init__(directory, **options)
        try:
            self.round_trips = RoundTrips(self.q._database.db.storage)
        except AttributeError as exc:     # ZEO's internals moved: say so, measure the rest
            self.round_trips = None
            self.round_trips_unavailable = repr(exc)

    def diagnostics(self):
        out = super().diagnostics()
        if self.round_trips is not None:
            out["round_trips"] = self.round_trips.report()
        else:
            out["round_trips_unavailable"] = self.round_trips_unavailable
        return out


def _opener(**options):
    return lambda location, mode: CountingAdapter(None, url=location, **options)


SHARED = SharedContender(
    "ackqueue-zeo", "ackqueue (zeo)", "ackqueue", "blocking",
    "one `ackqueue server` per run on a fresh file; every process opens "
    f"AckQueue(path='zeo://127.0.0.1:PORT', name={SHARED_QUEUE_NAME!r}); get() "
    "blocks and is woken by the server's invalidations",
    start_server, _opener())

# Fewer round trips per item through ZEO, (g) only.
SHARED_PREFETCH = SharedContender(
    "ackqueue-zeo-prefetch", "ackqueue (zeo, prefetch 8)", "ackqueue", "blocking",
    "as ackqueue (zeo), with AckQueue(..., prefetch=8): while a consumer keeps up, one "
    "claim commit takes up to 8 ready messages and its next gets receive them without a "
    "round trip; acks durable as by default",
    start_server, _opener(prefetch=8), scenarios=("g",))

SHARED_FAST = SharedContender(
    "ackqueue-zeo-fast", "ackqueue (zeo, prefetch 8, deferred acks)", "ackqueue",
    "blocking",
    "as ackqueue (zeo, prefetch 8), with acks='deferred' too: ack() returns at once and "
    "the ack rides on the process's next commit (a claim, or the committer's own within "
    "2 ms); a consumer's ack time is when ack() returned",
    start_server, _opener(prefetch=8, acks="deferred"), scenarios=("g",))

SHARED_NEXT_GET = SharedContender(
    "ackqueue-zeo-nextget", "ackqueue (zeo, prefetch 8, ack with next get)", "ackqueue",
    "blocking",
    "as ackqueue (zeo, prefetch 8), with ack_with_next_get=True: ack() returns at once and "
    "the ack waits up to 50 ms for the process's next commit (the next get's claim, when "
    "the consumer keeps up), where deferred acks wait 2 ms; a consumer's ack time is when "
    "ack() returned",
    start_server, _opener(prefetch=8, ack_with_next_get=True), scenarios=("g",))

SHARED_BATCHES = SharedContender(
    "ackqueue-zeo-batches", "ackqueue (zeo, prefetch 8, ack with next get, 20 ms batches)",
    "ackqueue", "blocking",
    "as ackqueue (zeo, prefetch 8, ack with next get), with prefetch_wait=0.02: a get that "
    "finds fewer messages ready than its batch waits up to 20 ms for more before it claims "
    "(Kafka's fetch.max.wait.ms), so a consumer that keeps up claims batches",
    start_server, _opener(prefetch=8, ack_with_next_get=True, prefetch_wait=0.02),
    scenarios=("g",))

SHARED_BATCHES16 = SharedContender(
    "ackqueue-zeo-batches16",
    "ackqueue (zeo, prefetch 16, ack with next get, 100 ms batches)", "ackqueue", "blocking",
    "as ackqueue (zeo, prefetch 8, ack with next get, 20 ms batches), with batches of up to "
    "16 and prefetch_wait=0.1: a get waits up to 100 ms for its batch to fill (Kafka's "
    "fetch.max.wait.ms is 500 ms by default), so that a consumer that keeps up claims more "
    "messages per commit, at the price of up to 100 ms of latency when the queue runs dry",
    start_server, _opener(prefetch=16, ack_with_next_get=True, prefetch_wait=0.1),
    scenarios=("g",))
