"""The native API's atomic batch (POST /v1/batch), redrive and pack, on a real
`ackqueue serve` (console script, free loopback port), stopped and SIGKILLed for real."""
import base64
import json
import signal

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue                                   # noqa: E402
from ackqueue.frames import FRAMES, encode_frames                # noqa: E402
from tests.service.test_service import body_of, service         # noqa: E402,F401


def batch(s, doc, **headers):
    return s.call("POST", "/v1/batch", json.dumps(doc).encode(),
                  {"Content-Type": "application/json", **headers})


def counts(s, name):
    status, doc = s.call("GET", f"/v1/queues/{name}")
    assert status == 200, doc
    return doc["stats"]["ready"], doc["stats"]["in_flight"]


def restart(s, sig=signal.SIGTERM):
    s.stop(sig)
    s.start()


def text_put(queue, body, **extra):
    return {"queue": queue, "body": body, "encoding": "str", **extra}


def ack(queue, m):
    return {"queue": queue, "receipt": m["receipt"]}


def test_a_batch_with_one_stale_receipt_puts_nothing_and_acks_nothing(service):
    s = service()
    s.put("pages", b"p1")
    s.put("pages", b"p2")
    s.put("old", b"o1")
    [m1] = s.receive("pages", "crawler", "visibility_timeout=3600")
    [m2] = s.receive("pages", "crawler", "visibility_timeout=3600")
    [m3] = s.receive("old", "crawler", "visibility_timeout=3600")
    # A purge ends the deliveries in flight (as SQS's PurgeQueue does); the service still
    # knows o1's receipt, so the batch finds that delivery stale.
    assert s.call("POST", "/v1/queues/old/purge")[1] == {"purged": 1}
    status, doc = batch(s, {"puts": [text_put("links", "a"), text_put("links", "b")],
                            "acks": [ack("pages", m1), ack("old", m3), ack("pages", m2)]})
    assert status == 409 and doc["error"]["code"] == "StaleReceipt", doc
    assert doc["error"]["entry"] == "acks[1]"
    assert counts(s, "links") == (0, 0)
    assert counts(s, "pages") == (0, 2)          # p1 and p2 still held: not acknowledged
    # an unknown receipt: 410, naming the entry, nothing done either
    status, doc = batch(s, {"puts": [text_put("links", "c")],
                            "acks": [{"queue": "pages", "receipt": "1.nonesuch"}]})
    assert status == 410 and doc["error"]["entry"] == "acks[0]", doc
    assert counts(s, "links") == (0, 0)
    restart(s)
    assert counts(s, "links") == (0, 0)
    assert counts(s, "pages") == (2, 0)          # both back: nothing was acknowledged
    assert s.stop() == 0


def test_crawler_cycle_take_one_put_its_links_ack_it(service):
    s = service()
    s.put("pages", b"/", **{"Content-Type": "text/plain"})
    seen, rounds = set(), 0
    while True:
        got = s.receive("pages", "crawler-1", "visibility_timeout=60")
        if not got:
            break
        [m] = got
        page = body_of(m).decode()
        seen.add(page)
        links = [f"{page}{c}/" for c in "ab"] if len(page) < 4 else []
        status, doc = batch(s, {
            "puts": [text_put("pages", u, dedup_id="page:" + u) for u in links] +
                    [text_put("links", u) for u in links],
            "acks": [ack("pages", m)],
            "lease": {"client": "crawler-1", "receipts": []}})
        assert status == 200, doc
        assert doc["acked"] == 1 and len(doc["ids"]) == 2 * len(links)
        rounds += 1
    assert rounds == len(seen) == 7              # "/", 2 of depth 1, 4 of depth 2
    assert counts(s, "pages") == (0, 0) and counts(s, "links") == (6, 0)
    restart(s)
    assert counts(s, "pages") == (0, 0) and counts(s, "links") == (6, 0)
    assert s.stop() == 0


def test_a_retried_batch_stores_once_even_after_a_restart(service):
    s = service()
    s.put("pages", b"p1")
    [m] = s.receive("pages", "c1", "visibility_timeout=3600")
    doc_in = {"idempotency_key": "crawl-42",
              "puts": [text_put("links", "a"), text_put("other", "b"),
                       text_put("links", "c", idempotency_key="own-key")],
              "acks": [ack("pages", m)]}
    status, first = batch(s, doc_in)
    assert status == 200 and first["acked"] == 1 and len(first["ids"]) == 3, first
    status, again = batch(s, doc_in)              # its answer was lost: the client retries
    assert status == 200 and again["duplicate"] is True, again
    assert again["ids"] == first["ids"]
    restart(s, signal.SIGKILL)
    status, again = batch(s, doc_in)
    assert status == 200 and again["duplicate"] and again["ids"] == first["ids"], again
    assert counts(s, "links") == (2, 0) and counts(s, "other") == (1, 0)
    assert counts(s, "pages") == (0, 0)
    # a key reused by a different batch (one of its keys new): refused, nothing done
    doc_in["puts"].append(text_put("links", "d"))
    status, doc = batch(s, doc_in)
    assert status == 409 and doc["error"]["code"] == "DuplicateMessage", doc
    assert counts(s, "links") == (2, 0)
    s.stop()


def test_sigkill_right_after_a_batchs_200_keeps_all_of_it(service):
    s = service()
    for i in range(3):
        s.put("pages", str(i).encode())
    got = s.receive("pages", "c1", "max=3&visibility_timeout=3600")
    status, doc = batch(s, {"puts": [text_put("links", f"l{i}") for i in range(5)],
                            "acks": [ack("pages", m) for m in got[:2]]})
    assert status == 200, doc
    restart(s, signal.SIGKILL)                    # nothing flushed, no clean close
    assert counts(s, "links") == (5, 0)
    assert counts(s, "pages") == (1, 0)           # the third was held, not acked: back
    [m] = s.receive("pages", "c1")
    assert body_of(m) == b"2"
    s.stop()


def test_lease_checks_and_frames(service):
    s = service()
    s.put("pages", b"p1")
    [m] = s.receive("pages", "owner", "visibility_timeout=3600")
    kept = {"queue": "pages", "receipt": m["receipt"]}
    status, doc = batch(s, {"puts": [text_put("links", "x")],
                            "lease": {"client": "nobody", "receipts": []}})
    assert status == 409 and doc["error"]["code"] == "LeaseExpired", doc
    status, doc = batch(s, {"puts": [text_put("links", "x")],
                            "lease": {"client": "owner-2", "receipts": [kept]}})
    assert status == 409 and doc["error"]["code"] == "LeaseExpired", doc
    s.call("POST", "/v1/leases/owner-2")
    status, doc = batch(s, {"puts": [text_put("links", "x")],
                            "lease": {"client": "owner-2", "receipts": [kept]}})
    assert status == 409 and doc["error"]["code"] == "NotOwned", doc
    assert doc["error"]["entry"] == "lease.receipts[0]"
    assert counts(s, "links") == (0, 0)
    # Frames: the JSON document, then each put's body as bytes; the lease holds.
    manifest = {"puts": [{"queue": "links", "encoding": "bytes"},
                         {"queue": "links", "encoding": "str", "priority": 500}],
                "lease": {"client": "owner", "receipts": [kept]}}
    body = encode_frames([json.dumps(manifest).encode(), b"\x00\xff", "é".encode()])
    status, doc = s.call("POST", "/v1/batch", body, {"Content-Type": FRAMES})
    assert status == 200 and doc["acked"] == 0 and len(doc["ids"]) == 2, doc
    got = s.receive("links", "reader", "max=2")
    assert [body_of(g) for g in got] == ["é".encode(), b"\x00\xff"]   # priority 500 first
    status, _ = s.call("POST", f"/v1/queues/pages/ack?receipt={m['receipt']}")
    assert status == 200                          # kept, not acknowledged by the batch
    # bad input: 400 naming the entry, nothing done
    for bad, entry in (({"puts": [{"queue": "x y", "body": "a"}]}, "puts[0]"),
                       ({"puts": [{"queue": "q", "body": "!!", "encoding": "bytes"}]},
                        "puts[0]"),
                       ({"puts": [text_put("q", "a", priority=-1)]}, "puts[0]"),
                       ({"acks": [{"queue": "q"}]}, "acks[0]")):
        status, doc = batch(s, bad)
        assert status == 400 and doc["error"]["entry"] == entry, (bad, doc)
    assert batch(s, {})[0] == 400
    s.stop()


def test_python_reads_what_a_batch_put(service, tmp_path):
    s = service()
    status, doc = batch(s, {"puts": [
        text_put("jobs", "text"), {"queue": "jobs", "body": base64.b64encode(b"\x01").decode()},
        {"queue": "jobs", "body": '{"k": [1]}', "encoding": "json"}]})
    assert status == 200, doc
    s.stop()
    q = AckQueue(path=str(tmp_path / "q.fs"), name="jobs")
    try:
        assert [q.get_nowait() for _ in range(3)] == ["text", b"\x01", {"k": [1]}]
    finally:
        q.close()


# -- redrive and pack ---------------------------------------------------------------------

def dead_letter_one(s, body):
    """A message of jobs moved to jobs-dlq by Sasquatch's receive rules (max_receives)."""
    assert s.call("POST", "/send", json.dumps({"queue_name": "jobs",
                                                "message_body": body}))[0] == 200
    rule = {"queue_name": "jobs", "max_receives": 1, "dead_letter_queue_name": "jobs-dlq",
            "visibility_timeout": 600, "wait_time_seconds": 0}
    status, doc = s.call("POST", "/receive", json.dumps(rule))
    [m] = doc["messages"]
    s.call("POST", "/change_visibility", json.dumps({
        "queue_name": "jobs", "receipt_handles": [m["receipt_handle"]],
        "visibility_timeout": 0}))
    status, doc = s.call("POST", "/receive", json.dumps(rule))   # over max_receives
    assert status == 200 and doc["messages"] == [], doc


def test_redrive_moves_dead_letters_back_or_elsewhere(service):
    s = service()
    dead_letter_one(s, "one")
    assert counts(s, "jobs-dlq") == (1, 0) and counts(s, "jobs") == (0, 0)
    status, doc = s.call("POST", "/v1/queues/jobs-dlq/redrive")
    assert (status, doc) == (200, {"moved": 1})
    [m] = s.receive("jobs", "c1")
    assert body_of(m) == b"one"
    dead_letter_one(s, "two")
    status, doc = s.call("POST", "/v1/queues/jobs-dlq/redrive?to=retry")
    assert (status, doc) == (200, {"moved": 1})
    assert counts(s, "retry") == (1, 0) and counts(s, "jobs-dlq") == (0, 0)
    assert s.call("POST", "/v1/queues/jobs-dlq/redrive?to=jobs-dlq")[0] == 400
    assert s.call("POST", "/v1/queues/jobs-dlq/redrive?to=a%20b")[0] == 400
    assert s.stop() == 0


def test_pack_shrinks_the_file_and_the_queues_stay_in_use(service, tmp_path):
    s = service()
    for i in range(50):
        s.put("jobs", b"x" * 2000)
    got = s.receive("jobs", "c1", "max=50")
    assert len(got) == 50
    status, _ = s.call("DELETE", "/v1/queues/jobs/messages",
                       json.dumps({"receipts": [m["receipt"] for m in got]}))
    assert status == 200
    status, doc = s.call("POST", "/v1/pack")
    assert status == 200 and doc["joined"] is False, doc
    assert doc["size_after"] < doc["size_before"] and doc["freed"] > 100_000, doc
    assert (tmp_path / "q.fs").stat().st_size == doc["size_after"]
    s.put("jobs", b"after")
    assert [body_of(m) for m in s.receive("jobs", "c1")] == [b"after"]
    assert s.call("POST", "/v1/pack?keep_seconds=-1")[0] == 400
    assert s.stop() == 0


def test_redrive_pack_and_batch_rights_under_auth(service, tmp_path):
    from tests.service.test_service_stats_auth import ADMIN, ALICE, BOB
    import hashlib
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {
        "alice": {"secret": ALICE, "rights": {"jobs*": ["read", "write"], "*": ["read"]}},
        "bob": {"secret_sha256": hashlib.sha256(BOB.encode()).hexdigest(),
                "rights": {"jobs.in": ["write"], "mail": ["read"]}},
        "root": {"secret": ADMIN, "rights": {"*": ["admin"]}}}}))
    s = service("--auth", str(path))

    def call(method, url, token, body=None):
        return s.call(method, url, body, {"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})[0]
    assert call("POST", "/v1/queues/jobs-dlq/redrive", ALICE) == 403
    assert call("POST", "/v1/pack", ALICE) == 403
    assert call("POST", "/v1/queues/jobs-dlq/redrive", ADMIN) == 200
    assert call("POST", "/v1/pack", ADMIN) == 200
    puts = json.dumps({"puts": [text_put("jobs.in", "x")]}).encode()
    assert call("POST", "/v1/batch", BOB, puts) == 200             # write on jobs.in
    other = json.dumps({"puts": [text_put("mail", "x")]}).encode()
    assert call("POST", "/v1/batch", BOB, other) == 403            # read only on mail
    acks = json.dumps({"acks": [{"queue": "jobs.in", "receipt": "1.x"}]}).encode()
    assert call("POST", "/v1/batch", BOB, acks) == 403             # acks need read
    assert call("POST", "/v1/batch", ALICE, acks) == 410           # allowed; unknown
    s.stop()


def test_identical_batches_at_once_store_once_and_all_answer_200(service):
    """A client that times out and resends while its first batch is still committing:
    the resent batch waits for the first and answers its ids (duplicate), never a 409
    about its own receipts being acknowledged already."""
    import threading
    s = service()
    s.put("pages", b"p1")
    [m] = s.receive("pages", "c1", "visibility_timeout=3600")
    doc_in = {"idempotency_key": "k", "puts": [text_put("links", str(i)) for i in range(50)],
              "acks": [ack("pages", m)]}
    answers = []
    barrier = threading.Barrier(6)

    def send():
        conn = s.conn()
        barrier.wait()
        answers.append(s.call(
            "POST", "/v1/batch", json.dumps(doc_in).encode(),
            {"Content-Type": "application/json"}, conn=conn))
    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [status for status, _ in answers] == [200] * 6, answers
    assert sum(1 for _, doc in answers if not doc.get("duplicate")) == 1
    assert len({tuple(doc["ids"]) for _, doc in answers}) == 1
    assert counts(s, "links") == (50, 0) and counts(s, "pages") == (0, 0)
    s.stop()
