"""Where the remote drop-in's wake-up goes, phase by phase (a diagnostic, not a scenario).

    python -m benchmarks.wake_phases [--durability os|fsync] [--samples 200]

(e) across processes through the service, as benchmarks/scenarios/e_xproc.py runs it (a
consumer process blocked in get(); this process sleeps 15-25 ms, then puts), with an
``ackqueue serve`` whose steps are stamped with time.time(): the request reaching the
service's middleware and the put handler, put_many in the pool, the ready listener, the
long poll's wake on the loop, the claim in the pool, the receive's answer, and the
consumer's get() returning.  Prints the median of each phase.  The stamps wrap the
service's methods in the child process only (nothing of ackqueue is changed).
"""
import argparse
import os
import random
import re
import select
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

PHASES = ["middleware", "handler", "put_many", "listener", "wake", "claim", "claimed",
          "answered"]


def _traced_serve(path, durability, log_path):
    """The child: ackqueue serve with stamps (runs in its own process)."""
    from aiohttp import web
    from ackqueue import queue as front
    from ackqueue.service import backend, http, runtime
    from ackqueue.service.main import serve
    log = open(log_path, "a", buffering=1)

    def mark(what):
        log.write(f"{time.time():.6f} {what}\n")

    def around(cls, name, before, after=None, static=False):
        orig = getattr(cls, name)

        def sync(*a, **k):
            mark(before)
            r = orig(*a, **k)
            if after:
                mark(after)
            return r
        setattr(cls, name, staticmethod(sync) if static else sync)

    errors, put, receive = runtime.Api.errors, http.Native.put, http.Native.receive

    @web.middleware
    async def traced_errors(self, request, handler):
        if request.method == "POST" and request.path.endswith("/messages"):
            mark("middleware")
        return await errors(self, request, handler)

    async def traced_put(self, request):
        mark("handler")
        return await put(self, request)

    async def traced_receive(self, request):
        r = await receive(self, request)
        mark("answered")
        return r
    runtime.Api.errors, http.Native.put = traced_errors, traced_put
    http.Native.receive = traced_receive
    around(front.AckQueue, "put_many", "put_many")
    around(runtime.Api, "_listener", "listener")
    around(runtime.Api, "wake", "wake")
    around(backend.Service, "receive", "claim", "claimed", static=True)
    serve(path, port=0, durability=durability)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args(argv)
    from ackqueue import AckQueue
    d = tempfile.mkdtemp(prefix="ackqueue-wake-")
    log_path = os.path.join(d, "stamps.log")
    srv = subprocess.Popen(
        [sys.executable, "-c", "import sys; from benchmarks.wake_phases import _traced_serve;"
         " _traced_serve(*sys.argv[1:])", os.path.join(d, "s.fs"), args.durability, log_path],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    select.select([srv.stdout], [], [], 60)
    url = "http://" + re.search(r"http://([\d.]+:\d+)", srv.stdout.readline()).group(1)
    consumer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from ackqueue import AckQueue
        q = AckQueue(path={url!r}, name="w")
        for i in range({args.samples}):
            print("waiting", flush=True)
            m = q.get_message(timeout=60)
            t1 = time.time()
            q.ack(m)
            print(f"got {{t1:.6f}}", flush=True)
        q.close()
        """)], stdout=subprocess.PIPE, text=True)
    q = AckQueue(path=url, name="w")
    rng, rows = random.Random(5), []
    try:
        for i in range(args.samples):
            assert consumer.stdout.readline().startswith("waiting")
            time.sleep(rng.uniform(0.015, 0.025))
            with open(log_path, "a") as f:
                f.write("SAMPLE\n")
            t0 = time.time()
            q.put(i)
            t2 = time.time()
            rows.append((t0, t2, float(consumer.stdout.readline().split()[1])))
    finally:
        q.close()
        consumer.wait(60)
        srv.terminate()
        srv.wait(60)
    report(rows, open(log_path).read().split("SAMPLE\n")[1:], args)


def report(rows, blocks, args):
    phases = {}
    for (t0, t2, t1), block in zip(rows, blocks):
        at = {}
        for line in block.splitlines():
            ts, what = line.split(" ", 1)
            at.setdefault(what, float(ts))
        prev_name, prev = "put() called", t0
        for name in PHASES:
            if name in at:
                phases.setdefault(f"{prev_name} -> {name}", []).append(at[name] - prev)
                prev_name, prev = name, at[name]
        phases.setdefault(f"{prev_name} -> item in hand", []).append(t1 - prev)
        phases.setdefault("listener -> put() returned", []).append(t2 - at["listener"])
        phases.setdefault("total: put() called -> item in hand", []).append(t1 - t0)
        phases.setdefault("total: put() called -> put() returned", []).append(t2 - t0)
    print(f"ackqueue serve --durability {args.durability}, {len(rows)} samples, medians:")
    for name, values in phases.items():
        print(f"  {name:<42} {statistics.median(values) * 1000:7.3f} ms")


if __name__ == "__main__":
    main()
