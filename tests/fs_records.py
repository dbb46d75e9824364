"""What a FileStorage file holds, read back from the file: the class names of the records
its last transaction wrote, sorted (for tests that count what one commit writes), a
queue's record as a process that is gone left it, and how many bytes of data it holds."""
import os

from ZODB.FileStorage import FileStorage
from ZODB.utils import get_pickle_metadata

from ackqueue.torn_tail import check_tail


def data_size(path):
    """The size of the file at path without the zeros a synced queue file keeps written
    ahead of its commits while it is open (filestorage.SyncedFileStorage): where its last
    transaction ends (each ends with its length, never zero)."""
    with open(path, "rb") as f:
        data = f.read()
    return len(data.rstrip(b"\0")) if len(data) > 4 else os.path.getsize(path)


def records_of_last_transaction(path):
    storage = FileStorage(path, read_only=True)
    try:
        last = None
        for txn in storage.iterator():
            last = sorted(get_pickle_metadata(rec.data)[1] for rec in txn)
        return last
    finally:
        storage.close()


def read_catalog(path, read):
    """read(the ackqueue catalog) in the file at path, opened read-only (as a process that
    is gone left it), and what it returns.  The zeros it wrote ahead of its commits are
    cut first, as the next open would (ZODB would read them as a transaction)."""
    import ZODB
    from ackqueue import store
    check_tail(path)
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        return read(db.open().root()[store.ROOT_KEY])
    finally:
        db.close()


def read_queue(path, read, name="default"):
    """read(the QueueRecord of queue name), as read_catalog."""
    return read_catalog(path, lambda catalog: read(catalog.queues[name]))
