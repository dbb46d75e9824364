"""SIGKILL torture: real producer and consumer processes, killed at random moments, over
many rounds, embedded (one process at a time holds the file) and through a ZEO server
(several producers and consumers at once).

Contract checked after every round, with the processes' own journals as evidence:

- the queue opens (a fresh inspector process opens it after every round: embedded, the
  file itself; ZEO, through the server);
- every message whose ``put`` returned is acknowledged or still in the queue (ready or in
  flight): otherwise it is *lost*;
- no acknowledged message is delivered again or found in the queue afterwards
  (*redelivered-after-ack*), and no message is acknowledged twice;
- a ``put_many``, a transaction of puts, and a crawler transaction (get a parent, put its
  children, ack the parent, in one ``with q.transaction()``) are all or nothing, also
  when the process died inside them (*torn* otherwise);
- every message found is complete (its payload matches its checksum), was put by
  someone (no *phantom*), and is stored once (no *duplicated* message ids for one item).

How the evidence is gathered.  Every child process appends one line per event to its own
journal file (``os.write`` on an ``O_APPEND`` descriptor: the line is in the kernel when
the call returns, so SIGKILL cannot lose it; no fsync is needed because the machine does
not crash).  Each line starts with ``time.monotonic_ns()``, one clock for every process
of the machine, so lines of different processes can be ordered.  A process writes the
intention before an operation and the outcome after it returns ("putting X" / "put X",
"acking X" / "acked X", "batch B ..." / "batch-done B", "txn T P children" /
"txn-done T"), and "got X MID TCALL RC" after a get returned, with TCALL the clock
*before* the get was called.  A kill between intention and outcome leaves the operation
in doubt; the checker then accepts both outcomes but insists on atomicity and on
consistency with what is seen later:

- a put in doubt may or may not exist; a batch or transaction in doubt must exist wholly
  or not at all (a crawler transaction exists iff its children do; then its parent's ack
  happened too);
- an ack in doubt excuses the message's absence only if the message was not seen (got by
  anyone, or found by the inspector) after the ack was attempted; once the checker has
  relied on that ack, seeing the message again is a redelivery after ack;
- a delivery after an ack is a violation only when its get was *called* after the ack had
  *returned* (TCALL > the acked line's time), so scheduling delays cannot fake one.

After the round's processes are dead the inspector drains the whole queue (waiting, via
ZEO, until the killed processes' leases expire and their in-flight messages come back),
checks every payload, and gives everything back when it closes.  The checker
(``Checker``) is plain code fed with journal lines and inventories; tests/test_torture.py
feeds it synthetic violations to show that it reports them.

Command line::

    python tests/torture.py --mode embedded|zeo|both --rounds N --seed S [--json FILE]

``--long`` (or ACKQUEUE_LONG=1) raises the default rounds to a long run.  The summary
prints rounds, kills (and where the kills landed, read from the journals), messages put,
acked, lost, redelivered-after-ack, open failures, ordinary redeliveries, and the time.
"""
import argparse
import hashlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = os.environ.get("ACKQUEUE_LONG", "") not in ("", "0")
QUEUE = "torture"
READY_TIMEOUT = 60        # failure bounds only, never expected to be reached
INSPECT_TIMEOUT = 120

# Rounds per mode: CI-sized and long.
DEFAULT_ROUNDS = {"embedded": 4, "zeo": 2}
LONG_ROUNDS = {"embedded": 60, "zeo": 30}

VIOLATIONS = ("lost", "redelivered_after_ack", "acked_twice", "torn", "garbled", "phantom",
              "duplicated", "open_failures", "worker_errors", "inventory_incomplete")


# -- items ----------------------------------------------------------------------------------

def checksum(ident, pad):
    return hashlib.blake2b(ident.encode() + pad, digest_size=16).hexdigest()


def make_item(ident, rng, depth=0):
    """A dict with a random-sized payload and its checksum: a torn or mixed-up message
    cannot pass verify().  Mostly small; a few large ones make commits long enough for a
    kill to land inside their write."""
    r = rng.random()
    size = (rng.randrange(0, 512) if r < 0.7 else rng.randrange(512, 16384) if r < 0.97
            else rng.randrange(16384, 131072))
    pad = rng.randbytes(size)
    return {"id": ident, "depth": depth, "pad": pad, "sum": checksum(ident, pad)}


def verify(body):
    """The item's id if body is a complete item, else None."""
    try:
        ok = (isinstance(body, dict) and set(body) == {"id", "depth", "pad", "sum"}
              and checksum(body["id"], body["pad"]) == body["sum"])
    except Exception:
        ok = False
    return body["id"] if ok else None


# -- child processes ------------------------------------------------------------------------

class Journal:
    """Append-only event lines of one process (see the module docstring)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, kind, *fields):
        line = " ".join((str(time.monotonic_ns()), kind) + tuple(map(str, fields)))
        os.write(self.fd, (line + "\n").encode())


def worker_main(cfg):
    """A producer, a consumer or both (cfg["role"]), until it is killed (or, sometimes, a
    clean close and exit).  Every choice comes from cfg["seed"]."""
    from ackqueue import AckQueue, Empty, StaleAck

    rng = random.Random(cfg["seed"])
    journal = Journal(cfg["journal"])
    tag, role = cfg["tag"], cfg["role"]
    journal.write("open")
    q = AckQueue(path=cfg["path"], name=QUEUE)
    journal.write("ready")
    print("ready", flush=True)

    # An armed kill: this process SIGKILLs itself a few milliseconds after the k-th start
    # of one kind of operation, so kills land inside put_many, acks and transactions
    # (commits included) far more often than the parent's random timing alone achieves.
    arm = None
    if rng.random() < cfg.get("armed", 0.0):
        arm = (rng.choice(["put", "put_many", "txn_put", "ack", "ack_many", "crawl"]),
               rng.randrange(1, 6))
    started = Counter()

    def starting(op):
        started[op] += 1
        if arm == (op, started[op]):
            timer = threading.Timer(rng.uniform(0, 0.004),
                                    os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()

    counter = [0]

    def new_id():
        counter[0] += 1
        return f"{tag}.{counter[0]}"

    clean_exit = rng.randrange(5, 150) if rng.random() < cfg.get("clean_exit", 0.0) else None
    timeout = cfg.get("get_timeout")          # None: non-blocking gets (embedded)

    def receive(n=1, **options):
        tcall = time.monotonic_ns()
        journal.write("getting")
        try:
            if n == 1:
                msgs = [q.get_message(block=timeout is not None, timeout=timeout,
                                      **options)]
            else:
                msgs = q.get_messages(n, block=timeout is not None, timeout=timeout)
        except Empty:
            journal.write("empty")
            return []
        good = []
        for m in msgs:
            ident = verify(m.body)
            if ident is None:
                journal.write("garbled", int(m.id), repr(m.body)[:200].replace(" ", "_"))
                continue
            journal.write("got", ident, int(m.id), tcall, m.receive_count)
            good.append(m)
        return good

    def ack(msgs, how):
        ids = [m.body["id"] for m in msgs]
        starting("ack" if len(msgs) == 1 else "ack_many")
        journal.write("acking", *ids)
        try:
            if len(msgs) > 1:
                q.ack_many(msgs)
            elif how == "id":
                q.ack(msgs[0].id)
            elif how == "task_done":
                q.task_done()            # the oldest this thread holds: the only one
            else:
                q.ack(msgs[0])
        except StaleAck as exc:          # through ZEO, after this process's lease expired
            journal.write("ack-failed", type(exc).__name__)
            return
        journal.write("acked", *ids)

    def produce():
        r = rng.random()
        if r < 0.5:
            ident = new_id()
            item = make_item(ident, rng)
            starting("put")
            journal.write("putting", ident)
            q.put(item)
            journal.write("put", ident)
        else:
            label = "put_many" if r < 0.8 else "txn_put"
            items = [make_item(new_id(), rng) for _ in range(rng.randrange(2, 12))]
            batch = new_id()
            starting(label)
            journal.write("batch", batch, label, *[it["id"] for it in items])
            if label == "put_many":
                q.put_many(items)
            else:
                with q.transaction():
                    for it in items:
                        q.put(it)
            journal.write("batch-done", batch)

    def consume():
        r = rng.random()
        if r < 0.15:
            crawl()
        elif r < 0.3:
            msgs = receive(rng.randrange(2, 8))
            if msgs:
                ack(msgs, "many")
        else:
            # Sometimes with a visibility deadline: through ZEO, a killed holder's message
            # then comes back at its deadline instead of at its lease's expiry.
            vt = 2.0 if rng.random() < 0.1 else ...
            msgs = receive(visibility_timeout=vt)
            if not msgs:
                return
            r = rng.random()
            if r < 0.05:
                ident = msgs[0].body["id"]
                journal.write("nacking", ident)
                q.nack(msgs[0])
                journal.write("nacked", ident)
            else:
                ack(msgs, "id" if r < 0.15 else "task_done" if r < 0.25 else "message")

    def crawl():
        """The crawler pattern: get a page, put the links found on it, ack the page, in
        one transaction.  Links are not crawled further (depth 1)."""
        txn = new_id()
        starting("crawl")
        try:
            with q.transaction():
                msgs = receive()
                if not msgs:
                    return
                parent = msgs[0]
                links = []
                if parent.body["depth"] == 0:
                    links = [make_item(new_id(), rng, depth=1)
                             for _ in range(rng.randrange(0, 6))]
                journal.write("txn", txn, parent.body["id"], *[it["id"] for it in links])
                for it in links:
                    q.put(it)
                q.ack(parent)
        except StaleAck as exc:
            journal.write("txn-failed", txn, type(exc).__name__)
            return
        journal.write("txn-done", txn)

    ops = 0
    while True:
        if clean_exit is not None and ops >= clean_exit:
            q.close()
            journal.write("closed")
            return 0
        ops += 1
        if role == "producer":
            produce()
            if q.qsize() > cfg.get("backlog", 100):
                time.sleep(0.05)              # consumers are behind: do not bury them
        elif role == "consumer":
            consume()
        else:
            backlog = q.qsize()
            if rng.random() < (0.7 if backlog < 20 else 0.2):
                produce()
            else:
                consume()


def inspect_main(cfg):
    """Open the queue, drain it (waiting until no message is in flight elsewhere), verify
    every item, print one JSON line, and close (which gives everything back)."""
    from ackqueue import AckQueue, Empty

    start = time.monotonic()
    q = AckQueue(path=cfg["path"], name=QUEUE)
    opened = time.monotonic() - start
    held, items, garbled = [], [], []
    deadline = time.monotonic() + cfg.get("wait", 60)
    complete = False
    while True:
        try:
            m = q.get_message(block=False)
        except Empty:
            counts = q.counts()
            if counts["in_flight"] == len(held) and counts["ready"] == 0 \
                    and counts["delayed"] == 0:
                complete = True
                break
            if time.monotonic() > deadline:
                break
            # Through ZEO, what killed processes held comes back when their leases
            # expire (this inspector's watch expires them): wait for it.
            try:
                m = q.get_message(timeout=0.5)
            except Empty:
                continue
        held.append(m)
        ident = verify(m.body)
        if ident is None:
            garbled.append([int(m.id), repr(m.body)[:200]])
        else:
            items.append([ident, int(m.id), m.receive_count])
    unfinished = q.unfinished_tasks
    print(json.dumps({"open_seconds": opened, "items": items, "garbled": garbled,
                      "complete": complete, "counts": q.counts(),
                      "unfinished": unfinished, "held": len(held)}), flush=True)
    q.close()
    return 0


# -- the checker ----------------------------------------------------------------------------

class Checker:
    """Judges journals and inventories (see the module docstring).  Feed it each round's
    journals (add_journal), then the round's inventory (add_inventory), then end_round();
    result() gives the counts.  Violations are kept as sets of item ids (or message ids
    for garbled items), so a violation seen in several rounds counts once."""

    def __init__(self):
        self.started = set()           # ids some process began to put
        self.put_returned = set()      # ids whose put (or batch, or transaction) returned
        self.acked = {}                # id -> a time by which its ack had returned
        self.ack_count = Counter()     # successful acks per id
        self.ack_pending = {}          # id -> latest attempt of an ack in doubt
        self.first_seen = {}           # id -> earliest sighting (get called, inventory)
        self.last_seen = {}            # id -> latest sighting
        self.last_get_call = {}        # id -> latest time a get that delivered it was called
        self.mids = defaultdict(set)   # id -> message ids it was delivered under
        self.deliveries = 0
        self.distinct_delivered = set()
        self.units = []                # (kind, ids, parent, time, expect) in doubt this round
        self.present = set()
        self.kills = Counter()         # where kills landed
        self.counters = Counter()      # acks failed, batches, transactions, ...
        self.violations = {name: set() for name in VIOLATIONS}
        self.evidence = {}             # violation id -> why

    def violate(self, kind, ident, why):
        self.violations[kind].add(ident)
        self.evidence.setdefault(f"{kind}:{ident}", why)

    def _seen(self, ident, t):
        self.first_seen[ident] = min(self.first_seen.get(ident, t), t)
        self.last_seen[ident] = max(self.last_seen.get(ident, t), t)

    def _ack_done(self, ident, t):
        self.ack_count[ident] += 1
        self.acked[ident] = min(self.acked.get(ident, t), t)

    def add_journal(self, lines, killed=True):
        """One process's journal (lines, in order).  Returns where the process was when it
        died: the operation left open, "open" (during AckQueue()), "startup" (before
        it) or "between" operations."""
        open_op = None
        opened = False
        any_line = False
        for line in lines:
            if not line.endswith("\n"):
                break                  # not expected (one write() per line), but harmless
            any_line = True
            t, kind, *f = line.split()
            t = int(t)
            if kind == "ready":
                opened = True
            elif kind == "getting":
                open_op = ("get", (), t)
            elif kind == "empty":
                open_op = None
            elif kind == "putting":
                self.started.add(f[0])
                open_op = ("put", f, t)
            elif kind == "put":
                self.put_returned.add(f[0])
                open_op = None
            elif kind == "batch":
                ids = f[2:]
                self.started.update(ids)
                open_op = (f[1], ids, t)
            elif kind == "batch-done":
                self.put_returned.update(open_op[1])
                self.counters["batches"] += 1
                open_op = None
            elif kind == "got":
                ident, mid, tcall = f[0], int(f[1]), int(f[2])
                self._seen(ident, tcall)
                self.last_get_call[ident] = max(self.last_get_call.get(ident, tcall), tcall)
                self.mids[ident].add(mid)
                if open_op is not None and open_op[0] == "get":
                    open_op = None
                self.deliveries += 1
                self.distinct_delivered.add(ident)
            elif kind == "garbled":
                open_op = None
                self.violate("garbled", f"mid{f[0]}", f"a consumer got {f[1]}")
            elif kind in ("acking", "nacking"):
                open_op = (kind[:-3], f, t)
            elif kind == "acked":
                for ident in open_op[1]:
                    self._ack_done(ident, t)
                open_op = None
            elif kind == "ack-failed":
                self.counters["acks_refused"] += len(open_op[1])
                open_op = None
            elif kind == "nacked":
                open_op = None
            elif kind == "txn":
                parent, children = f[1], f[2:]
                self.started.update(children)
                open_op = ("txn", (parent, children), t)
            elif kind == "txn-done":
                parent, children = open_op[1]
                self._ack_done(parent, t)
                self.put_returned.update(children)
                self.counters["transactions"] += 1
                open_op = None
            elif kind == "txn-failed":
                parent, children = open_op[1]
                # Rolled back: none of its children may exist.
                self.units.append(("txn-failed", children, None, t))
                open_op = None
        if open_op is not None:
            kind, what, t = open_op
            if kind in ("put_many", "txn_put"):
                self.units.append(("batch", what, None, t))
            elif kind == "txn":
                self.units.append(("txn", what[1], what[0], t))
            elif kind == "ack":
                for ident in what:
                    self.ack_pending[ident] = max(self.ack_pending.get(ident, t), t)
            phase = {"ack": "ack" if len(what) == 1 else "ack_many",
                     "txn": "crawl transaction"}.get(kind, kind)
        else:
            phase = "between" if opened else "open" if any_line else "startup"
        if killed:
            self.kills[phase] += 1
        return phase

    def add_inventory(self, t, items, garbled=(), complete=True):
        """What the inspector found at time t (after every writer died): [id, mid, rc]."""
        self.present = set()
        for ident, mid, _rc in items:
            if ident in self.present:
                self.violate("duplicated", ident, "found twice in one inventory")
            self.present.add(ident)
            self.mids[ident].add(mid)
            self._seen(ident, t)
        for mid, text in garbled:
            self.violate("garbled", f"mid{mid}", f"the inspector found {text}")
        if not complete:
            self.violate("inventory_incomplete", f"t{t}",
                         "messages stayed in flight or delayed after every process died")
        self.inventory_time = t

    def end_round(self):
        """Resolve this round's operations in doubt and check every invariant."""
        for kind, ids, parent, t in self.units:
            exist = [i for i in ids if i in self.first_seen]
            if kind == "txn-failed":
                if exist:
                    self.violate("torn", ids[0], f"a rolled-back transaction left {exist}")
            elif 0 < len(exist) < len(ids):
                self.violate("torn", ids[0], f"{kind} in doubt: only {exist} of {ids} exist")
            elif kind == "txn" and not ids:
                # An ack with nothing to show for it: as an ack in doubt.
                self.ack_pending[parent] = max(self.ack_pending.get(parent, t), t)
            elif kind == "txn" and exist:
                # Its links exist, so it committed, ack of its parent included; by the
                # first sighting of a link the ack had certainly happened.
                self._ack_done(parent, min(self.first_seen[i] for i in ids))
                self.counters["transactions_in_doubt_committed"] += 1
        self.units = []
        t_inv = self.inventory_time
        for ident in self.put_returned | set(self.first_seen):
            if ident in self.present or ident in self.acked:
                continue
            pending = self.ack_pending.get(ident)
            if pending is not None and pending > self.last_seen.get(ident, -1):
                # An ack in doubt and the message gone since: the ack happened, by the
                # time of this inventory at the latest.
                self._ack_done(ident, t_inv)
                self.counters["acks_in_doubt_completed"] += 1
                continue
            self.violate("lost", ident, "put returned (or it was seen), neither acked nor "
                         "in the queue")
        for ident, t_ack in self.acked.items():
            if ident in self.present:
                self.violate("redelivered_after_ack", ident,
                             "acknowledged, yet in the queue after the round")
            elif self.last_get_call.get(ident, -1) > t_ack:
                self.violate("redelivered_after_ack", ident,
                             "a get called after its ack returned delivered it")
            if self.ack_count[ident] > 1:
                self.violate("acked_twice", ident, f"acked {self.ack_count[ident]} times")
        for ident in self.first_seen:
            if ident not in self.started:
                self.violate("phantom", ident, "seen, but nobody began to put it")
            if len(self.mids[ident]) > 1:
                self.violate("duplicated", ident, f"stored as {sorted(self.mids[ident])}")

    def result(self):
        r = {name: len(ids) for name, ids in self.violations.items()}
        r.update({
            # Messages known to have existed: put returned, or seen (a put in doubt
            # that had committed).
            "messages": len(self.put_returned | set(self.first_seen)),
            "messages_put": len(self.put_returned),
            "puts_begun": len(self.started),
            "acked": len(self.acked),
            "deliveries": self.deliveries,
            "redelivered": self.deliveries - len(self.distinct_delivered),
            "in_queue": len(self.present),
            "kills_landed": dict(sorted(self.kills.items())),
        })
        r.update(self.counters)
        return r


# -- the rounds -----------------------------------------------------------------------------

def child_env():
    """The children import the same ackqueue as this process (a worktree's, say)."""
    import ackqueue
    root = os.path.dirname(os.path.dirname(os.path.abspath(ackqueue.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    return env


class Run:
    """One mode's run: its children, journals, checker and report."""

    def __init__(self, mode, rounds, seed, workdir, log, long=False):
        self.mode, self.rounds, self.seed, self.log, self.long = mode, rounds, seed, log, long
        self.dir = os.path.join(workdir, mode)
        os.makedirs(os.path.join(self.dir, "journals"))
        self.rng = random.Random(f"{seed}-{mode}")
        self.checker = Checker()
        self.env = child_env()
        self.sigkills = 0             # SIGKILLs the parent sent
        self.self_kills = 0           # armed kills (the child killed itself)
        self.clean_exits = 0
        self.processes = 0
        self.round_journals = []      # (path, process) of the current round
        self.errors = []              # worker and inspector failures, with their stderr
        self.inspect_seconds = 0.0

    def spawn(self, round_no, slot, life, role, path, **extra):
        tag = f"{self.mode[0]}{round_no}{slot}.{life}"
        journal = os.path.join(self.dir, "journals", f"{tag}.log")
        cfg = {"path": path, "journal": journal, "tag": tag, "role": role,
               "seed": f"{self.seed}-{tag}", **extra}
        err = open(os.path.join(self.dir, "journals", f"{tag}.err"), "w+")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_worker",
                                 json.dumps(cfg)], stdout=subprocess.PIPE, stderr=err,
                                env=self.env, text=True)
        proc.err = err
        proc.journal = journal
        self.processes += 1
        self.round_journals.append(proc)
        return proc

    def kill(self, proc):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            self.sigkills += 1
            proc.wait()
        elif proc.returncode == -signal.SIGKILL:
            self.self_kills += 1
        proc.stdout.close()
        return self.finished(proc)

    def finished(self, proc):
        """Account for a dead child: a kill, a clean exit or an error."""
        code = proc.returncode
        if code == 0:
            self.clean_exits += 1
        elif code != -signal.SIGKILL:
            proc.err.seek(0)
            self.errors.append(f"{proc.journal}: exit {code}\n{proc.err.read()[-3000:]}")
            self.checker.violate("worker_errors", proc.journal, f"exit {code}")
        proc.err.close()
        return code

    def inspect(self, path, wait):
        """The inventory, by a fresh inspector process; None if the queue did not open."""
        t = time.monotonic_ns()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "_inspect",
                               json.dumps({"path": path, "wait": wait})],
                              capture_output=True, text=True, env=self.env,
                              timeout=INSPECT_TIMEOUT)
        if proc.returncode != 0:
            self.errors.append(f"inspector: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            self.checker.violate("open_failures", f"t{t}", proc.stderr[-300:])
            return None
        return t, json.loads(proc.stdout)

    def end_round(self, path, wait):
        for proc in self.round_journals:
            # No journal: killed before it could create one (interpreter start-up).
            lines = []
            if os.path.exists(proc.journal):
                with open(proc.journal) as f:
                    lines = f.readlines()
            self.checker.add_journal(lines, killed=proc.returncode == -signal.SIGKILL)
        self.round_journals = []
        t0 = time.monotonic()
        found = self.inspect(path, wait)
        self.inspect_seconds += time.monotonic() - t0
        if found is None:
            return False
        t, inv = found
        self.checker.add_inventory(t, inv["items"], inv["garbled"], inv["complete"])
        if inv["unfinished"] != inv["held"]:
            self.checker.violate("inventory_incomplete", f"t{t}",
                                 f"unfinished_tasks {inv['unfinished']} but "
                                 f"{inv['held']} messages found")
        self.checker.end_round()
        return True

    def report(self, elapsed):
        r = {"mode": self.mode, "seed": self.seed, "rounds": self.rounds_done,
             "kills": self.sigkills + self.self_kills, "kills_by_parent": self.sigkills,
             "kills_self_armed": self.self_kills, "clean_exits": self.clean_exits,
             "processes": self.processes}
        r.update(self.checker.result())
        r["elapsed_seconds"] = round(elapsed, 1)
        r["inspect_seconds"] = round(self.inspect_seconds, 1)
        r["violations"] = sum(r[name] for name in VIOLATIONS)
        r["evidence"] = dict(list(self.checker.evidence.items())[:20])
        r["errors"] = self.errors[:5]
        return r

    # -- embedded: one process at a time holds the file --------------------------------

    def run_embedded(self):
        path = os.path.join(self.dir, "queue.fs")
        lives = 3                     # processes per round, one after the other
        for round_no in range(self.rounds):
            for life in range(lives):
                proc = self.spawn(round_no, "w", life, "both", path, armed=0.5,
                                  clean_exit=0.1)
                if self.rng.random() < 0.1:
                    # Around the opening of the file (importing takes about 0.3 s).
                    time.sleep(self.rng.uniform(0.2, 0.6))
                elif read_ready(proc):
                    time.sleep(self.rng.uniform(0.02, 0.7))
                self.kill(proc)
            if not self.end_round(path, wait=10):
                break
            self.rounds_done = round_no + 1
            self.progress(round_no)

    # -- ZEO: several producers and consumers at once through one server ---------------

    def run_zeo(self):
        from zeo_server import Server
        lease = 1.0
        # The server runs conflict resolution with ackqueue's code: the same as ours.
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = self.env["PYTHONPATH"]
        try:
            server = Server(os.path.join(self.dir, "queue.fs"),
                            os.path.join(self.dir, "server.log"))
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        url = f"{server.url}?lease_timeout={lease}"
        slots = {"p0": "producer", "b0": "both", "c0": "consumer", "c1": "consumer"}
        round_seconds = 3.0
        try:
            for round_no in range(self.rounds):
                life = Counter()
                procs, deaths = {}, {}
                end = time.monotonic() + round_seconds

                def start(slot):
                    procs[slot] = self.spawn(round_no, slot, life[slot], slots[slot], url,
                                             armed=0.2, clean_exit=0.05, get_timeout=0.3,
                                             backlog=40)
                    life[slot] += 1
                    # Mostly a random time after the child is ready (start-up through ZEO
                    # takes a while on a busy machine), sometimes during start-up or open.
                    deaths[slot] = (time.monotonic() + self.rng.uniform(0.2, 1.5)
                                    if self.rng.random() < 0.1 else None)

                for slot in slots:
                    start(slot)
                while time.monotonic() < end:
                    time.sleep(0.02)
                    for slot, proc in procs.items():
                        now = time.monotonic()
                        if deaths[slot] is None and is_ready(proc):
                            deaths[slot] = now + self.rng.uniform(0.1, 1.2)
                        if proc.poll() is not None or (deaths[slot] or now + 1) < now:
                            self.kill(proc)
                            start(slot)
                # The round ends with every process killed wherever it is, once it is
                # working (a kill during start-up would show nothing), in random order.
                for slot in self.rng.sample(sorted(procs), len(procs)):
                    if deaths[slot] is None and read_ready(procs[slot]):
                        time.sleep(self.rng.uniform(0, 0.3))
                    self.kill(procs[slot])
                if not self.end_round(url, wait=30):
                    break
                self.rounds_done = round_no + 1
                self.progress(round_no)
        finally:
            server.stop()

    def progress(self, round_no):
        if self.long:
            r = self.checker.result()
            self.log(f"  {self.mode} round {round_no + 1}/{self.rounds}: "
                     f"{self.sigkills + self.self_kills} kills, {r['messages']} messages, "
                     f"{r['acked']} acked, violations "
                     f"{sum(r[n] for n in VIOLATIONS)}")

    def run(self):
        start = time.monotonic()
        self.rounds_done = 0
        try:
            (self.run_embedded if self.mode == "embedded" else self.run_zeo)()
        finally:
            for proc in self.round_journals:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return self.report(time.monotonic() - start)


def is_ready(proc):
    """Whether the child has printed its "ready" line (without waiting)."""
    ready, _, _ = select.select([proc.stdout], [], [], 0)
    return bool(ready) and proc.stdout.readline().strip() == "ready"


def read_ready(proc):
    """Wait for the child's "ready" line; False if it died first (an armed kill)."""
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    return bool(ready) and proc.stdout.readline().strip() == "ready"


def run(mode="both", rounds=None, seed=0, workdir=None, long=LONG, log=print, keep=False):
    """Run the torture in mode ("embedded", "zeo" or "both"); returns a list of reports
    (dicts), one per mode.  rounds: per mode (default: CI-sized, or long).  The work
    directory (journals, queue files, server log) is removed unless keep or a violation."""
    modes = ["embedded", "zeo"] if mode == "both" else [mode]
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="ackqueue-torture-")
    reports = []
    for m in modes:
        n = rounds if rounds is not None else (LONG_ROUNDS if long else DEFAULT_ROUNDS)[m]
        reports.append(Run(m, n, seed, workdir, log, long).run())
    if own and not keep and not any(r["violations"] for r in reports):
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        for r in reports:
            r["workdir"] = workdir
    return reports


def summary(r):
    """One line of figures."""
    landed = ", ".join(f"{k} {v}" for k, v in r["kills_landed"].items())
    return (f"torture {r['mode']}: {r['rounds']} rounds, {r['kills']} kills "
            f"(landed in: {landed}), "
            f"{r['messages']} messages ({r['messages_put']} put returned), {r['acked']} "
            f"acked, {r['lost']} lost, "
            f"{r['redelivered_after_ack']} redelivered-after-ack, {r['open_failures']} "
            f"open failures, {r['redelivered']} redelivered (normal), {r['torn']} torn, "
            f"{r['garbled']} garbled, {r['phantom']} phantom, {r['duplicated']} duplicated, "
            f"{r['acked_twice']} acked twice, {r['worker_errors']} worker errors, "
            f"{r['elapsed_seconds']} s")


def table(reports):
    rows = [("rounds", "rounds"), ("SIGKILLs", "kills"), ("processes", "processes"),
            ("messages", "messages"), ("of which put returned", "messages_put"),
            ("acknowledged", "acked"),
            ("transactions committed", "transactions"), ("lost", "lost"),
            ("redelivered after ack", "redelivered_after_ack"),
            ("open failures", "open_failures"),
            ("redelivered (normal, unacked at a kill)", "redelivered"),
            ("torn batches/transactions", "torn"), ("garbled", "garbled"),
            ("seconds", "elapsed_seconds")]
    out = ["| | " + " | ".join(r["mode"] for r in reports) + " |",
           "|---|" + "---:|" * len(reports)]
    for label, key in rows:
        out.append(f"| {label} | " + " | ".join(str(r.get(key, 0)) for r in reports) + " |")
    return "\n".join(out)


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["embedded", "zeo", "both"], default="both")
    parser.add_argument("--rounds", type=int, help="rounds per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long", action="store_true", default=LONG,
                        help="long-run defaults (also ACKQUEUE_LONG=1)")
    parser.add_argument("--json", help="write the reports to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    reports = run(args.mode, args.rounds, args.seed, args.workdir, args.long,
                  keep=args.keep)
    for r in reports:
        print(summary(r))
        for why in list(r["evidence"].items())[:10]:
            print("   ", *why)
        for err in r["errors"]:
            print(err)
    print(table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python tests/torture.py " + " ".join(
                           argv if argv is not None else sys.argv[1:]),
                       "commit": git_commit(), "python": sys.version.split()[0],
                       "date": time.strftime("%Y-%m-%d"), "reports": reports}, f, indent=1)
    return 1 if any(r["violations"] for r in reports) else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("_worker", "_inspect"):
        try:
            sys.exit((worker_main if sys.argv[1] == "_worker" else inspect_main)(
                json.loads(sys.argv[2])))
        except Exception:
            traceback.print_exc()
            sys.exit(3)
    sys.exit(main())
