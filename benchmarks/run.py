#!/usr/bin/env python
"""Side-by-side benchmark of ackqueue against its peers (issue 5).

Run from the repository root:

    python -m pip install -e ".[bench]"
    python benchmarks/run.py                 # the full suite (10-14 minutes here)
    python benchmarks/run.py --quick         # a smoke run (about two minutes)
    python benchmarks/run.py --scenarios b,e --out /tmp/res

Every contender is measured in the same run, with the same item (a ~100-byte dict), each
(contender, scenario, repetition) in a fresh temporary directory.  Results go to
<out>/results.json (raw numbers and machine info), <out>/results.md (tables with ratios
against persist-queue) and <out>/results.png (a log-scale bar chart).  Nothing here is a
test: no number is asserted, and tests/ does not import this file.

Adding a contender is one entry in CONTENDERS (see make_contenders()): a label, a factory
that takes a fresh directory and returns an Adapter, and a sentence on its durability.
"""
import argparse
import datetime
import gc
import importlib.metadata
import inspect
import json
import os
import pickle
import platform
import queue as stdlib_queue
import random
import re
import select
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import floors  # noqa: E402  (benchmarks/floors.py, beside this file)
import lean  # noqa: E402  (benchmarks/lean.py)

PAYLOAD = "x" * 70                 # with the "n" key: 105 bytes as a pickle


def make_item(n):
    """The item every contender queues: a small dict, ~100 bytes pickled."""
    return {"n": n, "payload": PAYLOAD}


class Timeout(Exception):
    """A scenario did not finish in its time limit (reported, never hidden)."""


# ---------------------------------------------------------------------------------------
# Adapters: one small uniform interface over each queue library.
#
#   put(item)                 enqueue, returning when the library says it is stored
#   get(timeout) -> handle    the next message, or None after timeout seconds
#   item(handle)              the item inside a handle
#   ack(handle)               acknowledge
#   put_batch(items)          the library's closest thing to a batch put
#   get_ack_batch(n, timeout) receive and acknowledge n messages, batched where possible
#   close()
# ---------------------------------------------------------------------------------------


class Adapter:
    batch_method = "per-item calls (no batch API)"

    def item(self, handle):
        return handle

    def put_batch(self, items):
        for it in items:
            self.put(it)

    def get_ack_batch(self, n, timeout):
        out = []
        for _ in range(n):
            h = self.get(timeout)
            if h is None:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            self.ack(h)
            out.append(h)
        return out

    def diagnostics(self):
        """Counters the library exposes about the run (read before close), or None."""
        return None

    def close(self):
        pass


class StdlibAdapter(Adapter):
    """queue.Queue: get + task_done stands for get + ack."""

    def __init__(self, directory):
        self.q = stdlib_queue.Queue()

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None

    def ack(self, handle):
        self.q.task_done()


class PersistQueueAdapter(Adapter):
    """persist-queue's SQLiteAckQueue(path, multithreading=True): put, get, ack(item).

    It has no batch API, and SQLiteAckQueue refuses auto_commit=False (it warns "disable
    auto commit is not supported in ack queue" and keeps auto_commit=True), so batches are
    per-item calls, one SQLite commit each."""

    batch_method = ("per-item put/get/ack: SQLiteAckQueue has no bulk put and refuses "
                    "auto_commit=False")
    POLL = 0.0005

    def __init__(self, directory, *, poll=False):
        import persistqueue
        self._empty = persistqueue.Empty
        self.poll = poll             # across processes: get(block=False) every POLL seconds
        self.q = persistqueue.SQLiteAckQueue(os.path.join(directory, "pq"),
                                             multithreading=True)

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        if self.poll:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return self.q.get(block=False)
                except self._empty:
                    if time.monotonic() >= deadline:
                        return None
                    time.sleep(self.POLL)
        try:
            return self.q.get(block=True, timeout=timeout)
        except self._empty:
            return None

    def ack(self, handle):
        self.q.ack(handle)

    def close(self):
        self.q.close()


class LiteQueueAdapter(Adapter):
    """litequeue.LiteQueue(path): put(str), pop() -> Message or None, done(message_id).

    litequeue stores TEXT, so items go through json (its own serialisation cost, as the
    others pay pickle's).  pop() never blocks: get() polls it every POLL seconds.  One
    LiteQueue shares one sqlite3 connection, whose explicit BEGIN/COMMIT pairs cannot be
    interleaved by threads, so each thread gets its own LiteQueue on the same file (the
    way litequeue is used from several processes)."""

    POLL = 0.0005
    batch_method = ("put: 100 puts in one `with lq.transaction()`; get: pop() one by one "
                    "(pop is its own BEGIN IMMEDIATE transaction and cannot nest); "
                    "ack: 100 done() in one `with lq.transaction()`")

    def __init__(self, directory):
        import litequeue
        self._cls = litequeue.LiteQueue
        self.path = os.path.join(directory, "lite.db")
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()
        self._lq()                           # create the table from this thread

    def _lq(self):
        lq = getattr(self._local, "lq", None)
        if lq is None:
            lq = self._local.lq = self._cls(self.path)
            with self._lock:
                self._all.append(lq)
        return lq

    def put(self, item):
        self._lq().put(json.dumps(item))

    def get(self, timeout):
        lq = self._lq()
        deadline = time.monotonic() + timeout
        while True:
            m = lq.pop()
            if m is not None:
                return m
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.POLL)

    def item(self, handle):
        return json.loads(handle.data)

    def ack(self, handle):
        self._lq().done(handle.message_id)

    def put_batch(self, items):
        lq = self._lq()
        with lq.transaction():
            for it in items:
                lq.put(json.dumps(it))

    def get_ack_batch(self, n, timeout):
        got = []
        for _ in range(n):
            m = self.get(timeout)
            if m is None:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            got.append(m)
        lq = self._lq()
        with lq.transaction():
            for m in got:
                lq.done(m.message_id)
        return got

    def close(self):
        for lq in self._all:
            try:
                lq.close()
            except Exception:
                pass


class AckQueueAdapter(Adapter):
    """ackqueue.AckQueue: put, get, ack(item).  Batches use put_many/get_many/ack_many when
    the queue has them, else `with q.transaction():` around 100 puts and around 100
    get+acks (one commit each)."""

    def __init__(self, directory, *, memory=False, url=None, **options):
        from ackqueue import AckQueue
        if memory:
            self.q = AckQueue(**options)
        elif url is not None:
            self.q = AckQueue(path=url, name=SHARED_QUEUE_NAME, **options)
        else:
            self.q = AckQueue(path=os.path.join(directory, "queue.fs"), **options)
        self.has_batch = all(hasattr(self.q, n) for n in ("put_many", "get_many", "ack_many"))
        self.batch_method = (
            "q.put_many(items), q.get_many(100, timeout=...), q.ack_many(items)"
            if self.has_batch else
            "`with q.transaction():` around 100 puts, and around 100 get + ack; "
            "put_many/get_many/ack_many not present")

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None

    def ack(self, handle):
        self.q.ack(handle)

    def put_batch(self, items):
        if self.has_batch:
            self.q.put_many(items)
            return
        with self.q.transaction():
            for it in items:
                self.q.put(it)

    def get_ack_batch(self, n, timeout):
        if self.has_batch:
            got = []
            while len(got) < n:                       # get_many may return fewer than asked
                more = self.q.get_many(n - len(got), timeout=timeout)
                if not more:
                    raise Timeout(f"batch get: queue empty after {timeout}s")
                got.extend(more)
            self.q.ack_many(got)
            return got
        with self.q.transaction():
            got = []
            for _ in range(n):
                h = self.get(timeout)
                if h is None:
                    raise Timeout(f"batch get: queue empty after {timeout}s")
                got.append(h)
            for h in got:
                self.q.ack(h)
        return got

    def qsize(self):
        return self.q.qsize()

    def diagnostics(self):
        """This process's commit counters (shared by its queues on the same storage) and,
        for a shared queue, the claims it lost to other processes."""
        try:
            c = self.q._database.committer
            out = {"commits": c.commits, "units": c.units, "conflicts": c.conflicts,
                   "conflicts_by_class": dict(c.conflicts_by_class)}
            lost = getattr(self.q._state, "claims_lost", None)
            if lost is not None:
                out["claims_lost"] = lost
            return out
        except AttributeError as exc:     # the private counters moved: say so, go on
            return {"unavailable": repr(exc)}

    def close(self):
        self.q.close()


class LeanZodbAdapter(Adapter):
    """benchmarks/lean.py's LeanZodbQueue on a FileStorage (every commit fsync'd): the
    least a durable ack queue on ZODB does, as a reference for ackqueue."""

    batch_method = "put_many(items) (one commit), get_many(100), ack_many(items) (one commit)"

    def __init__(self, directory):
        self.q = lean.LeanZodbQueue(os.path.join(directory, "lean.fs"))

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        return self.q.get(timeout)

    def item(self, handle):
        return handle[1]

    def ack(self, handle):
        self.q.ack(handle)

    def put_batch(self, items):
        self.q.put_many(items)

    def get_ack_batch(self, n, timeout):
        got = []
        while len(got) < n:
            more = self.q.get_many(n - len(got), timeout)
            if not more:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            got.extend(more)
        self.q.ack_many(got)
        return got

    def diagnostics(self):
        return {"commits": self.q.commits, "units": self.q.units}

    def close(self):
        self.q.close()


class ZeoAckQueueAdapter(AckQueueAdapter):
    """ackqueue through a queue server: starts `ackqueue server` on a fresh file in the
    run's directory, opens AckQueue(path="zeo://127.0.0.1:PORT", name=...), and stops the
    server (SIGTERM) after closing the queue.  The server's start is not timed."""

    def __init__(self, directory, **options):
        self.server = ZeoServer(directory)
        self.server_report = None
        try:
            super().__init__(directory, url=self.server.url, **options)
        except BaseException:
            self.server_report = self.server.stop()
            raise

    def close(self):
        try:
            super().close()
        finally:
            self.server_report = self.server.stop()


# ---------------------------------------------------------------------------------------
# A queue server for the shared (ZEO) contenders: `ackqueue server PATH --listen
# 127.0.0.1:0`, one per run on a fresh file, its log in a file, stopped with SIGTERM.
# ---------------------------------------------------------------------------------------

SHARED_QUEUE_NAME = "bench"
SERVER_START_TIMEOUT = 60             # failure bounds only
SERVER_STOP_TIMEOUT = 60


def ackqueue_command():
    """The ackqueue console script installed beside this Python (or python -m ackqueue)."""
    script = os.path.join(os.path.dirname(sys.executable), "ackqueue")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "ackqueue"]


class ZeoServer:
    """`ackqueue server DIR/shared.fs --listen 127.0.0.1:0` in a child process; the URL is
    parsed from the one line it prints; its stderr (logging) goes to DIR/server.log."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "shared.fs")
        self.log_path = os.path.join(directory, "server.log")
        self.log = open(self.log_path, "ab")
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            ackqueue_command() + ["server", self.path, "--listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, text=True,
            cwd=REPO)
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVER_START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"zeo://[\w.\-]+:\d+", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ackqueue server did not start: {line!r}; log: "
                               f"{self.log_tail()}")
        self.url = found.group(0)
        self.start_s = time.perf_counter() - t

    def log_tail(self, chars=1500):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def log_lines(self, pattern):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        return [line for line in lines if re.search(pattern, line)]

    def stop(self):
        """SIGTERM, wait; returns {"exit_code", "log_problems"} (never raises)."""
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                code = f"no exit {SERVER_STOP_TIMEOUT}s after SIGTERM: SIGKILLed"
        for f in (self.proc.stdout, self.log):
            try:
                f.close()
            except Exception:   # noqa: BLE001
                pass
        errors = self.log_lines(r" (ERROR|CRITICAL) |Traceback")
        warns = self.log_lines(r" WARNING ")
        return {"exit_code": code, "log_errors": errors[:20], "log_error_count": len(errors),
                "log_warnings": warns[:5], "log_warning_count": len(warns)}


# ---------------------------------------------------------------------------------------
# Contenders: the hook to add more (durability="os", zeo://) is one entry each.
# ---------------------------------------------------------------------------------------


@dataclass
class Contender:
    label: str
    make: object                     # callable(directory) -> Adapter
    durability: str
    fast: bool = False               # an in-memory reference: gets larger counts
    family: str = ""                 # "ackqueue", "persist-queue", ...
    counts: dict = None              # smaller counts for a slow contender: {kind: n}


REFERENCE = "persist-queue"          # ratios are taken against this label
LEAN = "ZODB lean (reference)"       # benchmarks/lean.py: what ZODB allows (issue 5's targets)
ZEO_COUNTS = {"n": 500, "batch_n": 1000}     # full-run counts of "ackqueue (zeo)" in (a)-(d)


def make_contenders():
    contenders = [
        Contender("queue.Queue", StdlibAdapter,
                  "none: in process memory only (reference)", fast=True, family="stdlib"),
        Contender(REFERENCE, PersistQueueAdapter,
                  "SQLite, journal_mode=WAL, synchronous=FULL (SQLite's default; "
                  "persist-queue sets only journal_mode): every commit fsyncs the WAL, "
                  "one commit per put, per get and per ack", family="persist-queue"),
        Contender("litequeue", LiteQueueAdapter,
                  "SQLite, journal_mode=WAL, synchronous=NORMAL (set by litequeue): "
                  "commits survive a process crash but are not fsync'd, so the latest "
                  "ones can be lost on power loss / OS crash", family="litequeue"),
        Contender("ackqueue (fsync)", AckQueueAdapter,
                  "ZODB FileStorage: every commit fsync'd; put and ack return once "
                  "durable", family="ackqueue"),
        Contender(LEAN, LeanZodbAdapter,
                  "ZODB FileStorage: every commit fsync'd; benchmarks/lean.py, the least a "
                  "durable ack queue on ZODB does (no ready index, counters, deadlines, "
                  "give-back, ...): a reference for what ZODB allows, not a product",
                  family="lean"),
        Contender("ackqueue (memory)", lambda d: AckQueueAdapter(d, memory=True),
                  "ZODB MappingStorage: in memory, nothing survives the process "
                  "(same code path and commits, no disk)", fast=False, family="ackqueue"),
    ]
    # Hook: when AckQueue grows a durability= option (issue 5), measure it too.
    try:
        from ackqueue import AckQueue
        params = inspect.signature(AckQueue.__init__).parameters
    except (ImportError, TypeError, ValueError):
        params = {}
    if "durability" in params:
        contenders.append(Contender(
            "ackqueue (os)", lambda d: AckQueueAdapter(d, durability="os"),
            "ZODB FileStorage, durability='os': written to the OS, no fsync; survives a "
            "process crash, not a power loss", family="ackqueue"))
    # Shared queues (issue 3): every run starts its own `ackqueue server` on a fresh file.
    # One-item commits through ZEO run at a few hundred per second here, so this contender
    # gets smaller counts in (a)-(d) (ZEO_COUNTS; the table shows each contender's N).
    contenders.append(Contender(
        "ackqueue (zeo)", ZeoAckQueueAdapter,
        "ZEO: one `ackqueue server` (ZODB FileStorage, every commit fsync'd by the server) "
        "on loopback, started per run on a fresh file; the client opens "
        "AckQueue(path='zeo://127.0.0.1:PORT'); put and ack return once the server has "
        "committed", family="ackqueue", counts=ZEO_COUNTS))
    return contenders


# ---------------------------------------------------------------------------------------
# Scenarios.  Each takes (adapter, count) and returns {metric: value}.
# METRICS describes each metric: unit and whether higher is better.
# ---------------------------------------------------------------------------------------

METRICS = {
    "put_rate": ("puts/s", True),
    "get_ack_rate": ("get+ack/s", True),
    "cycle_rate": ("items/s", True),
    "throughput": ("items/s", True),
    "p50_ms": ("ms", False),
    "p99_ms": ("ms", False),
    "mean_ms": ("ms", False),
}

GET_TIMEOUT = 30.0


def scenario_a(ad, n):
    """One thread puts n, then gets and acks n (one get+ack at a time)."""
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for it in items:
        ad.put(it)
    t1 = time.perf_counter()
    for _ in range(n):
        h = ad.get(GET_TIMEOUT)
        if h is None:
            raise Timeout("get timed out")
        ad.ack(h)
    t2 = time.perf_counter()
    return {"put_rate": n / (t1 - t0), "get_ack_rate": n / (t2 - t1),
            "cycle_rate": n / (t2 - t0)}


def scenario_b(ad, n):
    """One thread: put, get, ack, one message at a time."""
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for it in items:
        ad.put(it)
        h = ad.get(GET_TIMEOUT)
        if h is None:
            raise Timeout("get timed out")
        ad.ack(h)
    t1 = time.perf_counter()
    return {"cycle_rate": n / (t1 - t0)}


def scenario_c(ad, n, producers=4, consumers=4, limit=600.0):
    """4 producer and 4 consumer threads, one ack per item; end-to-end items/s."""
    per = n // producers
    total = per * producers
    lock = threading.Lock()
    state = {"consumed": 0, "end": None}
    done = threading.Event()
    errors = []
    start = threading.Barrier(producers + consumers + 1)

    def producer(k):
        try:
            start.wait()
            for i in range(per):
                ad.put(make_item(k * per + i))
        except BaseException as exc:      # noqa: BLE001 - reported below
            errors.append(repr(exc))
            done.set()

    def consumer():
        try:
            start.wait()
            while not done.is_set():
                h = ad.get(0.2)
                if h is None:
                    continue
                ad.ack(h)
                with lock:
                    state["consumed"] += 1
                    if state["consumed"] == total:
                        state["end"] = time.perf_counter()
                        done.set()
        except BaseException as exc:      # noqa: BLE001
            errors.append(repr(exc))
            done.set()

    threads = [threading.Thread(target=producer, args=(k,), daemon=True)
               for k in range(producers)]
    threads += [threading.Thread(target=consumer, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    finished = done.wait(limit)
    done.set()
    for t in threads:
        t.join(10)
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    if not finished or state["end"] is None:
        raise Timeout(f"only {state['consumed']} of {total} items consumed in {limit}s")
    return {"throughput": total / (state["end"] - t0)}


def scenario_d(ad, n, batch=100):
    """Batches of 100: put n in batches, then get+ack n in batches."""
    batches = max(1, n // batch)
    n = batches * batch
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for b in range(batches):
        ad.put_batch(items[b * batch:(b + 1) * batch])
    t1 = time.perf_counter()
    for b in range(batches):
        ad.get_ack_batch(batch, GET_TIMEOUT)
    t2 = time.perf_counter()
    return {"put_rate": n / (t1 - t0), "get_ack_rate": n / (t2 - t1),
            "cycle_rate": n / (t2 - t0)}


def scenario_e(ad, samples, seed=5):
    """Wake latency in one process: a consumer blocked in get(); the producer records
    time.perf_counter() and then puts; latency = put call to item in hand."""
    rng = random.Random(seed)
    waiting = threading.Event()
    lat = []
    errors = []

    def consumer():
        try:
            for _ in range(samples):
                waiting.set()
                h = ad.get(GET_TIMEOUT)
                t1 = time.perf_counter()
                if h is None:
                    raise Timeout("get timed out")
                lat.append(t1 - ad.item(h)["t0"])
                ad.ack(h)
        except BaseException as exc:      # noqa: BLE001
            errors.append(repr(exc))
            waiting.set()

    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    for i in range(samples):
        if not waiting.wait(GET_TIMEOUT) or errors:
            break
        waiting.clear()
        time.sleep(rng.uniform(0.002, 0.005))    # let the consumer block in get()
        item = make_item(i)
        item["t0"] = time.perf_counter()
        ad.put(item)
    t.join(GET_TIMEOUT)
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    if len(lat) != samples:
        raise Timeout(f"{len(lat)} of {samples} samples")
    ms = sorted(x * 1000 for x in lat)
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": statistics.fmean(ms)}


def one_line(doc):
    return " ".join(doc.split())


def percentile(sorted_values, p):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1,
                   int(round(p / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


SCENARIOS = {
    # key: (title, function, count kind)
    "a": ("(a) one thread: put N, then get+ack N", scenario_a, "n"),
    "b": ("(b) one thread: put, get, ack one at a time", scenario_b, "n"),
    "c": ("(c) 4 producer + 4 consumer threads, ack per item", scenario_c, "n"),
    "d": ("(d) batches of 100: put N, then get+ack N", scenario_d, "batch_n"),
    "e": ("(e) wake latency in one process: put call to item in hand", scenario_e,
          "samples"),
}
SHARED_SCENARIOS = ("e_xproc", "g")       # across processes: run_xwake, run_g
ALL_KEYS = ["a", "b", "c", "d", "e", "e_xproc", "f", "g"]


def counts_for(args):
    """Per-scenario counts: durable contenders, and the in-memory reference (fast)."""
    if args.quick:
        return {"n": (300, 20000), "batch_n": (1000, 20000), "samples": (50, 50)}
    return {"n": (3000, 200000), "batch_n": (10000, 200000), "samples": (200, 200)}


# ---------------------------------------------------------------------------------------
# Running (a)-(e): every contender, fresh directory per run, repetitions interleaved.
# ---------------------------------------------------------------------------------------


def run_one(contender, key, count, tmp_root):
    title, fn, _ = SCENARIOS[key]
    directory = tempfile.mkdtemp(prefix=f"ackbench-{key}-", dir=tmp_root)
    ad = None
    out = {}
    try:
        ad = contender.make(directory)
        batch_method = getattr(ad, "batch_method", None)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metrics = fn(ad, count)
        out = {"metrics": metrics, "seconds": time.perf_counter() - t,
               "batch_method": batch_method}
        diag = ad.diagnostics()
        if diag is not None:
            out["diagnostics"] = diag
        return out
    except Exception as exc:   # noqa: BLE001 - a failing contender is reported, not fatal
        out = {"error": f"{type(exc).__name__}: {exc}"}
        return out
    finally:
        if ad is not None:
            try:
                ad.close()
            except Exception as exc:   # noqa: BLE001
                out["close_error"] = f"{type(exc).__name__}: {exc}"
            if getattr(ad, "server_report", None) is not None:
                out["server"] = ad.server_report
        gc.collect()
        shutil.rmtree(directory, ignore_errors=True)


def run_table_scenarios(keys, contenders, args, tmp_root):
    counts = counts_for(args)
    out = {}
    for key in keys:
        title, fn, kind = SCENARIOS[key]
        durable_n, fast_n = counts[kind]
        print(f"\n{title}", flush=True)
        runs = {c.label: [] for c in contenders}
        started = time.perf_counter()
        for rep in range(args.repeat):
            for c in contenders:
                n = fast_n if c.fast else durable_n
                if c.counts and kind in c.counts:
                    n = min(n, c.counts[kind])
                r = run_one(c, key, n, tmp_root)
                r["count"] = n
                runs[c.label].append(r)
                shown = r.get("error") or ", ".join(
                    f"{m}={fmt(v)}" for m, v in r["metrics"].items())
                print(f"  [{rep + 1}/{args.repeat}] {c.label:<18} n={n:<7} {shown}",
                      flush=True)
        results = {}
        for c in contenders:
            rs = runs[c.label]
            ok = [r for r in rs if "metrics" in r]
            entry = {"count": rs[0]["count"], "runs": rs,
                     "batch_method": next((r["batch_method"] for r in ok), None)}
            if ok:
                entry["median"] = {m: statistics.median(r["metrics"][m] for r in ok)
                                   for m in ok[0]["metrics"]}
            else:
                entry["error"] = rs[0].get("error")
            results[c.label] = entry
        out[key] = {"title": title, "description": one_line(fn.__doc__),
                    "seconds": time.perf_counter() - started, "results": results}
    return out


# ---------------------------------------------------------------------------------------
# (f) scale: fill in a child process, SIGKILL it after its last commit, open in fresh
# child processes.  Children are this script run with --child.
# ---------------------------------------------------------------------------------------

PQ_TABLE = "`ack_queue_default`"     # persist-queue's table for name="default"


def child_main(argv):
    """Entry point of the helper processes of (f).  Prints one JSON line per report.
    The processes of (e) across processes and (g) go to shared_child_main."""
    if argv[0] in ("xwake", "gprod", "gcons", "gdrain"):
        task, family, location, mode, count, start = argv[:6]
        shared_child_main(task, family, location, mode, int(count), int(start), *argv[6:])
        return
    task, family, path, count = argv[0], argv[1], argv[2], int(argv[3])
    extra = argv[4:]
    import psutil
    proc = psutil.Process()

    def report(**kw):
        print(json.dumps(kw), flush=True)

    if task == "fill":
        hold = "hold" in extra
        t0 = time.perf_counter()
        if family == "ackqueue":
            from ackqueue import AckQueue
            q = AckQueue(path=path)
            chunk = 1000
            for start in range(0, count, chunk):
                with q.transaction():
                    for i in range(start, min(count, start + chunk)):
                        q.put(make_item(i))
            # every transaction block returns only after its fsync'd commit
        else:
            import persistqueue
            from persistqueue.serializers import pickle as pq_pickle
            q = persistqueue.SQLiteAckQueue(path, multithreading=True)
            conn = sqlite3.connect(os.path.join(path, "data.db"))
            chunk = 10000
            for start in range(0, count, chunk):
                now = time.time()
                rows = [(pq_pickle.dumps(make_item(i)), now, 0)      # status 0: "inited"
                        for i in range(start, min(count, start + chunk))]
                with conn:
                    conn.executemany(f"INSERT INTO {PQ_TABLE} (data, timestamp, status) "
                                     "VALUES (?, ?, ?)", rows)
        seconds = time.perf_counter() - t0
        report(event="filled", count=count, seconds=seconds, rate=count / seconds)
        if hold:
            time.sleep(3600)           # the parent SIGKILLs us here
        q.close()
        report(event="closed")
        return

    if task == "open":
        cycles = count
        index = None
        if family == "ackqueue":
            from ackqueue import AckQueue
            index = index_info(path)
            opener = lambda: AckQueue(path=path)                           # noqa: E731
        else:
            import persistqueue
            opener = lambda: persistqueue.SQLiteAckQueue(path, multithreading=True)  # noqa: E731
        gc.collect()
        rss_before = proc.memory_info().rss        # after the imports, before the open
        t0 = time.perf_counter()
        q = opener()
        open_s = time.perf_counter() - t0
        get = lambda: q.get(timeout=GET_TIMEOUT)     # noqa: E731
        ack = q.ack
        size = q.qsize
        t = time.perf_counter()
        ack(get())
        first = time.perf_counter() - t
        rss = proc.memory_info().rss
        backlog = size()
        lat = []
        for _ in range(cycles):
            t = time.perf_counter()
            ack(get())
            lat.append(time.perf_counter() - t)
        rss_after = proc.memory_info().rss
        t = time.perf_counter()
        q.close()
        close_s = time.perf_counter() - t
        ms = sorted(x * 1000 for x in lat)
        report(event="opened", open_s=open_s, index_at_open=index, first_get_ack_ms=first * 1000,
               rss_before_open_mb=rss_before / 2**20, rss_mb=rss / 2**20,
               rss_after_cycles_mb=rss_after / 2**20, backlog=backlog, cycles=cycles,
               mean_ms=statistics.fmean(ms) if ms else None,
               p50_ms=percentile(ms, 50) if ms else None,
               p99_ms=percentile(ms, 99) if ms else None, close_s=close_s)
        return
    raise SystemExit(f"unknown child task {task!r}")


def index_info(path):
    """What FileStorage's .index for path covers: a SIGKILLed process leaves the one
    written when the file was created (or last closed), so the next open re-reads every
    transaction after that position."""
    if not os.path.exists(path + ".index"):
        return {"exists": False}
    from ZODB.fsIndex import fsIndex
    try:
        pos = fsIndex.load(path + ".index")["pos"]
    except Exception as exc:   # noqa: BLE001
        return {"exists": True, "error": repr(exc)}
    return {"exists": True, "covers_bytes": pos, "file_bytes": os.path.getsize(path)}


def spawn_child(*argv):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *map(str, argv)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)


def read_report(proc, timeout):
    """The next JSON report line of a child (raises with its stderr if it died)."""
    deadline = time.monotonic() + timeout
    while True:
        line = proc.stdout.readline()
        if line:
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
            continue
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"child exited ({proc.returncode}) without a report: {err}")


def run_child(*argv, timeout=1800):
    proc = spawn_child(*argv)
    try:
        rep = read_report(proc, timeout)
        proc.wait(timeout)
        return rep
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def dir_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def scale_one(family, big, small_backlog, cycles, tmp_root, repeat=1):
    """Fill the queue with the big count in a child process, SIGKILL it after its last
    commit, then open it in a fresh process (open after SIGKILL, RSS after one get+ack; that
    process closes cleanly).  Then, repeat times and alternately, in fresh processes: open
    it again (open after a clean close, RSS, and 1,000 timed get+ack cycles at the big
    backlog), and open a small queue (a 1,000-message backlog plus what the cycles take)
    for the same 1,000 timed get+ack cycles.  Medians over the repetitions."""
    directory = tempfile.mkdtemp(prefix=f"ackbench-f-{family}-", dir=tmp_root)
    path = (os.path.join(directory, "queue.fs") if family == "ackqueue"
            else os.path.join(directory, "pq"))
    res = {"family": family, "count": big, "cycles": cycles}
    try:
        proc = spawn_child("fill", family, path, big, "hold")
        try:
            filled = read_report(proc, 3600)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        res["fill"] = filled
        res["fill_killed_returncode"] = proc.returncode
        if family == "ackqueue":
            res["index_after_kill"] = index_info(path)
        else:
            res["wal_bytes_after_kill"] = (
                os.path.getsize(os.path.join(path, "data.db-wal"))
                if os.path.exists(os.path.join(path, "data.db-wal")) else 0)
        res["file_bytes"] = dir_size(path)
        print(f"  {family}: filled {big:,} in {filled['seconds']:.1f}s "
              f"({filled['rate']:,.0f}/s), SIGKILLed (rc {proc.returncode}), "
              f"{res['file_bytes'] / 2**20:.0f} MB", flush=True)
        # 1. open after SIGKILL (no .index), one get+ack, RSS; closes cleanly.
        res["after_kill"] = run_child("open", family, path, 0)
        print(f"  {family}: open after SIGKILL {res['after_kill']['open_s']:.2f}s, "
              f"RSS {res['after_kill']['rss_mb']:.0f} MB", flush=True)
        # 2. a small queue (small_backlog + what the cycles take, so it stays at or above
        #    small_backlog), filled cleanly in a child.
        small_dir = tempfile.mkdtemp(prefix=f"ackbench-f-{family}-small-", dir=tmp_root)
        small_path = (os.path.join(small_dir, "queue.fs") if family == "ackqueue"
                      else os.path.join(small_dir, "pq"))
        try:
            res["small_fill"] = run_child("fill", family, small_path,
                                          small_backlog + cycles * repeat + 1)
            # 3. alternately: open the big file after a clean close and time get+ack at its
            #    backlog; open the small one and do the same (each in a fresh process).
            res["after_clean_close_runs"], res["small_runs"] = [], []
            for i in range(repeat):
                r = run_child("open", family, path, cycles)
                res["after_clean_close_runs"].append(r)
                print(f"  {family} [{i + 1}/{repeat}]: open after clean close "
                      f"{r['open_s']:.2f}s, RSS {r['rss_mb']:.0f} MB, get+ack mean "
                      f"{r['mean_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms at backlog "
                      f"{r['backlog']:,}", flush=True)
                r = run_child("open", family, small_path, cycles)
                res["small_runs"].append(r)
                print(f"  {family} [{i + 1}/{repeat}]: at backlog {r['backlog']:,}: open "
                      f"{r['open_s']:.3f}s, RSS {r['rss_mb']:.0f} MB, get+ack mean "
                      f"{r['mean_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms", flush=True)
            res["after_clean_close"] = median_report(res["after_clean_close_runs"])
            res["small"] = median_report(res["small_runs"])
        finally:
            shutil.rmtree(small_dir, ignore_errors=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return res


def median_report(runs):
    """Per numeric field, the median over runs (other fields from the first run)."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "backlog":
            vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
            out[k] = statistics.median(vals)
    out["backlog"] = runs[0]["backlog"]
    out["runs"] = len(runs)
    return out


def run_scale(args, tmp_root):
    big = args.fill_count if args.fill_count else (50000 if args.quick else 1000000)
    print(f"\n(f) scale: {big:,} queued messages", flush=True)
    started = time.perf_counter()
    out = {"title": f"(f) scale: {big:,} queued messages", "count": big,
           "description": one_line(scale_one.__doc__), "results": {}}
    for family, label in (("ackqueue", "ackqueue (fsync)"), ("persist-queue", REFERENCE)):
        try:
            out["results"][label] = scale_one(family, big, 1000, 1000, tmp_root,
                                              repeat=args.repeat)
        except Exception as exc:   # noqa: BLE001
            out["results"][label] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  {label}: ERROR {exc}", flush=True)
    out["not_measured"] = {"litequeue": "not measured in (f) (ackqueue and "
                                        "persist-queue only)",
                           "ackqueue (zeo)": "not measured in (f): the scale test opens "
                                             "the file itself, not through a server"}
    out["seconds"] = time.perf_counter() - started
    return out


# ---------------------------------------------------------------------------------------
# Across processes: (e) cross-process wake latency and (g) producer and consumer processes.
# The processes are this script run with --child (tasks xwake, gprod, gcons); they talk to
# the parent in JSON lines on stdout and read "go" on stdin; their stderr goes to a file.
# ---------------------------------------------------------------------------------------


@dataclass
class SharedContender:
    label: str
    family: str                      # "ackqueue", "persist-queue", "litequeue"
    mode: str                        # how its processes get: "blocking", "poll"
    sharing: str                     # how the processes share the queue (for the tables)
    scenarios: tuple = ("e_xproc", "g")
    samples: int = None              # (e) samples per run, when fewer than the others
    repeat: int = None               # repetitions, when fewer than the others


def persist_queue_tick():
    """persist-queue's blocking get() re-reads its database this often (seconds) when no put
    in its own process sets its in-process threading.Event (read from the installed code)."""
    try:
        from persistqueue import sqlbase
        return sqlbase.TICK_FOR_WAIT
    except (ImportError, AttributeError):
        return None


def make_shared_contenders():
    tick = persist_queue_tick()
    return [
        SharedContender(
            "ackqueue (zeo)", "ackqueue", "blocking",
            "one `ackqueue server` per run on a fresh file; every process opens "
            f"AckQueue(path='zeo://127.0.0.1:PORT', name={SHARED_QUEUE_NAME!r}); get() "
            "blocks and is woken by the server's invalidations"),
        SharedContender(
            REFERENCE, "persist-queue", "poll",
            "every process opens SQLiteAckQueue(DIR, multithreading=True) on the same "
            "directory (persist-queue's documentation says several processes are not "
            "supported); its blocking get() waits on an in-process threading.Event that "
            f"another process's put never sets and re-reads the database only every {tick} "
            "s, so across processes the adapter polls get(block=False) every 0.5 ms"),
        SharedContender(
            "persist-queue (blocking get)", "persist-queue", "blocking",
            "as persist-queue, but the consumer waits in its own blocking "
            f"get(timeout={GET_TIMEOUT:g}), as in one process; each sample waits for "
            f"persist-queue's {tick}-s re-read, so this row gets few samples and one "
            "repetition", scenarios=("e_xproc",), samples=3, repeat=1),
        SharedContender(
            "litequeue", "litequeue", "poll",
            "every process opens LiteQueue(FILE) on the same file (pop() is one BEGIN "
            "IMMEDIATE transaction with UPDATE ... RETURNING, so processes cannot take the "
            "same row); pop() never blocks, so get() polls it every 0.5 ms, as in one "
            "process"),
    ]


def open_shared(family, location, mode):
    """The adapter one process uses on a shared queue (location: a zeo:// URL or a dir)."""
    if family == "ackqueue":
        return AckQueueAdapter(None, url=location)
    if family == "persist-queue":
        return PersistQueueAdapter(location, poll=(mode == "poll"))
    if family == "litequeue":
        return LiteQueueAdapter(location)
    raise ValueError(f"unknown family {family!r}")


class ChildError(RuntimeError):
    """A child process reported an error (its traceback is kept for results.json)."""

    def __init__(self, message, child_traceback=None):
        super().__init__(message)
        self.child_traceback = child_traceback


class Child:
    """This script run with --child TASK ...: JSON lines on its stdout, "go" on its stdin,
    stderr into a file in the run's directory (shown when the child fails)."""

    def __init__(self, directory, name, *argv):
        self.name = name
        self.err_path = os.path.join(directory, f"{name}.stderr")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", *map(str, argv)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, cwd=REPO,
            bufsize=0)
        self._buf = b""

    def stderr_tail(self, chars=1500):
        try:
            with open(self.err_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def expect(self, event, timeout, progress=None):
        """The child's next report; it must be `event` (an "error" report raises).  With
        progress (a callable), timeout counts from the last change of progress()."""
        deadline = time.monotonic() + timeout
        last = progress() if progress else None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if progress is not None:
                now = progress()
                if now != last:
                    last, deadline = now, time.monotonic() + timeout
                    left = timeout
            if left <= 0:
                raise Timeout(f"{self.name}: no {event!r} report within {timeout:g}s"
                              + (" of its last progress" if progress else ""))
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                raise RuntimeError(f"{self.name} exited ({code}) before its {event!r} "
                                   f"report: {self.stderr_tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        rep = json.loads(line)
        if rep.get("event") == "error":
            raise ChildError(f"{self.name}: {rep.get('error')}", rep.get("traceback"))
        if rep.get("event") != event:
            raise RuntimeError(f"{self.name}: expected {event!r}, got {rep!r}")
        return rep

    def send(self, text):
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60):
        """Wait for the exit (SIGKILL after timeout); return the exit code."""
        try:
            self.proc.stdin.close()
        except Exception:   # noqa: BLE001
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            code = f"SIGKILLed: no exit {timeout}s after its last report"
        for f in (self.proc.stdout, self.err):
            try:
                f.close()
            except Exception:   # noqa: BLE001
                pass
        return code


def shared_child_main(task, family, location, mode, count, start, log_path=None):
    """Entry point of the processes of (e) cross-process and (g)."""
    def say(**kw):
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    warnings.simplefilter("ignore")
    try:
        ad = open_shared(family, location, mode)
    except Exception as exc:   # noqa: BLE001
        say(event="error", error=f"open failed: {type(exc).__name__}: {exc}")
        return
    try:
        say(event="ready", pid=os.getpid())
        if task == "xwake":
            # Consumer of (e) across processes: say "waiting" just before each get(); the
            # latency is from the producer's time.time() before put() to ours after get().
            lat, got = [], []
            for i in range(count):
                say(event="waiting", i=i)
                h = ad.get(GET_TIMEOUT)
                t1 = time.time()
                if h is None:
                    say(event="error", error=f"get() timed out after {GET_TIMEOUT:g}s at "
                                             f"sample {i}")
                    return
                it = ad.item(h)
                lat.append(t1 - it["t0"])
                got.append(it["n"])
                ad.ack(h)
            say(event="done", lat=lat, got=got, diag=ad.diagnostics())
        elif task == "gprod":
            sys.stdin.readline()                       # "go"
            t0 = time.time()
            done, error, tb = 0, None, None
            try:
                for i in range(start, start + count):
                    ad.put(make_item(i))
                    done += 1
            except Exception as exc:   # noqa: BLE001 - reported: put_ok puts returned
                error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
            say(event="done", start=t0, end=time.time(), put_ok=done, error=error,
                traceback=tb, diag=ad.diagnostics())
        elif task == "gcons":
            # Every acknowledged item goes to log_path at once ("n time.time()"), so that
            # what a consumer received is known even if it hangs and has to be killed.
            with open(log_path, "w") as log:
                sys.stdin.readline()                   # "go"
                got, last_ack, timed_out, error, tb = 0, None, False, None, None
                after_stop = None    # items received after this consumer's stop marker
                try:
                    while True:
                        # A queue shared by processes need not deliver in strict FIFO
                        # order under contention (ackqueue spreads its choices after a
                        # lost claim race), so a stop marker can come before the last
                        # items.  Every item was put before the markers, so after its
                        # marker a consumer takes what is still ready, waiting at most
                        # G_AFTER_STOP for each, and stops when nothing comes.
                        h = ad.get(G_GET_TIMEOUT if after_stop is None else G_AFTER_STOP)
                        if h is None:        # reported with what it got, never hidden
                            timed_out = after_stop is None
                            break
                        it = ad.item(h)
                        if it.get("stop"):
                            if after_stop is not None:
                                # another consumer's marker: a fresh one takes its place,
                                # behind whatever is still queued, and this one stops
                                ad.put({"stop": True})
                                ad.ack(h)
                                break
                            ad.ack(h)
                            after_stop = 0
                            continue
                        ad.ack(h)
                        last_ack = time.time()
                        log.write(f"{it['n']} {last_ack!r}\n")
                        log.flush()
                        got += 1
                        if after_stop is not None:
                            after_stop += 1
                except Exception as exc:   # noqa: BLE001 - reported with what it got
                    error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc()
            say(event="done", got=got, last_ack=last_ack, timed_out=timed_out, error=error,
                traceback=tb, diag=ad.diagnostics(), after_stop=after_stop or 0)
        elif task == "gdrain":
            # After a (g) run: whatever a get() still receives, and what qsize() says.
            left, stops = [], 0
            while True:
                h = ad.get(0.5)
                if h is None:
                    break
                it = ad.item(h)
                ad.ack(h)
                if it.get("stop"):
                    stops += 1
                else:
                    left.append(it["n"])
            say(event="done", left=len(left), left_ids=left, stops=stops,
                qsize=ad.qsize() if hasattr(ad, "qsize") else None)
        else:
            say(event="error", error=f"unknown task {task!r}")
    except Exception as exc:   # noqa: BLE001
        say(event="error", error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc())
    finally:
        try:
            ad.close()
        except Exception as exc:   # noqa: BLE001
            sys.stderr.write(f"close failed: {exc!r}\n")


G_GET_TIMEOUT = 30.0         # a (g) consumer that gets nothing for this long stops and
                             # reports it (items keep coming until the stop markers)
G_LIMIT = 600.0              # failure bound of the producers of one (g) run
G_IDLE = G_GET_TIMEOUT + 30  # a consumer silent for longer than this is hung
G_AFTER_STOP = 1.0           # after its stop marker, a consumer stops once a get() has
                             # waited this long for nothing


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
            if sc.family == "ackqueue":
                self.server = ZeoServer(self.directory)
                self.location = self.server.url
            else:
                self.location = self.directory
            self.ad = open_shared(sc.family, self.location, sc.mode)   # creates the queue
        except BaseException:
            if self.server is not None:
                self.server.stop()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def spawn(self, name, task, count=0, start=0, *extra):
        child = Child(self.directory, name, task, self.sc.family, self.location,
                      self.sc.mode, count, start, *extra)
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


def xwake_one(sc, samples, tmp_root, seed):
    """(e) across processes: a consumer process blocked in get(); this process sleeps
    15-25 ms (random, seeded) after the consumer says it is about to call get(), records
    time.time() and puts; the consumer records time.time() when get() returns."""
    run = None
    out = {}
    try:
        run = SharedRun(sc, "e_xproc", tmp_root)
        rng = random.Random(seed)
        child = run.spawn("consumer", "xwake", samples)
        child.expect("ready", 120)
        for i in range(samples):
            child.expect("waiting", GET_TIMEOUT + 60)
            time.sleep(rng.uniform(0.015, 0.025))
            item = make_item(i)
            item["t0"] = time.time()
            run.ad.put(item)
        rep = child.expect("done", GET_TIMEOUT + 60)
        ms = sorted(x * 1000 for x in rep["lat"])
        out["metrics"] = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                          "mean_ms": statistics.fmean(ms)}
        out["delivered_in_order"] = rep["got"] == list(range(samples))
        if rep.get("diag") is not None:
            out["consumer_diagnostics"] = rep["diag"]
    except Exception as exc:   # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        if getattr(exc, "child_traceback", None):
            out["child_traceback"] = exc.child_traceback
    finally:
        if run is not None:
            out.update(run.close(failed="error" in out))
    return out


def g_one(sc, producers, consumers, total, tmp_root):
    """(g): producer and consumer processes on one shared queue, one ack per item.  Each
    producer puts its share one at a time; consumers get and ack until they receive a stop
    marker, which this process puts (one per consumer) once every producer has finished,
    then take what is still ready (a shared queue may hand a marker out ahead of the last
    items) until a get() waits 1 s for nothing; a second marker is put back for another
    consumer.
    items/s = distinct items acknowledged / (last ack of an item - the moment "go" was
    sent), both time.time().  Then a fresh process drains the queue and reads qsize()."""
    run = None
    out = {}
    try:
        run = SharedRun(sc, "g", tmp_root)
        per = total // producers
        out["count"] = per * producers
        prods = [run.spawn(f"producer{k}", "gprod", per, k * per) for k in range(producers)]
        logs = [os.path.join(run.directory, f"consumer{k}.got") for k in range(consumers)]
        cons = [run.spawn(f"consumer{k}", "gcons", 0, 0, logs[k]) for k in range(consumers)]
        for child in prods + cons:
            child.expect("ready", 120)
        deadline = time.monotonic() + G_LIMIT
        t0 = time.time()
        for child in cons + prods:
            child.send("go")
        prod_reps = [p.expect("done", max(1.0, deadline - time.monotonic())) for p in prods]
        out["producers_seconds"] = [r["end"] - r["start"] for r in prod_reps]
        # Items whose put() returned; a producer whose put() raised stopped there (the
        # run goes on, so that what was put is still consumed and counted).
        expected = set()
        errors = []
        for k, r in enumerate(prod_reps):
            expected.update(range(k * per, k * per + r["put_ok"]))
            if r.get("error"):
                errors.append(f"producer{k}: put() raised {r['error']} after "
                              f"{r['put_ok']} of {per} puts")
                out.setdefault("child_tracebacks", {})[f"producer{k}"] = r.get("traceback")
        out["put_ok"] = len(expected)
        for _ in range(consumers):
            run.ad.put({"stop": True})
        total_logged = lambda: sum(dir_size(f) for f in logs if os.path.exists(f))  # noqa: E731
        cons_reps, hung = [], []
        for k, child in enumerate(cons):
            try:
                # a consumer that receives nothing for G_IDLE (its own get() times out
                # after G_GET_TIMEOUT) is hung; it is killed at the end, and its log counts
                cons_reps.append(child.expect("done", G_IDLE, progress=total_logged))
            except Timeout:
                hung.append(child.name)
        for k, r in enumerate(cons_reps):
            if r.get("error"):
                errors.append(f"consumer{k}: {r['error']}")
                out.setdefault("child_tracebacks", {})[f"consumer{k}"] = r.get("traceback")
        if hung:
            out["hung_consumers"] = hung
            errors.append(f"consumer process(es) {', '.join(hung)} neither received an "
                          f"item nor returned from get(timeout={G_GET_TIMEOUT:g}) for "
                          f"{G_IDLE:g} s; killed")
        if errors:
            out["error"] = "; ".join(errors)
        # What the consumers received, from their logs (complete even for a killed one).
        got, last = [], None
        for f in logs:
            if os.path.exists(f):
                with open(f) as fh:
                    for line in fh:
                        parts = line.split()
                        if len(parts) == 2:
                            got.append(int(parts[0]))
                            last = max(last or 0.0, float(parts[1]))
        unique = set(got)
        out["metrics"] = {"throughput": len(unique) / (last - t0) if last else None}
        out["delivered"] = len(got)
        out["duplicates"] = len(got) - len(unique)
        out["not_delivered"] = len(expected - unique)
        out["delivered_never_put"] = len(unique - expected)
        out["per_consumer"] = [sum(1 for _ in open(f)) if os.path.exists(f) else 0
                               for f in logs]
        out["consumers_timed_out"] = sum(bool(r.get("timed_out")) for r in cons_reps)
        out["received_after_stop"] = sum(r.get("after_stop") or 0 for r in cons_reps)
        out["not_delivered_ids"] = sorted(expected - unique)[:20]
        diags = [r.get("diag") for r in cons_reps]
        if diags and all(d and "commits" in d for d in diags):
            commits = sum(d["commits"] for d in diags)
            conflicts = sum(d["conflicts"] for d in diags)
            by_class = {}
            for d in diags:
                for k, v in d["conflicts_by_class"].items():
                    by_class[k] = by_class.get(k, 0) + v
            out["consumers"] = {
                "processes_reporting": len(diags), "processes": consumers,
                "commits": commits, "conflicts": conflicts,
                "conflict_rate": conflicts / commits if commits else None,
                "claims_lost": sum(d.get("claims_lost", 0) for d in diags),
                "conflicts_by_class": by_class, "per_process": diags}
        pdiags = [r.get("diag") for r in prod_reps]
        if all(d and "commits" in d for d in pdiags):
            out["producers"] = {"commits": sum(d["commits"] for d in pdiags),
                                "conflicts": sum(d["conflicts"] for d in pdiags),
                                "per_process": pdiags}
        if not hung:
            # Whatever a fresh process still receives (should be nothing), and qsize().
            drain = run.spawn("drain", "gdrain")
            try:
                drain.expect("ready", 120)
                rep = drain.expect("done", G_IDLE)
                out["left_in_queue"] = rep["left"]
                out["left_ids"] = rep.get("left_ids")
                out["stop_markers_left"] = rep["stops"]
                if rep.get("qsize") is not None:
                    out["qsize_after_drain"] = rep["qsize"]
            except Timeout as exc:
                out["drain_hung"] = str(exc)
                errors.append(f"after the run, get(timeout=0.5) in a fresh process did "
                              f"not return within {G_IDLE:g} s; killed")
                out["error"] = "; ".join(errors)
    except Exception as exc:   # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        if getattr(exc, "child_traceback", None):
            out["child_traceback"] = exc.child_traceback
    finally:
        if run is not None:
            out.update(run.close(failed="error" in out))
    return out


def shared_counts(args):
    """(e) cross-process samples and (g) items: full run, --quick."""
    return {"samples": 50 if args.quick else 200, "g_n": 200 if args.quick else 600}


G_VARIANTS = [(2, 2), (2, 4)]        # (producer processes, consumer processes)


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


def run_xwake(args, shared, tmp_root):
    samples = shared_counts(args)["samples"]
    title = "(e) wake latency across processes: put call to item in hand"
    print(f"\n{title}", flush=True)
    started = time.perf_counter()
    chosen = [sc for sc in shared if "e_xproc" in sc.scenarios]
    runs = {sc.label: [] for sc in chosen}
    for rep in range(args.repeat):
        for sc in chosen:
            if sc.repeat is not None and rep >= sc.repeat:
                continue
            n = min(samples, sc.samples or samples)
            r = xwake_one(sc, n, tmp_root, seed=5 + rep)
            r["count"] = n
            runs[sc.label].append(r)
            shown = r.get("error") or ", ".join(f"{m}={fmt(v)}"
                                                 for m, v in r["metrics"].items())
            print(f"  [{rep + 1}/{args.repeat}] {sc.label:<28} n={n:<5} {shown}", flush=True)
    results = {}
    for sc in chosen:
        entry = summarise(runs[sc.label])
        entry["count"] = runs[sc.label][0]["count"]
        entry["sharing"] = sc.sharing
        results[sc.label] = entry
    return {"title": title, "description": one_line(xwake_one.__doc__),
            "seconds": time.perf_counter() - started, "results": results}


def run_g(args, shared, tmp_root):
    total = shared_counts(args)["g_n"]
    title = "(g) producer and consumer processes on one shared queue"
    print(f"\n{title}", flush=True)
    started = time.perf_counter()
    chosen = [sc for sc in shared if "g" in sc.scenarios]
    runs = {(p, c, sc.label): [] for p, c in G_VARIANTS for sc in chosen}
    for rep in range(args.repeat):
        for p, c in G_VARIANTS:
            for sc in chosen:
                if sc.repeat is not None and rep >= sc.repeat:
                    continue
                r = g_one(sc, p, c, total, tmp_root)
                runs[(p, c, sc.label)].append(r)
                if "error" in r:
                    shown = "ERROR " + r["error"]
                if "not_delivered" in r:
                    shown = ("ERROR; " if "error" in r else "") + (
                        f"items/s={fmt(r['metrics']['throughput'])} "
                        f"dup={r['duplicates']} missing={r['not_delivered']}")
                    if r.get("consumers_timed_out"):
                        shown += f" consumers-timed-out={r['consumers_timed_out']}"
                    if r.get("qsize_after_drain"):
                        shown += f" qsize-after-drain={r['qsize_after_drain']}"
                    if "consumers" in r:
                        k = r["consumers"]
                        shown += (f" commits={k['commits']} conflicts={k['conflicts']} "
                                  f"lost={k['claims_lost']}")
                print(f"  [{rep + 1}/{args.repeat}] {p}p+{c}c {sc.label:<18} n={total} "
                      f"{shown}", flush=True)
    variants = {}
    for p, c in G_VARIANTS:
        results = {}
        for sc in chosen:
            entry = summarise(runs[(p, c, sc.label)])
            entry["count"] = total
            entry["sharing"] = sc.sharing
            results[sc.label] = entry
        variants[f"{p}p{c}c"] = {"producers": p, "consumers": c, "results": results,
                                 "title": f"{p} producer + {c} consumer processes"}
    return {"title": title, "description": one_line(g_one.__doc__),
            "seconds": time.perf_counter() - started, "variants": variants}


# ---------------------------------------------------------------------------------------
# Machine info, formatting, markdown, chart.
# ---------------------------------------------------------------------------------------


def machine_info(tmp_root):
    import psutil
    versions = {}
    for dist in ("ackqueue", "ZODB", "ZEO", "persistent", "BTrees", "transaction",
                 "persist-queue", "litequeue", "matplotlib", "psutil"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    versions["sqlite (library)"] = sqlite3.sqlite_version
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    fs = None
    real = os.path.realpath(tmp_root)
    best = ""
    for part in psutil.disk_partitions(all=True):
        if real.startswith(part.mountpoint) and len(part.mountpoint) > len(best):
            best, fs = part.mountpoint, f"{part.fstype} on {part.device} ({part.mountpoint})"
    return {
        "fsync_probe": fsync_probe(tmp_root),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": cpu_model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "temp_dir": real,
        "temp_dir_filesystem": fs,
        "loadavg_at_start": os.getloadavg(),
        "versions": versions,
        "ackqueue_git": git_state(),
    }


def git_state():
    """The repository's commit and whether ackqueue/ differs from it (recorded at the start
    and the end of a run: the code under test must not change in between)."""
    git = {}
    for key, cmd in (("commit", ["git", "rev-parse", "HEAD"]),
                     ("tree", ["git", "rev-parse", "HEAD:ackqueue"]),
                     ("status", ["git", "status", "--porcelain", "--", "ackqueue"]),
                     ("diff", ["git", "diff", "HEAD", "--", "ackqueue"])):
        try:
            git[key] = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                      timeout=10).stdout.strip()
        except Exception:   # noqa: BLE001
            git[key] = None
    import hashlib
    return {"commit": git.get("commit"), "ackqueue_tree": git.get("tree"),
            "ackqueue_dir_modified": bool(git.get("status")),
            "ackqueue_diff_sha1": hashlib.sha1((git.get("diff") or "").encode()).hexdigest()}


def fsync_probe(tmp_root, n=200):
    """How long an append of 100 bytes + os.fsync takes in the temp dir (the floor under
    every durable commit on this machine)."""
    directory = tempfile.mkdtemp(prefix="ackbench-fsync-", dir=tmp_root)
    try:
        fd = os.open(os.path.join(directory, "probe"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        times = []
        try:
            for _ in range(n):
                t = time.perf_counter()
                os.write(fd, b"x" * 100)
                os.fsync(fd)
                times.append((time.perf_counter() - t) * 1000)
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    times.sort()
    return {"samples": n, "p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
            "fsyncs_per_s_at_p50": 1000 / percentile(times, 50)}


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
    if not with_zeo:
        return
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


def markdown_targets(report):
    """Issue 5's targets: measured, and the bound the floors of this run put on each."""
    fl = report.get("floors") or {}
    lines = ["## Issue 5's targets, and the floor under each", "",
             "Targets with durability equal to persist-queue's: ackqueue (fsync), and "
             "ackqueue (zeo) across processes.  **Floor**: the bound that bare one-object "
             "ZODB commits, measured in this run with no ackqueue code "
             "(benchmarks/floors.py), put on the scenario (the most favourable of the "
             "measurements at the start and at the end of the run).  Where the floor is "
             "beyond the target, no change to ackqueue can meet it on this machine while "
             "put and ack return only once committed durably.  A floor counts commits "
             "only, not the CPU a queue spends around them, so a floor that allows a "
             "target does not show that a queue on ZODB can meet it.  **Lean ZODB queue**: "
             f"what {LEAN} (benchmarks/lean.py: durable puts and acks with group commit "
             "and nothing else ackqueue promises) measured in the same scenario of this "
             "run.  Where even it misses the target, what stands in the way is ZODB "
             "under CPython on this machine, not ackqueue's features.", ""]
    lines.append("| target | needed | measured | met | floor | floor allows the target | "
                 "how the floor is derived | lean ZODB queue | lean meets it |")
    lines.append("|---|---:|---:|---|---:|---|---|---:|---|")
    for r in floors.target_rows(report, REFERENCE, lean=LEAN):
        says = {True: "yes", False: "**no**", None: "—"}
        met = says[r["met"]]
        allows = says[floors.meets(r["bound"], r["needed"], r["higher_better"])]
        lean_meets = says[floors.meets(r["lean"], r["needed"], r["higher_better"])]
        lines.append(f"| {r['target']} | {fmt(r['needed'])} | {fmt(r['measured'])} | {met} | "
                     f"{fmt(r['bound'])} | {allows} | {r['bound_says']} | "
                     f"{fmt(r['lean'])} | {lean_meets} |")
    lines.append("")
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
    if bits:
        lines.append("Bare commits measured " + "; ".join(bits) + ".  (f)'s targets are in "
                     "its own section below.")
        lines.append("")
    return lines


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if v != v:
        return "nan"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


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


TABLE_COLUMNS = {
    "a": [("put_rate", "put/s"), ("get_ack_rate", "get+ack/s"), ("cycle_rate", "full cycle items/s")],
    "b": [("cycle_rate", "cycles/s")],
    "c": [("throughput", "items/s end to end")],
    "d": [("put_rate", "put/s"), ("get_ack_rate", "get+ack/s"), ("cycle_rate", "full cycle items/s")],
    "e": [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("mean_ms", "mean ms")],
    "e_xproc": [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("mean_ms", "mean ms")],
}


def code_changed_note(info):
    start, end = info.get("ackqueue_git"), info.get("ackqueue_git_at_end")
    same = ("ackqueue_tree", "ackqueue_dir_modified", "ackqueue_diff_sha1")
    if not start or not end or all(start.get(k) == end.get(k) for k in same):
        return ""
    return (f"  **The ackqueue code changed during this run** (git {str(start['commit'])[:10]}"
            f" → {str(end['commit'])[:10]}, or uncommitted changes in ackqueue/): later "
            "scenarios may have run other code than earlier ones.")


def markdown(report):
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
    lines.extend(markdown_targets(report))
    lines.append("## Contenders and their durability")
    lines.append("")
    lines.append("| contender | durability |")
    lines.append("|---|---|")
    for c in report["contenders"]:
        lines.append(f"| {c['label']} | {c['durability']} |")
    lines.append("")
    small = [c for c in report["contenders"] if c.get("counts")]
    for c in small:
        lines.append(f"{c['label']} gets smaller counts in (a)–(d): "
                     + ", ".join(f"{COUNT_KINDS.get(k, k)} at most {v:,}"
                                 for k, v in c["counts"].items())
                     + " (one-item commits through the server are slow); each table shows "
                       "every contender's N.")
        lines.append("")
    if any(k in report["scenarios"] for k in SHARED_SCENARIOS) and \
            report.get("shared_contenders"):
        lines.append("## Contenders across processes ((e) across processes, (g))")
        lines.append("")
        lines.append("| contender | how the processes share the queue |")
        lines.append("|---|---|")
        for c in report["shared_contenders"]:
            lines.append(f"| {c['label']} | {c['sharing']} |")
        lines.append("")
    for key in ALL_KEYS:
        sc = report["scenarios"].get(key)
        if sc is None:
            continue
        lines.append(f"## {sc['title']}")
        lines.append("")
        if key == "f":
            a = report["scenarios"].get("a", {}).get("results", {}).get(REFERENCE, {})
            lines.extend(markdown_scale(sc, (a.get("median") or {}).get("put_rate")))
            continue
        if key == "g":
            lines.extend(markdown_g(sc))
            continue
        lines.append(sc["description"])
        lines.append("")
        cols = TABLE_COLUMNS[key]
        header = "| contender | N |" + "".join(f" {name} | ×pq |" for _, name in cols)
        lines.append(header)
        lines.append("|---|---:|" + "---:|---:|" * len(cols))
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
        if key == "d":
            lines.append("What each contender used for a batch:")
            lines.append("")
            for label, entry in sc["results"].items():
                bits = entry.get("batch_method")
                cpi = commits_per_item(entry)
                if cpi:
                    bits += f"; ZODB commits made by the process per item (measured): {cpi}"
                lines.append(f"- {label}: {bits}")
            lines.append("")
        spread_metric = "p50_ms" if key in ("e", "e_xproc") else cols[-1][0]
        spreads = []
        for label, entry in sc["results"].items():
            ok = [r["metrics"] for r in entry["runs"] if "metrics" in r]
            if len(ok) > 1:
                vals = [r[spread_metric] for r in ok]
                spreads.append(f"{label} {fmt(min(vals))}–{fmt(max(vals))}")
        if spreads:
            lines.append(f"Spread over repetitions ({dict(cols)[spread_metric]}): "
                         + "; ".join(spreads) + ".")
            lines.append("")
        if key == "e_xproc":
            lines.extend(notes_e_xproc(sc))
        lines.extend(problem_lines(sc["results"]))
    return "\n".join(lines) + "\n"


COUNT_KINDS = {"n": "N in (a)–(c)", "batch_n": "N in (d)", "samples": "samples in (e)"}


def commits_per_item(entry):
    """'x.xx' from the diagnostics of ackqueue runs (commits / items in the run)."""
    vals = [r["diagnostics"]["commits"] / entry["count"] for r in entry["runs"]
            if "commits" in (r.get("diagnostics") or {})]
    if not vals:
        return None
    return f"{statistics.median(vals):.2f} (median over {len(vals)} run(s))"


def problem_lines(results):
    """Everything that went wrong in some run: errors, failed closes, children that did not
    exit cleanly, server exit codes and the WARNING/ERROR lines of the server's log."""
    out = []
    for label, entry in results.items():
        for i, r in enumerate(entry["runs"], 1):
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


def markdown_g(sc):
    lines = [sc["description"], ""]
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
    lines.append("Delivery over all runs of (g) (every run, failed ones included):")
    lines.append("")
    for label, t in summary.items():
        lines.append(f"- {label}: {t['runs']} run(s); {t['items']:,} items put (put() "
                     f"returned) in the runs that were counted; {t['dup']:,} duplicate "
                     f"deliveries; {t['lost']:,} of those items not delivered to the "
                     f"consumers before they stopped (in {t['lost_runs']} run(s))"
                     + (f", and a fresh process then received {t['left']:,} item(s) "
                        "still in the queue" if t["left"] else "")
                     + f"; {t['failed']} run(s) with an error.")
    lines.append("")
    for var in sc["variants"].values():
        lines.append(f"### {var['title']}")
        lines.append("")
        lines.append("| contender | N | items/s end to end | ×pq | consumer commits | conflict "
                     "retries | conflict-retry rate | claims lost | duplicates delivered | "
                     "not delivered |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        ref = var["results"].get(REFERENCE, {}).get("median")
        for label, entry in var["results"].items():
            runs = entry["runs"]
            clean = [r for r in runs if "metrics" in r and "error" not in r]
            counted = [r for r in runs if "not_delivered" in r]
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
            row += f" {each('duplicates')} | {each('not_delivered')} |"
            lines.append(row)
        lines.append("")
        lines.append("Commits, conflict retries, rate and claims lost: summed over the "
                     "consumer processes of a run, median over the runs without an error "
                     "(— where the library exposes no such counter).  Duplicates delivered "
                     "and not delivered: every run listed, from the consumers' logs.")
        lines.append("")
        spreads, notes = [], []
        for label, entry in var["results"].items():
            clean = [r for r in entry["runs"] if "metrics" in r and "error" not in r]
            counted = [r for r in entry["runs"] if "not_delivered" in r]
            if len(clean) > 1:
                vals = [r["metrics"]["throughput"] for r in clean]
                spreads.append(f"{label} {fmt(min(vals))}–{fmt(max(vals))}")
            bits = []
            lost = [r["not_delivered"] for r in counted]
            if any(lost):
                left = [r.get("left_in_queue") or 0 for r in counted]
                if all(x <= y for x, y in zip(lost, left)):
                    bits.append("items whose put() returned that the consumers did not get "
                                f"before they stopped, per run: {lost}; a fresh process "
                                f"received {left} afterwards (its items/s counts delivered "
                                "items only)")
                else:
                    bits.append("**items whose put() returned were never delivered**, per "
                                f"run: {lost} (its items/s counts delivered items only)")
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
            if counted and len(clean) < len(counted):
                bits.append("items/s per run (distinct items acknowledged / time), failed "
                            "runs included: " + ", ".join(
                                fmt(r["metrics"]["throughput"])
                                + (" (failed run)" if "error" in r else "") for r in counted))
            if counted:
                bits.append("items per consumer: " + "; ".join(
                    "/".join(str(n) for n in r["per_consumer"]) for r in counted))
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
            if bits:
                notes.append(f"- {label}: " + "; ".join(bits) + ".")
        if spreads:
            lines.append("Spread over repetitions (items/s end to end): "
                         + "; ".join(spreads) + ".")
            lines.append("")
        lines.extend(notes + ([""] if notes else []))
        lines.extend(problem_lines(var["results"]))
    return lines


def markdown_scale(sc, put_rate=None):
    lines = [sc["description"], ""]
    rows = [
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
    labels = list(sc["results"])
    lines.append("| measure | " + " | ".join(labels) + " | ×pq (ackqueue) |")
    lines.append("|---|" + "---:|" * (len(labels) + 1))
    for name, get, higher in rows:
        vals = []
        for label in labels:
            r = sc["results"][label]
            try:
                vals.append(get(r))
            except Exception:   # noqa: BLE001
                vals.append(None)
        ack = vals[labels.index("ackqueue (fsync)")] if "ackqueue (fsync)" in labels else None
        ref = vals[labels.index(REFERENCE)] if REFERENCE in labels else None
        rat = "—" if higher is None else ratio(ack, ref, higher)
        lines.append(f"| {name} | " + " | ".join(fmt(v) for v in vals) + f" | {rat} |")
    lines.append("")
    for label in labels:
        r = sc["results"][label]
        if "error" in r:
            lines.append(f"- {label}: error: {r['error']}")
            continue
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
        lines.append(f"- {label}: " + "; ".join(bits) + ".")
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


def chart(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = []
    for key, metric, label in (("a", "cycle_rate", "items/s"), ("b", "cycle_rate", "cycles/s"),
                               ("c", "throughput", "items/s"), ("d", "cycle_rate", "items/s"),
                               ("e", "p50_ms", "p50 ms (lower is better)"),
                               ("e_xproc", "p50_ms", "p50 ms (lower is better)")):
        sc = report["scenarios"].get(key)
        if sc:
            names = [l for l, e in sc["results"].items() if e.get("median")]
            vals = [sc["results"][l]["median"][metric] for l in names]
            panels.append((sc["title"], names, vals, label))
    sc = report["scenarios"].get("g")
    if sc:
        names, vals = [], []
        for var in sc["variants"].values():
            for label, e in var["results"].items():
                if e.get("median"):
                    names.append(f"{label}\n{var['producers']}p + {var['consumers']}c")
                    vals.append(e["median"]["throughput"])
        if names:
            panels.append((sc["title"], names, vals, "items/s end to end"))
    sc = report["scenarios"].get("f")
    if sc:
        names, vals = [], []
        for label, r in sc["results"].items():
            for what, k in (("after kill", "after_kill"), ("after close", "after_clean_close")):
                if k in r:
                    names.append(f"{label}\nopen {what}")
                    vals.append(r[k]["open_s"])
        if names:
            panels.append((sc["title"] + ": open time", names, vals, "seconds (lower is better)"))
    if not panels:
        return False
    ncols = 2
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(13, 3.6 * nrows), squeeze=False)
    colors = {"queue.Queue": "#999999", REFERENCE: "#d62728", "litequeue": "#ff7f0e"}
    for ax, (title, names, vals, unit) in zip(axes.flat, panels):
        cs = [next((v for k, v in colors.items() if n.startswith(k)), "#1f77b4")
              for n in names]
        y = range(len(names))
        ax.barh(list(y), vals, color=cs)
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(unit, fontsize=8)
        for i, v in enumerate(vals):
            ax.text(v, i, " " + fmt(v), va="center", fontsize=7)
        ax.margins(x=0.25)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    info = report["machine"]
    fig.suptitle(f"ackqueue vs peers — {info['date'][:10]}, {info['cpu_count']} CPUs, "
                 f"Python {info['python']} (log scale)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts, a ~1 minute smoke run")
    p.add_argument("--scenarios", default=",".join(ALL_KEYS),
                   help=f"comma-separated subset of {','.join(ALL_KEYS)}")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"))
    p.add_argument("--repeat", type=int, default=None,
                   help="repetitions per (scenario, contender); median reported "
                        "(default 3, --quick 1)")
    p.add_argument("--fill-count", type=int, default=None,
                   help="messages for (f) (default 1,000,000; --quick 50,000)")
    p.add_argument("--tmpdir", default=None,
                   help="where the fresh queue directories go (default: the system temp "
                        "dir; must not be tmpfs, where fsync costs nothing)")
    p.add_argument("--contenders", default=None,
                   help="comma-separated labels to keep (default: all)")
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ALL_KEYS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {ALL_KEYS}")
    tmp_root = args.tmpdir or tempfile.gettempdir()
    contenders = make_contenders()
    shared = make_shared_contenders()
    if args.contenders:
        keep = {c.strip() for c in args.contenders.split(",")}
        contenders = [c for c in contenders if c.label in keep]
        shared = [c for c in shared if c.label in keep]

    started = time.perf_counter()
    report = {"args": vars(args), "machine": machine_info(tmp_root),
              "item": {"example": make_item(0),
                       "pickled_bytes": len(pickle.dumps(make_item(0), protocol=5))},
              "contenders": [{"label": c.label, "durability": c.durability,
                              "counts": c.counts} for c in contenders],
              "shared_contenders": [{"label": c.label, "family": c.family, "mode": c.mode,
                                     "sharing": c.sharing, "scenarios": list(c.scenarios)}
                                    for c in shared],
              "scenarios": {}}
    print(f"ackqueue benchmarks: {len(contenders)} contenders, scenarios {keys}, "
          f"repeat {args.repeat}, temp dir {tmp_root} "
          f"({report['machine']['temp_dir_filesystem']})", flush=True)
    with_zeo = any(c.label == "ackqueue (zeo)" for c in shared) and "e_xproc" in keys
    report["floors"] = {}
    measure_floors(report["floors"], "at_start", args, tmp_root, with_zeo)
    table_keys = [k for k in keys if k in SCENARIOS]
    report["scenarios"].update(run_table_scenarios(table_keys, contenders, args, tmp_root))
    for key in keys:
        if key == "e_xproc":
            report["scenarios"]["e_xproc"] = run_xwake(args, shared, tmp_root)
        elif key == "g":
            report["scenarios"]["g"] = run_g(args, shared, tmp_root)
        elif key == "f":
            report["scenarios"]["f"] = run_scale(args, tmp_root)
    measure_floors(report["floors"], "at_end", args, tmp_root, with_zeo)
    report["total_seconds"] = time.perf_counter() - started
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    report["machine"]["ackqueue_git_at_end"] = git_state()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(report))
    made_chart = chart(report, os.path.join(args.out, "results.png"))
    print(f"\nwrote {args.out}/results.json, results.md"
          + (", results.png" if made_chart else "")
          + f" in {report['total_seconds']:.0f} s total", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
