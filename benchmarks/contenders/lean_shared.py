"""The lean shared ZODB queue (benchmarks/lean_shared.py) through a ZEO server: the floor
under ackqueue's batched claims and riding acks in (g), a reference, not a product."""
from benchmarks.contenders.base import SharedContender
from benchmarks.contenders.lean import LeanDelegate
from benchmarks.contenders.zeo import RoundTrips, start_server


class LeanSharedAdapter(LeanDelegate):
    """benchmarks/lean_shared.py's LeanSharedQueue on a ZEO ClientStorage connected to the
    run's `ackqueue server` (its own root entries beside ackqueue's), its round trips
    counted as ackqueue's are (RoundTrips)."""

    def __init__(self, url, fast=False):
        from ZEO.ClientStorage import ClientStorage
        from ackqueue.zeo.client import parse_zeo_url
        from benchmarks import lean_shared
        addr, _ = parse_zeo_url(url)
        storage = ClientStorage(addr, wait_timeout=30)
        self.round_trips = RoundTrips(storage)
        self.q = lean_shared.LeanSharedQueue(storage, fast=fast)

    def qsize(self):
        return self.q.qsize()

    def diagnostics(self):
        return {"commits": self.q.commits, "conflicts": self.q.conflicts,
                "conflicts_by_class": dict(self.q.conflicts_by_class),
                "round_trips": self.round_trips.report()}

    def close(self):
        self.q.close()


def _opener(**options):
    return lambda location, mode: LeanSharedAdapter(location, **options)


SHARED = SharedContender(
    "lean-zeo", "ZODB lean shared (zeo, reference)", "lean", "poll",
    "benchmarks/lean_shared.py through the same kind of `ackqueue server`: the least a "
    "queue shared through ZEO does (a BTree of ready messages and one of messages in "
    "flight; a put, a claim and an ack are one commit each; no give-back, deadlines or "
    "counts): a floor for ackqueue (zeo) in (g), not a product",
    start_server, _opener(), scenarios=("g",))

SHARED_FAST = SharedContender(
    "lean-zeo-fast", "ZODB lean shared (zeo, prefetch 8, acks on the next claim)", "lean",
    "poll",
    "as ZODB lean shared, with two savings of round trips: an ack rides on the "
    "process's next claim commit, and a claim takes up to 8 ready messages while the "
    "process keeps up",
    start_server, _opener(fast=True), scenarios=("g",))
