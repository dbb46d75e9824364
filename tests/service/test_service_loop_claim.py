"""The native receive's claim on the event loop's thread (Service.receive_now): it never
blocks the loop on a client's connection that another request holds (an ack waiting for
its commit holds it: a pool thread that submits a client's ack when the loop found its
connection busy, a claim with a dead-letter policy), and says so with None, so the long
poll tries in the pool."""
import threading

import pytest

from ackqueue import codec

pytest.importorskip("aiohttp")


@pytest.fixture
def svc():
    from ackqueue.service.backend import Service
    service = Service(None)
    try:
        yield service
    finally:
        service.close()


def test_receive_now_claims_what_is_ready(svc):
    session = svc.leases.touch("c1")
    cc = svc.client_conn(session, "q")
    svc.queue("q").put("hello")
    got = svc.receive_now(cc, 5, None)
    assert [codec.payload(m.body) for m in got] == [b"hello"]
    assert svc.receive_now(cc, 5, None) == []          # nothing else ready: empty, not None
    acked = threading.Event()
    svc.ack_submit(cc, got, lambda error: acked.set() if error is None else None)
    assert acked.wait(30)
    assert svc.queue("q").counts()["in_flight"] == 0


def test_receive_now_does_not_wait_for_a_busy_connection(svc):
    session = svc.leases.touch("c1")
    cc = svc.client_conn(session, "q")
    q = svc.queue("q")
    q.put("hello")
    held, release = threading.Event(), threading.Event()

    def holder():                                       # as a pool thread using it
        with cc.lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(30)
        assert svc.receive_now(cc, 1, None) is None     # the caller goes to the pool
        assert q.counts()["ready"] == 1                  # nothing was claimed
    finally:
        release.set()
        t.join()
    assert len(svc.receive_now(cc, 1, 30.0)) == 1


def test_receive_now_on_a_closed_connection_gets_nothing(svc):
    session = svc.leases.touch("c1")
    cc = svc.client_conn(session, "q")
    svc.queue("q").put("hello")
    cc.close()
    assert svc.receive_now(cc, 1, None) == []
