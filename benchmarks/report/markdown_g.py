"""results.md's section of (g): producer and consumer processes on one shared queue."""
import statistics

from benchmarks.common import REFERENCE
from benchmarks.report.text import fmt, fmt_count, problem_lines, ratio
from benchmarks.scenarios.g_processes import G_GET_TIMEOUT


def _totals(sc):
    """Per contender, delivery summed over every run of every variant."""
    summary = {}
    for var in sc["variants"].values():
        for label, entry in var["results"].items():
            t = summary.setdefault(label, {"runs": 0, "items": 0, "dup": 0, "lost": 0,
                                           "lost_runs": 0, "failed": 0, "left": 0})
            for r in entry["runs"]:
                t["runs"] += 1
                t["failed"] += "error" in r
                if "not_delivered" in r:
                    t["items"] += r.get("put_ok", r.get("count", 0))
                    t["dup"] += r["duplicates"]
                    t["lost"] += r["not_delivered"]
                    t["lost_runs"] += r["not_delivered"] > 0
                    t["left"] += r.get("left_in_queue") or 0
    return summary


def _delivery_summary(sc):
    lines = ["Delivery over all runs of (g) (every run, failed ones included):", ""]
    for label, t in _totals(sc).items():
        lines.append(f"- {label}: {t['runs']} run(s); {t['items']:,} items put (put() "
                     f"returned) in the runs that were counted; {t['dup']:,} duplicate "
                     f"deliveries; {t['lost']:,} of those items not delivered to the "
                     f"consumers before they stopped (in {t['lost_runs']} run(s))"
                     + (f", and a fresh process then received {t['left']:,} item(s) "
                        "still in the queue" if t["left"] else "")
                     + f"; {t['failed']} run(s) with an error.")
    lines.append("")
    return lines


def _clean(entry):
    return [r for r in entry["runs"] if "metrics" in r and "error" not in r]


def _counted(entry):
    return [r for r in entry["runs"] if "not_delivered" in r]


def _row(label, entry, ref):
    clean, counted = _clean(entry), _counted(entry)
    med = entry.get("median")
    row = f"| {label} | {entry['count']:,} |"
    if med is None:
        row += " no clean run (see below) | — |"
    else:
        row += (f" {fmt(med['throughput'])} | "
                f"{ratio(med['throughput'], ref and ref.get('throughput'), True)} |")
    k = [r["consumers"] for r in clean if "consumers" in r]
    if k:
        row += (f" {fmt_count(statistics.median(x['commits'] for x in k))} |"
                f" {fmt_count(statistics.median(x['conflicts'] for x in k))} |"
                f" {statistics.median(x['conflict_rate'] for x in k):.1%} |"
                f" {fmt_count(statistics.median(x['claims_lost'] for x in k))} |")
    else:
        row += " — | — | — | — |"

    def each(field):
        return ", ".join(f"{r[field]}" + (" (failed run)" if "error" in r else "")
                         for r in counted) or "—"
    return row + f" {each('duplicates')} | {each('not_delivered')} |"


def variant_table(var):
    """The table of one (g) variant (its title, one row per contender, how to read it)."""
    lines = [f"### {var['title']}", "",
             "| contender | N | items/s end to end | ×pq | consumer commits | conflict "
             "retries | conflict-retry rate | claims lost | duplicates delivered | "
             "not delivered |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ref = var["results"].get(REFERENCE, {}).get("median")
    for label, entry in var["results"].items():
        lines.append(_row(label, entry, ref))
    lines += ["",
              "Commits, conflict retries, rate and claims lost: summed over the "
              "consumer processes of a run, median over the runs without an error "
              "(— where the library exposes no such counter).  Duplicates delivered "
              "and not delivered: every run listed, from the consumers' logs.", ""]
    return lines


def _lost_bits(counted):
    lost = [r["not_delivered"] for r in counted]
    if not any(lost):
        return []
    left = [r.get("left_in_queue") or 0 for r in counted]
    if all(x <= y for x, y in zip(lost, left)):
        return ["items whose put() returned that the consumers did not get "
                f"before they stopped, per run: {lost}; a fresh process "
                f"received {left} afterwards (its items/s counts delivered "
                "items only)"]
    return ["**items whose put() returned were never delivered**, per "
            f"run: {lost} (its items/s counts delivered items only)"]


def _commit_bits(counted):
    bits = []
    k = [r["consumers"] for r in counted if "consumers" in r]
    if k:
        by = {}
        for x in k:
            for c, v in x["conflicts_by_class"].items():
                by[c] = by.get(c, 0) + v
        bits.append("conflict-retry rate per run: " + ", ".join(
            f"{x['conflict_rate']:.1%} ({x['conflicts']}/{x['commits']})" for x in k))
        if by:
            bits.append("conflict retries by class, all runs: " + ", ".join(
                f"{c} {v}" for c, v in sorted(by.items(), key=lambda kv: -kv[1])))
    p = [r["producers"] for r in counted if "producers" in r]
    if p:
        bits.append("producer processes (commits / conflict retries) per run: "
                    + ", ".join(f"{x['commits']}/{x['conflicts']}" for x in p))
    return bits


def _per_run_bits(counted):
    bits = ["items per consumer: " + "; ".join(
        "/".join(str(n) for n in r["per_consumer"]) for r in counted)]
    late = [r.get("received_after_stop") or 0 for r in counted]
    if any(late):
        bits.append("items the consumers received after taking a stop marker "
                    f"(the marker was handed out ahead of them), per run: {late}")
    left = [r.get("left_in_queue") for r in counted]
    if any(left):
        bits.append("items a fresh process still received after the consumers "
                    f"stopped, per run: {left} (item numbers "
                    f"{[r.get('left_ids') for r in counted]}; the consumers "
                    "did not receive "
                    f"{[r.get('not_delivered_ids') for r in counted]})")
    stuck = [r.get("qsize_after_drain") for r in counted]
    if any(stuck):
        bits.append("qsize() after that (messages the queue counts but no get() "
                    f"delivers), per run: {stuck}")
    waited = [r.get("consumers_timed_out", 0) for r in counted]
    if any(waited):
        bits.append(f"consumer processes whose get() returned nothing for "
                    f"{G_GET_TIMEOUT:g} s although the stop markers had been "
                    f"put, per run: {waited}")
    return bits


def _notes(entry):
    """The notes on one contender's runs of one variant."""
    clean, counted = _clean(entry), _counted(entry)
    bits = _lost_bits(counted) + _commit_bits(counted)
    if counted and len(clean) < len(counted):
        bits.append("items/s per run (distinct items acknowledged / time), failed "
                    "runs included: " + ", ".join(
                        fmt(r["metrics"]["throughput"])
                        + (" (failed run)" if "error" in r else "") for r in counted))
    if counted:
        bits += _per_run_bits(counted)
    return bits


def _variant_notes(var):
    spreads, notes = [], []
    for label, entry in var["results"].items():
        clean = _clean(entry)
        if len(clean) > 1:
            vals = [r["metrics"]["throughput"] for r in clean]
            spreads.append(f"{label} {fmt(min(vals))}–{fmt(max(vals))}")
        bits = _notes(entry)
        if bits:
            notes.append(f"- {label}: " + "; ".join(bits) + ".")
    lines = []
    if spreads:
        lines += ["Spread over repetitions (items/s end to end): " + "; ".join(spreads) + ".",
                  ""]
    return lines + notes + ([""] if notes else [])


REMOTE = ("ackqueue (remote)", "ackqueue (remote, ack with next get)")


def _durable_floor(report, kind):
    """items/s the durable request floor of the same run allows one message at a time
    (the service scenario's, service_floor.py), or None when it did not run."""
    durable = (((report or {}).get("scenarios", {}).get("service") or {})
               .get("parts", {}).get("durable", {}))
    return (durable.get(f"{kind} batch 1") or {}).get("median", {}).get("items_per_s")


def _targets(sc, report):
    """The target of (g): the remote drop-in at 2x persist-queue, beside the
    durable request floor of the same run."""
    f_fsync, f_zodb = _durable_floor(report, "fsync"), _durable_floor(report, "zodb")
    f_aio = _durable_floor(report, "aiohttp-zodb")
    lines = ["### Target: the remote drop-in at 2× persist-queue, fsync'd, "
             "0 duplicates", "",
             "The floor columns are the durable request floor of this run (the "
             "(service) section: a bare server answering each request once a group "
             "commit made it durable, 2 durable requests per message; the last on "
             "aiohttp, the service's stack, the others on a bare asyncio.Protocol); "
             "— where (service) did not run.", "",
             "| variant | contender | items/s | needed (2× persist-queue) | met | "
             "floor: append + fsync | floor: FileStorage | floor: aiohttp + FileStorage |",
             "|---|---|---:|---:|---|---:|---:|---:|"]
    for var in sc["variants"].values():
        ref = (var["results"].get(REFERENCE, {}).get("median") or {}).get("throughput")
        for label in REMOTE:
            entry = var["results"].get(label)
            if entry is None:
                continue
            tp = (entry.get("median") or {}).get("throughput")
            dup = sum(r.get("duplicates", 0) for r in _counted(entry))
            need = 2 * ref if ref else None
            met = "—" if tp is None or need is None else (
                "yes" if tp >= need and dup == 0 else "**no**")
            lines.append(f"| {var['title']} | {label} | {fmt(tp)} | {fmt(need)} | {met} | "
                         f"{fmt(f_fsync) if f_fsync else '—'} | "
                         f"{fmt(f_zodb) if f_zodb else '—'} | "
                         f"{fmt(f_aio) if f_aio else '—'} |")
    return lines + [""]


def _round_trip_rows(var):
    """Per contender whose runs counted their round trips to the ZEO server: items/s and
    the median round trips per item (all processes), consumers' and producers'."""
    rows = []
    for label, entry in var["results"].items():
        trips = [r["round_trips"] for r in _clean(entry) if "round_trips" in r]
        if not trips:
            continue
        count = entry["count"]
        tp = (entry.get("median") or {}).get("throughput")
        rows.append(f"| {var['title']} | {label} | {fmt(tp)} | "
                    f"{statistics.median(t['per_item'] for t in trips):.2f} | "
                    f"{statistics.median(t['consumers'] for t in trips) / count:.2f} | "
                    f"{statistics.median(t['producers'] for t in trips) / count:.2f} |")
    return rows


def _load_rows(var):
    """Per contender that counted its round trips: the classes of the objects its
    processes loaded from the server, per item (median over the runs), most first."""
    rows = []
    for label, entry in var["results"].items():
        runs = [r for r in _clean(entry) if "loads_by_class" in r.get("round_trips", {})]
        if not runs:
            continue
        count = entry["count"]
        for side in ("producers", "consumers"):
            names = {name for r in runs for name in r["round_trips"]["loads_by_class"][side]}
            per = {name: statistics.median(r["round_trips"]["loads_by_class"][side]
                                           .get(name, 0) for r in runs) / count
                   for name in names}
            shown = [f"{name.rsplit('.', 1)[-1]} {n:.2f}"
                     for name, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))
                     if n >= 0.01]           # ties by name: the same text every time
            rows.append(f"| {var['title']} | {label} | {side} | "
                        f"{', '.join(shown[:5]) or '—'} |")
    return rows


def _round_trips(sc):
    """Round trips per item through ZEO, beside the service path."""
    rows = [row for var in sc["variants"].values() for row in _round_trip_rows(var)]
    if not rows:
        return []
    loads = [row for var in sc["variants"].values() for row in _load_rows(var)]
    if loads:
        loads = ["", "Objects loaded from the server per item, by class (the loads above: "
                 "an object another process changed is read again, one round trip):", "",
                 "| variant | contender | processes | loads per item |",
                 "|---|---|---|---|"] + loads
    lines = ["### Round trips to the ZEO server per item", "",
             "Counted in each process (calls that wait for the server's answer: a "
             "commit's vote and tpc_finish, loads the cache lacks, prefetches), summed "
             "over the producer and consumer processes of a run, divided by the items; "
             "median over the runs.  The target halves the default's.  The service "
             "path's items/s are in the table above.", "",
             "| variant | contender | items/s | round trips per item | of which "
             "consumers | of which producers |", "|---|---|---:|---:|---:|---:|"]
    return lines + rows + loads + [""]


def markdown_g(sc, report=None):
    lines = [sc["description"], ""] + _delivery_summary(sc)
    for var in sc["variants"].values():
        lines += variant_table(var) + _variant_notes(var)
        lines += problem_lines(var["results"])
    if any(label in var["results"] for var in sc["variants"].values() for label in REMOTE):
        lines += _targets(sc, report)
    return lines + _round_trips(sc)
