"""Large bodies: a 50 MB item is stored in parts below ZODB's 16 MB record warning and
round-trips through its file without a warning; a format-2 file's single Body records
still read, and the file records today's format after its first open.
"""
import os


def _big_item():
    return os.urandom(1 << 20) * 50          # 50 MB, not compressible below ZODB's 16 MB


def test_a_50mb_item_round_trips_without_a_warning(tmp_path, caplog, recwarn):
    from ackqueue import AckQueue
    from ackqueue import store
    item = _big_item()
    path = tmp_path / "q.fs"
    with caplog.at_level("WARNING"):
        with AckQueue(path=path) as q:
            q.put(item)
            q.put("small")
        with AckQueue(path=path) as q:        # read back from the file, not the put's cache
            assert q.get(timeout=60) == item
            q.task_done()
            assert q.get(block=False) == "small"
            q.task_done()
            assert q.qsize() == 0
    assert [str(w.message)[:200] for w in recwarn] == []
    assert [r.getMessage()[:200] for r in caplog.records if r.levelno >= 30] == []
    assert store.BODY_PART < 16 << 20      # ZODB warns from 16 MB per record


def test_a_format2_file_is_migrated_and_its_large_bodies_read(tmp_path):
    """Format 3 splits large bodies into parts; a format-2 file's single Body records still
    read, and the file records format 3 after its first open."""
    import transaction
    import ZODB
    from ackqueue import AckQueue, store
    from ackqueue.filestorage import open_file_storage
    path = str(tmp_path / "q.fs")
    item = os.urandom(100_000)
    with AckQueue(path=path) as q:
        q.put(item)
    db = ZODB.DB(open_file_storage(path))    # make it a format-2 file: one Body record
    with db.transaction() as conn:
        catalog = conn.root()[store.ROOT_KEY]
        rec = catalog.queues["default"] if "default" in catalog.queues else \
            next(iter(catalog.queues.values()))
        seq, body = next(iter(rec.bodies.items()))
        assert body.parts is None and body.data is not None
        catalog.format = 2
    db.close()
    transaction.abort()
    with AckQueue(path=path) as q:
        assert q.get(block=False) == item
        q.task_done()
    db = ZODB.DB(open_file_storage(path))
    with db.transaction() as conn:
        assert conn.root()[store.ROOT_KEY].format == store.FORMAT     # migrated on open
    db.close()
