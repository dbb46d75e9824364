"""Where a request's time goes inside `ackqueue serve`: a profile of its path.

    python -m benchmarks.trace_service [--producers 4] [--consumers 4] [--count 2000]
                                       [--batch 1] [--durability fsync]

Starts the service in a child process with timers wrapped around its path (the aiohttp
handler, each hand-off to the thread pool and back, the committer's commits and their
FileStorage fsync, each ticket's wait), runs producer and consumer processes through
the benchmark's ServiceAdapter (one keep-alive ackqueue.remote.http connection each; put; receive
carrying the previous ack), and prints each timer's percentiles in ms.  A diagnostic, not
a benchmark: the timers cost a little, and the run is not beside any peer.  The child
is `python -m benchmarks.trace_service serve PATH PORT DURABILITY`; it prints its
timers to stderr when it stops (SIGTERM).
"""
import argparse
import atexit
import collections
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import psutil

STATS = collections.defaultdict(list)


def _record(key, seconds):
    STATS[key].append(seconds)


def _instrument():
    """Wrap the service's path with timers (in the traced child only)."""
    from aiohttp import web
    from ZODB.FileStorage.FileStorage import FileStorage
    from ackqueue import commit
    from ackqueue.service import runtime

    async def run(self, fn, *args):
        box, t_sub = {}, time.perf_counter()

        def inner():
            box["start"] = time.perf_counter()
            try:
                return fn(*args)
            finally:
                box["end"] = time.perf_counter()
        result = await self.loop.run_in_executor(self.pool, inner)
        _record("pool hop: loop -> pool thread", box["start"] - t_sub)
        _record("pool hop: pool thread -> loop", time.perf_counter() - box["end"])
        return result
    runtime.Api.run = run

    original_attempt = runtime.Api._attempt

    async def attempt(self, cc, fn, give_back):
        t = time.perf_counter()
        try:
            return await original_attempt(self, cc, fn, give_back)
        finally:
            _record("receive: one try in the pool (with hops)", time.perf_counter() - t)
    runtime.Api._attempt = attempt

    original_errors = runtime.Api.errors

    @web.middleware
    async def errors(self, request, handler):
        t = time.perf_counter()
        try:
            return await original_errors(self, request, handler)
        finally:
            _record(f"handler: {request.path.rsplit('/', 1)[-1]}", time.perf_counter() - t)
    runtime.Api.errors = errors

    original_try = commit.Committer._try_commit

    def try_commit(self, conn, tm, batch):
        t = time.perf_counter()
        try:
            return original_try(self, conn, tm, batch)
        finally:
            _record("commit: one group commit", time.perf_counter() - t)
            STATS["commit: units per commit"].append(len(batch))
    commit.Committer._try_commit = try_commit

    original_wait = commit.Ticket.wait

    def wait(self, timeout=None):
        t = time.perf_counter()
        try:
            return original_wait(self, timeout)
        finally:
            _record("commit: a durable unit's wait", time.perf_counter() - t)
    commit.Ticket.wait = wait

    original_finish = FileStorage._finish_finish

    def finish_finish(self, tid):
        t = time.perf_counter()
        try:
            return original_finish(self, tid)
        finally:
            _record("commit: FileStorage finish (its fsync)", time.perf_counter() - t)
    FileStorage._finish_finish = finish_finish


def _dump():
    for key in sorted(STATS):
        values = sorted(STATS[key])
        n = len(values)
        scale = 1 if "units" in key else 1000.0
        pick = lambda q: values[min(n - 1, int(n * q))] * scale     # noqa: E731
        print(f"  {key:44s} n={n:6d} mean={sum(values) / n * scale:7.3f} "
              f"p50={pick(.5):7.3f} p90={pick(.9):7.3f} p99={pick(.99):7.3f}",
              file=sys.stderr, flush=True)


def serve(path, port, durability):
    _instrument()
    atexit.register(_dump)
    from ackqueue.service.main import serve as run_service
    run_service(path, port=int(port), durability=durability)


def _producer(url, count, batch, out):
    from benchmarks.contenders.service import ServiceAdapter
    ad, lat = ServiceAdapter(url, name="trace"), []
    for i in range(0, count, batch):
        t = time.perf_counter()
        if batch == 1:
            ad.put({"n": i})
        else:
            ad.put_batch([{"n": i + k} for k in range(batch)])
        lat.append(time.perf_counter() - t)
    ad.close()
    out.put(("client: put", lat))


def _consumer(url, batch, idle, out):
    from benchmarks.contenders.service import ServiceAdapter
    ad, lat = ServiceAdapter(url, name="trace"), []
    while True:
        t = time.perf_counter()
        got = ad.get_many(batch, idle)
        if not got:
            break
        lat.append(time.perf_counter() - t)
        ad.ack_many(got)
    ad.close()
    out.put(("client: receive carrying the previous ack", lat))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--durability", default="fsync", choices=("fsync", "os"))
    p.add_argument("--tmpdir", default=None,
                   help="where the queue file goes (not tmpfs, where fsync costs nothing)")
    args = p.parse_args(argv)
    idle = 2.0
    with tempfile.TemporaryDirectory(prefix="ackbench-trace-", dir=args.tmpdir) as d:
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.trace_service", "serve",
             os.path.join(d, "q.fs"), "0", args.durability],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            found = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if not found:
                raise SystemExit(f"the traced service did not start: {line!r}")
            url = found.group(1)
            out = multiprocessing.Queue()
            per = args.count // args.producers
            procs = [multiprocessing.Process(target=_consumer,
                                             args=(url, args.batch, idle, out))
                     for _ in range(args.consumers)]
            procs += [multiprocessing.Process(target=_producer,
                                              args=(url, per, args.batch, out))
                      for _ in range(args.producers)]
            sproc = psutil.Process(server.pid)
            c0 = sproc.cpu_times()
            t0 = time.perf_counter()
            for proc in procs:
                proc.start()
            lat = collections.defaultdict(list)
            for _ in procs:
                key, values = out.get()
                lat[key] += values
            for proc in procs:
                proc.join()
            wall = time.perf_counter() - t0 - idle
            c1 = sproc.cpu_times()
            cpu = (c1.user + c1.system) - (c0.user + c0.system)
            print(f"server CPU {cpu / (per * args.producers) * 1e6:,.0f} us per item, "
                  f"{cpu / (wall + idle):.2f} of a core")
            print(f"{args.producers}p+{args.consumers}c, {per * args.producers} items, "
                  f"batch {args.batch}, durability {args.durability}: about "
                  f"{per * args.producers / wall:,.0f} items/s (wall less the final "
                  f"{idle:g} s idle poll)")
            for key, values in sorted(lat.items()):
                STATS[key] = values
            _dump()
            STATS.clear()
        finally:
            server.send_signal(signal.SIGTERM)
            _, err = server.communicate(timeout=60)
        print("inside the service:", file=sys.stderr)
        print("\n".join(x for x in err.splitlines() if x.startswith("  ")),
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(*sys.argv[2:5])
    else:
        main()
