"""What one put, get and ack costs ackqueue itself, beside the lean ZODB queue.

For each of ackqueue (fsync), the lean queue (benchmarks/lean.py), the lean queue writing
ackqueue's Counters in every commit (lean.py, counted=True) and ackqueue's floor
(benchmarks/contenders/ackqueue_floor.py), and with --cpu and --instructions the lean
queue keeping what ackqueue's guarantees add per message (lean.py, guarded=True), and
with --instructions that queue writing the Counters too (lean-guarantees), in one
thread on a fresh file: N puts, then N get+acks one at a time (scenario (a)), then the
same in batches of 100 (scenario (d)).  It reports, per phase:

- records per commit, bytes per commit and the classes written, read back from the .fs
  with ZODB's FileStorage iterator (what the storage really stored);
- Python function calls per item (cProfile's count, profiler on, in the calling thread
  only; a measure of frames, not of time), and the top functions by own time with --top.

With --instructions it counts instead the instructions each of those contenders runs per
item (valgrind's cachegrind, which must be installed; no fsync, as --cpu): one child
process per contender, phase and size, each counted whole, and the per-item figure taken
from differences of runs that share their setup (put: two sizes of the put phase; get+ack:
the put phase with and without the get+ack phase after it; the batch phases likewise).
Unlike CPU time it does not depend on the machine's load: on this 2-core shared machine
two counts of one tree differ by about 0.5%, where CPU times of one tree differ by 10-30%.
That makes it the tool to tell whether a change of a few microseconds per operation took
work out of the hot path; it says nothing about waiting (fsync, locks, thread switches).
It also counts scenario (c), 4 producer and 4 consumer threads (the difference of two runs
of two sizes, valgrind handing the CPU round as a scheduler would), with the commits per
item it made: there several threads' operations share each commit, so what an operation
costs outside the commit weighs more than in one thread, and costs that grow with the
number of threads show.

With --cpu it measures instead the CPU time (user + system, of the whole process) per item
of the same phases without fsync (ackqueue with durability="os", the lean queue and the
floor on the same OS-durable FileStorage), in --reps rounds that each run every contender
once on a fresh file, in turn: the least and the median per contender, and the lean
queue's CPU over each one's, the median of the rounds' ratios.  That is what each spends
around the disk, less sensitive to the disk and to the machine's load than rates.

    python -m benchmarks.own_cost [--n 400] [--top 15]
    python -m benchmarks.own_cost --cpu [--n 3000] [--reps 3]
    python -m benchmarks.own_cost --instructions [--n 900]
"""
import argparse
import collections
import cProfile
import os
import pstats
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ZODB.FileStorage import FileStorage
from ZODB.utils import get_pickle_metadata

from benchmarks.common import make_item


def _transactions(path):
    """[(records, bytes, Counter of class names)] for every transaction of the file."""
    storage = FileStorage(path, read_only=True)
    out = []
    try:
        for txn in storage.iterator():
            classes, size, count = collections.Counter(), 0, 0
            for rec in txn:
                if rec.data is None:
                    continue
                module, name = get_pickle_metadata(rec.data)
                classes[name] += 1
                size += len(rec.data)
                count += 1
            out.append((count, size, classes))
    finally:
        storage.close()
    return out


class _Ack:
    """ackqueue.AckQueue on a file, driven as the suite's adapter drives it."""

    label = "ackqueue (fsync)"

    def __init__(self, path):
        from ackqueue import AckQueue
        self.q = AckQueue(path=path)

    def put(self, item):
        self.q.put(item)

    def get_ack(self):
        self.q.ack(self.q.get(timeout=30))

    def get(self, timeout):                 # get and ack: scenario (c)'s adapter calls
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def ack(self, handle):
        self.q.ack(handle)

    def commits(self):
        return self.q._database.committer.commits     # private: a diagnostic only

    def put_batch(self, items):
        self.q.put_many(items)

    def get_ack_batch(self, n):
        got = []
        while len(got) < n:
            got.extend(self.q.get_many(n - len(got), timeout=30))
        self.q.ack_many(got)

    def close(self):
        self.q.close()


class _Floor(_Ack):
    """ackqueue with the ready-set and counter writes off (benchmarks/contenders/
    ackqueue_floor.py): what is left when a commit writes the message segment alone."""

    label = "ackqueue, no ready/counter writes (floor)"
    file_name = "queue.fs"      # where the suite's adapter puts it

    def __init__(self, path):
        from benchmarks.contenders.ackqueue_floor import FloorAdapter
        self._adapter = FloorAdapter(os.path.dirname(path))
        self.q = self._adapter.q

    def close(self):
        self._adapter.close()


class _Lean:
    label = "ZODB lean (reference)"
    counted = False
    guarded = False

    def __init__(self, path):
        from benchmarks.lean import LeanZodbQueue
        self.q = LeanZodbQueue(path, counted=self.counted, guarded=self.guarded)

    def put(self, item):
        self.q.put(item)

    def get_ack(self):
        self.q.ack(self.q.get(30))

    def get(self, timeout):
        return self.q.get(timeout)

    def ack(self, handle):
        self.q.ack(handle)

    def commits(self):
        return self.q.commits

    def put_batch(self, items):
        self.q.put_many(items)

    def get_ack_batch(self, n):
        got = []
        while len(got) < n:
            got.extend(self.q.get_many(n - len(got), 30))
        self.q.ack_many(got)

    def close(self):
        self.q.close()


class _LeanCounted(_Lean):
    """The lean queue writing ackqueue's Counters in every commit (lean.py, counted)."""

    label = "ZODB lean + Counters (floor)"
    counted = True


def _phases(q, n, batch=100):
    items = [make_item(i) for i in range(n)]
    yield "put", n, lambda: [q.put(it) for it in items]
    yield "get+ack", n, lambda: [q.get_ack() for _ in range(n)]
    chunks = [items[i:i + batch] for i in range(0, n, batch)]
    yield f"put_many({batch})", n, lambda: [q.put_batch(c) for c in chunks]
    yield f"get_many+ack_many({batch})", n, lambda: [q.get_ack_batch(len(c)) for c in chunks]


def measure(kind, n, top):
    """{phase: {...}} for one contender on a fresh file."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("OWN_COST_TMP")) as d:
        path = os.path.join(d, getattr(kind, "file_name", "q.fs"))
        q = kind(path)
        results, marks = {}, []
        for phase, count, run in _phases(q, n):
            start = len(_transactions_live(path))
            prof = cProfile.Profile()
            prof.enable()
            run()
            prof.disable()
            stats = pstats.Stats(prof)
            marks.append((phase, count, start, stats))
        q.close()
        txns = _transactions(path)
        ends = [m[2] for m in marks[1:]] + [len(txns)]
        for (phase, count, start, stats), end in zip(marks, ends):
            phase_txns = txns[start:end]
            classes = collections.Counter()
            for _, _, c in phase_txns:
                classes.update(c)
            commits = max(1, len(phase_txns))
            results[phase] = {
                "commits": len(phase_txns),
                "records_per_commit": sum(t[0] for t in phase_txns) / commits,
                "bytes_per_commit": sum(t[1] for t in phase_txns) / commits,
                "classes_per_commit": {k: round(v / commits, 2)
                                       for k, v in classes.most_common()},
                "calls_per_item": stats.total_calls / count,
                "top": _top(stats, top),
            }
    return results


def _transactions_live(path):
    """Transactions so far, read while the queue holds the file (a read-only second
    FileStorage on the same file reads what is committed)."""
    return _transactions(path)


def _top(stats, top):
    if not top:
        return []
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [(f"{os.path.basename(f)}:{line}({name})", nc, round(tt * 1e3, 1))
            for (f, line, name), (cc, nc, tt, ct, callers) in rows]


class _AckOS(_Ack):
    label = "ackqueue (durability os)"

    def __init__(self, path):
        from ackqueue import AckQueue
        self.q = AckQueue(path=path, durability="os")


class _LeanOS(_Lean):
    """The lean queue on a FileStorage that commits as ackqueue's durability="os" does
    (its _finish_finish: the same commit, without the fsync)."""

    label = "ZODB lean (no fsync)"

    def __init__(self, path):
        from benchmarks import lean

        class NoFsync(FileStorage):         # not ackqueue's storage: FileStorage's own
            def _finish_finish(self, tid):  # FileStorage's, without its fsync
                self._file.flush()
                self._pos = self._nextpos
                self._index.update(self._tindex)
                self._ltid = tid
                self._blob_tpc_finish()

        real = lean.FileStorage
        lean.FileStorage = NoFsync
        try:
            super().__init__(path)
        finally:
            lean.FileStorage = real


class _LeanCountedOS(_LeanOS):
    label = "ZODB lean + Counters (no fsync)"
    counted = True


class _LeanGuardedOS(_LeanOS):
    label = "ZODB lean + delivery records (no fsync)"
    guarded = True


class _LeanGuaranteesOS(_LeanOS):
    """Both floors at once (lean.py, guarded and counted; the suite's lean-guarantees,
    here on FileStorage without fsync as the other lean queues of --instructions)."""

    label = "ZODB lean + records + Counters (no fsync)"
    counted = True
    guarded = True


class _FloorOS(_Floor):
    label = "floor (durability os)"

    def __init__(self, path):
        from benchmarks.contenders.ackqueue_floor import FloorAdapter
        self._adapter = FloorAdapter(os.path.dirname(path), durability="os")
        self.q = self._adapter.q


def cpu_once(kind, n):
    """{phase: CPU seconds per item} of one fresh run of one contender."""
    out = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("OWN_COST_TMP")) as d:
        q = kind(os.path.join(d, getattr(kind, "file_name", "q.fs")))
        try:
            for phase, count, run in _phases(q, n):
                start = time.process_time()
                run()
                out[phase] = (time.process_time() - start) / count
        finally:
            q.close()
    return out


def cpu(kinds, n, reps):
    """{kind: {phase: [CPU seconds per item of each rep]}}: reps rounds, each running
    every contender once in turn, so that a slow spell of a shared machine falls on all
    of them alike instead of on whichever ran then."""
    out = {kind: collections.defaultdict(list) for kind in kinds}
    for _ in range(reps):
        for kind in kinds:
            for phase, seconds in cpu_once(kind, n).items():
                out[kind][phase].append(seconds)
    return out


# --instructions: each phase that fills a queue, and the phase that empties it after.
_PAIRS = (("put", "get+ack"), ("put_many(100)", "get_many+ack_many(100)"))
_INSTRUCTION_KINDS = {"ackqueue": _AckOS, "lean": _LeanOS, "lean-counted": _LeanCountedOS,
                      "lean-guarded": _LeanGuardedOS, "lean-guarantees": _LeanGuaranteesOS}


THREADS = "(c) 4+4 threads"     # the phase of --instructions that runs scenario (c)
THREADS_WARM_UP = 50            # put+get+acks before it, in one thread


def _child(kind_name, phases, n):
    """Run the given phases of one contender on a fresh file (a child process of
    --instructions, counted by cachegrind from start to end).  The phase THREADS runs
    scenario (c) over n items and prints the commits it made."""
    kind = _INSTRUCTION_KINDS[kind_name]
    with tempfile.TemporaryDirectory(dir=os.environ.get("OWN_COST_TMP")) as d:
        q = kind(os.path.join(d, getattr(kind, "file_name", "q.fs")))
        try:
            if THREADS in phases:
                from benchmarks.scenarios import c_threads
                for i in range(THREADS_WARM_UP):
                    q.put(make_item(i))
                    q.get_ack()
                before = q.commits()
                c_threads.run(q, n)
                print(f"commits {q.commits() - before}")
            for phase, _, run in _phases(q, n):
                if phase in phases:
                    run()
        finally:
            q.close()


def _count(kind_name, phases, n):
    """(instructions that one child run executes (valgrind's cachegrind, I refs), the
    commits it printed or None).  Valgrind runs one thread at a time; for THREADS it hands
    the CPU round (--fair-sched) as a real scheduler would, not in long slices to one."""
    fair = ["--fair-sched=yes"] if THREADS in phases else []
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", *fair,
           "--cachegrind-out-file=/dev/null", sys.executable, "-m", "benchmarks.own_cost",
           "--child", kind_name, ",".join(phases), str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    commits = re.search(r"^commits (\d+)$", out.stdout, re.M)
    return (int(found.group(1).replace(",", "")),
            None if commits is None else int(commits.group(1)))


def instructions(n, names=tuple(_INSTRUCTION_KINDS)):
    """({contender: {phase: instructions per item}}, {contender: commits per item in
    THREADS}) (see the module docstring)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (e.g. apt-get install valgrind)")
    small = max(n // 3, 100)
    out, grouping = {}, {}
    for name in names:
        res = out[name] = {}
        for first, second in _PAIRS:
            alone_small, _ = _count(name, (first,), small)
            alone, _ = _count(name, (first,), n)
            both, _ = _count(name, (first, second), n)
            res[first] = (alone - alone_small) / (n - small)
            res[second] = (both - alone) / n
        few, few_commits = _count(name, (THREADS,), small)
        many, many_commits = _count(name, (THREADS,), n)
        res[THREADS] = (many - few) / (n - small)
        grouping[name] = (many_commits - few_commits) / (n - small)
    return out, grouping


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--top", type=int, default=0)
    p.add_argument("--cpu", action="store_true",
                   help="CPU time per item without fsync, in --reps rounds of every contender")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--instructions", action="store_true",
                   help="instructions per item (valgrind's cachegrind), without fsync")
    p.add_argument("--contenders", default=",".join(_INSTRUCTION_KINDS),
                   help="with --instructions: which of %(default)s")
    p.add_argument("--child", nargs=3, metavar=("KIND", "PHASES", "N"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind_name, phases, n = args.child
        _child(kind_name, phases.split(","), int(n))
        return
    if args.instructions:
        res, grouping = instructions(args.n, args.contenders.split(","))
        lean = res.get("lean")
        print("== instructions per item (cachegrind, no fsync)"
              + ("; the lean queue's over each" if lean else ""))
        for name, phases in res.items():
            for phase, count in phases.items():
                ratio = f"   {lean[phase] / count:5.2f}x" if lean else ""
                extra = (f"   commits/item {grouping[name]:.2f}" if phase == THREADS
                         else "")
                print(f"  {name:14s} {phase:28s} {count:12,.0f}{ratio}{extra}")
        return
    if args.cpu:
        kinds = (_AckOS, _LeanOS, _LeanCountedOS, _LeanGuardedOS, _FloorOS)
        res = cpu(kinds, args.n, args.reps)
        lean = res[_LeanOS]
        for kind in kinds:
            print(f"== {kind.label}: CPU us per item, least and median of {args.reps} "
                  "rounds; the lean queue's over this, median of the rounds")
            for phase, runs in res[kind].items():
                ratios = [other / mine for mine, other in zip(runs, lean[phase])]
                print(f"  {phase:28s} {min(runs) * 1e6:8.1f} {statistics.median(runs) * 1e6:8.1f}"
                      f"   {statistics.median(ratios):5.2f}x")
        return
    for kind in (_Ack, _Lean, _LeanCounted, _Floor):
        res = measure(kind, args.n, args.top)
        print(f"== {kind.label}")
        for phase, r in res.items():
            print(f"  {phase:28s} commits {r['commits']:4d}  records/commit "
                  f"{r['records_per_commit']:5.2f}  bytes/commit {r['bytes_per_commit']:7.0f}"
                  f"  calls/item {r['calls_per_item']:7.1f}  {r['classes_per_commit']}")
            for row in r["top"]:
                print(f"      {row[0]:60s} calls {row[1]:7d}  own ms {row[2]:8.1f}")


if __name__ == "__main__":
    main()
