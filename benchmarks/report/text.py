"""Formatting shared by the markdown sections."""
import statistics

from benchmarks.common import fmt  # noqa: F401  (re-exported for the sections)


def fmt_count(v):
    """A count (or a median of counts): no decimals unless it has a half."""
    if v is None:
        return "—"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def ratio(v, ref, higher_better):
    if v is None or ref is None or not v or not ref:
        return "—"
    r = v / ref if higher_better else ref / v
    if r < 0.01:
        return f"{r:.1g}×"
    return f"{r:.2f}×" if r < 10 else f"{r:.0f}×" if r >= 100 else f"{r:.1f}×"


def commits_per_item(entry):
    """'x.xx' from the diagnostics of ackqueue runs (commits / items in the run)."""
    vals = [r["diagnostics"]["commits"] / entry["count"] for r in entry["runs"]
            if "commits" in (r.get("diagnostics") or {})]
    if not vals:
        return None
    return f"{statistics.median(vals):.2f} (median over {len(vals)} run(s))"


def _run_problems(r):
    bits = []
    if r.get("error"):
        bits.append(f"error: {r['error']}")
    if r.get("close_error"):
        bits.append(f"close failed: {r['close_error']}")
    bad = {k: v for k, v in (r.get("child_exit_codes") or {}).items() if v != 0}
    if bad:
        bits.append(f"child exit codes {bad}")
    srv = r.get("server")
    if srv and srv.get("exit_code") != 0:
        bits.append(f"server exit code {srv.get('exit_code')}")
    if srv and srv.get("log_error_count"):
        bits.append(f"{srv['log_error_count']} ERROR line(s) in the server log, "
                    f"first: {srv['log_errors'][0][:300]!r}")
    return bits


def problem_lines(results):
    """Everything that went wrong in some run: errors, failed closes, children that did not
    exit cleanly, server exit codes and the WARNING/ERROR lines of the server's log."""
    out = []
    for label, entry in results.items():
        for i, r in enumerate(entry["runs"], 1):
            bits = _run_problems(r)
            if bits:
                out.append(f"- {label}, run {i}: " + "; ".join(bits))
    warned = []
    for label, entry in results.items():
        counts = [(r.get("server") or {}).get("log_warning_count") for r in entry["runs"]]
        if any(counts):
            first = next(w for r in entry["runs"]
                         for w in (r.get("server") or {}).get("log_warnings", []))
            warned.append(f"- {label}: WARNING lines in the server log per run: {counts}; "
                          f"first: {first[:200]!r}")
    lines = []
    if out:
        lines += ["Problems seen:", ""] + out + [""]
    if warned:
        lines += ["Server log warnings (ZEO reports commits queueing for its storage lock):",
                  ""] + warned + [""]
    return lines
