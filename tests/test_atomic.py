"""ackqueue.atomic.transaction: one commit across queues of one storage."""
import pytest

import ackqueue
from ackqueue import AckQueue
from ackqueue.atomic import transaction


@pytest.fixture
def two(tmp_path):
    path = str(tmp_path / "q.fs")
    pages, links = AckQueue(path=path, name="pages"), AckQueue(path=path, name="links")
    yield path, pages, links
    pages.close()
    links.close()


def reopen(path):
    pages, links = AckQueue(path=path, name="pages"), AckQueue(path=path, name="links")
    try:
        return pages.qsize(), sorted(links.get_nowait() for _ in range(links.qsize()))
    finally:
        pages.close()
        links.close()


def test_puts_and_acks_on_two_queues_commit_together(two):
    path, pages, links = two
    pages.put("page-1")
    m = pages.get_message()
    with transaction(pages, links):
        links.put_many(["a", "b"])
        pages.ack(m)
        assert links.qsize() == 0              # not visible before the commit
    assert links.qsize() == 2 and pages.qsize() == 0
    pages.close()
    links.close()
    assert reopen(path) == (0, ["a", "b"])


def test_a_stale_ack_at_commit_puts_nothing_and_acks_nothing(two):
    path, pages, links = two
    pages.put_many(["p1", "p2"])
    m1, m2 = pages.get_message(), pages.get_message()
    with pytest.raises(ackqueue.StaleAck) as info:
        with transaction(pages, links):
            links.put("x")
            pages.ack(m1)
            pages.nack(m2)                     # given back before the block's ack of it:
            pages.ack(m2)                      # refused at once
    assert (info.value.queue, info.value.message_id) == ("pages", int(m2.id))
    assert links.qsize() == 0
    pages.ack(m1)                              # m1 is still held: the block acked nothing
    pages.close()
    links.close()
    assert reopen(path) == (1, [])


def test_keep_refuses_a_delivery_given_back_and_never_acks_it(two):
    path, pages, links = two
    pages.put_many(["p1", "p2"])
    m1, m2 = pages.get_message(), pages.get_message()
    with transaction(pages, links, keep=[m2]):
        links.put("x")
        pages.ack(m1)
    assert pages.qsize() == 0 and links.qsize() == 1
    pages.ack(m2)                              # kept, not acknowledged, still held
    m3 = (pages.put("p3"), pages.get_message())[1]
    pages.nack(m3)
    with pytest.raises(ackqueue.StaleAck):
        with transaction(pages, links, keep=[m3]):
            links.put("y")
    assert links.qsize() == 1


def test_queues_of_different_storages_are_refused(tmp_path):
    a = AckQueue(path=str(tmp_path / "a.fs"))
    b = AckQueue(path=str(tmp_path / "b.fs"))
    try:
        with pytest.raises(ValueError):
            with transaction(a, b):
                a.put(1)
                b.put(2)
        assert a.qsize() == 0 and b.qsize() == 0
        a.put(3)                               # the blocks ended: plain puts work again
        assert a.qsize() == 1
    finally:
        a.close()
        b.close()


def test_an_exception_inside_rolls_back_every_queue(two):
    path, pages, links = two
    pages.put("p")
    m = pages.get_message()
    with pytest.raises(RuntimeError):
        with transaction(pages, links):
            links.put("x")
            pages.ack(m)
            raise RuntimeError("crawler failed")
    assert links.qsize() == 0
    pages.ack(m)                               # still held


class Note:
    """A write of a record of the caller's own (root["test.notes"]), as t.write takes."""

    def __init__(self, text):
        self.text = text

    def check(self, root):
        pass

    def apply(self, root):
        root["test.notes"] = root.get("test.notes", ()) + (self.text,)


def notes(path):
    q = AckQueue(path=path, name="pages")
    conn = q.db.open()
    try:
        return conn.root().get("test.notes", ())
    finally:
        conn.close()
        q.close()


def test_a_write_of_ones_own_record_commits_with_the_block_or_not_at_all(two):
    path, pages, links = two
    pages.put_many(["p1", "p2"])
    with transaction(pages, links) as t:
        got = pages.get()
        t.write(Note(got))
    with pytest.raises(RuntimeError):
        with transaction(pages) as t:
            got = pages.get()
            t.write(Note(got))
            raise RuntimeError("rolled back")
    assert pages.qsize() == 1                  # p2 given back, p1 taken with its note
    pages.close()
    links.close()
    assert notes(path) == ("p1",)
    assert reopen(path) == (1, [])
