"""A floor under ackqueue (fsync), not a product: the same code path with the work that
a put or an ack commit does beside storing the message switched off.

Beside the messages, ackqueue's store keeps the queue's Counters (sizes and lifetime
totals, exact after a crash; the expiry order marker; the journal of the ready set, which
lets a queue reopen without a scan; what processes sharing a server watch to wake
getters).  This contender replaces the ready set's changes
(KeySet.add/add_many/discard/discard_many), Counters.add and Counters.set_order with
no-ops while it is open.  A put or an ack of one message keeps the message in the
Counters (the message index's journal), so ackqueue and this floor both write that one
record, and the distance from this floor to ackqueue (fsync) is the counters' and the
ready set's work in Python.  A batch writes its message segments, and ackqueue the
Counters beside them, so there the distance also holds that second record.  The
distance from it to the lean queue is what is left of ackqueue's own Python (deliveries,
deadlines, give-back on thread death, ...).  A file it wrote has no ready set and wrong
counters: never reopen one.
"""
from benchmarks.contenders.ackqueue import AckQueueAdapter
from benchmarks.contenders.base import Contender


class FloorAdapter(AckQueueAdapter):
    """ackqueue (fsync) without the ready-set and counter writes (see the module doc)."""

    def __init__(self, directory, **options):
        from ackqueue import segments, store
        self._patched = [(segments.KeySet, "add"), (segments.KeySet, "add_many"),
                         (segments.KeySet, "discard"), (segments.KeySet, "discard_many"),
                         (store.Counters, "add"), (store.Counters, "set_order")]
        self._saved = [(cls, name, cls.__dict__.get(name)) for cls, name in self._patched]
        segments.KeySet.add = lambda self, key: True
        segments.KeySet.add_many = lambda self, keys: None
        segments.KeySet.discard = lambda self, key: True
        # Every key an ack takes out is in the ready set (a lone process writes no
        # claims): said so, the acks take the store's usual path, not the one for
        # messages found elsewhere.
        segments.KeySet.discard_many = lambda self, keys: set(keys)
        store.Counters.add = lambda self, **deltas: None
        store.Counters.set_order = lambda self, marker: None
        try:
            super().__init__(directory, **options)
        except BaseException:
            self._restore()
            raise

    def _restore(self):
        for cls, name, original in self._saved:
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._saved = []

    def close(self):
        try:
            super().close()
        finally:
            self._restore()


CONTENDER = Contender(
    "ackqueue-floor", "ackqueue, no ready/counter writes (floor)", FloorAdapter,
    "a floor, not a product: ackqueue (fsync) with the ready-set, counter and expiry "
    "marker work switched off (before store format 7 its commits then wrote the message "
    "segment alone; since, the one record ackqueue's do)",
    fast=False,
    family="ackqueue")
