"""A receipt acts only on its own queue, and only for a client with rights on that queue, on
every route that takes receipts: a real ``ackqueue serve --auth`` with two clients, the
owner (rights on jobs*) receiving from a jobs queue through each front, and the intruder
(rights on secret* only) using the leaked receipt on every receipt route of every front,
naming its own queue or none.  Each attempt is refused and nothing is done: the owner's
receipt still holds its delivery afterwards (the owner then acknowledges it)."""
import http.client
import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("boto3")

from botocore.exceptions import ClientError            # noqa: E402

from service_proc import Service, serve_with_clients  # noqa: E402
from sqs_helpers import client                         # noqa: E402

OWNER = "owner-secret-0123456789"
INTRUDER = "intruder-secret-9876543210"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = serve_with_clients(tmp_path_factory.mktemp("receipts"), {
        "owner": {"secret": OWNER, "rights": {"jobs*": ["read", "write"]}},
        "intruder": {"secret": INTRUDER, "rights": {"secret*": ["read", "write"]}}})
    yield s
    assert s.stop() == 0


def call(service, method, path, doc=None, token=OWNER, **headers):
    """(status, JSON answer) of one request."""
    body = None if doc is None else json.dumps(doc)
    headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        headers["Content-Type"] = "application/json"
    c = http.client.HTTPConnection("127.0.0.1", service.port, timeout=20)
    try:
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def ok(service, method, path, doc=None, **headers):
    status, answer = call(service, method, path, doc, **headers)
    assert status == 200, answer
    return answer


# -- receipts of each front, received by the owner ----------------------------------------

def native_receipt(service, queue):
    ok(service, "POST", f"/v1/queues/{queue}/messages")
    got = ok(service, "POST", f"/v1/queues/{queue}/receive?visibility_timeout=600",
             **{"X-Client-Id": "owner:1"})
    [m] = got["messages"]
    return m["receipt"]


def sasquatch_receipt(service, queue):
    ok(service, "POST", "/send", {"queue_name": queue, "message_body": "m"})
    [m] = ok(service, "POST", "/receive", {"queue_name": queue, "visibility_timeout": 600,
                                           "wait_time_seconds": 0})["messages"]
    return m["receipt_handle"]


def sqs_clients(service):
    return (client(service.url, "owner", OWNER), client(service.url, "intruder", INTRUDER))


def sqs_receipt(service, queue):
    owner, _ = sqs_clients(service)
    fifo = queue.endswith(".fifo")
    url = owner.create_queue(QueueName=queue, Attributes={"FifoQueue": "true"} if fifo
                             else {})["QueueUrl"]
    extra = {"MessageGroupId": "g", "MessageDeduplicationId": "d"} if fifo else {}
    owner.send_message(QueueUrl=url, MessageBody="m", **extra)
    [m] = owner.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"]
    return m["ReceiptHandle"]


RECEIPTS = {"native": native_receipt, "sasquatch": sasquatch_receipt, "sqs": sqs_receipt}


def still_held(service, kind, queue, receipt):
    """The owner's receipt still names its delivery, in flight: the owner acknowledges it
    through the front it came from."""
    if kind == "native":
        assert ok(service, "POST", f"/v1/queues/{queue}/ack?receipt={receipt}") == {
            "acked": 1}
    elif kind == "sasquatch":
        assert ok(service, "POST", "/delete", {"queue_name": queue,
                                               "receipt_handles": [receipt]}) == {"deleted": 1}
    else:
        owner, _ = sqs_clients(service)
        url = owner.get_queue_url(QueueName=queue)["QueueUrl"]
        # MessageNotInflight if the delivery had been deleted or given back.
        owner.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt,
                                        VisibilityTimeout=600)
        owner.delete_message(QueueUrl=url, ReceiptHandle=receipt)
        assert owner.receive_message(QueueUrl=url).get("Messages", []) == []


# -- the intruder's attempts ----------------------------------------------------------------

def http_attempts(receipt, kind):
    """(method, path, body, expected status) of every native and Sasquatch route taking
    receipts, as the intruder sends them: naming its own queue, or (Sasquatch) none.  A
    Sasquatch route naming no queue checks the rights on the queue of the receipts it holds
    (403), and knows no receipt of another front (404)."""
    bare_status = 403 if kind == "sasquatch" else 404
    own = {"queue_name": "secret", "receipt_handles": [receipt]}
    bare = {"receipt_handles": [receipt]}
    lease_check = {"lease": {"client": "intruder", "receipts": [
        {"queue": "secret", "receipt": receipt}]}}
    return [
        ("POST", "/delete", own, 404),
        ("POST", "/delete", bare, bare_status),
        ("POST", "/change_visibility", dict(own, visibility_timeout=0), 404),
        ("POST", "/change_visibility", dict(bare, visibility_timeout=0), bare_status),
        ("POST", f"/v1/queues/secret/ack?receipt={receipt}", None, 410),
        ("DELETE", f"/v1/queues/secret/messages?receipt={receipt}", None, 410),
        ("POST", f"/v1/queues/secret/nack?receipt={receipt}", None, 410),
        ("POST", f"/v1/queues/secret/visibility?receipt={receipt}&visibility_timeout=0",
         None, 410),
        ("POST", "/v1/batch", {"acks": [{"queue": "secret", "receipt": receipt}]}, 410),
        ("POST", "/v1/batch", lease_check, 409),
        # naming the receipt's own queue: the intruder has no right on it
        ("POST", "/v1/queues/jobs/ack?receipt=" + receipt, None, 403),
        ("POST", "/v1/batch", {"acks": [{"queue": "jobs", "receipt": receipt}]}, 403),
        ("POST", "/delete", {"queue_name": "jobs", "receipt_handles": [receipt]}, 403),
    ]


def sqs_attempts(service, receipt, fifo):
    """[(label, callable raising ClientError or returning a batch answer)] of every SQS
    action taking receipts, signed by the intruder with a queue URL of its own queue."""
    _, intruder = sqs_clients(service)
    name = "secret.fifo" if fifo else "secret"
    url = intruder.create_queue(QueueName=name, Attributes={"FifoQueue": "true"} if fifo
                                else {})["QueueUrl"]
    entry = [{"Id": "e1", "ReceiptHandle": receipt}]
    return [
        ("DeleteMessage", lambda: intruder.delete_message(QueueUrl=url,
                                                          ReceiptHandle=receipt)),
        ("ChangeMessageVisibility", lambda: intruder.change_message_visibility(
            QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)),
        ("DeleteMessageBatch", lambda: intruder.delete_message_batch(QueueUrl=url,
                                                                     Entries=entry)),
        ("ChangeMessageVisibilityBatch", lambda: intruder.change_message_visibility_batch(
            QueueUrl=url, Entries=[dict(entry[0], VisibilityTimeout=0)])),
    ]


def refused(label, attempt):
    """The SQS error code of an attempt (a batch: of its one entry, none succeeding)."""
    try:
        answer = attempt()
    except ClientError as exc:
        return exc.response["Error"]["Code"]
    assert answer.get("Successful", []) == [], (label, answer)
    [failed] = answer["Failed"]
    return failed["Code"]


@pytest.mark.parametrize("kind", sorted(RECEIPTS))
def test_a_leaked_receipt_is_refused_on_every_native_and_sasquatch_route(service, kind):
    queue = f"jobs-{kind}-http"
    receipt = RECEIPTS[kind](service, queue)
    ok(service, "POST", "/v1/leases/intruder", token=INTRUDER)        # its lease holds
    for method, path, doc, status in http_attempts(receipt, kind):
        got, answer = call(service, method, path, doc, token=INTRUDER)
        assert got == status, (kind, method, path, doc, answer)
        assert answer["error"]["code"] and answer["error"]["message"]
    still_held(service, kind, queue, receipt)


@pytest.mark.parametrize("kind", sorted(RECEIPTS))
def test_a_leaked_receipt_is_refused_by_every_sqs_action(service, kind):
    queue = f"jobs-{kind}-sqs"
    receipt = RECEIPTS[kind](service, queue)
    for label, attempt in sqs_attempts(service, receipt, fifo=False):
        assert refused(label, attempt) == "ReceiptHandleIsInvalid", (kind, label)
    still_held(service, kind, queue, receipt)


def test_a_leaked_fifo_receipt_is_refused_by_every_sqs_action(service):
    receipt = sqs_receipt(service, "jobs-leak.fifo")
    for fifo in (True, False):
        for label, attempt in sqs_attempts(service, receipt, fifo=fifo):
            assert refused(label, attempt) == "ReceiptHandleIsInvalid", (fifo, label)
    still_held(service, "sqs", "jobs-leak.fifo", receipt)


def test_a_receipt_on_its_own_queue_with_rights_still_works_without_naming_it(service):
    """Sasquatch clients name no queue in /delete and /change_visibility: the rights are
    checked on the receipt's queue, which the owner has (not on every queue, "*")."""
    receipt = sasquatch_receipt(service, "jobs-bare")
    assert ok(service, "POST", "/change_visibility", {
        "receipt_handles": [receipt], "visibility_timeout": 300}) == {"result": "ok"}
    assert ok(service, "POST", "/delete", {"receipt_handles": [receipt]}) == {"deleted": 1}
    status, answer = call(service, "POST", "/delete", {"receipt_handles": [receipt]})
    assert (status, answer["error"]["code"]) == (404, "NotFound")


def test_receipts_of_another_queue_are_refused_without_auth(tmp_path):
    """Without --auth too, a receipt acts only within the queue the request names."""
    s = Service(None, tmp_path / "service.log")
    try:
        receipt = sasquatch_receipt(s, "jobs")
        for path, doc in (("/delete", {}), ("/change_visibility", {"visibility_timeout": 0})):
            status, answer = call(s, "POST", path, dict(doc, queue_name="other",
                                                        receipt_handles=[receipt]))
            assert (status, answer["error"]["code"]) == (404, "NotFound"), path
        sqs = client(s.url)
        url = sqs.create_queue(QueueName="other")["QueueUrl"]
        with pytest.raises(ClientError) as e:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=receipt)
        assert e.value.response["Error"]["Code"] == "ReceiptHandleIsInvalid"
        still_held(s, "sasquatch", "jobs", receipt)
    finally:
        assert s.stop() == 0
