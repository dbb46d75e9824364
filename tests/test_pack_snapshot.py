"""A pack with keep_seconds=0 removes revisions that a client's snapshot may still read.

ZODB then raises ReadConflictError ("object deleted, likely by simultaneous pack") in the
reader.  tests/test_pack.py::test_packs_through_a_server_while_clients_work meets it
as "ackqueue: reaper pass failed" with that traceback, depending on timing.  Here the race
is made to happen every time: right after a reader of the queue took its snapshot, another
process (a real client of a real ``ackqueue server``) claims a message, which writes a new
revision of the message's segment, and the server packs.  The reader's caches are then
emptied, as a busy client's bounded caches evict what it read long ago, so that it must
load the old revision from the server, which no longer has it.  The reader must read again
from a fresh snapshot, not fail.
"""
import logging
import threading

import pytest

from ackqueue import AckQueue, maintenance
from zeo_server import Server, kill, read_line, spawn

OTHER = """
import sys
from ackqueue import AckQueue
q = AckQueue(path=sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "put":
        q.put("m1"); q.put("m2")
    elif line.strip() == "get":
        q.get(timeout=30)          # holds m1: a new revision of its segment
    print("done", flush=True)
"""


def _ask(proc, command):
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    assert read_line(proc) == "done"


@pytest.fixture
def race(tmp_path):
    """(reader queue, arm): arm(thread_name=None) makes the reader's next snapshot read
    by that thread (by default the calling one) lose the race with another client's claim and a pack."""
    server = Server(tmp_path / "q.fs", tmp_path / "server.log")
    other = spawn(OTHER, server.url)
    q = None
    try:
        assert read_line(other) == "ready"
        q = AckQueue(path=server.url)
        _ask(other, "put")
        arbiter = q._state.arbiter
        record = arbiter.record
        fired, again = [], threading.Event()

        def arm(thread_name=None):
            thread_name = thread_name or threading.current_thread().name

            def racing_record():
                rec = record()                    # the snapshot is taken here
                me = threading.current_thread().name
                if not me.startswith(thread_name):
                    return rec
                if fired:
                    again.set()                   # a read after the race
                else:
                    fired.append(me)
                    _ask(other, "get")            # another client writes meanwhile...
                    maintenance.pack(q._database, keep_seconds=0)   # ...and the server packs
                    arbiter._rconn.cacheMinimize()                  # evicted here
                    q._database.db.storage._cache.clear()
                return rec

            arbiter.record = racing_record
            return fired, again

        yield q, arm
    finally:
        kill(other)
        if q is not None:
            q.close()
        assert server.stop() == 0
    log = server.read_log()
    assert "Traceback" not in log, log[-3000:]


def test_a_get_reads_again_when_a_pack_removed_its_snapshot(race, caplog):
    q, arm = race
    caplog.set_level(logging.DEBUG, logger="ackqueue.pack_rereads")
    fired, _ = arm()
    assert q.get(block=False) == "m2"     # m1 is the other client's now
    assert fired
    assert any("reading again from a fresh snapshot" in r.getMessage()
               for r in caplog.records)   # the race did happen, and was read again
    q.task_done()
    assert q.qsize() == 0


def test_sizes_read_again_when_a_pack_removed_their_snapshot(race):
    q, arm = race
    fired, _ = arm()
    assert q.counts() == {"ready": 1, "in_flight": 1, "delayed": 0}
    assert fired


def test_the_reaper_reads_again_when_a_pack_removed_its_snapshot(race, caplog):
    q, arm = race
    caplog.set_level(logging.WARNING)
    fired, again = arm("ackqueue-reaper")
    assert again.wait(60)                 # a failure bound only: it scans every second
    assert [r.getMessage() for r in caplog.records] == []


def test_a_peek_reads_again_when_a_pack_removed_its_snapshot(race):
    q, arm = race
    fired, _ = arm()
    assert q.peek().body == "m2"
    assert fired


def test_a_servers_conflict_resolution_after_a_pack_logs_no_traceback(tmp_path):
    """A writer started from a revision that a pack then removed: the server's conflict
    resolution cannot read it, and the writer gets a ConflictError to retry (ackqueue's
    committer retries).  The server says so in one line, not with ZODB's traceback."""
    import transaction
    import ZEO
    from ZODB.POSException import ConflictError
    from ackqueue import store

    server = Server(tmp_path / "q.fs", tmp_path / "server.log")
    AckQueue(path=server.url).close()              # the queue "default" exists
    dbs = [ZEO.DB(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        tms = [transaction.TransactionManager() for _ in dbs]
        conns = [db.open(transaction_manager=tm) for db, tm in zip(dbs, tms)]
        counts = [c.root()[store.ROOT_KEY].queues["default"].counts for c in conns]
        counts[0].get("ready")                     # the writer read revision 1
        counts[1].add(ready=1)
        tms[1].commit()                            # another wrote revision 2
        dbs[1].pack(days=0)                        # revision 1 is gone
        counts[0].add(ready=1)
        with pytest.raises(ConflictError):
            tms[0].commit()
        tms[0].abort()
    finally:
        for db in dbs:
            db.close()
        assert server.stop() == 0
    log = server.read_log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert "conflict resolution" in log
