"""results.md's section of (spark): messages/s per batch size, its target, floors."""

SOURCE, FILE = "ackqueue source", "JSON file source"


def _cell(r):
    if r is None:
        return "—"
    if "error" in r:
        return f"failed: {r['error'][:60]}"
    return f"{r['rate']:,.0f}" if r.get("rate") else "—"


def markdown_spark(sc):
    lines = [sc["description"], ""]
    if "error" in sc:
        lines += [f"The run failed: `{sc['error']}`", ""]
    res = sc.get("results", {})
    batches = list(res)
    if not batches:
        return lines
    names = [k for k in res[batches[0]] if isinstance(res[batches[0]][k], dict)
             and ("rate" in res[batches[0]][k] or "error" in res[batches[0]][k])]
    lines += ["| messages/s (rows / summed batch time) | "
              + " | ".join(f"batches of {b}" for b in batches) + " |",
              "|---|" + "---:|" * len(batches)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_cell(res[b].get(name)) for b in batches)
                     + " |")
    lines.append("")
    for b in batches:
        src, ref = res[b].get(SOURCE) or {}, res[b].get(FILE) or {}
        if src.get("rate") and ref.get("rate"):
            ratio = ref["rate"] / src["rate"]
            met = "met" if ratio <= 2 else "missed"
            lines.append(f"- batches of {b}: the file source is {ratio:.2f}x the queue "
                         f"source per message (target: at most 2x): {met}; the queue was "
                         f"left with {res[b].get('ackqueue source left')}, the sink queue "
                         f"holds {res[b].get('ackqueue sink holds')} rows.")
    return lines + [""]
