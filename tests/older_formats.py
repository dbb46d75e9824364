"""Queue files as older store formats wrote them, made from today's files: for the tests
that show each migration."""
import ZODB
from ZODB.FileStorage import FileStorage

from ackqueue import store


def as_format(root, version):
    """Rewrite the catalog in root as store format version wrote it, as far as the
    indexes' journals go: before format 7 no message index kept one, before format 5 no
    ready set (each folded into its segments and unhooked from the queue's Counters)."""
    catalog = root[store.ROOT_KEY]
    for rec in catalog.queues.values():
        for since, index in ((7, rec.messages), (5, rec.ready)):
            if version < since:
                index.fold()
                del index.journal_holder        # back to the class default, None
    catalog.format = version


def rewrite_file_as_format(path, version):
    """as_format() on the queue file at path, committed."""
    db = ZODB.DB(FileStorage(path))
    try:
        with db.transaction() as conn:
            as_format(conn.root(), version)
    finally:
        db.close()
