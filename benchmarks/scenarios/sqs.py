"""(sqs) The SQS protocol: boto3 clients against ``ackqueue serve``
(fsync'd commits) and against moto's server, in one run: 2 producer + 2 consumer
processes, one message at a time (send, receive, delete) and in batches of 10
(SendMessageBatch, ReceiveMessage with MaxNumberOfMessages=10, DeleteMessageBatch).

Each body carries the time.time() of its send, so a consumer reports the latency from send
to receive (same machine, same clock); messages/s = distinct messages deleted / (the last
delete - "go").  moto gets smaller counts (it runs at tens of messages per second)."""
import json
import os
import shutil
import sys
import time
import traceback

from benchmarks.children import Child, report
from benchmarks.common import fmt, percentile

KEY = "sqs"
TITLE = "(sqs) the SQS protocol with boto3: ackqueue serve vs moto's server"
SERVERS = (("ackqueue", "ackqueue serve (SQS, fsync)"), ("moto", "moto server (memory)"),
           ("null", "floor: a bare aiohttp SQS (deque, no durability)"))
LIMIT = 900.0
WAIT = 1                     # a consumer's long poll (s); it stops after 2 empty ones


def counts(args):
    if args.quick:
        return {"ackqueue": {1: 400, 10: 2000}, "moto": {1: 100, 10: 300},
                "null": {1: 400, 10: 2000}}
    return {"ackqueue": {1: 2000, 10: 10000}, "moto": {1: 300, 10: 1000},
            "null": {1: 2000, 10: 10000}}


def one_run(kind, total, batch, tmp_root, producers=2, consumers=2):
    from benchmarks.contenders.sqs import make_server
    directory = os.path.join(tmp_root, f"sqs-{kind}-{batch}-{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    server, children, out = None, [], {"count": total, "batch": batch}
    try:
        server = make_server(kind, directory)
        per = total // producers
        prods = [Child(directory, f"producer{k}", "qprod", server.url, per, k * per, batch)
                 for k in range(producers)]
        cons = [Child(directory, f"consumer{k}", "qcons", server.url, batch)
                for k in range(consumers)]
        children = prods + cons
        for c in children:
            c.expect("ready", 120)
        cpu0, t0 = server.cpu(), time.time()
        for c in cons + prods:
            c.send("go")
        preps = [p.expect("done", LIMIT) for p in prods]
        creps = [c.expect("done", LIMIT) for c in cons]
        wall = time.time() - t0
        got = [n for r in creps for n in r["ids"]]
        lat = sorted(x for r in creps for x in r["lat_ms"])
        last = max((r["last_delete"] or 0) for r in creps)
        out.update(sent=sum(r["sent"] for r in preps), delivered=len(got),
                   duplicates=len(got) - len(set(got)))
        out["metrics"] = {"throughput": len(set(got)) / (last - t0) if last > t0 else None,
                          "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                          "server_cpu": (server.cpu() - cpu0) / wall}
        errors = [r["error"] for r in preps + creps if r.get("error")]
        if errors:
            out["error"] = "; ".join(errors)[:2000]
    except Exception as exc:   # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for c in children:
            c.finish(30)
        if server is not None:
            out["server"] = server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def run(args, shared, tmp_root):
    print(f"\n{TITLE}", flush=True)
    n = counts(args)
    results = {}
    for batch in (1, 10):
        for kind, label in SERVERS:
            r = one_run(kind, n[kind][batch], batch, tmp_root)
            results.setdefault(str(batch), {})[kind] = r
            m = r.get("metrics", {})
            print(f"  {label}, batch {batch}: {fmt(m.get('throughput'))} messages/s, p50 "
                  f"{fmt(m.get('p50_ms'))} ms, p99 {fmt(m.get('p99_ms'))} ms"
                  + (f"  ERROR {r['error']}" if r.get("error") else ""), flush=True)
    ratios, of_floor = {}, {}
    for batch, rs in results.items():
        a, m, f = ((rs[k].get("metrics") or {}).get("throughput")
                   for k in ("ackqueue", "moto", "null"))
        ratios[batch] = a / m if a and m else None
        of_floor[batch] = a / f if a and f else None
        print(f"  batch {batch}: ackqueue = {fmt(ratios[batch])}x moto, "
              f"{fmt(of_floor[batch])} of the floor", flush=True)
    return {"title": TITLE, "description": __doc__.split("\n\n")[0], "results": results,
            "ratio_vs_moto": ratios, "share_of_floor": of_floor,
            "targets": {"1": 20, "10": 100}}


# --- the children -------------------------------------------------------------------------

def child_producer(url, count, start, batch):
    from benchmarks.contenders.sqs import SqsClient
    count, start, batch = int(count), int(start), int(batch)
    c = SqsClient(url)
    report(event="ready")
    sys.stdin.readline()
    sent, error = 0, None
    try:
        for i in range(start, start + count, batch):
            bodies = [json.dumps({"n": n, "t": time.time(), "payload": "x" * 70})
                      for n in range(i, min(i + batch, start + count))]
            if batch == 1:
                c.send(bodies[0])
            else:
                c.send_batch(bodies)
            sent += len(bodies)
    except Exception as exc:   # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    report(event="done", sent=sent, error=error)


def child_consumer(url, batch):
    from benchmarks.contenders.sqs import SqsClient
    batch = int(batch)
    c = SqsClient(url)
    report(event="ready")
    sys.stdin.readline()
    ids, lat, last, empty, error, started = [], [], None, 0, None, False
    try:
        while empty < 2 or not started:
            got = c.receive(batch, WAIT)
            now = time.time()
            if not got:
                empty += 1
                if not started and empty > 60:     # nothing ever came: give up
                    break
                continue
            started, empty = True, 0
            for m in got:
                doc = json.loads(m["Body"])
                ids.append(doc["n"])
                lat.append((now - doc["t"]) * 1000.0)
            c.delete(got)
            last = time.time()
    except Exception as exc:   # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    report(event="done", ids=ids, lat_ms=lat, last_delete=last, error=error)
