"""results.md's section of (service): the four parts, its targets and the floors."""
from benchmarks.common import REFERENCE
from benchmarks.report.text import fmt

ZEO = "ackqueue (zeo)"
SERVICE = "ackqueue (service)"
DURABLE_LABELS = {"fsync": "bare asyncio.Protocol + group-committed append + fsync",
                  "zodb": "bare asyncio.Protocol + group-committed FileStorage commit",
                  "aiohttp-zodb": "aiohttp (the service's stack) + group-committed "
                                  "FileStorage commit"}
FLOOR_LABELS = {"protocol": "bare asyncio.Protocol server",
                "aiohttp": "bare aiohttp app (GET → small body)",
                "service": "ackqueue serve, GET /health (the whole app, no store)"}


def _m(entry, metric):
    return (entry or {}).get("median", {}).get(metric)


def _spread(entry, metric, scale=1.0):
    s = (entry or {}).get("spread", {}).get(metric)
    return f"{fmt(s[0] * scale)}–{fmt(s[1] * scale)}" if s else "—"


def _pct(v):
    return "—" if v is None else f"{v * 100:.1f}%"


def _runs(entry):
    return len((entry or {}).get("runs", []))


def _integrity(entry):
    bad = [r for r in (entry or {}).get("runs", []) if r.get("error")
           or r.get("duplicates") or r.get("not_delivered")]
    if not bad:
        return "all delivered once"
    return "; ".join(str(r.get("error") or f"dup {r.get('duplicates')} missing "
                         f"{r.get('not_delivered')}") for r in bad)


def _process_table(results, ref, zeo):
    lines = ["| contender | N | items/s | spread | ×zeo | ×pq | p50 ms put→receive | "
             "p99 ms | server CPU (cores) | runs | delivery |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for label, e in results.items():
        tp = _m(e, "throughput")
        n = e["runs"][0].get("count") if e.get("runs") else None
        vs = lambda other: fmt(tp / other) if tp and other else "—"  # noqa: E731
        cpu = _m(e, "server_cpu")
        lines.append(f"| {label} | {fmt(n)} | {fmt(tp)} | {_spread(e, 'throughput')} | "
                     f"{vs(zeo)} | {vs(ref)} | {fmt(_m(e, 'p50_ms'))} | "
                     f"{fmt(_m(e, 'p99_ms'))} | {fmt(cpu) if cpu is not None else '—'} | "
                     f"{_runs(e)} | {_integrity(e)} |")
    return lines + [""]


def _polls_table(polls, c):
    lines = [f"### {c['polls']} idle long polls, a sender putting 1 message/s for "
             f"{c['poll_seconds']} s", "",
             "| server CPU (share of one core) | spread | messages that reached a poll | "
             "p50 ms put→poll | p99 ms | server threads | runs |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for label, e in polls.items():
        runs = e.get("runs", [])
        reached = ", ".join(f"{r.get('reached')}/{len(r.get('sent', []))}" for r in runs)
        threads = ", ".join(str(r.get("threads_after")) for r in runs)
        lines.append(f"| {_pct(_m(e, 'server_cpu'))} | "
                     f"{_spread(e, 'server_cpu', 100)} % | {reached} | "
                     f"{fmt(_m(e, 'p50_ms'))} | {fmt(_m(e, 'p99_ms'))} | {threads} | "
                     f"{len(runs)} |")
    return lines


def _floor_table(floor, c):
    lines = ["", "### The request floor of the stack (no storage work)", "",
             f"{4} client processes, each one keep-alive connection (ackqueue.remote.http) sending "
             f"sequential GETs for {c['floor_seconds']} s.", "",
             "| server | requests/s | spread | server CPU (cores) | runs |",
             "|---|---:|---|---:|---:|"]
    for kind, e in floor.items():
        lines.append(f"| {FLOOR_LABELS.get(kind, kind)} | {fmt(_m(e, 'rps'))} | "
                     f"{_spread(e, 'rps')} | {fmt(_m(e, 'server_cpu'))} | {_runs(e)} |")
    return lines


def _durable_table(durable, c):
    if not durable:
        return []
    lines = ["", "### The durable request floor (no queue: HTTP plus a group commit)", "",
             f"{4} client processes, each one keep-alive connection (ackqueue.remote.http) "
             f"sending sequential POSTs for {c['floor_seconds']} s, each answered only once a "
             "group commit made its body durable (one pickled item, or 10 in frames); "
             "items/s = requests/s × items per request ÷ 2 (a put and a receive "
             "carrying its ack per message).", "",
             "| server | items per request | durable requests/s | items/s allowed | "
             "spread | server CPU (cores) | runs |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for key, e in durable.items():
        kind, _, per = key.partition(" batch ")
        lines.append(f"| {DURABLE_LABELS.get(kind, kind)} | {per} | "
                     f"{fmt(_m(e, 'rps'))} | {fmt(_m(e, 'items_per_s'))} | "
                     f"{_spread(e, 'items_per_s')} | {fmt(_m(e, 'server_cpu'))} | "
                     f"{_runs(e)} |")
    return lines


SAYS = {True: "yes", False: "**no**", None: "—"}
TARGETS_HEAD = [
    "", "### The service's targets (fsync'd commits), and the floor under each", "",
    "The floor bound is what the request rate alone allows, with no storage "
    "work: one message at a time costs 2 requests per message (a put, and a "
    "receive carrying the previous ack), a batch of 10 costs 2 requests per 10 "
    "messages.  It is given for the service's own app (GET /health through "
    "the middleware), a bare aiohttp app, and a bare asyncio.Protocol server.",
    "",
    "The durable bounds add the storage: the durable request floor above, "
    "with a group-committed append + fsync and with a group-committed "
    "FileStorage commit, on a bare asyncio.Protocol server and on aiohttp "
    "(no queue work in any of them).",
    "",
    "| target | needed | measured | met | bound: service app | bare aiohttp | "
    "bare asyncio | durable: fsync | durable: FileStorage | "
    "durable: aiohttp + FileStorage |",
    "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]


def _met(v, need, higher=True):
    if v is None or need is None:
        return None
    return v >= need if higher else v < need


def _bound(rps, per):
    return f"{fmt(rps * per)}" if rps else "—"


def _or_dash(v):
    return fmt(v) if v else "—"


def _targets_table(parts, c, zeo, ref, svc):
    """The service's targets, what was measured, and the bound each floor puts on it."""
    batch, polls, floor = (parts.get(k, {}) for k in ("batch", "polls", "floor"))
    durable = parts.get("durable", {})
    f_app, f_bare = _m(floor.get("service"), "rps"), _m(floor.get("aiohttp"), "rps")
    f_proto = _m(floor.get("protocol"), "rps")
    b = _m(batch.get(SERVICE), "throughput")
    pcpu = _m(polls.get(SERVICE), "server_cpu")
    lines = list(TARGETS_HEAD)
    rows = [("one at a time, ≥10× ackqueue (zeo)", zeo and 10 * zeo, svc, True, 0.5, 1),
            ("one at a time, ≥2× persist-queue", ref and 2 * ref, svc, True, 0.5, 1),
            ("batches of 10, full cycle", 10000, b, True, 5, 10)]
    for name, need, v, hi, per, batch_of in rows:
        d_fsync = _m(durable.get(f"fsync batch {batch_of}"), "items_per_s")
        d_zodb = _m(durable.get(f"zodb batch {batch_of}"), "items_per_s")
        d_aio = _m(durable.get(f"aiohttp-zodb batch {batch_of}"), "items_per_s")
        lines.append(f"| {name} (items/s) | {fmt(need)} | {fmt(v)} | "
                     f"{SAYS[_met(v, need, hi)]} | {_bound(f_app, per)} | "
                     f"{_bound(f_bare, per)} | {_bound(f_proto, per)} | "
                     f"{_or_dash(d_fsync)} | {_or_dash(d_zodb)} | {_or_dash(d_aio)} |")
    lines.append(f"| {c['polls']} idle long polls (share of a core) | < 5% | {_pct(pcpu)} | "
                 f"{SAYS[_met(pcpu, 0.05, False)]} | — | — | — | — | — | — |")
    return lines


def _headline(parts):
    """(ackqueue (zeo), persist-queue, the service): items/s one message at a time."""
    one = parts.get("one", {})
    return tuple(_m(one.get(label), "throughput") for label in (ZEO, REFERENCE, SERVICE))


def process_tables(sc):
    """The tables of the processes through the service: one at a time, then batches."""
    parts = sc["parts"]
    zeo, ref, _ = _headline(parts)
    lines = ["### 2 producer + 2 consumer processes, one message at a time", ""]
    lines += _process_table(parts.get("one", {}), ref, zeo)
    lines += ["### The same through the service in batches of 10", "",
              "Batch put of 10 frames (one commit), receive max=10 in frames, the 10 "
              "acks riding on the next receive.", ""]
    return lines + _process_table(parts.get("batch", {}), None, None)


def targets_table(sc):
    """The service's targets beside the measured rates and the floors' bounds."""
    return _targets_table(sc["parts"], sc["counts"], *_headline(sc["parts"]))


def markdown_service(sc, report=None):
    """The section of (service): its four parts' tables, then its targets."""
    parts, c = sc["parts"], sc["counts"]
    lines = [sc["description"], ""] + process_tables(sc)
    lines += _polls_table(parts.get("polls", {}), c)
    lines += _floor_table(parts.get("floor", {}), c)
    lines += _durable_table(parts.get("durable", {}), c)
    return lines + targets_table(sc) + [""]
