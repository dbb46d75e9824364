"""The storage's cost: what one durable commit of a small record costs on this machine, for
each way a queue could store it, measured in one run.

    python -m benchmarks.storage_floor [--out DIR] [--repeat 3] [--tmpdir DIR]

Each mechanism commits the same ~200-byte record, back to back (µs per commit, median of
blocks) and after a short pause (2-5 ms, as a lone producer sees; p50 µs).  Then one
thread's put+get+ack cycle as a queue on that mechanism must write it: the number of
commits is the queue's design, stated beside each row (persist-queue: an INSERT, an UPDATE
at get, an UPDATE at ack; ackqueue: a put and an ack, the get writes nothing; ackqueue with
acks="deferred": the put's commit carries the previous ack).  The rounds are interleaved
(mechanism after mechanism, round after round) so that the machine's load falls on all of
them alike; medians over the rounds are reported with the load average.

Mechanisms whose package is missing (relstorage) are reported as not measured, with why.
Results: DIR/storage_floor.json and DIR/storage_floor.md.
"""
import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import tempfile
import time

from benchmarks.machine import machine_info

RECORD = bytes(range(200))          # the small record every mechanism commits
PAUSE = (0.002, 0.005)              # seconds before each paused commit
PREALLOCATED = 8 * 1024 * 1024      # bytes overwritten in place (wraps around)


# -- the mechanisms ------------------------------------------------------------------------

class Append:
    """A log file opened for appending; each commit writes the record and syncs."""

    def __init__(self, directory, sync):
        self._fd = os.open(os.path.join(directory, "log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sync = sync

    def commit(self, i):
        os.write(self._fd, RECORD)
        self._sync(self._fd)

    def close(self):
        os.close(self._fd)


class Overwrite:
    """A file written in full beforehand; each commit overwrites the next slot in place and
    fdatasyncs (no size change, so no metadata to sync)."""

    def __init__(self, directory):
        self._fd = os.open(os.path.join(directory, "ring"), os.O_RDWR | os.O_CREAT, 0o600)
        block = b"\0" * (1 << 20)
        for _ in range(PREALLOCATED // len(block)):
            os.write(self._fd, block)
        os.fsync(self._fd)
        self._slots = PREALLOCATED // len(RECORD)

    def commit(self, i):
        os.pwrite(self._fd, RECORD, (i % self._slots) * len(RECORD))
        os.fdatasync(self._fd)

    def close(self):
        os.close(self._fd)


class SqliteWal:
    """SQLite in WAL mode with synchronous=FULL (persist-queue) or NORMAL (litequeue); each
    commit inserts the record (a cycle: insert, update at get, update at ack)."""

    def __init__(self, directory, synchronous):
        self._db = sqlite3.connect(os.path.join(directory, "q.db"), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, data BLOB, status INT)")

    def commit(self, i):
        self._insert()

    def _insert(self):
        with self._db:
            return self._db.execute("INSERT INTO q (data, status) VALUES (?, 0)",
                                    (RECORD,)).lastrowid

    def cycle(self, i):
        rowid = self._insert()
        with self._db:
            self._db.execute("UPDATE q SET status = 1 WHERE id = ?", (rowid,))
        with self._db:
            self._db.execute("UPDATE q SET status = 2 WHERE id = ?", (rowid,))

    def close(self):
        self._db.close()


class Zodb:
    """A ZODB storage; each commit rewrites one small persistent object holding the record
    (a cycle: a put's commit and an ack's commit; deferred: one commit carrying both)."""

    def __init__(self, storage, per_cycle=2):
        import transaction
        import ZODB
        from persistent.mapping import PersistentMapping
        self._db = ZODB.DB(storage)
        self._tm = transaction.TransactionManager()
        self._conn = self._db.open(transaction_manager=self._tm)
        self._conn.root()["floor"] = self._obj = PersistentMapping(n=0, data=RECORD)
        self._tm.commit()
        self._per_cycle = per_cycle

    def commit(self, i):
        self._obj["n"] = i
        self._tm.commit()

    def cycle(self, i):
        for k in range(self._per_cycle):
            self.commit(i * 2 + k)

    def close(self):
        self._db.close()


def file_storage(directory, per_cycle=2):
    from ZODB.FileStorage import FileStorage
    return Zodb(FileStorage(os.path.join(directory, "q.fs")), per_cycle)


def file_storage_watched(directory):
    """FileStorage appended and fsync'd (no space written ahead), with ackqueue's commit
    path (the file-gone check, the in-memory scratch written with one pwrite, the known
    tids): the row to compare the synced one with, on equal commit paths."""
    from ackqueue.filestorage import WatchedFileStorage
    return Zodb(WatchedFileStorage(os.path.join(directory, "q.fs"), create=True))


def file_storage_synced(directory):
    """FileStorage as ackqueue's durability="fsync" opens it: each commit written
    into zeros written ahead of it, then fdatasync (storage.SyncedFileStorage)."""
    from ackqueue.filestorage import open_file_storage
    return Zodb(open_file_storage(os.path.join(directory, "q.fs"), "fsync"))


def file_storage_fdatasync(directory):
    """FileStorage whose commit ends in fdatasync instead of fsync: the data and the file's
    size are synced (what reading the commit back needs), not its modification time."""
    from ZODB.FileStorage import FileStorage

    class FdatasyncFileStorage(FileStorage):
        def _finish_finish(self, tid):          # FileStorage's, with fdatasync
            self._file.flush()
            os.fdatasync(self._file.fileno())
            self._pos = self._nextpos
            self._index.update(self._tindex)
            self._ltid = tid
            self._blob_tpc_finish()
    return Zodb(FdatasyncFileStorage(os.path.join(directory, "q.fs")))


def file_storage_os(directory):
    """FileStorage with its fsync off, as ackqueue's durability="os" opens it."""
    from ackqueue.filestorage import open_file_storage
    return Zodb(open_file_storage(os.path.join(directory, "q.fs"), "os"))


def relstorage_sqlite(directory, synchronous=None):
    """RelStorage (history-free) on its sqlite3 driver: its default pragmas (WAL with
    synchronous=NORMAL, so a commit is not synced), or synchronous=FULL (synced)."""
    from relstorage.adapters.sqlite.adapter import Sqlite3Adapter
    from relstorage.options import Options
    from relstorage.storage import RelStorage
    options = Options(keep_history=False)
    pragmas = {} if synchronous is None else {"synchronous": synchronous}
    adapter = Sqlite3Adapter(os.path.join(directory, "rs"), pragmas, options=options)
    return Zodb(RelStorage(adapter, options=options))


def _append_cycle(mech):
    def cycle(i):           # a log-structured queue: a put record and an ack record
        mech.commit(i)
        mech.commit(i)
    mech.cycle = cycle
    return mech


# (id, label, what a commit promises, commits per put+get+ack cycle, factory)
MECHANISMS = [
    ("append-fsync", "append + fsync", "durable", 2,
     lambda d: _append_cycle(Append(d, os.fsync))),
    ("append-fdatasync", "append + fdatasync", "durable", 2,
     lambda d: _append_cycle(Append(d, os.fdatasync))),
    ("overwrite-fdatasync", "overwrite in preallocated file + fdatasync", "durable", 2,
     lambda d: _append_cycle(Overwrite(d))),
    ("sqlite-wal-full", "SQLite WAL, synchronous=FULL (persist-queue)", "durable", 3,
     lambda d: SqliteWal(d, "FULL")),
    ("sqlite-wal-normal", "SQLite WAL, synchronous=NORMAL (litequeue)",
     "not durable: the WAL is synced only at checkpoints; survives a process crash", 3,
     lambda d: SqliteWal(d, "NORMAL")),
    ("filestorage", "ZODB FileStorage, one-object commit", "durable", 2, file_storage),
    ("filestorage-watched", "ZODB FileStorage appended, fsync, with ackqueue's commit "
     "path (appended, no space written ahead)", "durable", 2, file_storage_watched),
    ("filestorage-synced", "ZODB FileStorage into space written ahead, fdatasync, with "
     "ackqueue's checks (ackqueue)", "durable", 2, file_storage_synced),
    ("filestorage-deferred", "ZODB FileStorage, ack riding on the next put (ackqueue, "
     "acks='deferred')", "put durable; ack durable with the next commit", 1,
     lambda d: file_storage(d, per_cycle=1)),
    ("filestorage-fdatasync", "ZODB FileStorage, commit synced by fdatasync", "durable",
     2, file_storage_fdatasync),
    ("relstorage-sqlite-full", "ZODB RelStorage on SQLite (synchronous=FULL), one-object "
     "commit", "durable", 2, lambda d: relstorage_sqlite(d, "FULL")),
    ("relstorage-sqlite", "ZODB RelStorage on SQLite (its default: synchronous=NORMAL), "
     "one-object commit", "not durable: WAL synced only at checkpoints", 2,
     relstorage_sqlite),
    ("filestorage-os", "ZODB FileStorage without fsync (ackqueue durability='os')",
     "not durable: survives a process crash, not a power loss", 2, file_storage_os),
]


# -- measuring ----------------------------------------------------------------------------

def _tight(fn, count, blocks):
    """µs per call of fn, back to back: the median of `blocks` blocks."""
    per_block, k = [], max(1, count // blocks)
    n = 0
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(k):
            fn(n)
            n += 1
        per_block.append((time.perf_counter() - t) / k * 1e6)
    return statistics.median(per_block)


def _paused(fn, samples, seed):
    """p50 µs of fn, each call after a 2-5 ms pause."""
    rng, times = random.Random(seed), []
    for n in range(samples):
        time.sleep(rng.uniform(*PAUSE))
        t = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def measure_one(factory, tmp_root, commits, cycles, samples, seed):
    """One round of one mechanism in a fresh directory."""
    directory = tempfile.mkdtemp(prefix="ackbench-storage-", dir=tmp_root)
    try:
        mech = factory(directory)
        try:
            out = {"commit_us": _tight(mech.commit, commits, 5),
                   "commit_paused_p50_us": _paused(mech.commit, samples, seed),
                   "cycle_us": _tight(mech.cycle, cycles, 5)}
        finally:
            mech.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out["cycles_per_s"] = 1e6 / out["cycle_us"]
    return out


def run(tmp_root, repeat=3, commits=1000, cycles=500, samples=200, wanted=None):
    """Every mechanism, `repeat` interleaved rounds; returns the report dict."""
    chosen = [m for m in MECHANISMS if wanted is None or m[0] in wanted]
    rounds = {m[0]: [] for m in chosen}
    skipped = {}
    loads = [os.getloadavg()]
    for r in range(repeat):
        for mid, _label, _promise, _per_cycle, factory in chosen:
            if mid in skipped:
                continue
            try:
                rounds[mid].append(measure_one(factory, tmp_root, commits, cycles, samples,
                                               seed=r))
            except ImportError as exc:
                skipped[mid] = f"not installed: {exc}"
        loads.append(os.getloadavg())
    rows = []
    for mid, label, promise, per_cycle, _factory in chosen:
        row = {"id": mid, "label": label, "promise": promise, "commits_per_cycle": per_cycle}
        if mid in skipped:
            row["skipped"] = skipped[mid]
        else:
            for key in ("commit_us", "commit_paused_p50_us", "cycle_us", "cycles_per_s"):
                row[key] = statistics.median(x[key] for x in rounds[mid])
                row[key + "_rounds"] = [x[key] for x in rounds[mid]]
        rows.append(row)
    return {"rows": rows, "repeat": repeat, "commits": commits, "cycles": cycles,
            "samples": samples, "record_bytes": len(RECORD), "pause_s": list(PAUSE),
            "loadavg": loads, "versions": _versions(), "machine": machine_info(tmp_root)}


def _versions():
    import importlib.metadata
    out = {"sqlite (library)": sqlite3.sqlite_version}
    for dist in ("ZODB", "relstorage"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def markdown(report):
    """The report as a markdown table."""
    lines = [
        f"Record {report['record_bytes']} bytes; medians of {report['repeat']} interleaved "
        f"rounds; load average (1 min) {report['loadavg'][0][0]:.2f} at start, "
        f"{report['loadavg'][-1][0]:.2f} at end; {report['versions']}.",
        "",
        "| mechanism | promise | commit back to back (µs) | commit after 2-5 ms pause, "
        "p50 (µs) | commits per put+get+ack | cycle (µs) | cycles/s |",
        "|---|---|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['label']} | {row['promise']} | {row['skipped']} | | "
                         f"{row['commits_per_cycle']} | | |")
            continue
        lines.append(
            f"| {row['label']} | {row['promise']} | {row['commit_us']:.0f} | "
            f"{row['commit_paused_p50_us']:.0f} | {row['commits_per_cycle']} | "
            f"{row['cycle_us']:.0f} | {row['cycles_per_s']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    global RECORD
    parser = argparse.ArgumentParser(prog="python -m benchmarks.storage_floor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"),
                        help="where storage_floor.json and storage_floor.md go")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--tmpdir", default=None,
                        help="where the files go (not tmpfs, where syncing costs nothing)")
    parser.add_argument("--record-bytes", type=int, default=len(RECORD),
                        help="the size of the record each commit writes (default "
                             "%(default)s; ackqueue's one-message put commit is about "
                             "1,700 bytes)")
    parser.add_argument("--only", default=None,
                        help="comma-separated mechanism ids: " + ", ".join(m[0] for m in
                                                                          MECHANISMS))
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    RECORD = (bytes(range(256)) * (args.record_bytes // 256 + 1))[:args.record_bytes]
    report = run(args.tmpdir or tempfile.gettempdir(), args.repeat, args.commits,
                 args.cycles, args.samples, wanted)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "storage_floor.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out, "storage_floor.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
