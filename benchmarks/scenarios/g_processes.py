"""(g) Producer and consumer processes on one shared queue, an ack per item."""
import os
import resource
import sys
import time
import traceback

from benchmarks.children import report
from benchmarks.common import Timeout, dir_size, fmt, make_item, one_line
from benchmarks.floors import unix_socket_round_trip
from benchmarks.scenarios.shared import (SharedRun, in_child, record_failure,
                                         shared_counts, summarise)

KEY = "g"
TITLE = "(g) producer and consumer processes on one shared queue"
VARIANTS = [(2, 2), (2, 4)]        # (producer processes, consumer processes)

G_GET_TIMEOUT = 30.0         # a (g) consumer that gets nothing for this long stops and
                             # reports it (items keep coming until the stop markers)
G_LIMIT = 600.0              # failure bound of the producers of one (g) run
G_IDLE = G_GET_TIMEOUT + 30  # a consumer silent for longer than this is hung
G_AFTER_STOP = 1.0           # after its stop marker, a consumer stops once a get() has
                             # waited this long for nothing


def g_one(sc, producers, consumers, total, tmp_root):
    """(g): producer and consumer processes on one shared queue, one ack per item.  Each
    producer puts its share one at a time; consumers get and ack until they receive a stop
    marker, which this process puts (one per consumer) once every producer has finished,
    then take what is still ready (a shared queue may hand a marker out ahead of the last
    items) until a get() waits 1 s for nothing; a second marker is put back for another
    consumer.
    items/s = distinct items acknowledged / (last ack of an item - the moment "go" was
    sent), both time.time().  Then a fresh process drains the queue and reads qsize()."""
    run = None
    out = {}
    try:
        run = SharedRun(sc, "g", tmp_root)
        per = total // producers
        out["count"] = per * producers
        prods = [run.spawn(f"producer{k}", "gprod", per, k * per) for k in range(producers)]
        logs = [os.path.join(run.directory, f"consumer{k}.got") for k in range(consumers)]
        cons = [run.spawn(f"consumer{k}", "gcons", 0, 0, logs[k]) for k in range(consumers)]
        for child in prods + cons:
            child.expect("ready", 120)
        deadline = time.monotonic() + G_LIMIT
        t0 = time.time()
        cpu0 = process_cpu()
        for child in cons + prods:
            child.send("go")
        prod_reps = [p.expect("done", max(1.0, deadline - time.monotonic())) for p in prods]
        errors = []
        expected = _producers_done(out, prod_reps, per, errors)
        for _ in range(consumers):
            run.ad.put({"stop": True})
        cons_reps, hung = _consumers_done(out, cons, logs, errors)
        _cpu(out, process_cpu() - cpu0, prod_reps, cons_reps)
        _delivery(out, logs, t0, expected, cons_reps)
        _counters(out, cons_reps, prod_reps, consumers)
        if not hung:
            _drain(run, out, errors)
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        if run is not None:
            out.update(run.close(failed="error" in out))
    return out


def _producers_done(out, prod_reps, per, errors):
    """The items whose put() returned; a producer whose put() raised stopped there (the
    run goes on, so that what was put is still consumed and counted)."""
    out["producers_seconds"] = [r["end"] - r["start"] for r in prod_reps]
    expected = set()
    for k, r in enumerate(prod_reps):
        expected.update(range(k * per, k * per + r["put_ok"]))
        if r.get("error"):
            errors.append(f"producer{k}: put() raised {r['error']} after "
                          f"{r['put_ok']} of {per} puts")
            out.setdefault("child_tracebacks", {})[f"producer{k}"] = r.get("traceback")
    out["put_ok"] = len(expected)
    return expected


def _consumers_done(out, cons, logs, errors):
    """The consumers' reports, and the names of those that hung."""
    total_logged = lambda: sum(dir_size(f) for f in logs if os.path.exists(f))  # noqa: E731
    cons_reps, hung = [], []
    for k, child in enumerate(cons):
        try:
            # a consumer that receives nothing for G_IDLE (its own get() times out
            # after G_GET_TIMEOUT) is hung; it is killed at the end, and its log counts
            cons_reps.append(child.expect("done", G_IDLE, progress=total_logged))
        except Timeout:
            hung.append(child.name)
    for k, r in enumerate(cons_reps):
        if r.get("error"):
            errors.append(f"consumer{k}: {r['error']}")
            out.setdefault("child_tracebacks", {})[f"consumer{k}"] = r.get("traceback")
    if hung:
        out["hung_consumers"] = hung
        errors.append(f"consumer process(es) {', '.join(hung)} neither received an "
                      f"item nor returned from get(timeout={G_GET_TIMEOUT:g}) for "
                      f"{G_IDLE:g} s; killed")
    if errors:
        out["error"] = "; ".join(errors)
    return cons_reps, hung


def _read_logs(logs):
    """What the consumers received, from their logs (complete even for a killed one)."""
    got, last = [], None
    for f in logs:
        if os.path.exists(f):
            with open(f) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) == 2:
                        got.append(int(parts[0]))
                        last = max(last or 0.0, float(parts[1]))
    return got, last


def _delivery(out, logs, t0, expected, cons_reps):
    got, last = _read_logs(logs)
    unique = set(got)
    out["metrics"] = {"throughput": len(unique) / (last - t0) if last else None}
    out["delivered"] = len(got)
    out["duplicates"] = len(got) - len(unique)
    out["not_delivered"] = len(expected - unique)
    out["delivered_never_put"] = len(unique - expected)
    out["per_consumer"] = [sum(1 for _ in open(f)) if os.path.exists(f) else 0
                           for f in logs]
    out["consumers_timed_out"] = sum(bool(r.get("timed_out")) for r in cons_reps)
    out["received_after_stop"] = sum(r.get("after_stop") or 0 for r in cons_reps)
    out["not_delivered_ids"] = sorted(expected - unique)[:20]


def process_cpu():
    """This process's CPU seconds so far (user + system, every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu(out, parent_seconds, prod_reps, cons_reps):
    """CPU µs per item: the parent's over the run (the owner, for a contender whose
    parent holds the queue file; near zero for the others, whose server is a process of
    its own), each producer's and each consumer's from "go" to its last item."""
    n = out.get("count")
    if not n:
        return
    per = lambda seconds: round(seconds * 1e6 / n, 1)   # noqa: E731
    out["cpu_us_per_item"] = {
        "parent": per(parent_seconds),
        "producers": [per(r["cpu"]) for r in prod_reps if r.get("cpu") is not None],
        "consumers": [per(r["cpu"]) for r in cons_reps if r.get("cpu") is not None]}


def _summed(counts):
    """{key: the sum of its values} over several {key: count} of the processes of a run."""
    total = {}
    for one in counts:
        for key, n in one.items():
            total[key] = total.get(key, 0) + n
    return total


def _counters(out, cons_reps, prod_reps, consumers):
    """ackqueue's commit and conflict counters, summed over the processes of the run."""
    diags = [r.get("diag") for r in cons_reps]
    if diags and all(d and "commits" in d for d in diags):
        commits = sum(d["commits"] for d in diags)
        conflicts = sum(d["conflicts"] for d in diags)
        by_class = _summed(d["conflicts_by_class"] for d in diags)
        out["consumers"] = {
            "processes_reporting": len(diags), "processes": consumers,
            "commits": commits, "conflicts": conflicts,
            "conflict_rate": conflicts / commits if commits else None,
            "claims_lost": sum(d.get("claims_lost", 0) for d in diags),
            "conflicts_by_class": by_class, "per_process": diags}
    pdiags = [r.get("diag") for r in prod_reps]
    trips, loaded = {}, {}
    for side, ds in (("consumers", diags), ("producers", pdiags)):
        if ds and all(d and "round_trips" in d for d in ds):
            trips[side] = sum(d["round_trips"]["total"] for d in ds)
            loaded[side] = _summed(d["round_trips"].get("loads_by_class", {}) for d in ds)
    if len(trips) == 2 and out.get("count"):
        out["round_trips"] = dict(trips, total=trips["consumers"] + trips["producers"],
                                  per_item=(trips["consumers"] + trips["producers"])
                                  / out["count"], loads_by_class=loaded)
    if all(d and "commits" in d for d in pdiags):
        out["producers"] = {"commits": sum(d["commits"] for d in pdiags),
                            "conflicts": sum(d["conflicts"] for d in pdiags),
                            "per_process": pdiags}


def _drain(run, out, errors):
    """Whatever a fresh process still receives (should be nothing), and qsize()."""
    drain = run.spawn("drain", "gdrain")
    try:
        drain.expect("ready", 120)
        rep = drain.expect("done", G_IDLE)
        out["left_in_queue"] = rep["left"]
        out["left_ids"] = rep.get("left_ids")
        out["stop_markers_left"] = rep["stops"]
        if rep.get("qsize") is not None:
            out["qsize_after_drain"] = rep["qsize"]
    except Timeout as exc:
        out["drain_hung"] = str(exc)
        errors.append(f"after the run, get(timeout=0.5) in a fresh process did "
                      f"not return within {G_IDLE:g} s; killed")
        out["error"] = "; ".join(errors)


# --- the child processes --------------------------------------------------------------


def _produce(ad, count, start):
    sys.stdin.readline()                       # "go"
    t0 = time.time()
    cpu0 = process_cpu()
    done, error, tb = 0, None, None
    try:
        for i in range(start, start + count):
            ad.put(make_item(i))
            done += 1
    except Exception as exc:   # noqa: BLE001 - reported: put_ok puts returned
        error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    report(event="done", start=t0, end=time.time(), put_ok=done, error=error,
           traceback=tb, diag=ad.diagnostics(), cpu=process_cpu() - cpu0)


def child_producer(shared_id, location, count, start, *extra):
    in_child(_produce, shared_id, location, int(count), int(start))


def _consume_until_stopped(ad, log, state):
    """get and ack, logging every item, until the stop marker (see _consume)."""
    while True:
        # A queue shared by processes need not deliver in strict FIFO order under
        # contention (ackqueue spreads its choices after a lost claim race), so a stop
        # marker can come before the last items.  Every item was put before the markers,
        # so after its marker a consumer takes what is still ready, waiting at most
        # G_AFTER_STOP for each, and stops when nothing comes.
        h = ad.get(G_GET_TIMEOUT if state["after_stop"] is None else G_AFTER_STOP)
        if h is None:        # reported with what it got, never hidden
            state["timed_out"] = state["after_stop"] is None
            return
        it = ad.item(h)
        if it.get("stop"):
            if state["after_stop"] is not None:
                # another consumer's marker: a fresh one takes its place, behind
                # whatever is still queued, and this one stops
                ad.put({"stop": True})
                ad.ack(h)
                return
            ad.ack(h)
            state["after_stop"] = 0
            continue
        ad.ack(h)
        state["last_ack"] = time.time()
        log.write(f"{it['n']} {state['last_ack']!r}\n")
        log.flush()
        state["got"] += 1
        if state["after_stop"] is not None:
            state["after_stop"] += 1


def _consume(ad, log_path):
    # Every acknowledged item goes to log_path at once ("n time.time()"), so that what a
    # consumer received is known even if it hangs and has to be killed.
    state = {"got": 0, "last_ack": None, "timed_out": False, "after_stop": None}
    error, tb = None, None
    with open(log_path, "w") as log:
        sys.stdin.readline()                   # "go"
        cpu0 = process_cpu()
        try:
            _consume_until_stopped(ad, log, state)
        except Exception as exc:   # noqa: BLE001 - reported with what it got
            error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
    report(event="done", got=state["got"], last_ack=state["last_ack"],
           timed_out=state["timed_out"], error=error, traceback=tb,
           diag=ad.diagnostics(), after_stop=state["after_stop"] or 0,
           cpu=process_cpu() - cpu0)


def child_consumer(shared_id, location, count, start, log_path):
    in_child(_consume, shared_id, location, log_path)


def _drain_queue(ad):
    """After a (g) run: whatever a get() still receives, and what qsize() says."""
    left, stops = [], 0
    while True:
        h = ad.get(0.5)
        if h is None:
            break
        it = ad.item(h)
        ad.ack(h)
        if it.get("stop"):
            stops += 1
        else:
            left.append(it["n"])
    report(event="done", left=len(left), left_ids=left, stops=stops,
           qsize=ad.qsize() if hasattr(ad, "qsize") else None)


def child_drain(shared_id, location, count, start, *extra):
    in_child(_drain_queue, shared_id, location)


# --- the parent: every variant, repetitions interleaved -------------------------------


def _shown(r):
    """One run's result, as printed while the suite runs."""
    if "error" in r:
        shown = "ERROR " + r["error"]
    if "not_delivered" in r:
        shown = ("ERROR; " if "error" in r else "") + (
            f"items/s={fmt(r['metrics']['throughput'])} "
            f"dup={r['duplicates']} missing={r['not_delivered']}")
        if r.get("consumers_timed_out"):
            shown += f" consumers-timed-out={r['consumers_timed_out']}"
        if r.get("qsize_after_drain"):
            shown += f" qsize-after-drain={r['qsize_after_drain']}"
        cpu = r.get("cpu_us_per_item")
        if cpu:
            shown += (f" cpu-us/item parent={fmt(cpu['parent'])} "
                      f"producers={'+'.join(fmt(v) for v in cpu['producers'])} "
                      f"consumers={'+'.join(fmt(v) for v in cpu['consumers'])}")
        if "consumers" in r:
            k = r["consumers"]
            shown += (f" commits={k['commits']} conflicts={k['conflicts']} "
                      f"lost={k['claims_lost']}")
    return shown


def run(args, shared, tmp_root):
    total = shared_counts(args)["g_n"]
    print(f"\n{TITLE}", flush=True)
    started = time.perf_counter()
    chosen = [sc for sc in shared if KEY in sc.scenarios]
    runs = {(p, c, sc.label): [] for p, c in VARIANTS for sc in chosen}
    for rep in range(args.repeat):
        for p, c in VARIANTS:
            for sc in chosen:
                if sc.repeat is not None and rep >= sc.repeat:
                    continue
                r = g_one(sc, p, c, total, tmp_root)
                runs[(p, c, sc.label)].append(r)
                print(f"  [{rep + 1}/{args.repeat}] {p}p+{c}c {sc.label:<18} n={total} "
                      f"{_shown(r)}", flush=True)
    variants = {}
    for p, c in VARIANTS:
        results = {}
        for sc in chosen:
            entry = summarise(runs[(p, c, sc.label)])
            entry["count"] = total
            entry["sharing"] = sc.sharing
            results[sc.label] = entry
        variants[f"{p}p{c}c"] = {"producers": p, "consumers": c, "results": results,
                                 "title": f"{p} producer + {c} consumer processes"}
    socket_floor = unix_socket_round_trip(tmp_root)
    print(f"  floor: a bare Unix-socket round trip between two processes, p50 "
          f"{socket_floor['p50_us']:.0f} µs (p90 {socket_floor['p90_us']:.0f} µs)",
          flush=True)
    return {"title": TITLE, "description": one_line(g_one.__doc__),
            "seconds": time.perf_counter() - started, "variants": variants,
            "floors": {"unix_socket_round_trip": socket_floor}}
