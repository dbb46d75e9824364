"""What the expiry index costs in memory and what a count costs with it.

python -m benchmarks.expiry_memory [--count N] [--tmpdir DIR]

For a backlog of N messages in a file, with the index and with the index taken away (the
same code; see contenders/ackqueue_noexpiry.py), measures in this process:
- the memory an open queue holds (tracemalloc: after open and a first counts(), with the
  file's messages all ready): the index must add nothing per message in RAM;
- counts() right after the retention of a tenth of the backlog passed (no sweep ran):
  the index version takes them out and counts exactly, the other still counts them.
Time comes from an injected clock, so nothing waits for retention."""
import argparse
import os
import tempfile
import time
import tracemalloc

import transaction


def fill(path, count, clock, noindex):
    from ackqueue import AckQueue, store
    q = AckQueue(path=path, clock=clock)
    if noindex:
        tm = transaction.TransactionManager()
        conn = q.db.open(transaction_manager=tm)
        with tm:
            conn.root()[store.ROOT_KEY].queues[q.name].expiry = None
        conn.close()
    short = count // 10
    for start in range(0, count, 1000):
        n = min(1000, count - start)
        retention = 60 if start < short else 3600
        q.put_many([b"x" * 100] * n, retention=retention)
    q.close()


def measure(path, clock):
    from ackqueue import AckQueue
    tracemalloc.start()
    q = AckQueue(path=path, clock=clock)
    first = q.counts()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    clock.now += 61
    began = time.perf_counter()
    after = q.counts()
    took = time.perf_counter() - began
    q.close()
    return held, first, after, took


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--tmpdir", default=None)
    args = parser.parse_args()
    print(f"backlog {args.count:,} messages (a tenth with a 60 s retention), "
          f"load average {os.getloadavg()[0]:.1f}")
    for noindex in (False, True):
        label = "without index" if noindex else "with index   "
        with tempfile.TemporaryDirectory(dir=args.tmpdir) as d:
            path = os.path.join(d, "q.fs")
            clock = Clock()
            fill(path, args.count, clock, noindex)
            held, first, after, took = measure(path, clock)
            print(f"{label}: open+counts holds {held / 1e6:.1f} MB "
                  f"({held / args.count:.0f} B/message); counts {first['ready']:,} ready, "
                  f"61 s later {after['ready']:,} ready (counts took {took * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
