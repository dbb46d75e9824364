"""The contenders: one adapter module per queue library, and the registry below.

To add a contender (a queue service over HTTP, a remote drop-in, ...):

1. write ``benchmarks/contenders/NAME.py`` with an ``Adapter`` subclass and a
   ``Contender(id, label, make, durability)`` entry (see ``base.py`` for the protocol;
   import the library inside the adapter, not at module level);
2. add its entry to ``_contenders()`` below.  If several processes can share it, also give
   the module a ``SharedContender`` and add it to ``_shared()``, in the order its rows
   should appear in (e) across processes and (g).

Everything else (the command line's --contender ids, the tables, the chart) follows.
"""
from benchmarks.contenders import (ackqueue, lean, lean_shared, litequeue, persist_queue,
                                   service, stdlib, zeo)
from benchmarks.contenders import (ackqueue_file, ackqueue_floor, ackqueue_noexpiry,
                                   ackqueue_remote, wake_floor)
from benchmarks.contenders.base import Adapter, Contender, SharedContender  # noqa: F401


def _contenders():
    """Every contender of (a)-(e), in the order of the tables (and of each repetition)."""
    return [
        stdlib.CONTENDER,
        persist_queue.CONTENDER,
        litequeue.CONTENDER,
        ackqueue.FSYNC,
        ackqueue.DEFERRED,        # acks="deferred": the ack rides on the next commit
        lean.CONTENDER,
        lean.COUNTED,             # a floor: the lean queue writing Counters
        lean.GUARDED,             # a floor: the lean queue keeping delivery records
        lean.SYNCED,              # the lean queue on ackqueue's synced storage
        lean.GUARANTEES,          # a floor: both of the above and Counters, synced
        ackqueue_floor.CONTENDER,  # a floor: no ready/counter writes
        ackqueue.MEMORY,
        ackqueue.OS,              # measured when AckQueue takes durability=
        zeo.CONTENDER,
        zeo.CONTENDER_PREFETCH,   # claims batched through ZEO
        ackqueue_remote.CONTENDER,
        ackqueue_noexpiry.FSYNC,  # the expiry index's cost, side by side
        ackqueue_noexpiry.OS,
    ]


def _shared():
    """Every way several processes share a queue, for (e) across processes and (g)."""
    return [
        ackqueue_file.SHARED,             # the same path in every process
        ackqueue_remote.SHARED,
        ackqueue_remote.SHARED_ACK_WITH_GET,
        ackqueue_remote.SHARED_OS,        # (e) across processes: the floor without fsync
        zeo.SHARED,
        zeo.SHARED_PREFETCH,      # fewer round trips per item, (g) only
        zeo.SHARED_FAST,
        zeo.SHARED_NEXT_GET,
        zeo.SHARED_BATCHES,
        zeo.SHARED_BATCHES16,
        lean_shared.SHARED,       # the floor under it, (g) only
        lean_shared.SHARED_FAST,
        *persist_queue.shared_contenders(),
        *litequeue.shared_contenders(),
        service.SHARED,           # the queue service: its own scenario only
        wake_floor.SHARED,        # (e) across processes: the floor of a service wake-up
        wake_floor.SHARED_AIOHTTP,  # the same floor on the service's HTTP stack
    ]


# Diagnostic contenders, run only when named with --contender: each measures the cost of
# one part of ackqueue beside it (the ready/counter writes, the expiry index) or the floor
# under a target (the lean queue shared through ZEO), not a library a user would pick,
# and together they would make a full run twice as long.
OPT_IN = ("ackqueue-floor", "lean-counted", "lean-guarded", "lean-synced", "lean-guarantees",
          "ackqueue-noexpiry", "ackqueue-os-noexpiry", "lean-zeo", "lean-zeo-fast")


def all_ids():
    """The ids the command line accepts (both registries; without checking availability)."""
    ids = []
    for c in _contenders() + _shared():
        if c.id not in ids:
            ids.append(c.id)
    return ids


ALIASES = {"queue.Queue": "stdlib"}


def _wanted(c, keep):
    return c.id in keep or c.label in keep


def select(names=None):
    """(contenders, shared contenders) to run: all available ones, or those whose id (or
    label, as the old --contenders took) is in names.  Raises ValueError on unknown names."""
    contenders = [c for c in _contenders() if c.available is None or c.available()]
    shared = _shared()
    if not names:
        return ([c for c in contenders if c.id not in OPT_IN],
                [c for c in shared if c.id not in OPT_IN])
    keep = {ALIASES.get(n, n) for n in names}
    known = set(all_ids()) | {c.label for c in _contenders() + shared}
    unknown = sorted(n for n in keep if n not in known)
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; choose from {all_ids()}")
    return ([c for c in contenders if _wanted(c, keep)],
            [c for c in shared if _wanted(c, keep)])


def by_id(contender_id):
    """The Contender with this id (for the child processes of (f))."""
    return next(c for c in _contenders() if c.id == contender_id)


def shared_by_id(contender_id):
    """The SharedContender with this id (for the child processes of (e) and (g))."""
    return next(c for c in _shared() if c.id == contender_id)
