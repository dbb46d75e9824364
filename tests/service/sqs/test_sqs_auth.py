"""SigV4 on the SQS protocol under ``ackqueue serve --auth``: boto3 signs with botocore's
own signer (the client's name is the access key id, its secret the secret key); the
service verifies the signature itself.  A real service from the console script."""
import datetime

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("boto3")

import botocore.auth                                   # noqa: E402
from botocore.exceptions import ClientError            # noqa: E402

from service_proc import serve_with_clients            # noqa: E402
from sqs_helpers import client                         # noqa: E402

ALICE = "alice-secret-0123456789"
ADMIN = "admin-secret-9876543210"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = serve_with_clients(tmp_path_factory.mktemp("sqsauth"), {
        "AKIAALICE": {"secret": ALICE, "rights": {"jobs*": ["read", "write"]}},
        "AKIAADMIN": {"secret": ADMIN, "rights": {"*": ["admin"]}},
        "hashed": {"secret_sha256": "0" * 64, "rights": {"*": ["admin"]}}})
    yield s
    assert s.stop() == 0


def code(e):
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"][
        "HTTPStatusCode"]


def test_signed_requests_with_rights_work(service):
    alice = client(service.url, "AKIAALICE", ALICE)
    url = alice.create_queue(QueueName="jobs-a")["QueueUrl"]
    alice.send_message(QueueUrl=url, MessageBody="m")
    [m] = alice.receive_message(QueueUrl=url)["Messages"]
    alice.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    admin = client(service.url, "AKIAADMIN", ADMIN)
    admin.create_queue(QueueName="other")
    assert [u.rsplit("/", 1)[1] for u in alice.list_queues()["QueueUrls"]] == ["jobs-a"]


def test_a_wrong_secret_an_unknown_key_and_no_signature_are_refused(service):
    with pytest.raises(ClientError) as e:
        client(service.url, "AKIAALICE", ALICE + "x").list_queues()
    assert code(e) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(ClientError) as e:
        client(service.url, "AKIANOBODY", ALICE).list_queues()
    assert code(e) == ("InvalidClientTokenId", 403)
    with pytest.raises(ClientError) as e:       # a client with only a hashed secret
        client(service.url, "hashed", ALICE).list_queues()
    assert code(e) == ("InvalidClientTokenId", 403)
    from botocore import UNSIGNED
    with pytest.raises(ClientError) as e:
        client(service.url, signature_version=UNSIGNED).list_queues()
    assert code(e) == ("MissingAuthenticationToken", 403)


def test_rights_that_do_not_cover_the_queue_are_access_denied(service):
    admin = client(service.url, "AKIAADMIN", ADMIN)
    url = admin.create_queue(QueueName="private")["QueueUrl"]
    alice = client(service.url, "AKIAALICE", ALICE)
    with pytest.raises(ClientError) as e:
        alice.send_message(QueueUrl=url, MessageBody="m")
    assert code(e) == ("AccessDenied", 403)
    jobs = alice.create_queue(QueueName="jobs-b")["QueueUrl"]
    with pytest.raises(ClientError) as e:            # purge needs admin
        alice.purge_queue(QueueUrl=jobs)
    assert code(e) == ("AccessDenied", 403)


def test_a_request_signed_over_five_minutes_ago_is_refused(service, monkeypatch):
    alice = client(service.url, "AKIAALICE", ALICE)
    alice.list_queues()
    past = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - \
        datetime.timedelta(minutes=6)
    # The client's clock, as botocore's signer reads it, is six minutes behind.
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: past)
    with pytest.raises(ClientError) as e:
        alice.list_queues()
    assert code(e) == ("SignatureDoesNotMatch", 403)
    assert "expired" in e.value.response["Error"]["Message"]
