"""(e) across processes: wake latency from a put in this process to a get in another."""
import random
import time

from benchmarks.children import report
from benchmarks.common import (GET_TIMEOUT, fmt, latency_metrics, make_item, one_line,
                               percentile)
from benchmarks.scenarios.shared import (SharedRun, in_child, record_failure,
                                         shared_counts, summarise)

KEY = "e_xproc"
TITLE = "(e) wake latency across processes: put call to item in hand"
COLUMNS = [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("mean_ms", "mean ms"),
           ("put_p50_ms", "put() p50 ms"), ("after_put_p50_ms", "after put() returned p50 ms")]


def xwake_one(sc, samples, tmp_root, seed):
    """(e) across processes: a consumer process blocked in get(); this process sleeps
    15-25 ms (random, seeded) after the consumer says it is about to call get(), records
    time.time() and puts; the consumer records time.time() when get() returns.  Beside
    the latency, put()'s own duration (its durable commit) and the latency minus it (what
    the wake path adds once put() returned; negative when the item was in hand first)."""
    run = None
    out = {}
    puts = []
    try:
        run = SharedRun(sc, "e_xproc", tmp_root)
        rng = random.Random(seed)
        child = run.spawn("consumer", "xwake", samples)
        child.expect("ready", 120)
        for i in range(samples):
            child.expect("waiting", GET_TIMEOUT + 60)
            time.sleep(rng.uniform(0.015, 0.025))
            item = make_item(i)
            item["t0"] = t0 = time.time()
            run.ad.put(item)
            puts.append(time.time() - t0)
        rep = child.expect("done", GET_TIMEOUT + 60)
        out["metrics"] = latency_metrics(sorted(x * 1000 for x in rep["lat"]))
        out["metrics"]["put_p50_ms"] = percentile(sorted(x * 1000 for x in puts), 50)
        out["metrics"]["after_put_p50_ms"] = percentile(
            sorted((lat - put) * 1000 for lat, put in zip(rep["lat"], puts)), 50)
        out["delivered_in_order"] = rep["got"] == list(range(samples))
        if rep.get("diag") is not None:
            out["consumer_diagnostics"] = rep["diag"]
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        if run is not None:
            out.update(run.close(failed="error" in out))
    return out


def _consume(ad, count):
    """The consumer process: say "waiting" just before each get(); the latency is from the
    producer's time.time() before put() to ours after get()."""
    lat, got = [], []
    for i in range(count):
        report(event="waiting", i=i)
        h = ad.get(GET_TIMEOUT)
        t1 = time.time()
        if h is None:
            report(event="error", error=f"get() timed out after {GET_TIMEOUT:g}s at "
                                        f"sample {i}")
            return
        it = ad.item(h)
        lat.append(t1 - it["t0"])
        got.append(it["n"])
        ad.ack(h)
    report(event="done", lat=lat, got=got, diag=ad.diagnostics())


def child_xwake(shared_id, location, count, start, *extra):
    in_child(_consume, shared_id, location, int(count))


def run(args, shared, tmp_root):
    samples = shared_counts(args)["samples"]
    print(f"\n{TITLE}", flush=True)
    started = time.perf_counter()
    chosen = [sc for sc in shared if KEY in sc.scenarios]
    runs = {sc.label: [] for sc in chosen}
    for rep in range(args.repeat):
        for sc in chosen:
            if sc.repeat is not None and rep >= sc.repeat:
                continue
            n = min(samples, sc.samples or samples)
            r = xwake_one(sc, n, tmp_root, seed=5 + rep)
            r["count"] = n
            runs[sc.label].append(r)
            shown = r.get("error") or ", ".join(f"{m}={fmt(v)}"
                                                 for m, v in r["metrics"].items())
            print(f"  [{rep + 1}/{args.repeat}] {sc.label:<28} n={n:<5} {shown}", flush=True)
    results = {}
    for sc in chosen:
        entry = summarise(runs[sc.label])
        entry["count"] = runs[sc.label][0]["count"]
        entry["sharing"] = sc.sharing
        results[sc.label] = entry
    return {"title": TITLE, "description": one_line(xwake_one.__doc__),
            "seconds": time.perf_counter() - started, "results": results}
