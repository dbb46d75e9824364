"""queue.Queue: the in-memory reference (get + task_done stands for get + ack)."""
import queue as stdlib_queue

from benchmarks.contenders.base import Adapter, Contender


class StdlibAdapter(Adapter):
    """queue.Queue: get + task_done stands for get + ack."""

    def __init__(self, directory):
        self.q = stdlib_queue.Queue()

    def put(self, item):
        self.q.put(item)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None

    def ack(self, handle):
        self.q.task_done()


CONTENDER = Contender(
    "stdlib", "queue.Queue", StdlibAdapter,
    "none: in process memory only (reference)", fast=True, family="stdlib")
