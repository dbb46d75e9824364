"""ackqueue without its expiry index: the cost of the index, measured side by side with the
same code writing it.

The queue is opened as usual, then its record's index is taken away (one commit through
the queue's own ZODB database, before anything is measured): the store then writes no
index entries with puts and deletes, and the counts fall back to the lazy path.  A
benchmark-only seam: nothing in ackqueue turns the index off."""
import transaction

from benchmarks.contenders.ackqueue import AckQueueAdapter, has_durability_option
from benchmarks.contenders.base import Contender


class NoExpiryAdapter(AckQueueAdapter):
    def __init__(self, directory, **options):
        super().__init__(directory, **options)
        from ackqueue import store
        tm = transaction.TransactionManager()
        conn = self.q.db.open(transaction_manager=tm)
        try:
            with tm:
                rec = conn.root()[store.ROOT_KEY].queues[self.q.name]
                rec.expiry = None
        finally:
            conn.close()


FSYNC = Contender(
    "ackqueue-noexpiry", "ackqueue (fsync, no expiry index)", NoExpiryAdapter,
    "as ackqueue (fsync), with the queue's expiry index taken away (the cost of the "
    "index, side by side)", family="ackqueue")
OS = Contender(
    "ackqueue-os-noexpiry", "ackqueue (os, no expiry index)",
    lambda d: NoExpiryAdapter(d, durability="os"),
    "as ackqueue (os), with the queue's expiry index taken away", family="ackqueue",
    available=has_durability_option)
