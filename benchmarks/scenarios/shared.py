"""What (e) across processes and (g) share: one run's queue, server and children, the
opening of the queue in a child, and the medians over repetitions."""
import os
import shutil
import statistics
import sys
import tempfile
import traceback
import warnings

from benchmarks.children import Child, report


def shared_counts(args):
    """(e) cross-process samples and (g) items: full run, --quick."""
    return {"samples": 50 if args.quick else 200, "g_n": 200 if args.quick else 600}


class SharedRun:
    """The directory, the server (ackqueue), the parent's adapter and the children of one
    cross-process run; close() tears everything down and records how it went."""

    def __init__(self, sc, key, tmp_root):
        self.sc = sc
        self.directory = tempfile.mkdtemp(prefix=f"ackbench-{key}-", dir=tmp_root)
        self.server = None
        self.children = []
        self.ad = None
        self.report = {}
        try:
            self.location, self.server = sc.provision(self.directory)
            self.ad = sc.open(self.location, sc.mode)              # creates the queue
        except BaseException:
            if self.server is not None:
                self.server.stop()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def spawn(self, name, task, count=0, start=0, *extra):
        child = Child(self.directory, name, task, self.sc.id, self.location,
                      count, start, *extra)
        self.children.append(child)
        return child

    def close(self, failed=False):
        codes = {}
        for child in self.children:
            # after a failure a child may wait for what will never come: do not wait long
            codes[child.name] = child.finish(5 if failed else 60)
            tail = child.stderr_tail()
            if tail or codes[child.name] != 0:
                self.report.setdefault("child_stderr", {})[child.name] = tail
        if codes:
            self.report["child_exit_codes"] = codes
        if self.ad is not None:
            try:
                self.ad.close()
            except Exception as exc:   # noqa: BLE001
                self.report["close_error"] = f"{type(exc).__name__}: {exc}"
        if self.server is not None:
            self.report["server"] = self.server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
        return self.report


def record_failure(out, exc):
    """A failed cross-process run: its error and tracebacks go into its result."""
    out["error"] = f"{type(exc).__name__}: {exc}"
    out["traceback"] = traceback.format_exc()
    if getattr(exc, "child_traceback", None):
        out["child_traceback"] = exc.child_traceback


def in_child(body, shared_id, location, *args):
    """Run body(ad, *args) in a child process on the shared queue at location, with the
    adapter of shared contender shared_id; any failure becomes an "error" report."""
    from benchmarks import contenders
    sc = contenders.shared_by_id(shared_id)
    warnings.simplefilter("ignore")
    try:
        ad = sc.open(location, sc.mode)
    except Exception as exc:   # noqa: BLE001
        report(event="error", error=f"open failed: {type(exc).__name__}: {exc}")
        return
    try:
        report(event="ready", pid=os.getpid())
        body(ad, *args)
    except Exception as exc:   # noqa: BLE001
        report(event="error", error=f"{type(exc).__name__}: {exc}",
               traceback=traceback.format_exc())
    finally:
        try:
            ad.close()
        except Exception as exc:   # noqa: BLE001
            sys.stderr.write(f"close failed: {exc!r}\n")


def summarise(runs):
    """Medians over the runs that finished without an error (the others are listed)."""
    ok = [r for r in runs if "metrics" in r and "error" not in r
          and all(v is not None for v in r["metrics"].values())]
    entry = {"runs": runs}
    if ok:
        entry["median"] = {m: statistics.median(r["metrics"][m] for r in ok)
                           for m in ok[0]["metrics"]}
    else:
        entry["error"] = next((r.get("error") for r in runs if r.get("error")), "no result")
    return entry
