"""One queue file opened by every process: AckQueue(path="queue.fs") in each.  The first
to open it (the benchmark's own process) holds it and serves the others over the Unix
socket beside it (ackqueue.owner); producers and consumers are its clients: one put, one
get (a long poll) and one ack request per item, every commit fsync'd and grouped."""
import os

from benchmarks.common import SHARED_QUEUE_NAME
from benchmarks.contenders.ackqueue import AckQueueAdapter
from benchmarks.contenders.base import SharedContender


def in_file(directory):
    """provision(): the run's fresh queue file; no server (its first opener serves it)."""
    return os.path.join(directory, "queue.fs"), None


SHARED = SharedContender(
    "ackqueue-file", "ackqueue (same file)", "ackqueue", "blocking",
    "every process opens "
    f"AckQueue(path='queue.fs', name={SHARED_QUEUE_NAME!r}); the first (the benchmark's "
    "parent) holds the file and serves the others over its Unix socket; every commit "
    "fsync'd, requests of all clients group-committed",
    in_file, lambda location, mode: AckQueueAdapter(None, url=location),
    scenarios=("g",))
