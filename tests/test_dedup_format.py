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
            apply_unit(conn.root(), [PruneDedup("default", until + 1, "dedup")])
        with db.transaction() as conn:
            assert list(conn.root()[store.ROOT_KEY].queues["default"].dedup) == ["long"]
    finally:
        db.close()


def test_a_prune_step_reads_at_most_its_limit_and_keeps_an_id_put_again(tmp_path):
    from ackqueue.store import PruneDedup, apply_unit
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(["a", "c", "d"], dedup_ids=["a", "c", "d"], dedup_window=1)
        q.put_many(["b"], dedup_ids=["b"], dedup_window=600)     # as if put again since
    db = ZODB.DB(FileStorage(path))
    try:
        with db.transaction() as conn:
            at = conn.root()[store.ROOT_KEY].queues["default"].dedup["a"][0] + 1
        steps = []
        after = None
        while True:
            step = PruneDedup("default", at, "dedup", after, 2)
            with db.transaction() as conn:
                apply_unit(conn.root(), [step])
            steps.append((after, step.next_after))
            if step.next_after is None:
                break
            after = step.next_after
        # two entries per step: (a, b) then (c, d), then an empty step past the end
        assert steps == [(None, "b"), ("b", "d"), ("d", None)]
        with db.transaction() as conn:
            assert list(conn.root()[store.ROOT_KEY].queues["default"].dedup) == ["b"]
    finally:
        db.close()


class _Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def test_a_sweep_prunes_dedup_ids_one_step_per_commit(tmp_path, monkeypatch):
    """A sweep forgets expired dedup ids in steps of PRUNE_STEP entries, each its own
    commit and submitted once the one before committed: no commit scans the whole table
    (a service that dedups every put keeps an entry per put of the last window)."""
    from ackqueue import state as state_module
    monkeypatch.setattr(state_module, "PRUNE_STEP", 3)
    clock = _Clock()
    q = AckQueue(path=str(tmp_path / "q.fs"), clock=clock)
    try:
        short = [f"s{i:02d}" for i in range(10)]
        q.put_many(list(range(10)), dedup_ids=short, dedup_window=10)
        q.put_many(["x", "y"], dedup_ids=["long1", "long2"], dedup_window=600)
        st = q._state
        steps = []
        submit = st.committer.submit

        def recording(ops, *args, **kwargs):
            steps.extend(op for op in ops if isinstance(op, store.PruneDedup))
            return submit(ops, *args, **kwargs)

        monkeypatch.setattr(st.committer, "submit", recording)
        clock.now += 30         # past the short window, short of the reaper's own sweep
        st.sweep()
        left = None
        for _ in range(1000):                 # the steps commit one after the other
            tm, conn = st.snapshot()
            try:
                left = sorted(conn.root()[store.ROOT_KEY].queues[q.name].dedup)
            finally:
                tm.abort()
                conn.close()
            if left == ["long1", "long2"] and steps and steps[-1].next_after is None:
                break
            st.committer.submit([], lead=True).wait()     # let the next step commit
        assert left == ["long1", "long2"]
        # 12 entries, 3 per step: 4 steps, and one more that finds the end
        assert [s.limit for s in steps] == [3] * 5
        assert [s.after for s in steps][0] is None and steps[-1].next_after is None
        q.put("again", dedup_id="s03")                    # forgotten: accepted
        with pytest.raises(DuplicateMessage):
            q.put("again", dedup_id="long1")
    finally:
        q.close()
