"""What a FileStorage file's last transaction wrote, read back from the file: the class
names of its records, sorted (for tests that count what one commit writes)."""
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
