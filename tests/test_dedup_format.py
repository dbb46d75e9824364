"""Dedup ids in store format 6: one entry per id, (until, seq), in QueueRecord.dedup,
so that a put with a dedup id (every put of the remote drop-in carries an idempotency
key) writes one bucket of them; a format-5 file (the until in .dedup, the seq in
.dedup_ids) is migrated on open."""
import ZODB
from ZODB.FileStorage import FileStorage

import pytest

from ackqueue import AckQueue, DuplicateMessage, store
from fs_records import records_of_last_transaction
from older_formats import as_format


def test_a_put_with_a_dedup_id_writes_one_dedup_record(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        for k in range(40):                      # the dedup tree and segments exist
            q.put(k, dedup_id=f"warm-{k}")
        q.put("x", dedup_id="idempotency:7d1f")
    written = records_of_last_transaction(path)
    # (the message itself is in the Counters: the message index's journal, format 7)
    assert written[0] == "Counters"
    assert len(written) == 2 and written[1] in ("OOBTree", "OOBucket"), written


def to_format_5(root):
    """What format 5 wrote: the until alone in .dedup, the seq in .dedup_ids (and the
    message indexes without their journal, format 7's)."""
    from BTrees.OOBTree import OOBTree
    catalog = root[store.ROOT_KEY]
    as_format(root, 5)
    for rec in catalog.queues.values():
        if rec.dedup is not None:
            rec.dedup_ids = OOBTree()
            for dedup_id, (until, seq) in list(rec.dedup.items()):
                rec.dedup[dedup_id] = until
                rec.dedup_ids[dedup_id] = seq


def test_a_format_5_file_is_migrated_and_its_dedup_ids_still_refuse(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        first = q.put_many(["a"], dedup_ids=["k1"])[0]
        q.put_many(["b"], dedup_ids=["k2"], dedup_window=0.001)  # its window passes
    db = ZODB.DB(FileStorage(path))
    with db.transaction() as conn:
        to_format_5(conn.root())
    db.close()
    with AckQueue(path=path) as q:
        with pytest.raises(DuplicateMessage) as caught:
            q.put("again", dedup_id="k1")
        assert caught.value.original_id == first
        assert q.dedup_lookup("k1") == first
        q.put("b again", dedup_id="k2")             # its window had passed
        assert q.qsize() == 3
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        catalog = db.open().root()[store.ROOT_KEY]
        rec = catalog.queues["default"]
        assert catalog.format == store.FORMAT >= 6
        assert rec.dedup_ids is None
        assert rec.dedup["k1"] == (rec.dedup["k1"][0], int(first))
    finally:
        db.close()


def test_expired_dedup_entries_are_pruned(tmp_path):
    from ackqueue.store import PruneDedup, apply_unit
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(["a"], dedup_ids=["short"], dedup_window=1)
        q.put_many(["b"], dedup_ids=["long"], dedup_window=600)
    db = ZODB.DB(FileStorage(path))
    try:
        with db.transaction() as conn:
            rec = conn.root()[store.ROOT_KEY].queues["default"]
            until = rec.dedup["short"][0]
            apply_unit(conn.root(), [PruneDedup("default", until + 1)])
        with db.transaction() as conn:
            assert list(conn.root()[store.ROOT_KEY].queues["default"].dedup) == ["long"]
    finally:
        db.close()
