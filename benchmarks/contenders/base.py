"""The adapter protocol: one small uniform interface over each queue library.

Every scenario talks to a queue through an Adapter, never to the library itself.  An
adapter module (one per library, in this package) defines a subclass of Adapter and one
Contender (or SharedContender) entry per way the library is measured; the registry in
contenders/__init__.py lists those entries.  A module must not import its third-party
library at module level: import it inside __init__ (or the hook that needs it), so that
``python -m benchmarks --help`` works with only ackqueue installed.

What an adapter does (``handle`` is whatever the library hands out for a message):

    put(item)                 enqueue, returning when the library says it is stored
    get(timeout) -> handle    the next message, or None after timeout seconds
    item(handle)              the item inside a handle (default: the handle itself)
    ack(handle)               acknowledge
    put_batch(items)          the library's closest thing to a batch put (default: puts)
    get_ack_batch(n, timeout) receive and acknowledge n messages, batched where possible
                              (default: n get + ack; raises Timeout if the queue runs dry)
    batch_method              a sentence: what a "batch" of (d) is for this library
    diagnostics()             counters the library exposes about the run, or None
    qsize()                   optional: messages the queue counts (read after (g))
    close()

and the registry entries that describe it:

    Contender(id, label, make, durability, ...)
        id: the name on the command line (--contender ID); label: the name in the
        report; make(directory) -> Adapter on a fresh queue in that (fresh) directory;
        durability: a sentence for the report.  fast=True for an in-memory reference
        (larger counts), counts={kind: n} for a slow one (smaller counts), and
        scale=a ScaleSupport to be measured in (f).
    SharedContender(id, label, family, mode, sharing, provision, open, ...)
        a way for several processes to share one queue, for (e) across processes and
        (g): provision(directory) -> (location, server or None) sets the queue up for
        one run (server.stop() tears it down), open(location, mode) -> Adapter in each
        process.
"""
from dataclasses import dataclass

from benchmarks.common import Timeout


class Adapter:
    batch_method = "per-item calls (no batch API)"

    def put(self, item):
        raise NotImplementedError

    def get(self, timeout):
        raise NotImplementedError

    def ack(self, handle):
        raise NotImplementedError

    def item(self, handle):
        return handle

    def put_batch(self, items):
        for it in items:
            self.put(it)

    def get_ack_batch(self, n, timeout):
        out = []
        for _ in range(n):
            h = self.get(timeout)
            if h is None:
                raise Timeout(f"batch get: queue empty after {timeout}s")
            self.ack(h)
            out.append(h)
        return out

    def diagnostics(self):
        """Counters the library exposes about the run (read before close), or None."""
        return None

    def close(self):
        pass


class ScaleSupport:
    """(f)'s hooks for a library measured at scale (run in the child processes of (f)).

    file_name: the queue's file (or directory) name inside the run's directory.
    fill(path, count) fills a new queue with count items and returns it, open; every
    commit must be durable when it returns.  opener(path) imports what the open needs
    and returns a callable that opens the queue (the timed part) and returns an object
    with get(timeout=), ack(handle), qsize() and close().
    index(path): what the reopen will find about the file (recorded, or None).
    after_kill(path): {field: value} about the files a SIGKILLed filler left."""

    file_name = "queue"

    def fill(self, path, count):
        raise NotImplementedError

    def opener(self, path):
        raise NotImplementedError

    def index(self, path):
        return None

    def after_kill(self, path):
        return {}


@dataclass
class Contender:
    id: str                          # on the command line
    label: str                       # in the report
    make: object                     # callable(directory) -> Adapter
    durability: str
    fast: bool = False               # an in-memory reference: gets larger counts
    family: str = ""                 # "ackqueue", "persist-queue", ...
    counts: dict = None              # smaller counts for a slow contender: {kind: n}
    scale: ScaleSupport = None       # measured in (f) when set
    available: object = None         # callable() -> bool: measured only when true


@dataclass
class SharedContender:
    id: str
    label: str
    family: str                      # "ackqueue", "persist-queue", "litequeue"
    mode: str                        # how its processes get: "blocking", "poll"
    sharing: str                     # how the processes share the queue (for the tables)
    provision: object = None         # callable(directory) -> (location, server or None)
    open: object = None              # callable(location, mode) -> Adapter
    scenarios: tuple = ("e_xproc", "g")
    samples: int = None              # (e) samples per run, when fewer than the others
    repeat: int = None               # repetitions, when fewer than the others


def in_directory(directory):
    """provision() for libraries shared through a file: the location is the directory."""
    return directory, None
