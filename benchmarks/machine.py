"""Machine info for results.json: hardware, versions, the code under test, fsync cost."""
import datetime
import hashlib
import importlib.metadata
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

from benchmarks.common import REPO, percentile

DISTRIBUTIONS = ("ackqueue", "ZODB", "ZEO", "persistent", "BTrees", "transaction",
                 "persist-queue", "litequeue", "matplotlib", "psutil")


def versions():
    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    out["sqlite (library)"] = sqlite3.sqlite_version
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def filesystem(path):
    """"fstype on device (mountpoint)" of the mount that holds path."""
    import psutil
    fs = None
    best = ""
    for part in psutil.disk_partitions(all=True):
        if path.startswith(part.mountpoint) and len(part.mountpoint) > len(best):
            best, fs = part.mountpoint, f"{part.fstype} on {part.device} ({part.mountpoint})"
    return fs


def machine_info(tmp_root):
    import psutil
    real = os.path.realpath(tmp_root)
    return {
        "fsync_probe": fsync_probe(tmp_root),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "temp_dir": real,
        "temp_dir_filesystem": filesystem(real),
        "loadavg_at_start": os.getloadavg(),
        "versions": versions(),
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
