"""``with q.transaction():``, ``redrive()`` and ``pack()`` on the remote drop-in,
against a real ``ackqueue serve``: a block's puts and acks travel as one atomic batch
request (POST /v1/batch) when it ends; its gets are made at once and given back if the
block raises or its batch is refused."""
import json
import queue
import urllib.request

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue, NotSupported, StaleAck   # noqa: E402
from ackqueue.atomic import transaction                 # noqa: E402
from cutting_proxy import CuttingProxy                   # noqa: E402


@pytest.fixture
def service(own_service):
    return own_service()


@pytest.fixture
def opened():
    queues = []

    def make(url, name, **kwargs):
        q = AckQueue(path=url, name=name, **kwargs)
        queues.append(q)
        return q
    yield make
    for q in queues:
        q.close()


def _counts(url, name):
    """The queue's figures as the service has them, asked by a plain HTTP client."""
    with urllib.request.urlopen(f"{url}/v1/queues/{name}", timeout=30) as r:
        return json.loads(r.read())["stats"]


def test_a_crawler_step_commits_as_one(service, opened):
    q = opened(service.url, "crawl")
    q.put("https://example.org/")
    with q.transaction():                 # README's crawler, through the service
        url = q.get(timeout=10)
        for n in range(3):
            q.put(f"{url}{n}")
        q.task_done()
        assert _counts(service.url, "crawl")["in_flight"] == 1   # nothing sent yet
    assert q.stats()["acked"] == 1
    assert [q.get(timeout=10) for _ in range(3)] == [f"https://example.org/{n}"
                                                      for n in range(3)]


def test_puts_and_acks_are_invisible_until_the_block_ends(service, opened):
    jobs = opened(service.url, "jobs")
    jobs.put("first")
    with jobs.transaction():
        got = jobs.get(timeout=10)
        jobs.put("second")
        jobs.put("third", priority=1000)    # delivered first
        jobs.task_done()
        c = _counts(service.url, "jobs")
        assert (c["ready"], c["in_flight"]) == (0, 1)             # the batch is not sent
    assert got == "first"
    c = _counts(service.url, "jobs")
    assert (c["ready"], c["in_flight"]) == (2, 0)
    assert jobs.stats()["acked"] == 1
    assert [jobs.get(timeout=10), jobs.get(timeout=10)] == ["third", "second"]


def test_an_exception_rolls_the_block_back(service, opened):
    jobs = opened(service.url, "jobs")
    jobs.put("a")
    with pytest.raises(RuntimeError, match="boom"):
        with jobs.transaction():
            assert jobs.get(timeout=10) == "a"
            jobs.put("made from a")
            jobs.task_done()
            raise RuntimeError("boom")
    c = _counts(service.url, "jobs")
    assert (c["ready"], c["put"], c["acked"]) == (1, 1, 0)        # nothing put nor acked
    m = jobs.get_message(timeout=10)                              # given back at its place
    assert (m.body, m.receive_count) == ("a", 2)
    jobs.ack(m)


def test_a_stale_ack_refuses_the_whole_batch(service, opened):
    jobs = opened(service.url, "jobs")
    jobs.put("held")
    m = jobs.get_message(timeout=10)
    with pytest.raises(StaleAck):
        with jobs.transaction():
            jobs.put("never stored")
            jobs.ack(m)
            # the delivery ends behind the block's back: nacked by its receipt
            req = urllib.request.Request(
                f"{service.url}/v1/queues/jobs/nack", method="POST",
                data=json.dumps({"receipts": [m._holding.receipt]}).encode(),
                headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).close()
    c = _counts(service.url, "jobs")
    assert (c["ready"], c["in_flight"]) == (1, 0)                 # only "held", given back
    assert jobs.get(timeout=10) == "held"
    with pytest.raises(queue.Empty):
        jobs.get(timeout=0.2)


def test_what_a_block_cannot_hold_says_so(service, opened):
    jobs = opened(service.url, "jobs")
    jobs.put("x")
    with pytest.raises(NotSupported, match="nack"):
        with jobs.transaction():
            jobs.nack(jobs.get_message(timeout=10))
    m = jobs.get_message(timeout=10)                              # rolled back: given back
    assert m.receive_count == 2
    with pytest.raises(Exception, match="do not nest"):
        with jobs.transaction():
            with jobs.transaction():
                pass
    jobs.ack(m)


def test_a_batch_cut_off_is_retried_and_stored_once(service, opened):
    proxy = CuttingProxy(service.port)
    try:
        jobs = opened(f"http://127.0.0.1:{proxy.port}", "jobs")
        jobs.put("warm")                  # the connection is open and kept alive
        with jobs.transaction():
            assert jobs.get(timeout=10) == "warm"
            jobs.put("once")
            jobs.task_done()
            proxy.armed.set()             # the batch's answer is cut, the retry answered
        assert proxy.cuts == 1
        c = _counts(service.url, "jobs")
        assert (c["ready"], c["in_flight"]) == (1, 0)
        assert jobs.stats()["acked"] == 1
    finally:
        proxy.close()


def test_redrive_through_the_service(service, opened):
    dead = opened(service.url, "dead")
    work = opened(service.url, "work", max_receives=1, dead_letter="dead")
    work.put("poison")
    work.nack(work.get_message(timeout=10))
    with pytest.raises(queue.Empty):
        work.get(timeout=0.2)             # this receive moved it to "dead"
    assert _counts(service.url, "dead")["ready"] == 1
    assert dead.redrive() == 1
    m = AckQueue(path=service.url, name="work").get_message(timeout=10)
    assert (m.body, m.receive_count) == ("poison", 1)


def test_several_queues_of_one_service_commit_as_one(service, opened):
    pages, links = opened(service.url, "pages"), opened(service.url, "links")
    pages.put("https://example.org/")
    pages.put("https://example.org/b")
    with transaction(pages, links):
        m = pages.get_message(timeout=10)
        links.put(m.body + "1")
        links.put(m.body + "2")
        pages.ack(m)
        assert _counts(service.url, "links")["ready"] == 0          # nothing sent yet
    assert (_counts(service.url, "links")["ready"], pages.stats()["acked"]) == (2, 1)
    with pytest.raises(KeyError):
        with transaction(pages, links):
            m = pages.get_message(timeout=10)
            links.put("never")
            raise KeyError("boom")
    assert _counts(service.url, "links")["ready"] == 2               # nothing more put
    assert pages.get_message(timeout=10).receive_count == 2          # given back


def test_keep_refuses_the_batch_when_a_delivery_is_over(service, opened):
    pages, links = opened(service.url, "pages"), opened(service.url, "links")
    pages.put("p")
    m = pages.get_message(timeout=10)
    pages.change_visibility(m, 0)         # its delivery ends: given back
    with pytest.raises(StaleAck):
        with transaction(pages, links, keep=[m]):
            links.put("derived from p")
    assert _counts(service.url, "links")["ready"] == 0
    with pytest.raises(ValueError, match="one queue service"):
        with transaction(pages, AckQueue()):
            pass


def test_pack_through_the_service(service, opened):
    jobs = opened(service.url, "jobs")
    jobs.put_many([b"x" * 1000] * 200)
    for _ in range(200):
        jobs.get(timeout=10)
        jobs.task_done()
    report = jobs.pack()                  # the service packs its file, queues in use
    assert report.size_before > report.size_after > 0
    assert report.freed == report.size_before - report.size_after
    jobs.put("after the pack")
    assert jobs.get(timeout=10) == "after the pack"
    jobs.task_done()
