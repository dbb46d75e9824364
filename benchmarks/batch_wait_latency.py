"""What prefetch_wait costs in latency through a ZEO server.

``AckQueue(path="zeo://...", prefetch=P, prefetch_wait=S)`` lets a get that finds fewer
messages ready than its batch wait up to S seconds for more, so that a consumer that
keeps up claims batches (fewer commits and round trips per item, measured in (g)).  (g)
reports no latency, so this script measures the price beside it: one producer process
puts one item every ``--every`` seconds (the put time is the item), one consumer process
(prefetch P, 8 by default, the ack riding on the next get) gets them, and the put-to-get latency is
reported for each wait, alternating the waits on a fresh server and file each time.

    python -m benchmarks.batch_wait_latency [--n 200] [--every 0.03] [--waits 0,0.02]
                                            [--prefetch 8] [--rounds 2] [--tmpdir DIR]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time

from ackqueue import AckQueue

from benchmarks.contenders.zeo import ZeoServer

CONSUMER = r"""
import json, sys, time
from ackqueue import AckQueue
q = AckQueue(path=sys.argv[1], name="latency", prefetch=int(sys.argv[3]),
             ack_with_next_get=True, prefetch_wait=float(sys.argv[2]))
print("ready", flush=True)
latencies = []
while True:
    sent = q.get(timeout=60)
    if sent is None:
        q.task_done()
        break
    latencies.append(time.time() - sent)
    q.task_done()
q.close()
print(json.dumps(latencies), flush=True)
"""


def measure(wait, n, every, tmpdir=None, prefetch=8):
    """Put-to-get latencies (seconds) of n items put every `every` seconds, the server's
    file in a fresh directory under tmpdir (None: the system's temporary directory)."""
    with tempfile.TemporaryDirectory(dir=tmpdir) as directory:
        server = ZeoServer(directory)
        try:
            consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, server.url, str(wait),
                                         str(prefetch)],
                                        stdout=subprocess.PIPE, text=True)
            try:
                if consumer.stdout.readline().strip() != "ready":
                    raise RuntimeError("the consumer process did not start")
                with AckQueue(path=server.url, name="latency") as producer:
                    for _ in range(n):
                        producer.put(time.time())
                        time.sleep(every)
                    producer.put(None)
                    latencies = json.loads(consumer.stdout.readline())
                consumer.wait(60)
            finally:
                if consumer.poll() is None:
                    consumer.kill()
        finally:
            server.stop()
    return sorted(latencies)


def _ms(latencies, share):
    return 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * share))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="items per measurement")
    parser.add_argument("--every", type=float, default=0.03, help="seconds between puts")
    parser.add_argument("--waits", default="0,0.02", help="prefetch_wait values, seconds")
    parser.add_argument("--prefetch", type=int, default=8,
                        help="the consumer's prefetch (its batch, at most)")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each wait")
    parser.add_argument("--tmpdir", default=None,
                        help="where the server's files go (not tmpfs, where fsync is free)")
    args = parser.parse_args(argv)
    waits = [float(w) for w in args.waits.split(",")]
    print(f"one producer process putting an item every {args.every * 1000:.0f} ms, one "
          f"consumer process (prefetch={args.prefetch}, ack_with_next_get=True), {args.n} items each")
    print("| prefetch_wait | round | p50 ms | p90 ms | p99 ms |")
    print("|---:|---:|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        for wait in waits:
            latencies = measure(wait, args.n, args.every, args.tmpdir, args.prefetch)
            print(f"| {wait:g} | {round_} | {_ms(latencies, 0.5):.1f} | "
                  f"{_ms(latencies, 0.9):.1f} | {_ms(latencies, 0.99):.1f} |", flush=True)


if __name__ == "__main__":
    main()
