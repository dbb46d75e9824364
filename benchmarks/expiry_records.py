"""What the expiry index writes per commit, side by side with the same code without it.

python -m benchmarks.expiry_records [--cycles N] [--tmpdir DIR]

In a file (durability "os"), with the queue's index and with it taken away (as
contenders/ackqueue_noexpiry.py does), runs N cycles of put, get, ack one at a time and N
cycles of put_many(100) then 100 get+ack, then reads the file's transactions back and
prints the records and bytes each commit wrote (means over the measured commits).  Counts
of records are exact and do not depend on the machine's load, unlike the throughput
benchmarks."""
import argparse
import os
import statistics
import tempfile

import transaction
from ZODB.FileStorage import FileStorage


def run(directory, cycles, batch, noindex):
    """(commits, records per commit, bytes per commit) of the measured cycles."""
    from ackqueue import AckQueue, store
    path = os.path.join(directory, f"{'batch' if batch else 'one'}-{noindex}.fs")
    q = AckQueue(path=path, durability="os")
    if noindex:
        tm = transaction.TransactionManager()
        conn = q.db.open(transaction_manager=tm)
        with tm:
            conn.root()[store.ROOT_KEY].queues[q.name].expiry = None
        conn.close()
    for n in range(3):                  # the first segments and slots are made here
        q.put(n)
        q.ack(q.get_message())
    start = _last_tid(path)
    for n in range(cycles):
        size = 100 if batch else 1
        q.put_many(range(size))
        for _ in range(size):
            q.ack(q.get_message())
    q.close()
    records, sizes = [], []
    storage = FileStorage(path, read_only=True)
    try:
        for txn in storage.iterator(start):
            if txn.tid == start:
                continue
            found = list(txn)
            records.append(len(found))
            sizes.append(sum(len(r.data or b"") for r in found))
    finally:
        storage.close()
    return len(records), statistics.mean(records), statistics.mean(sizes)


def _last_tid(path):
    storage = FileStorage(path, read_only=True)
    try:
        return storage.lastTransaction()
    finally:
        storage.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--tmpdir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as directory:
        for batch in (False, True):
            for noindex in (False, True):
                commits, records, size = run(directory, args.cycles, batch, noindex)
                print(f"{'put_many(100), 100 get+ack' if batch else 'put, get, ack':27} "
                      f"{'without index' if noindex else 'with index':14} {commits} commits: "
                      f"{records:.2f} records, {size:.0f} bytes per commit")


if __name__ == "__main__":
    main()
