"""The native API's browse pages (browse_page): a page near the end of a long queue,
read cold from its file, loads a path down the index and the page's own segments (counted
in objects ZODB loads, not in time), not the queue; rows carry each message's state.
"""
import pytest

pytest.importorskip("aiohttp")


def _loads_of(db, fn):
    """(fn(), objects ZODB loaded from the storage meanwhile), by ZODB's own activity
    monitor (it sums the loads of each connection as it closes, counted since the
    connection's counts were last cleared)."""
    from ZODB.ActivityMonitor import ActivityMonitor
    for conn in db.pool.all:          # pooled connections: forget what they loaded before
        conn.getTransferCounts(True)
    monitor = ActivityMonitor()
    db.setActivityMonitor(monitor)
    try:
        out = fn()
    finally:
        db.setActivityMonitor(None)
    return out, sum(d["loads"] for d in monitor.getActivityAnalysis(divisions=1))


@pytest.mark.parametrize("n", [2000, 8000])
def test_a_browse_page_costs_its_size_not_the_queue_size(tmp_path, n):
    """Objects loaded for one page near the end of a queue of n messages, read cold (a
    queue reopened from its file): the old page scanned the queue for ids after `after`,
    loading every segment of it (n / 16 objects and more); a page now loads a path down
    the index and the page's own segments."""
    from ackqueue import AckQueue
    from ackqueue.service.http import browse_page
    path = str(tmp_path / f"q{n}.fs")
    q = AckQueue(path=path, name="big")
    for start in range(0, n, 500):
        q.put_many([f"m{i}" for i in range(start, start + 500)])
    q.close()
    q = AckQueue(path=path, name="big")
    try:
        held = q.get_message()               # one in flight, one delayed: states still right
        (rows, more), loads = _loads_of(q.db, lambda: browse_page(q, n - 30, 20))
        assert [int(m.id) for m in rows] == list(range(n - 29, n - 9)) and more
        assert all(m.state == "ready" for m in rows)
        assert loads < 20, loads    # measured 5 at n=2000 and 8000; the old scan: 127, 514
        rows, more = browse_page(q, 0, 3)
        assert [(int(m.id), m.state) for m in rows] == [(1, "in_flight"), (2, "ready"),
                                                        (3, "ready")]
        q.nack(held, delay=3600)
        q.stats()              # a give-back is written without waiting; stats() waits for it
        rows, _ = browse_page(q, 0, 1)
        assert rows[0].state == "delayed" and rows[0].visible_at is not None
        rows, more = browse_page(q, n - 5, 100)
        assert [int(m.id) for m in rows] == list(range(n - 4, n + 1)) and not more
    finally:
        q.close()
