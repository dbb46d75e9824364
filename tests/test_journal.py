"""The ready set's journal (store format 5): the set's recent changes kept in the queue's
Counters, as runs of keys, and folded into its segments.  Real ZODB storages, real
concurrent commits from two connections, a real SIGKILL."""
import random
import signal

import pytest
import ZODB
from ZODB.FileStorage import FileStorage
from ZODB.POSException import ConflictError

from ackqueue import AckQueue, journal, store
from ackqueue.journal import KeyJournal, KeyRuns
from ackqueue.segments import KeySet
from fs_records import read_catalog, read_queue, records_of_last_transaction
from helpers_reliability import run_child
from older_formats import rewrite_file_as_format
from two_connections import keys_after, two_connections


# -- runs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_runs_hold_the_same_keys_as_a_set(seed):
    rng = random.Random(seed)
    runs, model = KeyRuns(), set()
    for _ in range(3000):
        key = rng.randrange(200)
        if rng.random() < 0.55:
            assert runs.add(key) == (key not in model)
            model.add(key)
        else:
            assert runs.discard(key) == (key in model)
            model.discard(key)
        assert len(runs) == len(model)
    assert list(runs) == sorted(model)
    assert all((key in runs) == (key in model) for key in range(-1, 202))
    again = KeyRuns(runs.flat())                    # as stored, and read back
    assert list(again) == sorted(model) and len(again) == len(model)
    starts, ends = again.starts, again.ends         # disjoint, sorted, never touching
    assert all(e < s for e, s in zip(ends, starts[1:])) and all(s < e for s, e in
                                                                zip(starts, ends))


@pytest.mark.parametrize("seed", range(5))
def test_ranges_added_and_removed_hold_the_same_keys_as_a_set(seed):
    rng = random.Random(seed)
    runs, model = KeyRuns(), set()
    for _ in range(2000):
        start = rng.randrange(300)
        end = start + rng.randrange(1, 30)
        span = set(range(start, end))
        assert runs.overlaps(start, end) == bool(span & model)
        if rng.random() < 0.5 and not span & model:
            runs.add_range(start, end)
            model |= span
        else:
            gone = runs.remove_range(start, end)
            assert set().union(*(range(s, e) for s, e in gone)) == span & model
            model -= span
        assert len(runs) == len(model)
        assert KeyRuns.of(model).flat() == (runs.flat() if model else ())
    assert list(runs) == sorted(model)


def _merge_by_keys(old, committed, new):
    """merge_states' rule, key by key (what it computed before it worked on runs)."""
    merged = {}
    for name in (journal.ADDED, journal.REMOVED):
        before = set(KeyRuns(old.get(name, ())))
        theirs = before ^ set(KeyRuns(committed.get(name, ())))
        ours = before ^ set(KeyRuns(new.get(name, ())))
        if theirs & ours:
            raise ConflictError("both")
        keys = before ^ theirs ^ ours
        if keys:
            merged[name] = KeyRuns.of(keys).flat()
    return merged


@pytest.mark.parametrize("seed", range(5))
def test_merging_on_the_runs_ends_merges_as_key_by_key(seed):
    rng = random.Random(seed)

    def some_runs():
        return {name: KeyRuns.of(rng.sample(range(60), rng.randrange(0, 25))).flat()
                for name in (journal.ADDED, journal.REMOVED) if rng.random() < 0.8}

    conflicts = merges = 0
    for _ in range(500):
        old = some_runs()
        committed, new = dict(old), dict(old)
        for side in (committed, new):
            if rng.random() < 0.7:           # a few keys changed on each side
                for name in (journal.ADDED, journal.REMOVED):
                    keys = set(KeyRuns(side.get(name, ())))
                    keys ^= set(rng.sample(range(60), rng.randrange(0, 8)))
                    side[name] = KeyRuns.of(keys).flat()
        try:
            expected = _merge_by_keys(old, committed, new)
        except ConflictError:
            with pytest.raises(ConflictError):
                journal.merge_states(old, committed, new)
            conflicts += 1
        else:
            assert journal.merge_states(old, committed, new) == expected
            merges += 1
    assert conflicts > 10 and merges > 100          # both outcomes were tried


def test_neighbouring_keys_are_stored_as_one_run():
    runs = KeyRuns()
    for key in range(1000, 1300):
        runs.add(key)
    for key in range(1000, 1100):
        runs.discard(key)
    assert runs.flat() == (1100, 1300)


# -- a journaled key set is the set it stands for ----------------------------------------

def journaled(root):
    root["counts"] = counts = store.Counters()
    root["ready"] = ready = KeySet(bits=3, journal_holder=counts)
    return ready


@pytest.mark.parametrize("seed", range(4))
def test_a_journaled_set_reads_as_the_set_its_changes_make(tmp_path, monkeypatch, seed):
    """Random adds and removes, committed one by one and read back from a reopened file:
    membership, order, length and key_list are the set's, whatever the journal holds and
    however often it was folded (small bounds here, to fold often)."""
    monkeypatch.setattr(journal, "JOURNAL_KEYS", 12)
    monkeypatch.setattr(journal, "JOURNAL_RUNS", 4)
    rng = random.Random(seed)
    path = str(tmp_path / "set.fs")
    db = ZODB.DB(FileStorage(path))
    model, folded = set(), 0
    with db.transaction() as conn:
        journaled(conn.root())
    for _ in range(400):
        with db.transaction() as conn:
            ready = conn.root()["ready"]
            before = bool(ready.journal_holder.journal)
            key = rng.randrange(100)
            if rng.random() < 0.5:
                assert ready.add(key) == (key not in model)
                model.add(key)
            else:
                assert ready.discard(key) == (key in model)
                model.discard(key)
            folded += before and not ready.journal_holder.journal
    db.close()
    assert folded > 5                       # the bounds were reached, again and again
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        ready = db.open().root()["ready"]
        assert list(ready) == ready.key_list() == sorted(model)
        assert len(ready) == len(model) and bool(ready) == bool(model)
        assert all((key in ready) == (key in model) for key in range(100))
        assert list(ready.keys(min=50)) == sorted(k for k in model if k >= 50)
    finally:
        db.close()


def test_a_scattered_batch_goes_to_the_segments_and_small_changes_to_the_journal(tmp_path):
    db = ZODB.DB(FileStorage(str(tmp_path / "set.fs")))
    scattered = list(range(100, 100 + 2 * (journal.JOURNAL_BATCH + 1), 2))
    try:
        with db.transaction() as conn:
            ready = journaled(conn.root())
            ready.add(1)
            ready.add_many(scattered)
            assert not ready.journal_holder.journal     # folded, then written at once
            assert SegmentedKeys(ready) == [1] + scattered
            ready.discard(1)
            ready.add(2)
            assert ready.journal_holder.journal.stored() == {journal.ADDED: (2, 3),
                                                             journal.REMOVED: (1, 2)}
            assert list(ready) == [2] + scattered
    finally:
        db.close()


def test_a_batch_that_is_one_run_goes_to_the_journal_as_one_run(tmp_path):
    """A FIFO put_many's keys, and the ack_many of what a get_many took: no segment of
    the set is written, whatever the batch's size (up to JOURNAL_KEYS)."""
    db = ZODB.DB(FileStorage(str(tmp_path / "set.fs")))
    try:
        with db.transaction() as conn:
            ready = journaled(conn.root())
            ready.add_many(list(range(1000, 1500)))
            ready.add_many(list(range(1599, 1499, -1)))   # a LIFO batch: descending
            assert ready.journal_holder.journal.stored() == {journal.ADDED: (1000, 1600)}
            assert ready.discard_many(list(range(1000, 1100))) == set(range(1000, 1100))
            assert ready.journal_holder.journal.stored() == {journal.ADDED: (1100, 1600)}
            ready.fold()
            assert ready.discard_many(list(range(1090, 1200))) == set(range(1100, 1200))
            assert ready.journal_holder.journal.stored() == {journal.REMOVED: (1100, 1200)}
            assert SegmentedKeys(ready) == list(range(1100, 1600))
            assert list(ready) == list(range(1200, 1600))
            ready.add_many(list(range(1150, 1250)))   # partly in the set: key by key
            assert list(ready) == list(range(1150, 1600))
    finally:
        db.close()


@pytest.mark.parametrize("seed", range(4))
def test_batches_of_runs_and_of_scattered_keys_read_as_the_set(tmp_path, monkeypatch, seed):
    """Random batches (runs, runs that overlap the set, scattered keys) and single
    changes, committed one by one and read back from a reopened file."""
    monkeypatch.setattr(journal, "JOURNAL_KEYS", 60)
    monkeypatch.setattr(journal, "JOURNAL_RUNS", 5)
    rng = random.Random(seed)
    path = str(tmp_path / "set.fs")
    db = ZODB.DB(FileStorage(path))
    model = set()
    with db.transaction() as conn:
        journaled(conn.root())
    for _ in range(300):
        with db.transaction() as conn:
            ready = conn.root()["ready"]
            start = rng.randrange(200)
            if rng.random() < 0.7:
                keys = list(range(start, start + rng.randrange(2, 40)))
                if rng.random() < 0.3:
                    keys.reverse()
            else:
                keys = rng.sample(range(240), rng.randrange(2, 30))
            if rng.random() < 0.5:
                ready.add_many(keys)
                model.update(keys)
            else:
                assert ready.discard_many(keys) == model & set(keys)
                model.difference_update(keys)
    db.close()
    db = ZODB.DB(FileStorage(path, read_only=True))
    try:
        ready = db.open().root()["ready"]
        assert list(ready) == ready.key_list() == sorted(model)
        assert len(ready) == len(model)
        assert all((key in ready) == (key in model) for key in range(260))
    finally:
        db.close()


def SegmentedKeys(ready):
    """The keys in the set's segments alone (without its journal)."""
    from ackqueue.segments import SegmentedIndex
    return SegmentedIndex.key_list(ready)


# -- concurrent changes merge in the Counters, as they did in the segments ---------------

@pytest.fixture
def two(tmp_path):
    """Two connections of one FileStorage database on one journaled set holding
    1, 2, 3 and 9 in its segments and 20 in its journal."""
    db = ZODB.DB(FileStorage(str(tmp_path / "seg.fs")))
    with db.transaction() as conn:
        ready = journaled(conn.root())
        ready.add_many([1, 2, 3, 9] + [100 + i for i in range(journal.JOURNAL_BATCH)])
        ready.discard_many([100 + i for i in range(journal.JOURNAL_BATCH)])
        ready.fold()
        ready.add(20)
    with two_connections(db, "ready") as pairs:
        yield pairs


def test_concurrent_changes_of_different_keys_merge(two):
    (tm_a, a), (tm_b, b) = two
    a.discard(1)                 # the head, from the segments
    a.add(5)
    b.discard(20)                # from the journal
    b.discard(2)
    b.add(6)
    tm_a.commit()
    tm_b.commit()                # a conflict on the Counters, resolved by the journals
    assert keys_after(two[0]) == [3, 5, 6, 9]


@pytest.mark.parametrize("change, key", [("discard", 1), ("discard", 20), ("add", 5)])
def test_two_changes_of_one_key_conflict(two, change, key):
    """Two claims of one message (removals) or two adds of one key must not both win."""
    (tm_a, a), (tm_b, b) = two
    getattr(a, change)(key)
    getattr(b, change)(key)
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


def test_a_fold_beside_a_change_of_a_folded_key_conflicts_and_the_retry_lands(two):
    (tm_a, a), (tm_b, b) = two
    a.fold()                     # 20 moves to the segments
    b.discard(20)                # from the journal, as b still sees it
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()
    tm_b.abort()
    tm_b.begin()
    assert b.discard(20)         # now from the segments
    tm_b.commit()
    assert keys_after(two[0]) == [1, 2, 3, 9]


def test_a_fold_beside_a_change_of_another_key_merges(two):
    (tm_a, a), (tm_b, b) = two
    a.fold()
    b.discard(3)
    b.add(7)
    tm_a.commit()
    tm_b.commit()
    assert keys_after(two[0]) == [1, 2, 7, 9, 20]


# -- what a queue writes -----------------------------------------------------------------

def test_a_put_and_an_ack_each_write_the_counters_alone(tmp_path):
    """Before format 5 each wrote a third record, the ready set's segment (KeySegment);
    before format 7 a second one, the message's segment (Segment)."""
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(range(20))                   # the segments exist: nothing is created
        q.put("one")
        written_by_put = records_of_last_transaction(path)
        q.ack(q.get())
        written_by_ack = records_of_last_transaction(path)
        q.ack(q.get())                          # the new message, taken from the inbox
        written_by_second_ack = records_of_last_transaction(path)
    assert written_by_put == ["Counters"]
    assert written_by_ack == ["Counters"]
    assert written_by_second_ack == ["Counters"]


# -- the format 4 file, and a crash ---------------------------------------------------------

def test_a_format_4_file_is_migrated_on_open(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(range(30))
        for _ in range(3):
            q.ack(q.get())
    rewrite_file_as_format(path, 4)         # ready sets without their journal
    with AckQueue(path=path) as q:
        assert q.qsize() == 27
        q.put("new")
        assert [q.get() for _ in range(28)] == list(range(3, 30)) + ["new"]

    def migrated(catalog):
        rec = catalog.queues["default"]
        assert catalog.format == store.FORMAT >= 5
        assert rec.ready.journal_holder is rec.counts
        assert rec.counts.journal                       # the new put is in the journal
    read_catalog(path, migrated)


def test_a_sigkill_with_changes_in_the_journal_loses_none_of_them(tmp_path):
    path = str(tmp_path / "q.fs")
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        q.put_many(range(20))       # in the journal, as one run
        q.put_many(range(20, 20 + int(sys.argv[2])))   # fills it: folded to the segments
        for i in range(20, 30):
            q.put(i)                # in the journal
        for _ in range(5):
            q.ack(q.get())          # 0-4, in the journal
        print("done", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, path, journal.JOURNAL_KEYS)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_queue(path, lambda rec: (len(rec.counts.journal.added),
                                         len(rec.counts.journal.removed))) == (10, 5)
    total = 20 + journal.JOURNAL_KEYS
    with AckQueue(path=path) as q:
        assert q.qsize() == total + 5
        stats = q.stats()
        assert (stats["put"], stats["acked"]) == (total + 10, 5)
        assert q.get_many(total + 5) == (list(range(5, 20)) + list(range(20, total))
                                         + list(range(20, 30)))


def test_counters_without_a_journal_store_what_they_stored_before():
    counts = store.Counters()
    counts.add(put=1)
    plain = counts.__getstate__()
    counts.journal.added.add(7)
    assert counts.__getstate__() != plain
    counts.journal = KeyJournal()
    assert counts.__getstate__() == plain
