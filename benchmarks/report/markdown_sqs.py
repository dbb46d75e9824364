"""The (sqs) section of results.md."""
from benchmarks.common import fmt


def markdown_sqs(sc):
    lines = [sc["description"], "",
             "| batch | server | messages/s | p50 ms | p99 ms | server CPU | delivered "
             "| vs moto (target) |", "|---|---|---|---|---|---|---|---|"]
    for batch, rs in sc["results"].items():
        for kind, r in rs.items():
            m = r.get("metrics") or {}
            ratio = sc["ratio_vs_moto"].get(batch) if kind == "ackqueue" else None
            target = sc["targets"].get(batch)
            lines.append(
                f"| {batch} | {kind} | {fmt(m.get('throughput'))} | {fmt(m.get('p50_ms'))} "
                f"| {fmt(m.get('p99_ms'))} | {fmt(m.get('server_cpu'))} "
                f"| {r.get('delivered', '—')}/{r.get('sent', '—')} "
                f"| {fmt(ratio) + 'x (' + str(target) + 'x)' if ratio else '—'} |"
                + (f" ERROR: {r['error'][:200]}" if r.get("error") else ""))
    lines.append("")
    lines.append("ackqueue's share of the floor (the same boto3 processes against a bare "
                 "in-memory aiohttp SQS): " + ", ".join(
                     f"batch {b}: {fmt(v)}" for b, v in sc.get("share_of_floor", {}).items()))
    return lines + [""]
