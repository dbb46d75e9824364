"""How long the clients of a queue file wait when its holder is SIGKILLed.

    python -m benchmarks.takeover [--rounds 20] [--clients 2] [--tmpdir DIR]

Each round: a fresh queue file, a holder process that opens it (and does nothing else),
and client processes that open the same path and put one item after another, each put
fsync'd.  The holder is SIGKILLed while they work; a client whose put finds its socket gone
tries the file's lock, one of them takes the file over, and the others' retries reach it.
A client reports the longest time between two of its puts returning: the round's takeover
time is the longest over its clients (it includes one put).  Reported: p50, p90 and the
largest over the rounds (with 20 rounds the largest stands for the p99), and the
longest gap of a round without a kill, the same measurement's floor.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HOLDER = """
    import sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="jobs")
    print("open", flush=True)
    sys.stdin.readline()
    """

CLIENT = """
    import sys, time
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="jobs")
    q.put("warm")
    print("ready", flush=True)
    sys.stdin.readline()
    longest, last, n = 0.0, time.perf_counter(), 0
    stop_at = time.perf_counter() + float(sys.argv[2])
    while time.perf_counter() < stop_at:
        q.put(n)
        now = time.perf_counter()
        longest, last, n = max(longest, now - last), now, n + 1
    print(f"{longest!r} {n}", flush=True)
    q.close()
    """


def _spawn(script, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _expect(proc, word):
    line = proc.stdout.readline().strip()
    if line != word:
        raise RuntimeError(f"child {proc.pid} said {line!r}, not {word!r}")


def one_round(directory, clients, kill, run_for=1.0, kill_after=0.3):
    """The longest gap (seconds) between two puts of any client in one round."""
    path = os.path.join(directory, f"q{time.monotonic_ns()}.fs")
    holder = _spawn(HOLDER, path)
    procs = [holder]
    try:
        _expect(holder, "open")
        cs = [_spawn(CLIENT, path, run_for) for _ in range(clients)]
        procs += cs
        for c in cs:
            _expect(c, "ready")
        for c in cs:
            c.stdin.write("go\n")
            c.stdin.flush()
        time.sleep(kill_after)
        if kill:
            os.kill(holder.pid, signal.SIGKILL)
        gaps = [float(c.stdout.readline().split()[0]) for c in cs]
        for c in cs:
            c.wait(60)
        return max(gaps)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--tmpdir", default=None)
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="ackbench-takeover-", dir=args.tmpdir)
    try:
        floor = [one_round(directory, args.clients, kill=False) for _ in range(3)]
        gaps = sorted(one_round(directory, args.clients, kill=True)
                      for _ in range(args.rounds))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ms = [g * 1000 for g in gaps]
    print(f"takeover after a SIGKILL of the holder, {args.clients} clients, {args.rounds} "
          f"rounds: p50 {statistics.median(ms):.0f} ms, p90 {ms[int(len(ms) * 0.9)]:.0f} ms, "
          f"largest {ms[-1]:.0f} ms; the longest gap between two puts without a kill "
          f"{max(floor) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
