"""What a stat between commits does to the next commit's sync.

    python -m benchmarks.stat_sync [--commits 2000] [--rounds 3]

Each commit here is what a synced queue file's commit is at the system-call level
(storage.SyncedFileStorage): a 1,517-byte write into zeros written ahead, the status byte
rewritten 16 bytes in, then fdatasync.  Between commits it does nothing, or stats the file
by its path, or fstats it, or stats its directory.  Printed: the median fdatasync and the
median whole commit, in us, per variant and round (the variants alternate within a round).

It is why WatchedFileStorage looks at the file's directory at each commit and at the file
only when the directory changed: on Linux since 6.13 (multigrain timestamps) reading a
file's times makes its next write take fine-grained ones, and here that made the sync of
each commit dearer.
"""
import argparse
import os
import statistics
import tempfile
import time

AHEAD = 1 << 20
RECORD = 1517
VARIANTS = ("nothing", "stat of the file", "fstat of the file", "stat of its directory")


def run(variant, commits, directory):
    folder = tempfile.mkdtemp(dir=directory)
    path = os.path.join(folder, "q.fs")
    record = os.urandom(RECORD)
    syncs, whole = [], []
    with open(path, "w+b") as f:
        fd = f.fileno()
        f.write(b"FS30")
        f.flush()
        pos, ahead_end = 4, 0
        for _ in range(commits):
            if ahead_end - pos < AHEAD // 4:
                start = max(pos, os.fstat(fd).st_size)
                f.seek(start)
                f.write(bytes(AHEAD))
                f.flush()
                os.fdatasync(fd)
                ahead_end = start + AHEAD
            t0 = time.perf_counter()
            if variant == "stat of the file":
                os.stat(path)
            elif variant == "fstat of the file":
                os.fstat(fd)
            elif variant == "stat of its directory":
                os.stat(folder)
            f.seek(pos)
            f.write(record)
            f.flush()
            f.seek(pos + 16)
            f.write(b" ")
            f.flush()
            t1 = time.perf_counter()
            os.fdatasync(fd)
            t2 = time.perf_counter()
            syncs.append(t2 - t1)
            whole.append(t2 - t0)
            pos += RECORD
    os.remove(path)
    os.rmdir(folder)
    return statistics.median(syncs) * 1e6, statistics.median(whole) * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the files go (default: the temp dir)")
    args = p.parse_args(argv)
    print(f"kernel {os.uname().release}; {args.commits} commits of {RECORD} bytes per run; "
          "medians in us: fdatasync / whole commit")
    results = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            results[variant].append(run(variant, args.commits, args.dir))
    for variant, runs in results.items():
        shown = ", ".join(f"{sync:.0f} / {whole:.0f}" for sync, whole in runs)
        print(f"  {variant:24s} {shown}")


if __name__ == "__main__":
    main()
