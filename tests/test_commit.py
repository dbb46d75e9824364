"""The committer (ackqueue.commit): group commit and who holds the baton, on a real ZODB
database (in memory; the rules do not depend on the storage)."""
import threading

import ZODB
import pytest

from ackqueue.commit import LEAD_QUIET, Committer, CommitterClosed
from ackqueue import store

BOUND = 10      # seconds: a failure bound only


@pytest.fixture
def committer():
    db = ZODB.DB(None)
    with db.transaction() as conn:
        store.ensure_queue(conn.root(), "q", store.FIFO)
    c = Committer(db)
    yield c
    c.close()
    db.close()


def recording(where):
    """An on_commit callback that records the thread it ran in."""
    return lambda: where.append(threading.current_thread())


def test_a_lone_thread_commits_its_durable_unit_itself(committer):
    where = []
    for _ in range(3):
        ticket = committer.submit([store.Compact("q")], on_commit=recording(where),
                                  lead=True)
        assert ticket.wait(BOUND)
    assert where == [threading.current_thread()] * 3
    assert committer.commits == 3


def test_units_nobody_leads_go_to_the_committer_thread(committer):
    where = []
    ticket = committer.submit([store.Compact("q")], on_commit=recording(where))
    assert ticket.wait(BOUND)
    assert where == [committer._thread]


def test_a_leader_that_never_waits_still_gets_its_unit_committed(committer):
    where = []
    ticket = committer.submit([store.Compact("q")], on_commit=recording(where), lead=True)
    # No wait(): the thread commits it after LEADER_GRACE.
    assert ticket._done.wait(BOUND)
    assert where == [committer._thread] and ticket.error is None


def test_many_threads_leading_at_once_all_settle_and_group(committer):
    errors, per_thread = [], 200
    start = threading.Barrier(8)

    def work():
        try:
            start.wait()
            for _ in range(per_thread):
                committer.submit([store.Compact("q")], lead=True).wait(BOUND)
        except Exception as exc:        # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 6)
    assert not errors and not any(t.is_alive() for t in threads)
    assert committer.units == 8 * per_thread
    assert committer._durable_on_way == 0
    assert committer.commits <= committer.units


def test_a_group_that_several_threads_wait_for_yields_the_gil(committer, monkeypatch):
    """The threads a group commit woke get the GIL before the committer starts the next
    commit (time.sleep(0)), so that their next units can join it.  A group of one durable
    unit (a thread working alone), or of units no thread waits on, does not pay for that."""
    import ackqueue.commit as commit_module
    sleeps = []
    real_time = commit_module.time

    class _Time:
        def __getattr__(self, name):
            return getattr(real_time, name)

        def sleep(self, seconds):
            sleeps.append(seconds)
            real_time.sleep(seconds)

    monkeypatch.setattr(commit_module, "time", _Time())
    alone = committer.submit([store.Compact("q")], lead=True)
    assert alone.wait(BOUND)
    assert sleeps == [] and committer.commits == 1
    with committer._baton:              # both units wait for the baton: one group
        unwaited = [committer.submit([store.Compact("q")]) for _ in range(2)]
    for ticket in unwaited:
        assert ticket.wait(BOUND)
    assert sleeps == [] and committer.commits == 2
    with committer._baton:
        waited = [committer.submit([store.Compact("q")], lead=True) for _ in range(2)]
    for ticket in waited:
        assert ticket.wait(BOUND)
    assert committer.commits == 3
    assert sleeps == [0]


def test_close_commits_what_is_pending_and_refuses_more(committer):
    tickets = [committer.submit([store.Compact("q")], lead=True) for _ in range(3)]
    committer.close()
    assert all(t._done.is_set() and t.error is None for t in tickets)
    with pytest.raises(CommitterClosed):
        committer.submit([store.Compact("q")])


def submit_in_new_thread(committer, where, hold):
    """Submit one durable unit from a fresh thread and wait for it there; the thread then
    stays alive until hold is set (so that a later thread cannot reuse its ident)."""
    done = threading.Event()

    def work():
        committer.submit([store.Compact("q")], on_commit=recording(where),
                         lead=True).wait(BOUND)
        done.set()
        hold.wait(BOUND)
    t = threading.Thread(target=work)
    t.start()
    assert done.wait(BOUND)
    return t


@pytest.mark.parametrize("gap, leads", [(LEAD_QUIET * 2, True), (LEAD_QUIET / 2, False)])
def test_another_thread_leads_once_the_first_has_been_quiet(committer, gap, leads):
    # A producer and a consumer taking turns: each leads its own commit unless the
    # other submitted less than LEAD_QUIET ago (then the committer thread gathers them).
    now = [100.0]
    committer._monotonic = lambda: now[0]
    where, hold = [], threading.Event()
    try:
        first = submit_in_new_thread(committer, where, hold)
        now[0] += gap
        second = submit_in_new_thread(committer, where, hold)
    finally:
        hold.set()
    assert where[0] is first
    assert where[1] is (second if leads else committer._thread)


def test_a_ticket_wait_times_out_before_its_commit_and_every_waiter_wakes_after(committer):
    """A ticket's done flag (a bare lock, not a threading.Event): wait(timeout) returns
    False while the unit is not settled, and every thread waiting is released once it is."""
    from ackqueue.commit import Ticket
    ticket = Ticket([])
    assert ticket._done.wait(0) is False and ticket._done.wait(0.001) is False
    woken = []
    waiters = [threading.Thread(target=lambda: woken.append(ticket.wait(30)))
               for _ in range(3)]
    for t in waiters:
        t.start()
    ticket._settle(None)
    ticket._settle(None)              # a second settle changes nothing
    for t in waiters:
        t.join(30)
    assert woken == [True, True, True] and ticket._done.is_set()
    assert ticket.wait(0) is True
