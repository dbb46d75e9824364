"""(service) The queue service, in one run:

1. one at a time: 2 producer + 2 consumer processes, an ack per item, through
   `ackqueue serve` (native API, the ack riding on the next receive), beside ackqueue's
   ZEO sharing, persist-queue and litequeue (the (g) peers, same processes and items);
2. batches of 10 through the service: batch put in frames, receive max=10, acks riding;
3. 200 idle long polls held open while a sender puts 1 message/s: the server's CPU share,
   and that every message reaches a poll;
4. the request floor of the stack: a bare asyncio.Protocol server, a bare aiohttp app and
   the service's own GET /health, each hit by the same 4 client processes with
   sequential keep-alive GETs;
5. the durable request floor (service_floor.py): a bare asyncio.Protocol server that
   answers each POST once a group commit made its body durable (append + fsync, and a
   ZODB FileStorage commit), hit by 4 client processes, bodies of 1 and of 10 items.

Every client process (the scenario's and the floors') talks HTTP through ackqueue.remote.http,
the remote drop-in's client (one keep-alive connection each).  Every item carries the
time.time() of its put, so that a consumer reports the latency
from put to receive (same machine, same clock).  The server's CPU is psutil's user +
system seconds of the server process over the wall seconds from "go" to the last
consumer's end.
"""
import asyncio
import http.client
import json
import os
import statistics
import sys
import time
import traceback

from benchmarks.children import Child, report, serve_app, until_terminated
from benchmarks.common import fmt, make_item, percentile
from benchmarks.scenarios import service_floor
from benchmarks.scenarios.shared import SharedRun, in_child, record_failure

KEY = "service"
TITLE = "(service) the queue service: processes, batches, idle long polls, request floor"
PEERS = ("ackqueue-service", "ackqueue-zeo", "persist-queue", "litequeue")
GET_TIMEOUT = 30.0
AFTER_STOP = 1.0
LIMIT = 600.0
FLOOR_CLIENTS = 4


def counts(args):
    if args.quick:
        return {"n": 400, "zeo_n": 200, "batch_n": 2000, "polls": 200, "poll_seconds": 5,
                "floor_seconds": 2}
    return {"n": 2000, "zeo_n": 600, "batch_n": 20000, "polls": 200, "poll_seconds": 15,
            "floor_seconds": 4}


def _cpu_of(server):
    """CPU seconds (user + system) of a server process so far, or None."""
    if server is None:
        return None
    try:
        import psutil
        t = psutil.Process(server.proc.pid).cpu_times()
        return t.user + t.system
    except Exception:   # noqa: BLE001
        return None


# --- 1 and 2: producer and consumer processes -------------------------------------------


def processes_one(sc, total, batch, tmp_root, producers=2, consumers=2):
    """items/s = distinct items acknowledged durably / (the last such ack - "go")."""
    run, out = None, {"count": total, "batch": batch}
    try:
        run = SharedRun(sc, "svc", tmp_root)
        per = total // producers
        prods = [run.spawn(f"producer{k}", "sprod", per, k * per, batch)
                 for k in range(producers)]
        cons = [run.spawn(f"consumer{k}", "scons", 0, 0, batch) for k in range(consumers)]
        for child in prods + cons:
            child.expect("ready", 120)
        cpu0, t0 = _cpu_of(run.server), time.time()
        for child in cons + prods:
            child.send("go")
        deadline = time.monotonic() + LIMIT
        preps = [p.expect("done", max(1.0, deadline - time.monotonic())) for p in prods]
        for _ in range(consumers):
            run.ad.put({"stop": True})
        creps = [c.expect("done", GET_TIMEOUT + 30) for c in cons]
        wall = time.time() - t0
        cpu1 = _cpu_of(run.server)
        errors = [f"{r.get('error')}" for r in preps + creps if r.get("error")]
        got = [n for r in creps for n in r["ids"]]
        lat = sorted(x for r in creps for x in r["lat_ms"])
        last = max(r["last_ack"] or 0 for r in creps)
        out["put_ok"] = sum(r["put_ok"] for r in preps)
        out["delivered"], out["duplicates"] = len(got), len(got) - len(set(got))
        out["not_delivered"] = out["put_ok"] - len(set(got))
        out["metrics"] = {
            "throughput": len(set(got)) / (last - t0) if last else None,
            "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99)}
        if cpu0 is not None and cpu1 is not None:
            out["metrics"]["server_cpu"] = (cpu1 - cpu0) / wall
        if errors:
            out["error"] = "; ".join(errors)
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        if run is not None:
            out.update(run.close(failed="error" in out))
    return out


def _produce(ad, count, start, batch):
    sys.stdin.readline()                                   # "go"
    done, error = 0, None
    try:
        for i in range(start, start + count, batch):
            items = []
            for n in range(i, min(i + batch, start + count)):
                it = make_item(n)
                it["t"] = time.time()
                items.append(it)
            if batch == 1:
                ad.put(items[0])
            else:
                ad.put_batch(items)
            done += len(items)
    except Exception as exc:   # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
    report(event="done", put_ok=done, error=error)


def child_producer(shared_id, location, count, start, batch):
    in_child(_produce, shared_id, location, int(count), int(start), int(batch))


def _consume(ad, batch):
    """get (or get_many) and ack until a stop marker, then what is still ready until a
    get waits AFTER_STOP for nothing; a second marker is put back for another consumer.
    With acks riding on the next receive (the service), an ack is durable when that
    receive returns (or the final flush)."""
    ids, lat, last_ack = [], [], None
    rides = getattr(ad, "acks_ride", False)
    pending_real = False
    after_stop, error = None, None
    sys.stdin.readline()                                   # "go"
    try:
        while True:
            timeout = GET_TIMEOUT if after_stop is None else AFTER_STOP
            if batch > 1:
                hs = ad.get_many(batch, timeout)
            else:
                h = ad.get(timeout)
                hs = [] if h is None else [h]
            now = time.time()
            if rides and pending_real:
                last_ack, pending_real = now, False
            if not hs:
                break
            items = [ad.item(h) for h in hs]
            markers = 0
            for h, it in zip(hs, items):
                if it.get("stop"):
                    markers += 1
                    continue
                ids.append(it["n"])
                lat.append((now - it["t"]) * 1000.0)
                pending_real = True
            if batch > 1:
                ad.ack_many(hs)
            else:
                ad.ack(hs[0])
            if markers and rides and pending_real:
                # The producers are done: send the acks now rather than on a receive
                # that may wait out its long poll (that wait is not the acks' cost).
                ad.flush()
                last_ack, pending_real = time.time(), False
            if not rides and pending_real:
                last_ack, pending_real = time.time(), False
            # One marker per consumer: keep the first seen, put back any other (a batch
            # may hold several); a consumer that sees a second one stops.
            stop_again = markers and after_stop is not None
            if markers and after_stop is None:
                after_stop, markers = 0, markers - 1
            for _ in range(markers):
                ad.put({"stop": True})
            if stop_again:
                break
        if hasattr(ad, "flush"):
            ad.flush()
            if pending_real:
                last_ack = time.time()
    except Exception as exc:   # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    report(event="done", ids=ids, lat_ms=lat, last_ack=last_ack, error=error)


def child_consumer(shared_id, location, count, start, batch):
    in_child(_consume, shared_id, location, int(batch))


# --- 3: idle long polls -----------------------------------------------------------------


async def _polls(url, polls, seconds, sender):
    """polls long polls held open on one aiohttp session; returns the deliveries."""
    import aiohttp
    got, stop = [], asyncio.Event()

    async def one(session, k):
        pending = None
        while not stop.is_set():
            q = f"{url}/v1/queues/idle/receive?max=1&wait=30"
            if pending:
                q += f"&ack={pending}"
            async with session.post(q, headers={"X-Client-Id": f"poll{k}"}) as r:
                doc = await r.json()
            pending = None
            for m in doc.get("messages", []):
                got.append((json.loads(__import__("base64").b64decode(m["body"])),
                            time.time()))
                pending = m["receipt"]

    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.ensure_future(one(session, k)) for k in range(polls)]
        deadline = time.monotonic() + 30
        while True:                                          # every poll is in
            async with session.get(url + "/health") as r:
                health = await r.json()
            if health["long_polls"] >= polls or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        result = await asyncio.get_running_loop().run_in_executor(None, sender, health)
        await asyncio.sleep(1.0)                             # the last one's delivery
        async with session.get(url + "/health") as r:
            result["health_after"] = await r.json()
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    result["got"] = got
    return result


def idle_polls_one(tmp_root, polls, seconds):
    import tempfile
    import shutil
    from benchmarks.contenders.service import ServiceServer
    directory = tempfile.mkdtemp(prefix="ackbench-svc-polls-", dir=tmp_root)
    server, out = None, {"polls": polls, "seconds": seconds}
    try:
        server = ServiceServer(directory)

        def sender(health):
            c = http.client.HTTPConnection(server.host, server.port, timeout=30)
            sent = []
            cpu0, t0 = server.cpu(), time.time()
            for i in range(seconds):
                target = t0 + i
                time.sleep(max(0.0, target - time.time()))
                body = json.dumps({"n": i, "t": time.time()}).encode()
                c.request("POST", "/v1/queues/idle/messages", body,
                          {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    sent.append(i)
            time.sleep(max(0.0, t0 + seconds - time.time()))
            wall = time.time() - t0
            cpu = server.cpu() - cpu0
            c.close()
            return {"sent": sent, "cpu_s": cpu, "wall_s": wall,
                    "long_polls_at_start": health["long_polls"],
                    "threads_at_start": health["threads"]}

        r = asyncio.run(_polls(server.url, polls, seconds, sender))
        got = r.pop("got")
        reached = {m["n"] for m, _ in got}
        lat = sorted((t - m["t"]) * 1000 for m, t in got)
        out.update({k: v for k, v in r.items() if k != "health_after"})
        out["threads_after"] = r["health_after"]["threads"]
        out["reached"] = len(reached & set(r["sent"]))
        out["missing"] = sorted(set(r["sent"]) - reached)
        out["metrics"] = {"server_cpu": r["cpu_s"] / r["wall_s"],
                          "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99)}
        if out["missing"]:
            out["error"] = f"{len(out['missing'])} message(s) reached no poll"
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        if server is not None:
            out["server"] = server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return out


# --- 4: the request floor ---------------------------------------------------------------


def child_floor_server(kind):
    """A bare server on a free loopback port answering every GET with a small body."""
    body = b'{"status":"ok"}'
    if kind == "aiohttp":
        from aiohttp import web

        async def hello(request):
            return web.Response(body=body, content_type="application/json")

        async def main():
            app = web.Application()
            app.router.add_get("/{tail:.*}", hello)
            await serve_app(app)
        asyncio.run(main())
        return
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body)) + body

    class Proto(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, b""

        def data_received(self, data):
            self.buf += data
            while b"\r\n\r\n" in self.buf:             # GETs without a body
                _, self.buf = self.buf.split(b"\r\n\r\n", 1)
                self.transport.write(answer)

    async def main():
        srv = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
        report(event="ready", port=srv.sockets[0].getsockname()[1])
        await until_terminated()
    asyncio.run(main())


def child_floor_client(host, port, path, seconds):
    """Sequential keep-alive GETs through ackqueue.remote.http, the client the scenario's
    processes use (the remote drop-in's)."""
    from ackqueue.remote.http import Connection
    report(event="ready", pid=os.getpid())
    sys.stdin.readline()                                   # "go"
    c = Connection(host, int(port), 30)
    n, t0 = 0, time.perf_counter()
    end = t0 + float(seconds)
    while time.perf_counter() < end:
        c.request("GET", path)
        n += 1
    report(event="done", n=n, seconds=time.perf_counter() - t0)


class _Spawned:
    """A floor server in a child process (stopped with SIGTERM)."""

    def __init__(self, directory, kind):
        self.child = Child(directory, f"floor-{kind}", "sfloorsrv", kind)
        self.proc = self.child.proc
        self.port = self.child.expect("ready", 60)["port"]
        self.host = "127.0.0.1"

    def stop(self):
        self.proc.terminate()
        return {"exit_code": self.child.finish(10)}


def floor_one(kind, seconds, tmp_root):
    import tempfile
    import shutil
    directory = tempfile.mkdtemp(prefix="ackbench-svc-floor-", dir=tmp_root)
    server, out, clients = None, {"kind": kind}, []
    try:
        if kind == "service":
            from benchmarks.contenders.service import ServiceServer
            server, path = ServiceServer(directory), "/health"
        else:
            server, path = _Spawned(directory, kind), "/"
        clients = [Child(directory, f"client{k}", "sfloorcli", server.host, server.port,
                         path, seconds) for k in range(FLOOR_CLIENTS)]
        for c in clients:
            c.expect("ready", 60)
        cpu0, t0 = _cpu_of(server), time.time()
        for c in clients:
            c.send("go")
        reps = [c.expect("done", float(seconds) + 60) for c in clients]
        wall, cpu1 = time.time() - t0, _cpu_of(server)
        out["metrics"] = {"rps": sum(r["n"] / r["seconds"] for r in reps)}
        if cpu0 is not None and cpu1 is not None:
            out["metrics"]["server_cpu"] = (cpu1 - cpu0) / wall
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        for c in clients:
            c.finish(10)
        if server is not None:
            out["server"] = server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return out


# --- the parent -------------------------------------------------------------------------


def _summary(runs):
    ok = [r for r in runs if "metrics" in r and "error" not in r
          and all(v is not None for v in r["metrics"].values())]
    entry = {"runs": runs}
    if ok:
        entry["median"] = {m: statistics.median(r["metrics"][m] for r in ok)
                           for m in ok[0]["metrics"]}
        entry["spread"] = {m: [min(r["metrics"][m] for r in ok),
                               max(r["metrics"][m] for r in ok)] for m in ok[0]["metrics"]}
    else:
        entry["error"] = next((r.get("error") for r in runs if r.get("error")), "no result")
    return entry


def _shown(r):
    if "metrics" not in r:
        return "ERROR " + str(r.get("error"))
    bits = " ".join(f"{k}={fmt(v)}" for k, v in r["metrics"].items())
    for k in ("duplicates", "not_delivered", "reached"):
        if k in r:
            bits += f" {k}={r[k]}"
    return ("ERROR " + r["error"] + "; " if r.get("error") else "") + bits


def run(args, shared, tmp_root):
    c = counts(args)
    print(f"\n{TITLE}", flush=True)
    started = time.perf_counter()
    chosen = [sc for sc in shared if sc.id in PEERS]
    have_service = any(sc.id == "ackqueue-service" for sc in chosen)
    parts = {"one": {}, "batch": {}, "polls": {}, "floor": {}, "durable": {}}
    for rep in range(args.repeat):
        tag = f"[{rep + 1}/{args.repeat}]"
        for sc in chosen:
            n = c["zeo_n"] if sc.id == "ackqueue-zeo" else c["n"]
            r = processes_one(sc, n, 1, tmp_root)
            parts["one"].setdefault(sc.label, []).append(r)
            print(f"  {tag} 2p+2c one at a time {sc.label:<20} n={n} {_shown(r)}",
                  flush=True)
        if have_service:
            sc = next(s for s in chosen if s.id == "ackqueue-service")
            r = processes_one(sc, c["batch_n"], 10, tmp_root)
            parts["batch"].setdefault(sc.label, []).append(r)
            print(f"  {tag} 2p+2c batches of 10 {sc.label:<20} n={c['batch_n']} "
                  f"{_shown(r)}", flush=True)
            r = idle_polls_one(tmp_root, c["polls"], c["poll_seconds"])
            parts["polls"].setdefault("ackqueue (service)", []).append(r)
            print(f"  {tag} {c['polls']} idle long polls, 1 put/s for "
                  f"{c['poll_seconds']} s: {_shown(r)}", flush=True)
            for kind in ("protocol", "aiohttp", "service"):
                r = floor_one(kind, c["floor_seconds"], tmp_root)
                parts["floor"].setdefault(kind, []).append(r)
                print(f"  {tag} floor {kind:<9} {FLOOR_CLIENTS} clients "
                      f"{c['floor_seconds']} s: {_shown(r)}", flush=True)
            for kind in service_floor.KINDS:
                for batch in (1, 10):
                    r = service_floor.floor_one(kind, batch, c["floor_seconds"], tmp_root,
                                                _cpu_of)
                    parts["durable"].setdefault(f"{kind} batch {batch}", []).append(r)
                    print(f"  {tag} durable floor {kind:<5} batch {batch:<2} "
                          f"{service_floor.CLIENTS} clients {c['floor_seconds']} s: "
                          f"{_shown(r)}", flush=True)
    return {"title": TITLE, "description": " ".join(__doc__.split()),
            "counts": c, "seconds": time.perf_counter() - started,
            "parts": {k: {label: _summary(runs) for label, runs in v.items()}
                      for k, v in parts.items()}}
