"""Queues shared through a real server (``ackqueue server``) by several real processes.

Every test starts the console script on a free loopback port and stops it with SIGTERM.
Child processes are real Python processes; crashes are real SIGKILLs.  Leases are made short
(lease_timeout in the zeo:// address) so that a dead process's messages come back quickly;
waits are blocking gets with generous timeouts, which return as soon as the item arrives.
"""
import json
import os
import random
import signal
import threading
import time

import pytest

from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, Empty, ServerUnavailable,
                      StaleAck)

from zeo_server import Server, kill, read_line, spawn

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

WAIT = 30               # failure bound for blocking gets that should return quickly


class FakeClock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def short_lease(server, seconds=1.5):
    return f"{server.url}?lease_timeout={seconds}"


# -- the server command ---------------------------------------------------------------------

def test_server_serves_a_file_and_stops_cleanly_on_sigterm_and_sigint(tmp_path):
    path = tmp_path / "jobs.fs"
    srv = Server(path, tmp_path / "server.log")
    q = AckQueue(path=srv.url)
    q.put("kept")
    q.close()
    assert srv.stop(signal.SIGTERM) == 0
    assert os.path.exists(f"{path}.index"), "a clean stop closes the file (writes .index)"
    assert "stopping on SIGTERM" in srv.read_log()

    srv = Server(path, tmp_path / "server.log")
    with AckQueue(path=srv.url) as q:
        assert q.get(timeout=WAIT) == "kept"
        q.task_done()
    assert srv.stop(signal.SIGINT) == 0
    assert "stopping on SIGINT" in srv.read_log()


def test_a_second_server_on_the_same_file_is_refused_clearly(server, tmp_path):
    proc = spawn("""
        import sys
        from ackqueue.cli import main
        sys.exit(main(["server", sys.argv[1], "--listen", "127.0.0.1:0"]))
    """, server.path)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode != 0
    assert "already open in another process" in err


def test_a_client_whose_connection_is_reset_is_logged_at_info_not_error(server):
    """A client connection that ends in a reset (its process was killed, or it closed with
    invalidations unread) is routine for a queue server: ZEO logs it at ERROR, ackqueue's
    server at INFO."""
    import select
    import socket
    import struct

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    readable, _, _ = select.select([sock], [], [], WAIT)
    assert readable, "the server never sent its handshake"
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()                        # with linger 0: a reset, the handshake unread
    deadline = time.monotonic() + WAIT
    while "disconnected abruptly" not in server.read_log():
        assert time.monotonic() < deadline, "the reset was never logged:\n" + server.read_log()
        time.sleep(0.01)
    log = server.read_log()
    assert " INFO ZEO.asyncio.server: a client disconnected abruptly (ConnectionResetError" \
        in log
    assert " ERROR " not in log

    with AckQueue(path=server.url) as q:    # and the server serves on
        q.put("still here")
        assert q.get(timeout=WAIT) == "still here"
        q.task_done()


def test_unreachable_server_raises_server_unavailable(tmp_path):
    srv = Server(tmp_path / "gone.fs", tmp_path / "server.log")
    url = srv.url
    srv.stop()
    with pytest.raises(ServerUnavailable, match="cannot reach the queue server"):
        AckQueue(path=url + "?wait_timeout=0.5")


@pytest.mark.parametrize("url", ["zeo://", "zeo://host", "zeo://host:1/x",
                                 "zeo://h:1?lease_timeout=-1", "zeo://h:1?color=red"])
def test_bad_server_addresses_are_value_errors(url):
    with pytest.raises(ValueError):
        AckQueue(path=url)


# -- the core contract through a server -----------------------------------------------------

def test_fifo_ack_nack_task_done_and_counts(server):
    with AckQueue(path=server.url, name="contract") as q:
        for i in range(5):
            q.put(i)
        assert q.qsize() == 5 and q.unfinished_tasks == 5
        a, b = q.get(), q.get()
        assert (a, b) == (0, 1)
        assert q.qsize() == 3 and q.unfinished_tasks == 5
        q.ack(a)
        q.nack(b)                              # back at its original place: first again
        m = q.get_message(timeout=WAIT)
        assert (m.body, m.receive_count) == (1, 2)
        q.task_done()                          # acknowledges 1 (the oldest held)
        assert [q.get(block=False) for _ in range(3)] == [2, 3, 4]
        with pytest.raises(Empty):
            q.get(block=False)
        for _ in range(3):
            q.task_done()
        q.join()
        assert q.unfinished_tasks == 0
        with pytest.raises(ValueError):
            q.task_done()


def test_lifo_and_priority_queues_through_a_server(server):
    with AckLifoQueue(path=server.url, name="lifo") as q:
        for i in range(3):
            q.put(i)
        assert [q.get(), q.get(), q.get()] == [2, 1, 0]
    with AckPriorityQueue(path=server.url, name="prio") as q:
        for item in [(3, "c"), (1, "a"), (2, "b"), (1, "a2")]:
            q.put(item)
        got = [q.get() for _ in range(4)]
        assert got == [(1, "a"), (1, "a2"), (2, "b"), (3, "c")]
        held = got[0]
        q.nack(held)
        assert q.get(timeout=WAIT) == held


def test_visibility_deadline_and_delayed_nack_use_the_clock(server):
    clock = FakeClock()
    with AckQueue(path=server.url, name="deadline", clock=clock) as q:
        q.put("x")
        first = q.get_message(visibility_timeout=10)
        clock.now += 11
        again = q.get(timeout=WAIT)                # came back at its deadline
        assert again == "x"
        with pytest.raises(StaleAck):
            q.ack(first)                           # the first delivery is stale
        q.nack(again, delay=5)
        with pytest.raises(Empty):
            q.get(block=False)
        clock.now += 6
        m = q.get_message(timeout=WAIT)
        assert (m.body, m.receive_count) == ("x", 3)
        q.ack(m)
        assert q.unfinished_tasks == 0


def test_transactions_commit_or_roll_back_as_one(server):
    with AckQueue(path=server.url, name="txn") as q:
        q.put("url")
        with q.transaction():
            assert q.get() == "url"
            q.put("link-1")
            q.put("link-2")
        assert q.qsize() == 2 and q.unfinished_tasks == 2
        with pytest.raises(RuntimeError):
            with q.transaction():
                assert q.get() == "link-1"
                q.put("never")
                raise RuntimeError("crawler failed")
        assert [q.get(), q.get()] == ["link-1", "link-2"]
        q.task_done()
        q.task_done()
        assert q.unfinished_tasks == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_dies_gives_back_what_it_held(server):
    with AckQueue(path=server.url, name="threads") as q:
        q.put("job")

        def worker():
            q.get()
            raise RuntimeError("worker crashed")

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        m = q.get_message(timeout=WAIT)
        assert (m.body, m.receive_count) == ("job", 2)
        q.ack(m)


# -- several processes ----------------------------------------------------------------------

CONSUMER = """
    import json, sys
    from ackqueue import AckQueue, Empty
    q = AckQueue(path=sys.argv[1], name=sys.argv[2])
    print("ready", flush=True)
    got = []
    while True:
        try:
            item = q.get(timeout=float(sys.argv[3]))
        except Empty:
            break
        got.append(item)
        q.ack(item)
    state = q._state
    print(json.dumps({"got": got, "lost": state.arbiter.claims_lost,
                      "conflicts": q._database.committer.conflicts,
                      "commits": q._database.committer.commits}), flush=True)
    q.close()
"""


def test_a_put_in_one_process_wakes_a_get_blocked_in_another(server):
    child = spawn("""
        import sys, time
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1], name="wake")
        print("ready", flush=True)
        item = q.get(timeout=60)
        print(item, flush=True)
        q.ack(item)
        q.close()
    """, server.url)
    try:
        assert read_line(child) == "ready"
        with AckQueue(path=server.url, name="wake") as q:
            time.sleep(0.2)          # let the child block in get() before the put
            q.put("hello")
            assert read_line(child) == "hello"
        assert child.wait(WAIT) == 0
    finally:
        kill(child)


def test_four_consumer_processes_share_a_queue_without_double_delivery(server):
    total = 400
    with AckQueue(path=server.url, name="shared") as q:
        for start in range(0, total, 50):
            with q.transaction():
                for i in range(start, start + 50):
                    q.put(i)
        children = [spawn(CONSUMER, server.url, "shared", 2.0) for _ in range(4)]
        try:
            for child in children:
                assert read_line(child) == "ready"
            reports = [json.loads(read_line(child)) for child in children]
        finally:
            for child in children:
                kill(child)
        got = [item for r in reports for item in r["got"]]
        assert sorted(got) == list(range(total)), "each message delivered exactly once"
        assert q.unfinished_tasks == 0
    lost = sum(r["lost"] for r in reports)
    conflicts = sum(r["conflicts"] for r in reports)
    commits = sum(r["commits"] for r in reports)
    print(f"\n4 consumer processes, {total} messages: {commits} commits, {conflicts} "
          f"conflict retries ({conflicts / commits:.1%}), {lost} claims lost to others, "
          f"per process {[len(r['got']) for r in reports]}")


def test_messages_of_a_sigkilled_process_come_back_at_deadline_or_lease_expiry(server):
    url = short_lease(server)
    child = spawn("""
        import os, signal, sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1], name="crash")
        held = [q.get() for _ in range(2)]
        held += [q.get(visibility_timeout=1.0) for _ in range(2)]
        print(" ".join(map(str, held)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, url)
    with AckQueue(path=url, name="crash") as q:
        for i in range(5):
            q.put(i)
        try:
            assert read_line(child) == "0 1 2 3"
            assert child.wait(WAIT) == -signal.SIGKILL
        finally:
            kill(child)
        assert q.get() == 4                      # the one the child never took
        back = [q.get_message(timeout=WAIT) for _ in range(4)]
        assert sorted(m.body for m in back) == [0, 1, 2, 3]
        assert all(m.receive_count == 2 for m in back)
        for m in back:
            q.ack(m)
        q.task_done()
        assert q.unfinished_tasks == 0
        assert q._database.lease.expired_leases == 1


def spawn_holder(url, name):
    """A child process that gets one item of queue name, prints "holding ITEM", and on a
    line on its stdin acks it, printing "acked" or "stale ..." (StaleAck)."""
    return spawn("""
        import sys
        from ackqueue import AckQueue, StaleAck
        q = AckQueue(path=sys.argv[1], name=sys.argv[2])
        item = q.get()
        print("holding", item, flush=True)
        sys.stdin.readline()
        try:
            q.ack(item)
            print("acked", flush=True)
        except StaleAck as exc:
            print("stale", exc, flush=True)
        q.close()
    """, url, name)


def test_a_paused_process_cannot_ack_a_message_redelivered_meanwhile(server):
    url = short_lease(server)
    child = spawn_holder(url, "pause")
    try:
        with AckQueue(path=url, name="pause") as q:
            q.put("job")
            assert read_line(child) == "holding job"
            os.kill(child.pid, signal.SIGSTOP)           # a long pause, not a death
            m = q.get_message(timeout=WAIT)              # its lease expires: redelivered
            assert (m.body, m.receive_count) == ("job", 2)
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.write("ack\n")
            child.stdin.flush()
            answer = read_line(child)
            assert answer.startswith("stale"), answer
            q.ack(m)                                     # the live delivery still acks
            assert q.unfinished_tasks == 0
        assert child.wait(WAIT) == 0
    finally:
        kill(child)


def test_server_restart_loses_nothing_and_resurrects_no_ack(server):
    with AckQueue(path=server.url, name="restart") as q:
        for i in range(10):
            q.put(i)
        for _ in range(4):
            q.ack(q.get())
        held = q.get()                                   # 4, in flight across the restart
        server.restart()
        q.put(10)                                        # waits for the reconnection
        q.ack(held)
        rest = [q.get(timeout=WAIT) for _ in range(6)]
        assert rest == [5, 6, 7, 8, 9, 10]
        for item in rest:
            q.ack(item)
        assert q.unfinished_tasks == 0
        with pytest.raises(Empty):
            q.get(block=False)


PRODUCER = """
    import sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="torture")
    tag, count = sys.argv[2], int(sys.argv[3])
    for start in range(0, count, 10):
        with q.transaction():
            for i in range(start, min(start + 10, count)):
                q.put(f"{tag}-{i}")
    print("done", flush=True)
    q.close()
"""

WORKER = """
    import os, sys
    from ackqueue import AckQueue, Empty
    q = AckQueue(path=sys.argv[1], name="torture")
    log = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    print("ready", flush=True)
    while True:
        try:
            item = q.get(timeout=0.5)
        except Empty:
            continue
        os.write(log, (item + "\\n").encode())
        os.fsync(log)
        q.ack(item)
"""


def test_producers_and_consumers_with_random_sigkills_lose_nothing(server, tmp_path):
    """2 producer and 3 consumer processes; consumers are SIGKILLed at random moments and
    restarted.  Every message put is processed at least once and the queue drains."""
    rng = random.Random(20261123)
    url = short_lease(server, 1.0)
    per_producer = 150
    expected = {f"{tag}-{i}" for tag in "ab" for i in range(per_producer)}
    logs = [tmp_path / f"worker{n}.log" for n in range(3)]
    producers = [spawn(PRODUCER, url, tag, per_producer) for tag in "ab"]
    workers = [spawn(WORKER, url, log) for log in logs]
    kills = 0
    try:
        for w in workers:
            assert read_line(w) == "ready"
        with AckQueue(path=url, name="torture") as q:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.2, 0.6))
                n = rng.randrange(3)
                kill(workers[n])
                kills += 1
                workers[n] = spawn(WORKER, url, logs[n])
                assert read_line(workers[n]) == "ready"
                producing = any(p.poll() is None for p in producers)
                if not producing and q.unfinished_tasks == 0:
                    break
            for p in producers:
                assert read_line(p) == "done"
            # Stop killing; let the workers drain what is left.
            drain_end = time.monotonic() + 60
            while q.unfinished_tasks and time.monotonic() < drain_end:
                time.sleep(0.1)
            assert q.unfinished_tasks == 0, "the queue drained"
    finally:
        for proc in producers + workers:
            kill(proc)
    processed = []
    for log in logs:
        if log.exists():
            processed += log.read_text().split()
    assert set(processed) == expected, "every message was processed at least once"
    print(f"\n{len(expected)} messages, {kills} consumer kills, "
          f"{len(processed) - len(set(processed))} processed twice (killed before their ack)")


def test_operations_running_through_a_server_restart_complete_or_fail_clearly(server):
    """Puts and get+acks keep running while the server restarts under them: each one
    completes or raises ServerUnavailable; every put that returned is delivered (a put cut
    off mid-commit may be delivered twice), and nothing acknowledged comes back."""
    url = f"{server.url}?wait_timeout=20"
    errors, put_done, acked = [], [], []
    stop = threading.Event()
    with AckQueue(path=url, name="outage") as q:
        def producer():
            n = 0
            while not stop.is_set():
                try:
                    q.put(n)
                    put_done.append(n)
                except ServerUnavailable as exc:
                    errors.append(exc)
                n += 1

        def consumer():
            while not stop.is_set():
                try:
                    item = q.get(timeout=0.2)
                    q.ack(item)
                    acked.append(item)
                except Empty:
                    pass
                except (ServerUnavailable, StaleAck) as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
        for t in threads:
            t.start()
        while len(put_done) < 20:
            time.sleep(0.05)
        server.restart()
        mark = len(put_done)
        while len(put_done) < mark + 20:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(WAIT)
        rest = []
        while True:
            try:
                item = q.get(timeout=1)
            except Empty:
                break
            q.ack(item)
            rest.append(item)
        delivered = acked + rest
        assert set(put_done) <= set(delivered), "every completed put was delivered"
        duplicates = len(delivered) - len(set(delivered))
        assert q.unfinished_tasks == 0
        print(f"\nthrough a restart: {len(put_done)} puts, {len(errors)} clear errors "
              f"({sorted({type(e).__name__ for e in errors})}), {duplicates} delivered twice")


# -- wake-ups load what changed at once -------------------------------------------------------

def test_prefetch_caches_the_state_a_syncing_connection_reads(server, tmp_path):
    """prefetch asks for what another client's commit made of the objects, as of
    that commit, so that the loads of the getters it wakes find it (or join it in flight)."""
    import transaction
    import ZODB
    from persistent.mapping import PersistentMapping
    from ZEO.ClientStorage import ClientStorage
    from ZODB.utils import p64, u64

    from ackqueue.zeo.client import prefetch

    address = ("127.0.0.1", server.port)
    ours, theirs = ClientStorage(address, wait_timeout=WAIT), ClientStorage(address,
                                                                             wait_timeout=WAIT)
    our_db, their_db = ZODB.DB(ours), ZODB.DB(theirs)
    try:
        tm = transaction.TransactionManager()
        conn = their_db.open(tm)
        with tm:
            conn.root()["box"] = box = PersistentMapping(value=1)
        oid = box._p_oid
        with tm:
            box["value"] = 2
        tid = box._p_serial
        conn.close()
        deadline = time.monotonic() + WAIT
        while ours.lastTransaction() != tid:           # the invalidation reached us
            assert time.monotonic() < deadline, "the server never told us of the commit"
            time.sleep(0.01)
        reads_at = p64(u64(tid) + 1)      # what a connection that syncs now asks for
        assert ours._cache.loadBefore(oid, reads_at) is None, "nothing loaded it yet"

        prefetch(ours, {oid}, tid)
        while ours._cache.loadBefore(oid, reads_at) is None:
            assert time.monotonic() < deadline, "the prefetch never arrived"
            time.sleep(0.01)
        data, serial = ours._cache.loadBefore(oid, reads_at)[:2]
        assert serial == tid
        assert data == theirs.loadBefore(oid, reads_at)[0]

        conn = our_db.open()
        assert conn.get(oid)["value"] == 2, "the connection reads the prefetched state"
        conn.close()
    finally:
        our_db.close()
        their_db.close()


def _spy_on_prefetch(monkeypatch, runtime):
    """The oid sets ackqueue.database's prefetch is called with, in order (the real
    prefetch still runs)."""
    calls = []
    real_prefetch = runtime.prefetch
    monkeypatch.setattr(runtime, "prefetch",
                        lambda st, oids, tid: (calls.append(set(oids)),
                                               real_prefetch(st, oids, tid)))
    return calls


def test_a_wake_up_prefetches_only_for_getters_waiting_here(server, monkeypatch):
    """A change another process committed is prefetched when a getter here is blocked in
    get() (it reads that change at once), and not when none is: then a prefetch would only
    load every other process's commit into this client, needed or not."""
    from ackqueue import database as runtime

    calls = _spy_on_prefetch(monkeypatch, runtime)
    put_in_child = """
        import sys
        from ackqueue import AckQueue
        with AckQueue(path=sys.argv[1], name="pf") as q:
            q.put(sys.argv[2])
    """

    with AckQueue(path=server.url, name="pf") as q:
        state = q._state
        woken = threading.Event()
        store_changed = state.store_changed

        def told_of_a_change():       # by the wake-ups thread, after it chose to prefetch
            store_changed()
            if threading.current_thread().name == "ackqueue-wakeups":
                woken.set()
        monkeypatch.setattr(state, "store_changed", told_of_a_change)

        got = []

        def get_and_ack():
            # acked by the thread that got it: once that thread has ended, its delivery
            # is given back (thread death), so an ack from here after join() would race
            item = q.get(timeout=WAIT)
            q.ack(item)
            got.append(item)
        getter = threading.Thread(target=get_and_ack)
        getter.start()
        deadline = time.monotonic() + WAIT
        while state.getters_waiting == 0:
            assert time.monotonic() < deadline, "the getter never blocked"
            time.sleep(0.01)
        child = spawn(put_in_child, server.url, "first")
        try:
            assert child.wait(WAIT) == 0
        finally:
            kill(child)
        getter.join(WAIT)
        assert got == ["first"]
        assert any(state.arbiter.watch_oid in oids for oids in calls), \
            "the waiting getter's wake-up prefetched nothing"

        calls.clear()
        woken.clear()
        child = spawn(put_in_child, server.url, "second")
        try:
            assert child.wait(WAIT) == 0
        finally:
            kill(child)
        assert woken.wait(WAIT), "this process was never told of the second put"
        assert calls == [], "a wake-up with no getter waiting prefetched"
        assert q.get(timeout=WAIT) == "second"


def test_an_idle_producer_prefetches_what_it_wrote_and_a_consumer_nothing(server,
                                                                         monkeypatch):
    """With no getter waiting, a process that put lately prefetches, once other processes'
    changes stop, the changed objects it wrote lately (its next put writes them again: the
    counters, the sequence counter, the tail of the queue), so that the put does not load
    them one round trip at a time; never the rest of a change, which would load every
    other process's commit into this client, needed or not.  A process that never put, or
    not for WARM_AFTER_PUT seconds, keeps nothing warm (test above: a consumer)."""
    from ackqueue import database as runtime

    child = spawn("""
        import sys
        from ackqueue import AckQueue
        with AckQueue(path=sys.argv[1], name="warm") as q:
            q.put("first")                  # makes the queue
            print("put", flush=True)
            sys.stdin.readline()
            q.ack(q.get(timeout=60))        # the first claim: sets the queue's leased
            print("consumed", flush=True)
            sys.stdin.readline()
    """, server.url)
    calls = _spy_on_prefetch(monkeypatch, runtime)
    try:
        assert read_line(child) == "put"
        with AckQueue(path=server.url, name="warm") as q:
            database, state = q._database, q._state
            changed = []
            real_changed = database.changed
            monkeypatch.setattr(database, "changed", lambda oids, tid=None: (
                changed.append(oids), real_changed(oids, tid)))
            with state.mutex:
                rec = state.arbiter.record()
                counts, seq_counter, record = (rec.counts._p_oid, rec.next_seq._p_oid,
                                               rec._p_oid)
            probe = [counts, seq_counter, record]
            assert database.keep_warm(probe) == [], "keeps warm before it ever put"

            q.put("second")             # writes the counters and the sequence counter
            assert database.keep_warm(probe) == [counts, seq_counter]
            calls.clear()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert read_line(child) == "consumed"
            deadline = time.monotonic() + WAIT
            while not any(counts in oids for oids in calls):
                assert time.monotonic() < deadline, "the counters were never prefetched"
                time.sleep(0.01)
            assert any(oids and record in oids for oids in changed), \
                "the other process's claim did not change the queue's record"
            for oids in calls:
                assert record not in oids, "prefetched an object this process never wrote"
                assert set(database.db.storage.written_lately(oids)) == oids

            database.last_put_at -= runtime.WARM_AFTER_PUT     # as if that long ago
            assert database.keep_warm(probe) == []
    finally:
        kill(child)


def test_a_purge_ends_every_processs_deliveries(server):
    """Purge removes messages in flight too, here and in other processes; their
    acks are refused as stale, and nothing of it comes back."""
    child = spawn_holder(server.url, "purged")
    try:
        with AckQueue(path=server.url, name="purged") as q:
            q.put("theirs")
            assert read_line(child) == "holding theirs"
            q.put_many(["mine", "ready"])
            mine = q.get_message(timeout=WAIT)
            assert q.purge() == 3
            assert q.counts() == {"ready": 0, "in_flight": 0, "delayed": 0}
            with pytest.raises(StaleAck, match="purged"):
                q.ack(mine)
            child.stdin.write("ack\n")
            child.stdin.flush()
            answer = read_line(child)
            assert answer.startswith("stale"), answer
            assert q.stats()["purged"] == 3
            with pytest.raises(Empty):
                q.get(timeout=0.5)
    finally:
        kill(child)


def test_a_file_once_served_gives_back_on_open_what_a_dead_process_held(server, tmp_path):
    """A process that died holding a message under its lease, then the file opened by
    path (no server any more): the message is ready again, not stuck in flight."""
    child = spawn("""
        import sys, time
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        print("holding", q.get(), flush=True)
        time.sleep(600)
    """, server.url)
    try:
        with AckQueue(path=server.url) as q:
            q.put_many(["x", "y"])
            assert read_line(child) == "holding x"
    finally:
        kill(child)                       # SIGKILL: "x" stays leased in the store
    server.stop()
    with AckQueue(path=server.path) as q:
        assert q.counts() == {"ready": 2, "in_flight": 0, "delayed": 0}
        m = q.get_message(block=False)
        assert (m.body, m.receive_count) == ("x", 2)
        assert q.get(block=False) == "y"
        q.ack(m)
        q.task_done()
