"""results.md: the header, the standing targets, the contenders and one table per scenario.
(f) and (g) have their own sections (markdown_scale.py, markdown_g.py)."""
from benchmarks import floors
from benchmarks.common import LEAN, REFERENCE
from benchmarks.report.markdown_g import markdown_g
from benchmarks.report.markdown_scale import markdown_scale
from benchmarks.report.text import commits_per_item, fmt, problem_lines, ratio
from benchmarks.scenarios import ALL_KEYS, METRICS, SHARED_SCENARIOS, TABLE_COLUMNS

COUNT_KINDS = {"n": "N in (a)–(c)", "batch_n": "N in (d)", "samples": "samples in (e)"}

TARGETS_INTRO = (
    "Targets with durability equal to persist-queue's: ackqueue (fsync), and "
    "ackqueue (zeo) across processes.  **Floor**: the bound that bare one-object "
    "ZODB commits, measured in this run with no ackqueue code "
    "(benchmarks/floors.py), put on the scenario (the most favourable of the "
    "measurements at the start and at the end of the run).  Where the floor is "
    "beyond the target, no change to ackqueue can meet it on this machine while "
    "put and ack return only once committed durably.  A floor counts commits "
    "only, not the CPU a queue spends around them, so a floor that allows a "
    "target does not show that a queue on ZODB can meet it.  The floor of the "
    "0.9× lean targets is the lean queue writing ackqueue's Counters (its counts and "
    "ready-set journal, a second record) in every commit, when it ran "
    "(`--contender lean-counted`): what two records per commit allow at the lean "
    "queue's Python.  ackqueue writes the Counters beside a batch's segments; a put or "
    "an ack of one message writes the Counters alone, one record as the lean queue "
    "writes, so in (a)-(c) it is a comparison, not a bound.  **Lean ZODB queue**: "
    f"what {LEAN} (benchmarks/lean.py: durable puts and acks with group commit "
    "and nothing else ackqueue promises) measured in the same scenario of this "
    "run.  Where even it misses the target, what stands in the way is ZODB "
    "under CPython on this machine, not ackqueue's features.")


def _floor_bits(fl):
    """One phrase per measurement of the floors (start and end of the run)."""
    bits = []
    for when in ("at_start", "at_end"):
        f, z = fl.get("file_" + when) or {}, fl.get("zeo_" + when) or {}
        if "tight_us" in f:
            bits.append(f"{when.replace('_', ' ')}: FileStorage {fmt(f['tight_us'])} µs per "
                        f"commit back to back, p50 {fmt(f['after_pause_p50_ms'])} ms after a "
                        "2-5 ms pause" + (f"; through a server p50 "
                                          f"{fmt(z['after_pause_p50_ms'])} ms after a "
                                          "15-25 ms pause" if "after_pause_p50_ms" in z
                                          else ""))
        for name, r in (("FileStorage", f), ("server", z)):
            if "error" in r:
                bits.append(f"{when.replace('_', ' ')}: {name} floor not measured: "
                            f"{r['error']}")
    return bits


def markdown_targets(report):
    """The standing targets: measured, and the bound the floors of this run put on each."""
    fl = report.get("floors") or {}
    lines = ["## Targets, and the floor under each", "", TARGETS_INTRO, ""]
    lines.append("| target | needed | measured | met | floor | floor allows the target | "
                 "how the floor is derived | lean ZODB queue | lean meets it |")
    lines.append("|---|---:|---:|---|---:|---|---|---:|---|")
    says = {True: "yes", False: "**no**", None: "—"}
    for r in floors.target_rows(report, REFERENCE, lean=LEAN):
        met = says[r["met"]]
        allows = says[floors.meets(r["bound"], r["needed"], r["higher_better"])]
        lean_meets = says[floors.meets(r["lean"], r["needed"], r["higher_better"])]
        lines.append(f"| {r['target']} | {fmt(r['needed'])} | {fmt(r['measured'])} | {met} | "
                     f"{fmt(r['bound'])} | {allows} | {r['bound_says']} | "
                     f"{fmt(r['lean'])} | {lean_meets} |")
    lines.append("")
    bits = _floor_bits(fl)
    if bits:
        lines.append("Bare commits measured " + "; ".join(bits) + ".  (f)'s targets are in "
                     "its own section below.")
        lines.append("")
    return lines


def code_changed_note(info):
    start, end = info.get("ackqueue_git"), info.get("ackqueue_git_at_end")
    same = ("ackqueue_tree", "ackqueue_dir_modified", "ackqueue_diff_sha1")
    if not start or not end or all(start.get(k) == end.get(k) for k in same):
        return ""
    return (f"  **The ackqueue code changed during this run** (git {str(start['commit'])[:10]}"
            f" → {str(end['commit'])[:10]}, or uncommitted changes in ackqueue/): later "
            "scenarios may have run other code than earlier ones.")


def _header(report):
    info = report["machine"]
    lines = ["# ackqueue benchmark results", ""]
    lines.append(f"Run {info['date']} on {info['cpu_count']} CPUs ({info['cpu_model']}), "
                 f"{info['memory_gb']} GB, Python {info['python']}, {info['platform']}; "
                 f"temp files on {info['temp_dir_filesystem']}, where an append + "
                 f"fsync takes {fmt(info['fsync_probe']['p50_ms'])} ms (p50; p99 "
                 f"{fmt(info['fsync_probe']['p99_ms'])} ms).  Load average at start / end: "
                 f"{' '.join(fmt(x) for x in info['loadavg_at_start'])} / "
                 f"{' '.join(fmt(x) for x in info['loadavg_at_end'])}.  Mode: "
                 f"{'quick' if report['args']['quick'] else 'full'}, "
                 f"{report['args']['repeat']} repetition(s) per cell (median shown).  "
                 f"Whole run: {report['total_seconds']:.0f} s.")
    lines.append("")
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) +
                 f"; ackqueue at git {str(info['ackqueue_git']['commit'])[:10]}"
                 + (" (ackqueue/ modified)" if info["ackqueue_git"]["ackqueue_dir_modified"]
                    else "") + "." + code_changed_note(info))
    lines.append("")
    lines.append("Every number below was measured in this run.  **×pq** = advantage over "
                 "persist-queue in the same run (its value ÷ ours for times and latencies, "
                 "ours ÷ its for rates): above 1 is better than persist-queue.")
    lines.append("")
    return lines


def _contenders(report):
    lines = ["## Contenders and their durability", "",
             "| contender | durability |", "|---|---|"]
    for c in report["contenders"]:
        lines.append(f"| {c['label']} | {c['durability']} |")
    lines.append("")
    for c in (c for c in report["contenders"] if c.get("counts")):
        lines.append(f"{c['label']} gets smaller counts in (a)–(d): "
                     + ", ".join(f"{COUNT_KINDS.get(k, k)} at most {v:,}"
                                 for k, v in c["counts"].items())
                     + " (one-item commits through the server are slow); each table shows "
                       "every contender's N.")
        lines.append("")
    if any(k in report["scenarios"] for k in SHARED_SCENARIOS) and \
            report.get("shared_contenders"):
        lines += ["## Contenders across processes ((e) across processes, (g))", "",
                  "| contender | how the processes share the queue |", "|---|---|"]
        for c in report["shared_contenders"]:
            lines.append(f"| {c['label']} | {c['sharing']} |")
        lines.append("")
    return lines


def scenario_table(sc, cols):
    """The table of a table scenario ((a)-(e), (e) across processes): one row per
    contender, each metric beside its ratio to persist-queue."""
    lines = ["| contender | N |" + "".join(f" {name} | ×pq |" for _, name in cols),
             "|---|---:|" + "---:|---:|" * len(cols)]
    ref = sc["results"].get(REFERENCE, {}).get("median")
    for label, entry in sc["results"].items():
        med = entry.get("median")
        row = f"| {label} | {entry['count']:,} |"
        if med is None:
            row += f" error: {entry.get('error')} |" + " |" * (2 * len(cols) - 1)
        else:
            for m, _ in cols:
                row += (f" {fmt(med.get(m))} | "
                        f"{ratio(med.get(m), ref and ref.get(m), METRICS[m][1])} |")
        lines.append(row)
    lines.append("")
    return lines


def _batch_methods(sc):
    lines = ["What each contender used for a batch:", ""]
    for label, entry in sc["results"].items():
        bits = entry.get("batch_method")
        cpi = commits_per_item(entry)
        if cpi:
            bits += f"; ZODB commits made by the process per item (measured): {cpi}"
        lines.append(f"- {label}: {bits}")
    lines.append("")
    return lines


def _spreads(key, sc, cols):
    spread_metric = "p50_ms" if key in ("e", "e_xproc") else cols[-1][0]
    spreads = []
    for label, entry in sc["results"].items():
        ok = [r["metrics"] for r in entry["runs"] if "metrics" in r]
        if len(ok) > 1:
            vals = [r[spread_metric] for r in ok]
            spreads.append(f"{label} {fmt(min(vals))}–{fmt(max(vals))}")
    if not spreads:
        return []
    return [f"Spread over repetitions ({dict(cols)[spread_metric]}): "
            + "; ".join(spreads) + ".", ""]


def notes_e_xproc(sc):
    lines = []
    for label, entry in sc["results"].items():
        bits = []
        order = [r.get("delivered_in_order") for r in entry["runs"] if "metrics" in r]
        if order:
            bits.append("every sample delivered in order" if all(order) else
                        f"items out of order or missing in {order.count(False)} run(s)")
        diag = [r["consumer_diagnostics"] for r in entry["runs"]
                if "commits" in (r.get("consumer_diagnostics") or {})]
        if diag:
            bits.append("consumer process: " + ", ".join(
                f"{d['commits']} commits / {d['conflicts']} conflict retries" for d in diag))
        if bits:
            lines.append(f"- {label} ({len(entry['runs'])} run(s) of {entry['count']} "
                         f"samples): " + "; ".join(bits) + ".")
    return lines + ([""] if lines else [])


def _scenario(key, sc, report):
    """The section of one scenario (its title comes before)."""
    if key == "f":
        a = report["scenarios"].get("a", {}).get("results", {}).get(REFERENCE, {})
        return markdown_scale(sc, (a.get("median") or {}).get("put_rate"))
    if key == "g":
        return markdown_g(sc, report)
    if key == "spark":
        from benchmarks.report.markdown_spark import markdown_spark
        return markdown_spark(sc)
    if key == "service":
        from benchmarks.report.markdown_service import markdown_service
        return markdown_service(sc, report)
    if key == "sqs":
        from benchmarks.report.markdown_sqs import markdown_sqs
        return markdown_sqs(sc)
    cols = TABLE_COLUMNS[key]
    lines = [sc["description"], ""] + scenario_table(sc, cols)
    if key == "d":
        lines += _batch_methods(sc)
    lines += _spreads(key, sc, cols)
    if key == "e_xproc":
        lines += notes_e_xproc(sc)
    return lines + problem_lines(sc["results"])


def markdown(report):
    lines = _header(report) + markdown_targets(report) + _contenders(report)
    for key in ALL_KEYS:
        sc = report["scenarios"].get(key)
        if sc is not None:
            lines += [f"## {sc['title']}", ""] + _scenario(key, sc, report)
    return "\n".join(lines) + "\n"
