"""Running (a)-(e): every contender, a fresh directory per run, repetitions interleaved."""
import gc
import shutil
import statistics
import tempfile
import time
import warnings

from benchmarks.common import fmt, one_line
from benchmarks.scenarios import TABLE


def counts_for(args):
    """Per-scenario counts: durable contenders, and the in-memory reference (fast)."""
    if args.quick:
        return {"n": (300, 20000), "batch_n": (1000, 20000), "samples": (50, 50)}
    return {"n": (3000, 200000), "batch_n": (10000, 200000), "samples": (200, 200)}


def run_one(contender, key, count, tmp_root):
    fn = TABLE[key].run
    directory = tempfile.mkdtemp(prefix=f"ackbench-{key}-", dir=tmp_root)
    ad = None
    out = {}
    try:
        ad = contender.make(directory)
        batch_method = getattr(ad, "batch_method", None)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metrics = fn(ad, count)
        out = {"metrics": metrics, "seconds": time.perf_counter() - t,
               "batch_method": batch_method}
        diag = ad.diagnostics()
        if diag is not None:
            out["diagnostics"] = diag
        return out
    except Exception as exc:   # noqa: BLE001 - a failing contender is reported, not fatal
        out = {"error": f"{type(exc).__name__}: {exc}"}
        return out
    finally:
        if ad is not None:
            try:
                ad.close()
            except Exception as exc:   # noqa: BLE001
                out["close_error"] = f"{type(exc).__name__}: {exc}"
            if getattr(ad, "server_report", None) is not None:
                out["server"] = ad.server_report
        gc.collect()
        shutil.rmtree(directory, ignore_errors=True)


def count_of(c, kind, counts):
    """N for contender c in a scenario taking count kind."""
    durable_n, fast_n = counts[kind]
    n = fast_n if c.fast else durable_n
    if c.counts and kind in c.counts:
        n = min(n, c.counts[kind])
    return n


def summarise(contenders, runs):
    """Per contender: its runs, N, batch method and the medians of the runs that worked."""
    results = {}
    for c in contenders:
        rs = runs[c.label]
        ok = [r for r in rs if "metrics" in r]
        entry = {"count": rs[0]["count"], "runs": rs,
                 "batch_method": next((r["batch_method"] for r in ok), None)}
        if ok:
            entry["median"] = {m: statistics.median(r["metrics"][m] for r in ok)
                               for m in ok[0]["metrics"]}
        else:
            entry["error"] = rs[0].get("error")
        results[c.label] = entry
    return results


def repetition_order(contenders, rep):
    """The order of repetition rep (from 0): the table's, backwards every other time, so
    that no contender always runs right after the same one (a run's leftovers, such as
    dirty pages still being written back or a deleted file's blocks being freed, then
    fall on different contenders)."""
    return list(contenders)[::-1] if rep % 2 else list(contenders)


def run_scenario(key, contenders, args, tmp_root, counts):
    module = TABLE[key]
    print(f"\n{module.TITLE}", flush=True)
    runs = {c.label: [] for c in contenders}
    started = time.perf_counter()
    for rep in range(args.repeat):
        for c in repetition_order(contenders, rep):
            n = count_of(c, module.KIND, counts)
            r = run_one(c, key, n, tmp_root)
            r["count"] = n
            runs[c.label].append(r)
            shown = r.get("error") or ", ".join(
                f"{m}={fmt(v)}" for m, v in r["metrics"].items())
            print(f"  [{rep + 1}/{args.repeat}] {c.label:<18} n={n:<7} {shown}",
                  flush=True)
    return {"title": module.TITLE, "description": one_line(module.run.__doc__),
            "seconds": time.perf_counter() - started,
            "results": summarise(contenders, runs)}


def run_table_scenarios(keys, contenders, args, tmp_root):
    counts = counts_for(args)
    return {key: run_scenario(key, contenders, args, tmp_root, counts) for key in keys}
