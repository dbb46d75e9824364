"""The message index's journal (store format 7): messages put and seqs deleted since the
index's last fold kept in the queue's Counters, so that a put or an ack of one message
writes one record.  A model of the index under random changes, real concurrent commits
from two connections, the format 6 file, and a real SIGKILL."""
import collections
import random
import signal

import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage
from ZODB.MappingStorage import MappingStorage
from ZODB.POSException import ConflictError

from ackqueue import AckQueue, segments, store
from ackqueue.segments import MessageIndex, SegmentedIndex
from fs_records import read_catalog, read_queue
from helpers_reliability import run_child
from older_formats import rewrite_file_as_format
from two_connections import two_connections


def journaled(root):
    """A message index keeping its journal in a Counters, both in root."""
    counts = root["counts"] = store.Counters()
    messages = root["messages"] = MessageIndex(journal_holder=counts)
    return messages


def msg(n, body=b"x"):
    return (body, 100, float(n), 0, None, None, None)


def physical(messages):
    """{seq: stored} of the segments alone."""
    return {key: value for segment in messages.segments.values()
            for key, value in segment.data.items()}


def check_against(messages, model):
    holder = messages.journal_holder
    inside = physical(messages)
    assert not holder.inbox.keys() & inside.keys()          # a seq in one place only
    assert set(holder.gone) <= inside.keys()                # gone: still in the segments
    assert dict(messages.stored_items()) == model
    assert sum(len(v[0]) for v in holder.inbox.values()) <= segments.INBOX_BYTES
    assert list(messages.keys()) == sorted(model)
    assert len(messages) == len(model) and bool(messages) == bool(model)
    some = sorted(model)[len(model) // 2] if model else 0
    assert list(messages.keys(some)) == [k for k in sorted(model) if k >= some]
    for key in list(model)[-20:] + list(holder.gone)[:20] + [0, max(model, default=0) + 1]:
        assert (key in messages) == (key in model)
        assert messages.stored(key) == model.get(key)


# -- the index with its journal holds what a dict holds ------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_the_index_with_its_journal_holds_what_a_dict_holds(seed):
    """Random puts (one, a few, a batch; bodies small and large enough to fold the inbox
    by its bytes), changes, deletes (one, a few, a batch, sorted or not) and folds,
    committed and read back now and then."""
    rng = random.Random(seed)
    db = ZODB.DB(MappingStorage())
    try:
        tm = transaction.TransactionManager()
        conn = db.open(transaction_manager=tm)
        messages = journaled(conn.root())
        model, next_seq, deleted = {}, 1, []
        for step in range(1500):
            roll = rng.random()
            if roll < 0.3:                                  # new messages
                count = rng.choice([1, 1, 1, 3, segments.JOURNAL_BATCH + 5])
                seqs = list(range(next_seq, next_seq + count))
                next_seq += count + rng.choice([0, 0, 5])
                values = [msg(s, b"x" * rng.choice([1, 1, 700, 3000])) for s in seqs]
                how = rng.choice(["setitem", "set_stored", "set_run"])
                if how == "setitem":
                    for s, v in zip(seqs, values):
                        messages[s] = store.Msg(*v)
                elif how == "set_stored":
                    messages.set_stored(list(zip(seqs, values)))
                else:
                    messages.set_run(seqs, values)
                model.update(zip(seqs, values))
            elif roll < 0.45 and model:                     # a change of one message
                s = rng.choice(list(model))
                model[s] = msg(s, body=b"changed %d" % step)
                messages[s] = store.Msg(*model[s])
            elif roll < 0.85 and model:                     # deletes
                count = rng.choice([1, 1, 2, segments.JOURNAL_BATCH + 3])
                keys = rng.sample(sorted(model), min(count, len(model)))
                if rng.random() < 0.3:
                    keys.append(next_seq + 100)             # not there
                if rng.random() < 0.4 and deleted:          # deleted already (in gone?)
                    keys += rng.sample(deleted, min(3, len(deleted)))
                how = rng.choice(["discard", "discard_many", "discard_sorted", "del"])
                if how == "discard":
                    assert [messages.discard(k) for k in keys] == [k in model for k in keys]
                elif how == "discard_many":
                    assert messages.discard_many(keys) == {k for k in keys if k in model}
                elif how == "discard_sorted":
                    messages.discard_sorted(sorted(k for k in keys if k in model))
                else:
                    for k in keys:
                        if k in model:
                            del messages[k]
                        else:
                            with pytest.raises(KeyError):
                                del messages[k]
                for k in keys:
                    if model.pop(k, None) is not None:
                        deleted.append(k)
            elif roll < 0.88:
                messages.fold()
            else:
                tm.commit()
                conn.cacheMinimize()                        # read back from the storage
                messages = conn.root()["messages"]
            check_against(messages, model)
        tm.commit()
    finally:
        db.close()


def test_the_journal_is_folded_at_its_bounds():
    db = ZODB.DB(MappingStorage())
    try:
        with db.transaction() as conn:
            messages = journaled(conn.root())
            holder = messages.journal_holder
            for s in range(1, segments.INBOX_KEYS + 1):
                messages[s] = msg(s)
            assert len(holder.inbox) == segments.INBOX_KEYS and not physical(messages)
            messages[segments.INBOX_KEYS + 1] = msg(0)
            # Folded below the inbox's last segment; that segment's messages stay.
            last = (segments.INBOX_KEYS + 1) >> messages.bits
            seqs = range(1, segments.INBOX_KEYS + 2)
            assert sorted(holder.inbox) == [s for s in seqs if s >> messages.bits == last]
            assert sorted(physical(messages)) == [s for s in seqs
                                                  if s >> messages.bits != last]
            big = b"b" * (segments.INBOX_BYTES // 2 + 1)
            messages[100] = msg(100, big)
            messages[101] = msg(101, big)          # the bodies pass INBOX_BYTES: all of it
            assert not holder.inbox and {16, 17, 100, 101} <= physical(messages).keys()
            for s in range(1, segments.GONE_KEYS + 2):
                messages[1000 + s] = msg(s)
            messages.fold()
            for s in range(1, segments.GONE_KEYS + 1):
                del messages[1000 + s]
            assert holder.gone.count == segments.GONE_KEYS
            del messages[1000 + segments.GONE_KEYS + 1]
            assert not holder.gone.count and 1001 not in physical(messages)
    finally:
        db.close()


def test_a_full_inbox_keeps_its_last_segments_messages_so_each_segment_is_written_once(
        tmp_path):
    """Puts one at a time (ascending seqs) fold the inbox every INBOX_KEYS puts, each fold
    writing the one segment that the inbox's messages fill; before, each fold wrote the
    two segments its INBOX_KEYS + 1 messages span, the second of them again at the next
    fold.  Read from the file: the records of the index's segments."""
    db = ZODB.DB(FileStorage(str(tmp_path / "msg.fs")))
    try:
        with db.transaction() as conn:
            journaled(conn.root())
        per = 1 << MessageIndex().bits                  # messages in a segment
        for s in range(per, 9 * per):                   # segments 1 to 8, one put each
            with db.transaction() as conn:
                conn.root()["messages"][s] = msg(s)
        with db.transaction() as conn:
            messages = conn.root()["messages"]
            assert sorted(messages.journal_holder.inbox) == list(range(8 * per, 9 * per))
            assert list(messages.keys()) == list(range(per, 9 * per))
            oids = {segment._p_oid: number
                    for number, segment in messages.segments.items()}
        written = collections.Counter()
        for txn in db.storage.iterator():
            for rec in txn:
                if rec.oid in oids:
                    written[oids[rec.oid]] += 1
        assert written == {number: 1 for number in range(1, 8)}
    finally:
        db.close()


def test_an_inbox_within_one_segment_folds_whole():
    """An index of 64-message segments (files made before 16): INBOX_KEYS + 1 new
    messages may all be in one segment, and the inbox then folds as a whole."""
    db = ZODB.DB(MappingStorage())
    try:
        with db.transaction() as conn:
            counts = conn.root()["counts"] = store.Counters()
            messages = MessageIndex(bits=6, journal_holder=counts)
            for s in range(1, segments.INBOX_KEYS + 2):
                messages[s] = msg(s)
            assert not counts.inbox
            assert sorted(physical(messages)) == list(range(1, segments.INBOX_KEYS + 2))
    finally:
        db.close()


# -- concurrent changes merge in the Counters ----------------------------------------------

@pytest.fixture
def two(tmp_path):
    """Two connections of one FileStorage database on one journaled index holding 1, 2
    and 3 in its segments and 20 and 21 in its inbox, with 4 deleted (in gone)."""
    db = ZODB.DB(FileStorage(str(tmp_path / "msg.fs")))
    with db.transaction() as conn:
        messages = journaled(conn.root())
        for s in (1, 2, 3, 4):
            messages[s] = msg(s)
        messages.fold()
        del messages[4]
        messages[20] = msg(20)
        messages[21] = msg(21)
    with two_connections(db, "messages") as pairs:
        yield pairs


def read_after(pair):
    tm, messages = pair
    tm.begin()
    return dict(messages.stored_items())


def test_concurrent_changes_of_different_messages_merge(two):
    (tm_a, a), (tm_b, b) = two
    del a[1]                     # from the segments: into gone
    del a[20]                    # from the inbox
    a[22] = msg(22)
    del b[2]
    b[21] = msg(21, b"changed")
    b[23] = msg(23)
    tm_a.commit()
    tm_b.commit()                # a conflict on the Counters, resolved by the journals
    assert read_after(two[0]) == {3: msg(3), 21: msg(21, b"changed"), 22: msg(22),
                                  23: msg(23)}


@pytest.mark.parametrize("key", [1, 20])
def test_two_deletes_of_one_message_conflict(two, key):
    """Two acks of one message (from the segments or from the inbox) must not both win."""
    (tm_a, a), (tm_b, b) = two
    del a[key]
    del b[key]
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


def test_two_changes_of_one_new_message_conflict(two):
    (tm_a, a), (tm_b, b) = two
    a[20] = msg(20, b"a")
    b[20] = msg(20, b"b")
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


@pytest.mark.parametrize("change", ["delete", "change"])
def test_a_fold_beside_a_change_of_a_folded_message_conflicts_and_the_retry_lands(
        two, change):
    (tm_a, a), (tm_b, b) = two
    a.fold()                     # 20 and 21 move to the segments, 4 leaves them
    if change == "delete":
        del b[20]                # from the inbox, as b still sees it
    else:
        b[20] = msg(20, b"changed")
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()
    tm_b.abort()
    tm_b.begin()
    if change == "delete":
        del b[20]                # now from the segments
    else:
        b[20] = msg(20, b"changed")
    tm_b.commit()
    expected = {1: msg(1), 2: msg(2), 3: msg(3), 21: msg(21)}
    if change == "change":
        expected[20] = msg(20, b"changed")
    assert read_after(two[0]) == expected
    assert 4 not in physical(two[0][1])


def test_a_fold_beside_a_new_message_conflicts_and_the_retry_lands(two):
    (tm_a, a), (tm_b, b) = two
    a.fold()
    del b[3]
    b[22] = msg(22)
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()
    tm_b.abort()
    tm_b.begin()
    del b[3]
    b[22] = msg(22)
    tm_b.commit()
    assert read_after(two[0]) == {1: msg(1), 2: msg(2), 20: msg(20), 21: msg(21),
                                  22: msg(22)}


# -- the format 6 file, and a crash ---------------------------------------------------------

def test_a_format_6_file_is_migrated_on_open(tmp_path):
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path) as q:
        q.put_many(range(30))
        for i in range(3):
            q.put(100 + i)                      # in the inbox
            q.ack(q.get())                      # in gone
    rewrite_file_as_format(path, 6)         # message indexes without their journal

    def as_format_6_left_it(rec):
        assert rec.messages.journal_holder is None
        assert len(SegmentedIndex.key_list(rec.messages)) == 30
    read_queue(path, as_format_6_left_it)
    with AckQueue(path=path) as q:
        assert q.qsize() == 30
        q.put("new")
        assert [q.get() for _ in range(31)] == list(range(3, 30)) + [100, 101, 102, "new"]

    def migrated(catalog):
        rec = catalog.queues["default"]
        assert catalog.format == store.FORMAT >= 7
        assert rec.messages.journal_holder is rec.counts
        assert len(rec.counts.inbox) == 1                # the new put is in the journal
    read_catalog(path, migrated)


def test_a_sigkill_with_messages_in_the_journal_loses_none_of_them(tmp_path):
    """Puts and acks of one message, in the inbox and in gone when the process is
    killed, are all there after the restart; a batch beside them too."""
    path = str(tmp_path / "q.fs")
    proc = run_child("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        q.put_many(range(40))       # to the segments (a batch)
        for _ in range(5):
            q.ack(q.get())          # 0-4: in gone
        for i in range(100, 110):
            q.put(i)                # in the inbox
        q.ack(q.get())              # 5: in gone
        print("done", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_queue(path, lambda rec: (len(rec.counts.inbox), rec.counts.gone.count)) \
        == (10, 6)
    with AckQueue(path=path) as q:
        assert q.qsize() == 44
        stats = q.stats()
        assert (stats["put"], stats["acked"]) == (50, 6)
        assert q.get_many(100) == list(range(6, 40)) + list(range(100, 110))


def test_a_put_beside_a_fold_conflicts_even_with_the_same_new_seq(two):
    """Through a server two puts may take one seq (the sequence counter merges by taking
    the larger; the message index's conflict is what sends one of them back).  When one
    of them folds the inbox, the inboxes alone cannot tell: a fold (or any write of new
    messages to the segments) conflicts with every concurrent new message."""
    (tm_a, a), (tm_b, b) = two
    for s in range(30, 30 + segments.INBOX_KEYS - 3):
        a[s] = msg(s)
    a[99] = msg(99, b"a")
    a[120] = msg(120)            # a's inbox passes its bound: it folds all but 120
    assert list(a.journal_holder.inbox) == [120]
    b[99] = msg(99, b"b")        # the same new seq, into b's inbox
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


def test_a_batch_to_the_segments_beside_a_new_message_conflicts(two):
    (tm_a, a), (tm_b, b) = two
    seqs = list(range(40, 40 + segments.JOURNAL_BATCH + 1))
    a.set_run(seqs, [msg(s) for s in seqs])
    b[40] = msg(40, b"b")
    tm_a.commit()
    with pytest.raises(ConflictError):
        tm_b.commit()


def test_changes_of_older_messages_beside_a_fold_merge(two):
    (tm_a, a), (tm_b, b) = two
    a[22] = msg(22)
    a.fold()
    b[1] = msg(1, b"changed")    # in the segments: no new message
    del b[2]
    tm_a.commit()
    tm_b.commit()
    assert read_after(two[0]) == {1: msg(1, b"changed"), 3: msg(3), 20: msg(20),
                                  21: msg(21), 22: msg(22)}
