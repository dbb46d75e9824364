"""The merging index under the queue: real ZODB commits from two connections at once."""
import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage
from ZODB.MappingStorage import MappingStorage
from ZODB.POSException import ConflictError

from ackqueue import AckQueue, segments, store
from ackqueue.segments import KeySet, SegmentedIndex
from two_connections import keys_after, two_connections


@pytest.fixture(params=[SegmentedIndex, KeySet])
def two(tmp_path, request):
    """Two connections of one FileStorage database, each with its own transaction, on an
    index of either kind (plain segments, or the ready set's packed key segments)."""
    db = ZODB.DB(FileStorage(str(tmp_path / "seg.fs")))
    with db.transaction() as conn:
        conn.root()["index"] = index = request.param(bits=3)
        for key in (1, 2, 3, 9):
            index.add(key)
    with two_connections(db, "index") as pairs:
        yield pairs


def test_concurrent_changes_to_different_keys_merge_even_at_the_head(two):
    (tm_a, a), (tm_b, b) = two
    a.remove(1)                  # the first key: a BTree bucket refuses this merge
    b.remove(2)
    b.add(4)
    tm_a.commit()
    tm_b.commit()
    assert keys_after(two[0]) == [3, 4, 9]


@pytest.mark.parametrize("change, key", [("remove", 1), ("add", 5)])
def test_two_changes_of_one_key_conflict(two, change, key):
    """Two claims of one message (removals) or two adds of one key must not both win."""
    (tm_a, a), (tm_b, b) = two
    getattr(a, change)(key)
    getattr(b, change)(key)
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


def test_adds_and_removals_in_one_segment_from_both_sides_merge(two):
    (tm_a, a), (tm_b, b) = two
    a.remove(1)
    a.add(5)
    b.remove(3)
    b.add(6)
    tm_a.commit()
    tm_b.commit()
    assert keys_after(two[0]) == [2, 5, 6, 9]


def test_a_key_added_to_a_segment_emptied_meanwhile_merges(two):
    """An emptied segment stays in the index, so a concurrent add to it simply merges."""
    (tm_a, a), (tm_b, b) = two
    a.remove(9)                  # segment 1 (keys 8-15) becomes empty
    b.add(10)                    # into segment 1
    tm_a.commit()
    tm_b.commit()
    assert keys_after(two[0]) == [1, 2, 3, 10]


def test_a_key_added_to_a_segment_compacted_meanwhile_is_not_lost(two):
    """One transaction drops an empty segment from the index (compact) while another adds
    to it: the second must conflict, and its retry must land the key where it is found."""
    (tm_a, a), (tm_b, b) = two
    for key in (1, 2, 3):
        a.remove(key)            # segment 0 (keys 0-7) becomes empty
    tm_a.commit()
    tm_a.begin()
    tm_b.begin()
    assert a.has_empty_head()
    assert a.compact() == 1      # unlinks segment 0 (not the last one, which it keeps)
    b.add(4)                     # into segment 0, as b still sees it
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()
    tm_b.abort()
    tm_b.begin()
    b.add(4)
    tm_b.commit()
    assert keys_after(two[0]) == [4, 9]


def test_compact_keeps_the_last_segment(two):
    (tm_a, a), _ = two
    a.remove(9)
    assert not a.has_empty_head()     # the empty segment is the last: where keys go next
    assert a.compact() == 0
    tm_a.commit()
    assert keys_after(two[0]) == [1, 2, 3]


def test_counters_merge_concurrent_deltas_and_read_the_old_dict_state(tmp_path):
    """Counters keep one bytes state; two connections' concurrent adds sum, and a state
    written by an earlier version (a plain dict) loads and merges too."""
    from ackqueue.store import Counters
    db = ZODB.DB(FileStorage(str(tmp_path / "counts.fs")))
    try:
        with db.transaction() as conn:
            conn.root()["c"] = Counters()
        managers = [transaction.TransactionManager() for _ in range(2)]
        a, b = (db.open(transaction_manager=tm).root()["c"] for tm in managers)
        a.add(put=3, ready=3)
        b.add(put=2, acked=1)
        managers[0].commit()
        managers[1].commit()          # conflicts with the first; resolved by adding deltas
        managers[0].begin()
        assert (a.get("put"), a.get("ready"), a.get("acked")) == (5, 3, 1)
        assert isinstance(a.__getstate__(), bytes)
    finally:
        db.close()
    old = Counters()
    old.__setstate__({"put": 4, "ready": 1})           # an earlier version's state
    assert old.get("put") == 4 and old.get("acked") == 0
    merged = Counters()._p_resolveConflict({"put": 4}, {"put": 6}, old.__getstate__())
    fresh = Counters.__new__(Counters)
    fresh.__setstate__(merged)
    assert fresh.get("put") == 6 + 4 - 4 and fresh.get("ready") == 1


def test_key_list_is_every_key_in_order(tmp_path):
    index = SegmentedIndex(bits=2)
    keys = [9, 1, 4, 3, 17, 16, 2, 40]
    for key in keys:
        index.add(key)
    index.remove(4)
    assert index.key_list() == sorted(set(keys) - {4}) == list(index)


def test_a_key_set_packs_its_keys_and_holds_nothing_else(tmp_path):
    """The ready set's segments store 8 bytes per key, for keys up to the largest store
    key (top priority rank, 48-bit sequence), and refuse values they could not keep."""
    from ackqueue import store
    big = store.store_key(store.FIFO, 0, store.SEQ_MASK)
    keys = [3, 1, big, big - 1]
    db = ZODB.DB(FileStorage(str(tmp_path / "keys.fs")))
    try:
        with db.transaction() as conn:
            conn.root()["ready"] = ready = KeySet()
            ready.add_many(keys)
            segment = ready._segment(3)
            assert len(segment.__getstate__()) == 8 * 2
        with db.transaction() as conn:
            assert conn.root()["ready"].key_list() == sorted(keys)
    finally:
        db.close()
    with pytest.raises(TypeError):
        KeySet()[1] = "a value"
    with pytest.raises(TypeError):
        KeySet().set_many([(1, None), (2, "a value")])


# -- the message index unlinks a segment an ack empties, unless it is the last ----------

def test_an_ack_that_empties_an_old_message_segment_unlinks_it_in_that_commit(tmp_path):
    """No Compact commit has to write it again later (the last segment stays, for the
    next puts).  One-message acks are kept in the index's journal (format 7) until it
    passes GONE_KEYS: the ack that folds it unlinks the segments it empties."""
    def segment_numbers(q):
        tm, conn = q._state.snapshot()
        try:
            messages = conn.root()[store.ROOT_KEY].queues["default"].messages
            return list(messages.segments.keys()), len(messages)
        finally:
            tm.abort()
            conn.close()

    with AckQueue(path=str(tmp_path / "q.fs")) as q:
        q.put_many(range(300))                  # seqs 1-300: segments 0 to 18
        for _ in range(15):                     # seqs 1-15: all of segment 0
            q.ack(q.get())
        assert segment_numbers(q) == (list(range(19)), 285)   # in the journal: not yet
        for _ in range(segments.GONE_KEYS + 1 - 15):           # seqs 16-257: the fold
            q.ack(q.get())
        assert segment_numbers(q) == ([16, 17, 18], 43)
        q.put_many(range(2))
        q.ack_many(q.get_many(43))              # a batch goes to the segments at once
        assert segment_numbers(q) == ([18], 2)


def _retired_records(path):
    """How many records of the file at path store a segment as retired (its state
    segments.RETIRED), read with FileStorage's iterator."""
    import io
    import pickle

    storage = FileStorage(path, read_only=True)
    count = 0
    try:
        for txn in storage.iterator():
            for rec in txn:
                if rec.data is None:
                    continue
                unpickler = pickle.Unpickler(io.BytesIO(rec.data))
                unpickler.persistent_load = lambda ref: ref
                unpickler.load()                  # the class
                count += unpickler.load() == segments.RETIRED
    finally:
        storage.close()
    return count


def _take_100_of_300(q):
    q.put_many(range(300))                      # seqs 1-300: segments 0 to 18
    q.ack_many(q.get_many(100))                 # empties segments 0 to 5 (seqs 1-95)


def test_a_lone_process_leaves_the_segments_an_ack_many_empties_unwritten(tmp_path):
    """Its committer is the only writer of its queues (Committer(alone=True)), so a
    segment emptied and unlinked is not written as retired: nothing else can see it linked.
    The file reopens with the other 200 messages, in order."""
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        assert q._database.committer.alone
        _take_100_of_300(q)
    assert _retired_records(path) == 0
    with AckQueue(path=path) as q:
        assert q.qsize() == 200
        assert q.get_many(300) == list(range(100, 300))


def test_a_queue_in_an_applications_db_still_writes_the_segments_it_empties_as_retired(
        tmp_path):
    """An application's own connections may write the queue in their transactions
    (db=): a concurrent one that adds to an unlinked segment must conflict with the
    retired mark, so the committer is not alone and writes it."""
    path = str(tmp_path / "app.fs")
    db = ZODB.DB(FileStorage(path))
    try:
        with AckQueue(db=db) as q:
            assert not q._database.committer.alone
            _take_100_of_300(q)
    finally:
        db.close()
    assert _retired_records(path) == 6          # segments 0 to 5


def test_a_lone_process_opens_a_queue_through_its_committer(tmp_path):
    """The opening's writes (the queue record, what was in flight given back) are a
    committer commit too: nothing but the committer writes the queue.  (That a queue of
    another kind is still refused at open, and what was in flight given back, the tests
    of those show.)"""
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        committer = q._database.committer
        before = committer.commits
        with AckQueue(path=path, name="other") as other:
            assert committer.commits == before + 1
            other.put(1)
            assert other.get() == 1


def test_writing_alone_an_emptied_segment_is_unlinked_unwritten_and_an_abort_relinks_it():
    """A connection declared alone (segments.write_alone) unlinks a message segment that
    discard_sorted empties without changing it: it becomes a ghost (its data freed, not
    written).  If the commit is abandoned and retried, the segment is linked again and
    loads as stored.  A segment this transaction changed already is written anyway: it is
    retired, as when not alone."""
    from ackqueue.segments import MessageIndex
    db = ZODB.DB(MappingStorage())
    tm = transaction.TransactionManager()
    conn = db.open(transaction_manager=tm)
    try:
        segments.write_alone(conn)
        tm.begin()
        conn.root()["m"] = index = MessageIndex()
        index.set_many((key, (b"x", 0, 0.0, 0, None, None, None)) for key in range(40))
        tm.commit()                                 # segments 0, 1, 2 (16 keys each)
        first = index.segments[0]
        index.discard_sorted(list(range(16)))       # all of segment 0
        assert list(index.segments) == [1, 2]
        assert first._p_status == "ghost"           # not changed: nothing written
        tm.abort()
        assert list(index.segments) == [0, 1, 2]
        assert sorted(index.segments[0].data) == list(range(16))

        second = index.segments[1]
        index.discard_sorted([16])                  # changed in this transaction ...
        index.discard_sorted(list(range(17, 32)))   # ... then emptied
        assert list(index.segments) == [0, 2]
        assert second.retired and second._p_changed
        tm.abort()
    finally:
        conn.close()
        db.close()


def test_a_put_into_a_message_segment_unlinked_meanwhile_makes_it_again():
    """Several threads commit their puts one by one: a lower seq may arrive after its
    segment was emptied and unlinked.  (Each commit folds the index's journal here, as
    the commit that passes its bound does.)"""
    db = ZODB.DB(MappingStorage())
    try:
        def put(seq):
            return store.Put("q", seq, store.store_key(store.FIFO, 100, seq), b"x", 100, 1.0)

        def apply_and_fold(conn, ops):
            store.apply_unit(conn.root(), ops)
            messages = conn.root()[store.ROOT_KEY].queues["q"].messages
            messages.fold()
            return messages
        with db.transaction() as conn:
            store.ensure_queue(conn.root(), "q", store.FIFO)
            apply_and_fold(conn, [put(1), put(2), put(20)])
        with db.transaction() as conn:
            messages = apply_and_fold(conn, [store.Ack("q", 1, put(1).key),
                                             store.Ack("q", 2, put(2).key)])
            assert list(messages.segments) == [1]
        with db.transaction() as conn:
            assert list(apply_and_fold(conn, [put(3)]).segments) == [0, 1]
        with db.transaction() as conn:
            rec = conn.root()[store.ROOT_KEY].queues["q"]
            assert [seq for seq, _ in rec.messages.items()] == [3, 20]
            assert list(rec.ready) == [put(3).key, put(20).key]
            assert rec.counts.get("ready") == 2
    finally:
        db.close()


@pytest.mark.parametrize("seed", range(4))
def test_discard_sorted_removes_what_discard_many_removes(seed):
    """The acks' path (whole segments emptied in one step, the others key by key) leaves
    the same index, with the same segments unlinked, as discard_many."""
    import random
    from ackqueue.segments import MessageIndex
    rng = random.Random(seed)
    db = ZODB.DB(MappingStorage())
    try:
        with db.transaction() as conn:
            root = conn.root()
            root["a"], root["b"] = MessageIndex(), MessageIndex()
            keys = rng.sample(range(400), 250)
            for index in (root["a"], root["b"]):
                index.set_many((key, (b"x", 0, 0.0, 0, None, None, None)) for key in keys)
            for _ in range(20):
                start = rng.randrange(400)
                gone = sorted(set(range(start, start + rng.randrange(1, 60)))
                              | set(rng.sample(range(400), rng.randrange(0, 5))))
                root["a"].discard_many(gone)
                root["b"].discard_sorted(gone)
                assert list(root["a"].items()) == list(root["b"].items())
                assert list(root["a"].segments) == list(root["b"].segments)
    finally:
        db.close()
