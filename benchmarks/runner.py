"""Side-by-side benchmark of ackqueue against its peers.

Run from the repository root:

    python -m pip install -e ".[bench]"
    python -m benchmarks                      # the full suite (10-14 minutes here)
    python -m benchmarks --quick              # a smoke run (about two minutes)
    python -m benchmarks --scenario b,e --contender ackqueue,persist-queue --out /tmp/res
    python -m benchmarks --report             # the docs' current run from results.json

Every contender is measured in the same run, with the same item (a ~100-byte dict), each
(contender, scenario, repetition) in a fresh temporary directory.  Results go to
<out>/results.json (raw numbers and machine info), <out>/results.md (tables with ratios
against persist-queue) and <out>/results.png (a log-scale bar chart).  Nothing here is a
test: no number is asserted.  ``--report`` runs nothing: it writes the recorded run into the
docs' marked blocks (report/current.py).

Adding a contender is one adapter module in benchmarks/contenders/ and one line in its
registry (benchmarks/contenders/__init__.py).
"""
import argparse
import os
import pickle
import shutil
import sys
import tempfile
import textwrap
import time

from benchmarks import contenders as registry
from benchmarks import floors
from benchmarks.common import fmt, make_item
from benchmarks.scenarios import ALL_KEYS, TABLE


def parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill("contender ids: " + ", ".join(registry.all_ids())
                             + " (a display label such as 'ackqueue (zeo)' works too)",
                             width=78, break_on_hyphens=False))
    p.add_argument("--quick", action="store_true", help="small counts, a ~1 minute smoke run")
    p.add_argument("--scenario", "--scenarios", dest="scenarios", default=",".join(ALL_KEYS),
                   help=f"comma-separated subset of {','.join(ALL_KEYS)}")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"),
                   help="where results.json, results.md and results.png go "
                        "(default: benchmarks/results)")
    p.add_argument("--repeat", type=int, default=None,
                   help="repetitions per (scenario, contender); median reported "
                        "(default 3, --quick 1)")
    p.add_argument("--fill-count", type=int, default=None,
                   help="messages for (f) (default 1,000,000; --quick 50,000)")
    p.add_argument("--tmpdir", default=None,
                   help="where the fresh queue directories go (default: the system temp "
                        "dir; must not be tmpfs, where fsync costs nothing)")
    p.add_argument("--contender", "--contenders", dest="contenders", default=None,
                   help="comma-separated contender ids (or labels) to keep (default: all); "
                        "they also pick the contenders of (e) across processes, (f) and (g)")
    p.add_argument("--report", action="store_true",
                   help="run nothing: make the marked blocks of the --into files anew from "
                        "the run recorded in --out (its results.json)")
    p.add_argument("--into", action="append", default=None, metavar="FILE",
                   help="with --report, a file to update (repeatable; default: "
                        "docs/benchmarks.md and README.md); a file without markers is "
                        "left alone")
    p.add_argument("--check", action="store_true",
                   help="with --report, write nothing and exit 1 if a file would change")
    return p


def report_only(args):
    """--report: the docs' blocks from the recorded results; 1 if --check finds drift."""
    from benchmarks.report.current import update_files
    paths = args.into or [os.path.join("docs", "benchmarks.md"), "README.md"]
    try:
        done = update_files(os.path.join(args.out, "results.json"), paths, args.check)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, what in done:
        print(f"{path}: {what}")
    return 1 if any(what == "would change" for _, what in done) else 0


def parse(argv):
    """(args, scenario keys, contenders, shared contenders), or exit with a usage error."""
    p = parser()
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ALL_KEYS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {ALL_KEYS}")
    names = [n.strip() for n in args.contenders.split(",")] if args.contenders else None
    try:
        contenders, shared = registry.select(names)
    except ValueError as exc:
        p.error(str(exc))
    return args, keys, contenders, shared


def measure_floors(out, when, args, tmp_root, with_zeo):
    """Bare ZODB commits (benchmarks/floors.py) into out["file_" + when] and, when the
    run has (e) across processes through a server, out["zeo_" + when]."""
    quick = args.quick
    print(f"\nfloors {when.replace('_', ' ')}: bare one-object ZODB commits", flush=True)
    try:
        r = out["file_" + when] = floors.measure_file_floors(
            tmp_root, commits=200 if quick else 1000, samples=60 if quick else 300)
        print(f"  FileStorage: {fmt(r['tight_us'])} µs back to back, p50 "
              f"{fmt(r['after_pause_p50_ms'])} ms after a 2-5 ms pause", flush=True)
    except Exception as exc:   # noqa: BLE001
        out["file_" + when] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  FileStorage: ERROR {exc!r}", flush=True)
    if with_zeo:
        measure_zeo_floor(out, when, quick, tmp_root)


def measure_zeo_floor(out, when, quick, tmp_root):
    from benchmarks.contenders.zeo import ZeoServer
    directory = tempfile.mkdtemp(prefix="ackbench-floor-zeo-", dir=tmp_root)
    server = None
    try:
        server = ZeoServer(directory)
        r = out["zeo_" + when] = floors.zeo_commit_after_pause(
            server.url, samples=40 if quick else 150)
        print(f"  through the server: p50 {fmt(r['after_pause_p50_ms'])} ms after a "
              "15-25 ms pause", flush=True)
    except Exception as exc:   # noqa: BLE001
        out["zeo_" + when] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  through the server: ERROR {exc!r}", flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def new_report(args, contenders, shared, tmp_root):
    from benchmarks.machine import machine_info
    return {"args": vars(args), "machine": machine_info(tmp_root),
            "item": {"example": make_item(0),
                     "pickled_bytes": len(pickle.dumps(make_item(0), protocol=5))},
            "contenders": [{"label": c.label, "durability": c.durability,
                            "counts": c.counts} for c in contenders],
            "shared_contenders": [{"label": c.label, "family": c.family, "mode": c.mode,
                                   "sharing": c.sharing, "scenarios": list(c.scenarios)}
                                  for c in shared],
            "scenarios": {}}


def run_scenarios(report, keys, contenders, shared, args, tmp_root):
    from benchmarks.scenarios import e_xproc, f_scale, g_processes, service, table
    table_keys = [k for k in keys if k in TABLE]
    report["scenarios"].update(table.run_table_scenarios(table_keys, contenders, args,
                                                         tmp_root))
    for key in keys:
        if key == "e_xproc":
            report["scenarios"]["e_xproc"] = e_xproc.run(args, shared, tmp_root)
        elif key == "g":
            report["scenarios"]["g"] = g_processes.run(args, shared, tmp_root)
        elif key == "service":
            report["scenarios"]["service"] = service.run(args, shared, tmp_root)
        elif key == "f":
            report["scenarios"]["f"] = f_scale.run(args, contenders, tmp_root)
        elif key == "sqs":
            from benchmarks.scenarios import sqs
            report["scenarios"]["sqs"] = sqs.run(args, shared, tmp_root)
        elif key == "spark":
            from benchmarks.scenarios import spark
            report["scenarios"]["spark"] = spark.run(args, shared, tmp_root)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        from benchmarks.child_tasks import child_main
        child_main(argv[1:])
        return 0
    args, keys, contenders, shared = parse(argv)
    if args.report:
        return report_only(args)
    tmp_root = args.tmpdir or tempfile.gettempdir()
    started = time.perf_counter()
    report = new_report(args, contenders, shared, tmp_root)
    print(f"ackqueue benchmarks: {len(contenders)} contenders, scenarios {keys}, "
          f"repeat {args.repeat}, temp dir {tmp_root} "
          f"({report['machine']['temp_dir_filesystem']})", flush=True)
    with_zeo = any(c.label == "ackqueue (zeo)" for c in shared) and "e_xproc" in keys
    report["floors"] = {}
    measure_floors(report["floors"], "at_start", args, tmp_root, with_zeo)
    run_scenarios(report, keys, contenders, shared, args, tmp_root)
    measure_floors(report["floors"], "at_end", args, tmp_root, with_zeo)
    from benchmarks.machine import git_state
    report["total_seconds"] = time.perf_counter() - started
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    report["machine"]["ackqueue_git_at_end"] = git_state()
    from benchmarks import report as output
    written = output.write(report, args.out)
    print(f"\nwrote {args.out}/" + ", ".join(written)
          + f" in {report['total_seconds']:.0f} s total", flush=True)
    return 0
