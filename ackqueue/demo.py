"""The demo: the queue's main job under trouble, then a check that nothing was lost.

What happens, in a temporary folder (or --dir):

1. Two producer threads put the first part of the jobs ({"id": n, "kind": "job"}; some are
   {"kind": "parent"}) while worker threads get, "process" (record the id) and ack them.
   About 1 item in 200 makes a worker die of an exception while it holds the item; the
   queue gives the item back and the main loop starts a replacement worker.  Parents are
   fanned out atomically: ``with q.transaction():`` puts 3 children and acknowledges the
   parent in one commit (worker 0 and its replacements also make the get itself part of
   the transaction).
2. The workers are stopped, the queue is closed, and a child Python process opens the same
   file and consumes items, recording each id (fsync'd) in a side file *before* it acks.
   Once it has recorded enough, it is SIGKILLed.
3. The queue is reopened (what the child held in flight is ready again), two producers put
   the rest of the jobs and the workers run until every item put has been acknowledged.
4. A summary and a verification line computed from the recorded counts.
"""
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from queue import Empty

from .queue import AckQueue

__all__ = ["run_demo"]

CRASH_RATE = 1 / 200          # chance that a worker dies while holding an item
CHILDREN = 3                  # children per parent
KILL_AFTER = 100              # the child is killed after recording this many items
DRAIN_TIMEOUT = 45.0          # seconds the last phase may take before we give up


class WorkerCrash(RuntimeError):
    """A simulated worker crash: a real uncaught exception that ends the worker thread
    while it holds an item."""


def _quiet_crash_hook(previous):
    """A threading.excepthook that keeps planned crashes from printing a traceback each.

    A WorkerCrash is handed to the previous hook (ackqueue's, which records the thread as
    failed so that what it held is given back) disguised as SystemExit, which threading's
    default hook ignores silently; every other exception goes through unchanged."""
    def hook(args):
        if isinstance(args.exc_value, WorkerCrash):
            args = threading.ExceptHookArgs(
                (SystemExit, args.exc_value, args.exc_traceback, args.thread))
        previous(args)
    return hook


# The child process: consume and ack, recording each id in the side file before the ack.
CHILD_CODE = r"""
import json, os, sys
from ackqueue import AckQueue, Empty

path, side = sys.argv[1], sys.argv[2]
fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def record(*fields):
    os.write(fd, (json.dumps(fields) + "\n").encode())
    os.fsync(fd)

q = AckQueue(path=path)
record("open", os.getpid(), q.qsize())
idle = False
while True:
    try:
        msg = q.get_message(timeout=0.5)
    except Empty:
        if not idle:
            record("idle")
            idle = True
        continue
    idle = False
    job = msg.body
    if job["kind"] == "parent":
        with q.transaction():
            for k in range(%(children)d):
                child = {"id": "%%s.%%d" %% (job["id"], k), "kind": "child"}
                q.put(child)
                record("put", child["id"])   # intent: committed below, or the parent
                                             # comes back and is fanned out again
            record("done", job["id"], msg.receive_count)
            q.ack(msg)
    else:
        record("done", job["id"], msg.receive_count)
        q.ack(msg)
""" % {"children": CHILDREN}


def read_side_file(path):
    """The complete lines of the child's side file, parsed."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]          # a last line without "\n" is incomplete
    return [json.loads(line) for line in lines if line]


class Demo:
    def __init__(self, jobs, workers, directory, seed, quiet):
        self.jobs = jobs
        self.nworkers = max(1, workers)
        self.directory = directory
        self.seed = seed
        self.quiet = quiet
        self.path = os.path.join(directory, "jobs.fs")
        self.side = os.path.join(directory, "child-processed.txt")
        rng = random.Random(f"{seed}/plan")
        nparents = min(50, max(1, jobs // 20)) if jobs else 0
        self.parents = set(rng.sample(range(jobs), nparents))
        self.expected = set(range(jobs)) | {
            f"{p}.{k}" for p in self.parents for k in range(CHILDREN)}
        self.lock = threading.Lock()
        self.put_ids = set()                  # ids whose put returned (or committed)
        self.processed = collections.Counter()  # id -> times recorded processed
        self.deliveries = 0
        self.redelivered = 0                  # deliveries with receive_count > 1
        self.crashes = 0
        self.rolled_back = 0                  # transaction blocks a crash rolled back
        self.fanouts = 0
        self.child_info = {}
        self.q = None
        self.stop = threading.Event()
        self.workers = []
        self.producers = []
        self.worker_seq = 0
        self.t0 = time.monotonic()
        self.last_progress = 0.0

    # -- output ---------------------------------------------------------------------------

    def say(self, text):
        if not self.quiet:
            print(text, flush=True)

    def elapsed(self):
        return time.monotonic() - self.t0

    def progress(self, force=False):
        now = self.elapsed()
        if not force and now - self.last_progress < 1.0:
            return
        self.last_progress = now
        q = self.q
        ready = q.qsize()
        inflight = max(0, q.unfinished_tasks - ready)
        with self.lock:
            put = len(self.put_ids)           # jobs and children, as the totals count
            acked = len(self.processed)
            died = self.crashes
        self.say(f"  {now:5.1f}s  put {put}/{len(self.expected)}  acked {acked}  "
                 f"ready {ready}  in flight {inflight}  workers died {died}")

    # -- threads --------------------------------------------------------------------------

    def produce(self, ids):
        for n in ids:
            kind = "parent" if n in self.parents else "job"
            self.q.put({"id": n, "kind": kind})
            with self.lock:
                self.put_ids.add(n)

    def start_producers(self, ids):
        self.producers = [threading.Thread(target=self.produce, args=(ids[i::2],),
                                           name=f"producer-{i}", daemon=True)
                          for i in range(2)]
        for t in self.producers:
            t.start()

    def note_delivery(self, msg):
        with self.lock:
            self.deliveries += 1
            if msg.receive_count > 1:
                self.redelivered += 1

    def maybe_crash(self, rng):
        if rng.random() < CRASH_RATE:
            with self.lock:
                self.crashes += 1
            raise WorkerCrash(f"{threading.current_thread().name} crashed on purpose")

    def record(self, ident):
        with self.lock:
            self.processed[ident] += 1

    def work(self, rng, transactional):
        q = self.q
        while not self.stop.is_set():
            if transactional:
                # The get, the children's puts and the ack are one commit; a crash inside
                # rolls all of it back (the parent is given back, the children dropped).
                children = []
                try:
                    with q.transaction():
                        msg = q.get_message(timeout=0.5)
                        self.note_delivery(msg)
                        job = msg.body
                        if job["kind"] == "parent":
                            for k in range(CHILDREN):
                                child = {"id": f"{job['id']}.{k}", "kind": "child"}
                                q.put(child)
                                children.append(child["id"])
                        try:
                            self.maybe_crash(rng)
                        except WorkerCrash:
                            with self.lock:
                                self.rolled_back += 1
                            raise
                        self.record(job["id"])
                except Empty:
                    continue
                with self.lock:
                    self.put_ids.update(children)
                    self.fanouts += bool(children)
                continue
            try:
                msg = q.get_message(timeout=0.5)
            except Empty:
                continue
            self.note_delivery(msg)
            self.maybe_crash(rng)          # dies holding msg: the queue gives it back
            job = msg.body
            if job["kind"] == "parent":
                children = [f"{job['id']}.{k}" for k in range(CHILDREN)]
                with q.transaction():      # children appear and the parent is acked at once
                    for c in children:
                        q.put({"id": c, "kind": "child"})
                    self.record(job["id"])
                    q.ack(msg)
                with self.lock:
                    self.put_ids.update(children)
                    self.fanouts += 1
            else:
                self.record(job["id"])
                q.ack(msg)

    def start_worker(self, slot):
        self.worker_seq += 1
        rng = random.Random(f"{self.seed}/worker/{self.worker_seq}")
        t = threading.Thread(target=self.work, args=(rng, slot == 0),
                             name=f"worker-{slot}.{self.worker_seq}", daemon=True)
        t.start()
        return t

    def start_workers(self):
        self.stop.clear()
        self.workers = [self.start_worker(slot) for slot in range(self.nworkers)]

    def keep_pool(self):
        if self.stop.is_set():
            return
        for slot, t in enumerate(self.workers):
            if not t.is_alive():
                self.workers[slot] = self.start_worker(slot)

    def stop_workers(self):
        self.stop.set()
        for t in self.workers:
            t.join()

    # -- phases ---------------------------------------------------------------------------

    def phase_one(self, ids):
        self.say(f"phase 1: 2 producers put {len(ids)} jobs, {self.nworkers} workers "
                 f"(about 1 item in {round(1 / CRASH_RATE)} kills its worker)")
        self.q = AckQueue(path=self.path)
        self.start_workers()
        self.start_producers(ids)
        # Stop the workers early enough that a backlog is left for the child process.
        stop_at = len(ids) // 2
        while True:
            with self.lock:
                acked = len(self.processed)
            if acked >= stop_at or not any(t.is_alive() for t in self.producers) \
                    and self.q.qsize() <= KILL_AFTER * 2:
                break
            self.keep_pool()
            self.progress()
            time.sleep(0.05)
        self.stop_workers()
        for t in self.producers:
            t.join()
        self.progress(force=True)
        ready, unfinished = self.q.qsize(), self.q.unfinished_tasks
        self.q.close()
        self.q = None
        self.say(f"workers stopped, queue closed: {ready} ready, {unfinished} unacked")
        return ready

    def phase_two(self, ready):
        target = max(1, min(KILL_AFTER, ready // 2))
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        child = subprocess.Popen([sys.executable, "-c", CHILD_CODE, self.path, self.side],
                                 env=env, stdin=subprocess.DEVNULL)
        self.say(f"phase 2: child process pid {child.pid} opened the queue file; "
                 f"it will be SIGKILLed after {target} items")
        deadline = time.monotonic() + 30
        last = 0.0
        while True:
            records = read_side_file(self.side)
            done = sum(1 for r in records if r[0] == "done")
            idle = any(r[0] == "idle" for r in records)
            if done >= target or idle or child.poll() is not None \
                    or time.monotonic() > deadline:
                break
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                self.say(f"  {self.elapsed():5.1f}s  child pid {child.pid}: processed {done}")
            time.sleep(0.01)
        if child.poll() is None:
            self.say(f"killing child pid {child.pid} after {done} items")
            os.kill(child.pid, signal.SIGKILL)
        code = child.wait()
        records = read_side_file(self.side)
        done = [r for r in records if r[0] == "done"]
        with self.lock:
            for r in done:
                self.processed[r[1]] += 1
                self.deliveries += 1
                if r[2] > 1:
                    self.redelivered += 1
            self.put_ids.update(r[1] for r in records if r[0] == "put")
        self.child_info = {"pid": child.pid, "killed_at": len(done), "returncode": code,
                           "fanouts": sum(1 for r in done if r[1] in self.parents)}
        self.say(f"child pid {child.pid} ended with {code} "
                 f"({'SIGKILL' if code == -signal.SIGKILL else 'not killed'}); "
                 f"it recorded {len(done)} items")
        # What should be ready if every recorded item was acked: the child's fan-outs
        # added children; anything above that is what it held in flight when killed.
        return ready - len(done) + CHILDREN * self.child_info["fanouts"]

    def phase_three(self, ids, left):
        self.q = AckQueue(path=self.path)
        ready = self.q.qsize()
        self.say(f"reopened: {ready} ready, {self.q.unfinished_tasks} unacked; recovered "
                 f"{max(0, ready - left)} item(s) the killed child held in flight "
                 f"(or had recorded but not yet acked)")
        self.say(f"phase 3: 2 producers put the other {len(ids)} jobs; workers drain the queue")
        self.start_workers()
        self.start_producers(ids)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        drained = False
        while time.monotonic() < deadline:
            self.keep_pool()
            self.progress()
            if not any(t.is_alive() for t in self.producers) and \
                    self.q.unfinished_tasks == 0:
                drained = True
                break
            time.sleep(0.05)
        self.stop_workers()
        self.progress(force=True)
        unfinished = self.q.unfinished_tasks
        self.q.close()
        self.q = None
        if not drained:
            self.say(f"the queue did not drain within {DRAIN_TIMEOUT:.0f}s")
        return drained and unfinished == 0, unfinished

    def run(self):
        ids = list(range(self.jobs))
        split = (self.jobs * 3) // 5
        children = len(self.expected) - self.jobs
        self.say(f"ackqueue demo: {len(self.expected)} messages: {self.jobs} jobs, of which "
                 f"{len(self.parents)} parents fan out into {CHILDREN} children each "
                 f"(+{children}); seed {self.seed}, queue file {self.path}")
        ready = self.phase_one(ids[:split])
        left = self.phase_two(ready)
        drained, unfinished = self.phase_three(ids[split:], left)
        elapsed = self.elapsed()

        with self.lock:
            put = len(self.put_ids)
            acked = len(self.processed)
            twice = sum(1 for c in self.processed.values() if c > 1)
            lost = len(self.put_ids - set(self.processed))
            unexpected = len(self.put_ids ^ self.expected)
        print("summary:")
        print(f"  workers died holding an item: {self.crashes} "
              f"({self.rolled_back} of them inside a transaction, rolled back)")
        print(f"  parents fanned out in transactions: {self.fanouts} by threads + "
              f"{self.child_info['fanouts']} by the child process "
              f"(of {len(self.parents)} parents)")
        print(f"  child pid {self.child_info['pid']} killed at item "
              f"{self.child_info['killed_at']} (exit {self.child_info['returncode']})")
        print(f"  deliveries {self.deliveries}, of which redelivered (receive_count > 1) "
              f"{self.redelivered}; ids processed more than once {twice}")
        print(f"  queue drained: {'yes' if drained else 'no'} (unacked {unfinished}); "
              f"elapsed {elapsed:.1f}s")
        if unexpected:
            print(f"  put ids differ from the expected jobs + children by {unexpected}")
        print(f"verify: put {put}, acked {acked}, redelivered {self.redelivered}, lost {lost}",
              flush=True)
        return 0 if lost == 0 and drained and not unexpected else 1


def run_demo(jobs=3000, workers=4, directory=None, seed=None, quiet=False):
    """Run the demo; return the exit code (0: nothing lost and the queue drained)."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    created = directory is None
    if created:
        directory = tempfile.mkdtemp(prefix="ackqueue-demo-")
    else:
        os.makedirs(directory, exist_ok=True)
        for name in ("jobs.fs", "child-processed.txt"):
            if os.path.exists(os.path.join(directory, name)):
                print(f"ackqueue demo: {os.path.join(directory, name)} exists; "
                      "use an empty folder", file=sys.stderr)
                return 2
    previous_hook = threading.excepthook
    threading.excepthook = hook = _quiet_crash_hook(previous_hook)
    try:
        return Demo(jobs, workers, directory, seed, quiet).run()
    finally:
        if threading.excepthook is hook:
            threading.excepthook = previous_hook
        if created:
            shutil.rmtree(directory, ignore_errors=True)
