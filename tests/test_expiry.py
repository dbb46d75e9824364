"""qsize(), counts() and empty() leave out messages whose retention has passed, exactly, at
the moment they are called, with no sweep having run: through the
store's expiry index (ackqueue.expiry), in one process (file and memory), through a real
``ackqueue server`` (ZEO) and through a real ``ackqueue serve`` (the remote drop-in).

Time is an injected clock; the reaper's periodic sweep is kept out of the way (its interval
is pushed far away), so what the counts show is what the counts themselves found."""
import itertools
import time

import pytest
import transaction
from ZODB import DB
from ZODB.FileStorage import FileStorage

from ackqueue import AckPriorityQueue, AckQueue, Empty, state as state_module, store

from zeo_server import Server

_names = itertools.count()


class FakeClock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture(autouse=True)
def no_periodic_sweep(monkeypatch):
    """The reaper's sweep would take expired messages out by itself: keep it away (its
    interval, by either clock, far beyond what the tests advance)."""
    monkeypatch.setattr(state_module, "SWEEP_INTERVAL", 1e12)


@pytest.fixture(scope="module")
def zeo(tmp_path_factory):
    d = tmp_path_factory.mktemp("expiry-zeo")
    srv = Server(d / "shared.fs", d / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(params=["memory", "file", "zeo"])
def opener(request, tmp_path):
    """open(cls=AckQueue, name=None, **kwargs): queues of one storage of the backend."""
    opened, dbs = [], []
    base = f"q{next(_names)}"
    if request.param == "zeo":
        where = {"path": request.getfixturevalue("zeo").url}
    elif request.param == "file":
        where = {"path": str(tmp_path / "q.fs")}
    else:
        db = DB(None)
        dbs.append(db)
        where = {"db": db}

    def open_(cls=AckQueue, name="", **kwargs):
        q = cls(name=base + name, **where, **kwargs)
        opened.append(q)
        return q
    open_.backend = request.param
    yield open_
    for q in reversed(opened):
        q.close()
    for db in dbs:
        db.close()


def sizes(q):
    c = q.counts()
    return (c["ready"], c["in_flight"], c["delayed"])


def test_ready_messages_past_their_retention_leave_the_counts_at_once(opener):
    clock = FakeClock()
    q = opener(clock=clock)
    q.put("short", retention=10)
    q.put("long", retention=100)
    q.put("short, urgent", retention=10, priority=200)
    assert (q.qsize(), sizes(q), q.empty()) == (3, (3, 0, 0), False)
    clock.advance(10.5)
    assert (q.qsize(), sizes(q), q.empty()) == (1, (1, 0, 0), False)
    clock.advance(90)
    assert (q.qsize(), sizes(q), q.empty()) == (0, (0, 0, 0), True)
    with pytest.raises(Empty):
        q.get(block=False)
    assert q.stats()["expired"] == 3


def test_the_deadline_itself_is_exact(opener):
    clock = FakeClock(1_000_000.25)     # deadlines inside a second, not on its edge
    q = opener(clock=clock)
    q.put("a", retention=0.5)           # expires at .75
    q.put("b", retention=0.6)           # expires at .85
    clock.now = 1_000_000.75
    assert q.qsize() == 1               # a deadline at now has passed
    clock.now = 1_000_000.8
    assert q.qsize() == 1
    clock.now = 1_000_000.85
    assert q.qsize() == 0


def test_a_delayed_message_that_expires_before_it_is_visible(opener):
    clock = FakeClock()
    q = opener(clock=clock)
    q.put("late", retention=10, delay=50)
    q.put("kept", retention=100, delay=50)
    assert sizes(q) == (0, 0, 2)
    clock.advance(11)
    assert sizes(q) == (0, 0, 1)
    clock.advance(40)
    # (counts() first: through a server it promotes due delayed messages and waits for
    # that, where qsize() leaves them to the reaper; that is not about retention.)
    assert (sizes(q), q.qsize()) == ((1, 0, 0), 1)
    assert q.get(block=False) == "kept"


def test_an_expired_message_in_flight_stays_in_flight_until_its_delivery_ends(opener):
    clock = FakeClock()
    q = opener(clock=clock)
    q.put("held", retention=10)
    q.put("waiting", retention=10)
    m = q.get_message(visibility_timeout=1000)
    clock.advance(11)
    assert sizes(q) == (0, 1, 0)        # the waiting one went; the held one is in flight
    q.nack(m)                           # given back past its retention: it expires
    assert (q.qsize(), sizes(q), q.empty()) == (0, (0, 0, 0), True)
    assert q.stats()["expired"] == 2


def test_priority_by_value_queue(opener):
    clock = FakeClock()
    q = opener(AckPriorityQueue, clock=clock)
    for n, retention in ((5, 10), (1, 100), (3, 10), (2, 10)):
        q.put(n, retention=retention)
    clock.advance(11)
    assert (q.qsize(), sizes(q)) == (1, (1, 0, 0))
    assert q.get(block=False) == 1


def test_dead_letters_and_redrive_keep_exact_counts(opener):
    clock = FakeClock()
    dlq = opener(name="dlq", clock=clock)
    q = opener(clock=clock, max_receives=1, dead_letter=dlq.name)
    q.put("poison", retention=10)
    q.nack(q.get_message())
    with pytest.raises(Empty):
        q.get(block=False)              # moved to the dead-letter queue
    clock.advance(11)                   # past the first retention: a dead letter has its own
    assert (dlq.qsize(), sizes(q)) == (1, (0, 0, 0))
    assert dlq.redrive() == 1
    clock.advance(store.DEFAULT_RETENTION - 1)
    assert (q.qsize(), dlq.qsize()) == (1, 0)
    clock.advance(2)                    # a redriven message has the default retention again
    assert (q.qsize(), sizes(q), q.empty()) == (0, (0, 0, 0), True)
    dlq.put("dead", retention=10)
    clock.advance(11)
    assert dlq.empty()


def test_purge_and_acks_empty_the_index(opener):
    """Messages put after others with a later deadline (a shorter retention) are out of
    order: they have index entries, which acks and purge take out."""
    clock = FakeClock()
    q = opener(clock=clock)
    q.put_many(range(300), retention=20, delay=5)
    q.put_many(range(300), retention=10)
    assert index_size(q) == 300
    for _ in range(100):
        q.ack(q.get_message())
    assert index_size(q) == 200
    assert q.purge() == 500
    assert index_size(q) == 0
    clock.advance(30)
    assert sizes(q) == (0, 0, 0)


def index_size(q):
    """Entries of the queue's expiry index, read from a fresh snapshot."""
    q._state.committer.submit([]).wait()
    tm = transaction.TransactionManager()
    conn = q.db.open(transaction_manager=tm)
    try:
        return len(conn.root()[store.ROOT_KEY].queues[q.name].expiry)
    finally:
        tm.abort()
        conn.close()


def index_and_messages(q):
    """(seqs with an expiry index entry, seqs stored), read from one fresh snapshot."""
    tm = transaction.TransactionManager()
    conn = q.db.open(transaction_manager=tm)
    try:
        rec = conn.root()[store.ROOT_KEY].queues[q.name]
        entries = {seq for _slot, seq in rec.expiry.entries(2 ** 62)}
        return entries, set(rec.messages.keys())
    finally:
        tm.abort()
        conn.close()


def test_several_processes_through_a_server_see_the_same_exact_counts(zeo):
    """Two clients of one server (each its own storage connection and arbiter): one
    puts, the other counts, with no sweep anywhere."""
    clock = FakeClock()
    name = f"shared{next(_names)}"
    with AckQueue(path=zeo.url, name=name, clock=clock) as producer, \
            AckQueue(path=zeo.url, name=name, clock=clock) as counter:
        producer.put_many(range(5), retention=10)
        producer.put_many(range(3), retention=100)
        producer.put("delayed", retention=10, delay=50)
        assert sizes(counter) == (8, 0, 1)
        clock.advance(11)
        assert (counter.qsize(), sizes(counter), counter.empty()) == (3, (3, 0, 0), False)
        assert sizes(producer) == (3, 0, 0)
        clock.advance(100)
        assert (counter.qsize(), counter.empty()) == (0, True)


def test_a_file_reopened_after_the_retention_counts_exactly(tmp_path):
    clock = FakeClock()
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, clock=clock) as q:
        q.put_many(range(10), retention=10)
        q.put("kept", retention=100)
    clock.advance(11)
    with AckQueue(path=path, clock=clock) as q:
        assert (q.qsize(), sizes(q)) == (1, (1, 0, 0))


def test_a_format_3_file_gets_its_index_built_once_on_open(tmp_path):
    """A file written before the index (format 3: no QueueRecord.expiry) is migrated on
    open: the index is built from its messages, and the counts are exact at once."""
    from ackqueue.expiry import ExpiryIndex
    clock = FakeClock()
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, clock=clock) as q:
        q.put_many(range(4), retention=10)
        q.put("kept", retention=100)
    edit_root(path, to_format_3)
    assert read_root(path, lambda root: (root[store.ROOT_KEY].format,
                                         root[store.ROOT_KEY].queues["default"].expiry)) \
        == (3, None)
    clock.advance(11)
    with AckQueue(path=path, clock=clock) as q:
        assert (q.qsize(), sizes(q)) == (1, (1, 0, 0))
    assert read_root(path, lambda root: (
        root[store.ROOT_KEY].format,
        type(root[store.ROOT_KEY].queues["default"].expiry))) == (store.FORMAT, ExpiryIndex)


def to_format_3(root):
    catalog = root[store.ROOT_KEY]
    for rec in catalog.queues.values():
        del rec.expiry                  # back to the class default, None
    catalog.format = 3


def edit_root(path, change):
    db = DB(FileStorage(path))
    try:
        with db.transaction() as conn:
            change(conn.root())
    finally:
        db.close()


def read_root(path, read):
    db = DB(FileStorage(path, read_only=True))
    try:
        conn = db.open()
        try:
            return read(conn.root())
        finally:
            conn.close()
    finally:
        db.close()


def test_the_service_and_the_remote_drop_in_count_exactly(tmp_path):
    """``ackqueue serve`` runs on the wall clock: the test waits until the wall clock has
    passed the deadline (a condition on time.time, not a timed assertion)."""
    pytest.importorskip("aiohttp")
    from service_proc import Service
    service = Service(tmp_path / "svc.fs", tmp_path / "service.log")
    try:
        with AckQueue(path=service.url, name="remote") as q:
            q.put("short", retention=0.2)
            q.put("long", retention=3600)
            # The deadline the service gave it, by its clock (the same machine's).
            deadline = min(m.expires_at for m in q.browse())
            while time.time() <= deadline:
                time.sleep(0.05)
            assert (q.qsize(), sizes(q), q.empty()) == (1, (1, 0, 0), False)
    finally:
        assert service.stop() == 0


def test_concurrent_puts_and_acks_through_a_server_leave_the_index_exact(zeo):
    """Two clients (each its own connection to the server, so their commits meet in the
    server's conflict resolution) put and ack at once; afterwards the index holds exactly
    the messages left, and the counts leave out the expired ones among them."""
    import threading
    clock = FakeClock()
    name = f"race{next(_names)}"
    a = AckQueue(path=zeo.url, name=name, clock=clock)
    b = AckQueue(path=zeo.url, name=name, clock=clock)
    try:
        def work(q, tag):
            for n in range(40):
                q.put_many([(tag, n, k) for k in range(5)], retention=10 + n % 3)
                for _ in range(4):
                    q.ack(q.get_message(timeout=30))
        threads = [threading.Thread(target=work, args=(q, tag)) for q, tag in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sizes(a) == (80, 0, 0)
        entries, stored = index_and_messages(a)
        assert entries <= stored and len(stored) == 80
        clock.advance(13)
        assert (a.qsize(), b.qsize(), sizes(b)) == (0, 0, (0, 0, 0))
    finally:
        a.close()
        b.close()


# -- ordered messages need no index entry (the marker in Counters, ackqueue.expiry) ------

def test_messages_put_in_deadline_order_have_no_index_entry(opener):
    """Puts whose deadlines do not decrease (the usual retention, a longer one) write no
    entry; the counts still leave out exactly the expired ones, ready, delayed or in
    flight.  A shorter retention after them is out of order and indexed."""
    clock = FakeClock()
    q = opener(clock=clock)
    q.put_many(range(5), retention=10)
    q.put("delayed", retention=10, delay=50)
    q.put_many(range(3), retention=20)
    assert index_size(q) == 0
    q.put("short", retention=5)
    assert index_size(q) == 1
    held = q.get_message()
    clock.advance(6)                    # "short" expired: out of order, found by the index
    assert (q.qsize(), sizes(q)) == (7, (7, 1, 1))
    clock.advance(5)                    # the retention=10 prefix expired (held one stays)
    assert (q.qsize(), sizes(q), q.empty()) == (3, (3, 1, 0), False)
    q.ack(held)
    clock.advance(10)
    assert (q.qsize(), sizes(q), q.empty()) == (0, (0, 0, 0), True)


def test_a_clock_stepped_back_puts_out_of_order_and_counts_stay_exact(opener):
    clock = FakeClock()
    q = opener(clock=clock)
    q.put_many(range(3), retention=10)          # deadlines t0 + 10
    clock.advance(-4)
    q.put_many(range(2), retention=10)          # t0 + 6: earlier, after them
    assert index_size(q) == 2
    clock.advance(10)                           # t0 + 6: only the later puts expired
    assert (q.qsize(), sizes(q)) == (3, (3, 0, 0))
    clock.advance(4)
    assert (q.qsize(), q.empty()) == (0, True)


def test_an_index_with_an_entry_for_every_message_counts_each_once(tmp_path):
    """A format-4 file written before the marker (its index holds every message, the
    marker is absent) is read exactly: a message with an entry is counted once."""
    clock = FakeClock()
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, clock=clock) as q:
        q.put_many(range(4), retention=10)
        q.put("kept", retention=100)

    def index_everything(root):
        rec = root[store.ROOT_KEY].queues["default"]
        rec.expiry.add_many((seq, msg.expires_at) for seq, msg in rec.messages.items())
        rec.counts.values.pop(store.Counters.ORDER, None)
        rec.counts._p_changed = True
    edit_root(path, index_everything)
    with AckQueue(path=path, clock=clock) as q:
        assert index_size(q) == 5
        q.put_many(range(2), retention=50)      # ordered again: no entry
        assert index_size(q) == 5
        assert sizes(q) == (7, 0, 0)
        clock.advance(11)
        assert (q.qsize(), sizes(q)) == (3, (3, 0, 0))
        clock.advance(40)
        assert sizes(q) == (1, 0, 0)


def test_a_format_3_file_indexes_only_its_out_of_order_messages(tmp_path):
    clock = FakeClock()
    path = str(tmp_path / "q.fs")
    with AckQueue(path=path, clock=clock) as q:
        q.put("long", retention=100)
        q.put_many(range(4), retention=10)
        q.put("longer", retention=200)
    edit_root(path, to_format_3)
    with AckQueue(path=path, clock=clock) as q:
        assert index_size(q) == 4
        q.put("ordered", retention=300)
        q.put("out of order", retention=150)
        assert index_size(q) == 5
        clock.advance(11)
        assert sizes(q) == (4, 0, 0)
        clock.advance(140)
        assert sizes(q) == (2, 0, 0)


def test_two_commits_moving_the_order_marker_conflict():
    """The marker does not merge: two commits that each stored ordered messages against
    the same marker could interleave seqs and deadlines, so one of them is retried.
    A commit that leaves the marker alone (an ack) merges as before."""
    from ZODB.POSException import ConflictError
    old = store.Counters()
    put_a, put_b, ack = store.Counters(), store.Counters(), store.Counters()
    put_a.add(put=1, ready=1)
    put_a.set_order((10.0, 1))
    put_b.add(put=1, ready=1)
    put_b.set_order((9.0, 2))
    ack.add(acked=1, ready=-1)
    states = {name: c.__getstate__() for name, c in
              (("old", old), ("a", put_a), ("b", put_b), ("ack", ack))}
    with pytest.raises(ConflictError):
        old._p_resolveConflict(states["old"], states["a"], states["b"])
    merged = store.Counters()
    merged.__setstate__(old._p_resolveConflict(states["old"], states["a"], states["ack"]))
    assert (merged.order(), merged.get("put"), merged.get("ready"), merged.get("acked")) \
        == ((10.0, 1), 1, 0, 1)
