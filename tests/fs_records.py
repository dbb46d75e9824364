"""What a FileStorage file holds, read back from the file: the class names of the records
its last transaction wrote, sorted (for tests that count what one commit writes), and a
queue's record as a process that is gone left it."""
from ZODB.FileStorage import FileStorage
from ZODB.utils import get_pickle_metadata


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
    is gone left it), and what it returns."""
    import ZODB
    from ackqueue import store
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        return read(db.open().root()[store.ROOT_KEY])
    finally:
        db.close()


def read_queue(path, read, name="default"):
    """read(the QueueRecord of queue name), as read_catalog."""
    return read_catalog(path, lambda catalog: read(catalog.queues[name]))
