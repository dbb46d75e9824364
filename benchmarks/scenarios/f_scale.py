"""(f) Scale: fill in a child process, SIGKILL it after its last commit, open in fresh
child processes.  Contenders take part when their entry has a ScaleSupport (scale=)."""
import gc
import os
import shutil
import signal
import statistics
import tempfile
import time

from benchmarks.children import read_report, report, run_child, spawn_child
from benchmarks.common import GET_TIMEOUT, dir_size, latency_metrics, one_line

KEY = "f"
NOT_MEASURED = {"litequeue": "not measured in (f) (ackqueue and persist-queue only)",
                "ackqueue (zeo)": "not measured in (f): the scale test opens the file "
                                  "itself, not through a server"}


def _fill_and_kill(c, path, big, res):
    """Fill in a child, SIGKILL it once it reports its last commit durable."""
    proc = spawn_child("fill", c.id, path, big, "hold")
    try:
        filled = read_report(proc, 3600)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    res["fill"] = filled
    res["fill_killed_returncode"] = proc.returncode
    res.update(c.scale.after_kill(path))
    res["file_bytes"] = dir_size(path)
    print(f"  {c.family}: filled {big:,} in {filled['seconds']:.1f}s "
          f"({filled['rate']:,.0f}/s), SIGKILLed (rc {proc.returncode}), "
          f"{res['file_bytes'] / 2**20:.0f} MB", flush=True)


def _alternate(c, path, small_path, cycles, repeat, res):
    """Alternately: open the big file after a clean close and time get+ack at its backlog;
    open the small one and do the same (each in a fresh process)."""
    family = c.family
    res["after_clean_close_runs"], res["small_runs"] = [], []
    for i in range(repeat):
        r = run_child("open", c.id, path, cycles)
        res["after_clean_close_runs"].append(r)
        print(f"  {family} [{i + 1}/{repeat}]: open after clean close "
              f"{r['open_s']:.2f}s, RSS {r['rss_mb']:.0f} MB, get+ack mean "
              f"{r['mean_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms at backlog "
              f"{r['backlog']:,}", flush=True)
        r = run_child("open", c.id, small_path, cycles)
        res["small_runs"].append(r)
        print(f"  {family} [{i + 1}/{repeat}]: at backlog {r['backlog']:,}: open "
              f"{r['open_s']:.3f}s, RSS {r['rss_mb']:.0f} MB, get+ack mean "
              f"{r['mean_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms", flush=True)
    res["after_clean_close"] = median_report(res["after_clean_close_runs"])
    res["small"] = median_report(res["small_runs"])


def scale_one(c, big, small_backlog, cycles, tmp_root, repeat=1):
    """Fill the queue with the big count in a child process, SIGKILL it after its last
    commit, then open it in a fresh process (open after SIGKILL, RSS after one get+ack; that
    process closes cleanly).  Then, repeat times and alternately, in fresh processes: open
    it again (open after a clean close, RSS, and 1,000 timed get+ack cycles at the big
    backlog), and open a small queue (a 1,000-message backlog plus what the cycles take)
    for the same 1,000 timed get+ack cycles.  Medians over the repetitions."""
    family = c.family
    directory = tempfile.mkdtemp(prefix=f"ackbench-f-{family}-", dir=tmp_root)
    path = os.path.join(directory, c.scale.file_name)
    res = {"family": family, "count": big, "cycles": cycles}
    try:
        _fill_and_kill(c, path, big, res)
        # 1. open after SIGKILL (no .index), one get+ack, RSS; closes cleanly.
        res["after_kill"] = run_child("open", c.id, path, 0)
        print(f"  {family}: open after SIGKILL {res['after_kill']['open_s']:.2f}s, "
              f"RSS {res['after_kill']['rss_mb']:.0f} MB", flush=True)
        # 2. a small queue (small_backlog + what the cycles take, so it stays at or above
        #    small_backlog), filled cleanly in a child.
        small_dir = tempfile.mkdtemp(prefix=f"ackbench-f-{family}-small-", dir=tmp_root)
        small_path = os.path.join(small_dir, c.scale.file_name)
        try:
            res["small_fill"] = run_child("fill", c.id, small_path,
                                          small_backlog + cycles * repeat + 1)
            # 3. alternately, the big file and the small one
            _alternate(c, path, small_path, cycles, repeat, res)
        finally:
            shutil.rmtree(small_dir, ignore_errors=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return res


def median_report(runs):
    """Per numeric field, the median over runs (other fields from the first run)."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "backlog":
            vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
            out[k] = statistics.median(vals)
    out["backlog"] = runs[0]["backlog"]
    out["runs"] = len(runs)
    return out


def run(args, contenders, tmp_root):
    big = args.fill_count if args.fill_count else (50000 if args.quick else 1000000)
    print(f"\n(f) scale: {big:,} queued messages", flush=True)
    started = time.perf_counter()
    out = {"title": f"(f) scale: {big:,} queued messages", "count": big,
           "description": one_line(scale_one.__doc__), "results": {}}
    # ackqueue first, then its peers (in the registry's order)
    chosen = sorted((c for c in contenders if c.scale is not None),
                    key=lambda c: c.family != "ackqueue")
    for c in chosen:
        try:
            out["results"][c.label] = scale_one(c, big, 1000, 1000, tmp_root,
                                                repeat=args.repeat)
        except Exception as exc:   # noqa: BLE001
            out["results"][c.label] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  {c.label}: ERROR {exc}", flush=True)
    out["not_measured"] = dict(NOT_MEASURED)
    out["seconds"] = time.perf_counter() - started
    return out


# --- the child processes --------------------------------------------------------------


def child_fill(contender_id, path, count, *extra):
    """Fill a queue at path with count items; with "hold", wait to be SIGKILLed."""
    from benchmarks import contenders
    import psutil  # noqa: F401  (imported by every child of (f), as before)
    scale = contenders.by_id(contender_id).scale
    count = int(count)
    t0 = time.perf_counter()
    q = scale.fill(path, count)
    seconds = time.perf_counter() - t0
    report(event="filled", count=count, seconds=seconds, rate=count / seconds)
    if "hold" in extra:
        time.sleep(3600)           # the parent SIGKILLs us here
    q.close()
    report(event="closed")


def child_open(contender_id, path, count):
    """Open the queue at path (timed), one get+ack, RSS, then count timed get+acks."""
    from benchmarks import contenders
    import psutil
    proc = psutil.Process()
    scale = contenders.by_id(contender_id).scale
    cycles = int(count)
    index = scale.index(path)
    opener = scale.opener(path)
    gc.collect()
    rss_before = proc.memory_info().rss        # after the imports, before the open
    t0 = time.perf_counter()
    q = opener()
    open_s = time.perf_counter() - t0
    get = lambda: q.get(timeout=GET_TIMEOUT)     # noqa: E731
    ack = q.ack
    size = q.qsize
    t = time.perf_counter()
    ack(get())
    first = time.perf_counter() - t
    rss = proc.memory_info().rss
    backlog = size()
    lat = []
    for _ in range(cycles):
        t = time.perf_counter()
        ack(get())
        lat.append(time.perf_counter() - t)
    rss_after = proc.memory_info().rss
    t = time.perf_counter()
    q.close()
    close_s = time.perf_counter() - t
    ms = sorted(x * 1000 for x in lat)
    lm = latency_metrics(ms) if ms else {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    report(event="opened", open_s=open_s, index_at_open=index, first_get_ack_ms=first * 1000,
           rss_before_open_mb=rss_before / 2**20, rss_mb=rss / 2**20,
           rss_after_cycles_mb=rss_after / 2**20, backlog=backlog, cycles=cycles,
           mean_ms=lm["mean_ms"], p50_ms=lm["p50_ms"], p99_ms=lm["p99_ms"],
           close_s=close_s)
