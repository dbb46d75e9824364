"""results.md's section of (f): scale."""
from benchmarks.common import REFERENCE
from benchmarks.report.text import fmt, ratio

OURS = "ackqueue (fsync)"

ROWS = [   # (measure, how to read it from a contender's result, higher is better)
    ("fill rate (items/s, in the filling child)", lambda r: r["fill"]["rate"], True),
    ("queue file(s) on disk (MB)", lambda r: r["file_bytes"] / 2**20, False),
    ("open after SIGKILL (s)", lambda r: r["after_kill"]["open_s"], False),
    ("open after clean close (s)", lambda r: r["after_clean_close"]["open_s"], False),
    ("RSS after open + 1 get+ack, big backlog (MB)",
     lambda r: r["after_clean_close"]["rss_mb"], False),
    ("RSS after open + 1 get+ack, after SIGKILL (MB)",
     lambda r: r["after_kill"]["rss_mb"], False),
    ("RSS of the same process before opening (MB)",
     lambda r: r["after_clean_close"]["rss_before_open_mb"], None),
    ("get+ack mean at big backlog (ms)", lambda r: r["after_clean_close"]["mean_ms"], False),
    ("get+ack p99 at big backlog (ms)", lambda r: r["after_clean_close"]["p99_ms"], False),
    ("get+ack mean at small backlog (ms)", lambda r: r["small"]["mean_ms"], False),
    ("get+ack p99 at small backlog (ms)", lambda r: r["small"]["p99_ms"], False),
    ("mean latency big ÷ small backlog", lambda r: r["after_clean_close"]["mean_ms"]
     / r["small"]["mean_ms"], None),
    ("open at small backlog (s)", lambda r: r["small"]["open_s"], False),
]


def scale_table(sc):
    """(f)'s table: one row per measure, one column per contender, ackqueue's ratio."""
    labels = list(sc["results"])
    lines = ["| measure | " + " | ".join(labels) + " | ×pq (ackqueue) |",
             "|---|" + "---:|" * (len(labels) + 1)]
    for name, get, higher in ROWS:
        vals = []
        for label in labels:
            r = sc["results"][label]
            try:
                vals.append(get(r))
            except Exception:   # noqa: BLE001
                vals.append(None)
        ack = vals[labels.index(OURS)] if OURS in labels else None
        ref = vals[labels.index(REFERENCE)] if REFERENCE in labels else None
        rat = "—" if higher is None else ratio(ack, ref, higher)
        lines.append(f"| {name} | " + " | ".join(fmt(v) for v in vals) + f" | {rat} |")
    lines.append("")
    return lines


def _contender_note(label, r):
    if "error" in r:
        return f"- {label}: error: {r['error']}"
    bits = [f"big backlog at the first measurement "
            f"{r['after_clean_close']['backlog']:,}",
            f"small backlog at the first measurement {r['small']['backlog']:,}",
            f"{r['cycles']:,} get+ack cycles per measurement, "
            f"{r['after_clean_close']['runs']} measurement(s) each, medians shown"]
    idx = r.get("index_after_kill")
    if idx is not None:
        if idx.get("exists") and "covers_bytes" in idx:
            bits.append(f"after SIGKILL the .index on disk covered the first "
                        f"{idx['covers_bytes']:,} of {idx['file_bytes']:,} bytes "
                        "(written when the file was created), so the open re-read "
                        "everything after that")
        else:
            bits.append(f"after SIGKILL: .index {idx}")
    if "wal_bytes_after_kill" in r:
        bits.append(f"WAL left by the killed filler: {r['wal_bytes_after_kill'] / 2**20:.1f} MB")
    return f"- {label}: " + "; ".join(bits) + "."


def markdown_scale(sc, put_rate=None):
    lines = [sc["description"], ""] + scale_table(sc)
    for label, r in sc["results"].items():
        lines.append(_contender_note(label, r))
    why = "its public API has no bulk put, one fsync'd commit per put"
    if put_rate:
        why += (f"; at the {fmt(put_rate)} puts/s it did in (a) of this run, "
                f"{sc['count']:,} puts would take {sc['count'] / put_rate / 60:.0f} minutes")
    lines.append("- persist-queue was filled by a direct SQL `INSERT` of rows in its own "
                 f"format into its own table ({why}), then opened and used only through "
                 "its public API.  ackqueue was filled through its public API "
                 "(`with q.transaction():` blocks of 1,000 puts).")
    for label, why in sc["not_measured"].items():
        lines.append(f"- {label}: {why}.")
    lines.append("")
    return lines
