"""Service defects of issue 22, each with the check that failed before its fix: string
app keys (aiohttp's NotAppKeyWarning), browse pages that scanned the queue (counted in
objects loaded, not time), and the auth middleware reading a body before its size check."""
import json
import warnings

import pytest

pytest.importorskip("aiohttp")

from aiohttp import web                                          # noqa: E402


def test_make_app_uses_app_keys_no_not_app_key_warning(tmp_path):
    from ackqueue.service import auth as auth_mod
    from ackqueue.service.backend import Service
    from ackqueue.service.app import API, make_app
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {"root": {
        "secret": "admin-secret-012345678", "rights": {"*": ["admin"]}}}}))
    service = Service(None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            app = make_app(service, pool_size=1, auth=auth_mod.load_auth(str(path)))
        assert not [w for w in caught if issubclass(w.category, web.NotAppKeyWarning)], \
            [str(w.message) for w in caught]
        assert app[API].service is service
    finally:
        app[API].pool.shutdown()
        service.close()


# -- the auth middleware and the body's size and time checks ------------------------------

ADMIN = "admin-secret-012345678"


@pytest.fixture
def serve_auth(tmp_path):
    from tests.test_service import Service
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {"root": {"secret": ADMIN,
                                                     "rights": {"*": ["admin"]}}}}))
    started = []

    def start(*extra):
        s = Service(tmp_path / "q.fs", "--auth", str(path), *extra, log_dir=tmp_path)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


@pytest.mark.parametrize("path", ["/send", "/send_batch", "/v1/batch"])
def test_with_auth_a_body_past_the_limit_gets_413_before_auth_reads_it(serve_auth, path):
    """The auth middleware reads these bodies for their queue names: before the fix it
    read a 50 MB body that never came (no size check, no timeout) and held the
    connection open."""
    from ackqueue.service.main import LINGER
    from tests.test_service_limits import SLACK, connect, parse, read_until_closed
    s = serve_auth("--client-timeout", "30")
    sock = connect(s)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
                 .encode() + b'{"queue_name": "jobs", ' + b" " * 100)
    data, _ = read_until_closed(sock, LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 413 and doc["error"]["code"] == "MessageSizeExceeded", data
    assert headers.get("connection", "").lower() == "close"
    sock.close()
    status, _ = s.call("POST", "/send", json.dumps({"queue_name": "jobs", "message_body": "x"}),
                       {"Authorization": f"Bearer {ADMIN}"})
    assert status == 200
    s.stop()


def test_with_auth_a_stalled_body_gets_408_before_auth_reads_it(serve_auth):
    from ackqueue.service.main import LINGER
    from tests.test_service_limits import SLACK, connect, parse, read_until_closed
    s = serve_auth("--client-timeout", "1")
    sock = connect(s)
    sock.sendall(f"POST /send HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                 .encode() + b'{"queue_n')
    data, _ = read_until_closed(sock, 1 + LINGER + SLACK)
    status, headers, doc = parse(data)
    assert status == 408 and doc["error"]["code"] == "RequestTimeout", data
    sock.close()
    s.stop()


# -- browse pages -------------------------------------------------------------------------

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
