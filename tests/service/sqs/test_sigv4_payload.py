"""SigV4 binds the body: requests really signed by botocore's signer (through boto3, against a
real ``ackqueue serve --auth``), captured as sent, then their bytes replayed by hand with a
tampered body.  The payload hash of the canonical request is always the SHA-256 of the body
received; an ``x-amz-content-sha256`` header that differs from it, or that claims an
unsigned payload, is refused, signed or not.  A replay of an untouched request still
passes (SigV4 within its five minutes does not prevent replays; it prevents changes)."""
import hashlib
import http.client
import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("boto3")

from service_proc import serve_with_clients            # noqa: E402
from sqs_helpers import client                         # noqa: E402

SECRET = "writer-secret-0123456789"
ADMIN = "admin-secret-9876543210"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    s = serve_with_clients(tmp_path_factory.mktemp("sigv4"), {
        "AKIAWRITER": {"secret": SECRET, "rights": {"jobs*": ["read", "write"]}},
        "AKIAADMIN": {"secret": ADMIN, "rights": {"*": ["admin"]}}})
    yield s
    assert s.stop() == 0


def _body_bytes(body):
    return body.encode("utf-8") if isinstance(body, str) else bytes(body or b"")


def signed_client(service, content_sha256=None):
    """(boto3 client of AKIAWRITER, the list of requests it sent: (headers, body)).
    content_sha256: None (what boto3 sends for SQS: no x-amz-content-sha256), "hash" (the
    body's SHA-256 in the header, signed, as the AWS JS SDK v3 sends it) or a literal value
    put in the header before signing (e.g. UNSIGNED-PAYLOAD)."""
    c = client(service.url, "AKIAWRITER", SECRET)
    sent = []

    def before_sign(request, **_):
        if content_sha256 == "hash":
            value = hashlib.sha256(_body_bytes(request.body)).hexdigest()
        else:
            value = content_sha256
        if value is not None:
            request.headers["X-Amz-Content-SHA256"] = value

    def before_send(request, **_):
        headers = {k: v.decode("ascii") if isinstance(v, bytes) else v
                   for k, v in request.headers.items()}
        sent.append((headers, _body_bytes(request.body)))
    c.meta.events.register("before-sign.sqs", before_sign)
    c.meta.events.register("before-send.sqs", before_send)
    return c, sent


def replay(service, headers, body, drop=(), add=None):
    """(status, error code or None) of a request sent by hand: headers as captured (minus
    drop, plus add, lower-case names), Content-Length that of body."""
    out = {k: v for k, v in headers.items()
           if k.lower() not in set(drop) | {"content-length"}}
    out.update(add or {})
    out["Content-Length"] = str(len(body))
    c = http.client.HTTPConnection("127.0.0.1", service.port, timeout=20)
    try:
        c.request("POST", "/", body=body, headers=out)
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    code = None
    if r.status != 200:
        code = json.loads(data)["__type"].rsplit("#", 1)[-1]
        assert r.getheader("x-amzn-query-error", "").startswith(code), r.headers
    return r.status, code


def bodies(service, name):
    """Every message body of queue name (received by the admin client, then deleted)."""
    admin = client(service.url, "AKIAADMIN", ADMIN)
    url = admin.get_queue_url(QueueName=name)["QueueUrl"]
    out = []
    while True:
        got = admin.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if not got:
            return sorted(out)
        for m in got:
            out.append(m["Body"])
            admin.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def captured_send(service, queue, content_sha256=None):
    """(headers, body) of a real, accepted SendMessage of "good-1" to queue."""
    c, sent = signed_client(service, content_sha256)
    url = c.create_queue(QueueName=queue)["QueueUrl"]
    sent.clear()
    c.send_message(QueueUrl=url, MessageBody="good-1")
    [(headers, body)] = sent
    assert b'"good-1"' in body
    return headers, body


def tampered(body):
    out = body.replace(b'"good-1"', b'"evil-1"')       # same length
    assert out != body and len(out) == len(body)
    return out


def test_a_good_request_and_its_exact_replay_are_accepted(service):
    headers, body = captured_send(service, "jobs-good")
    assert "x-amz-content-sha256" not in {k.lower() for k in headers}
    assert replay(service, headers, body) == (200, None)
    headers, body = captured_send(service, "jobs-good-h", "hash")
    assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert "x-amz-content-sha256" in headers["Authorization"]       # signed
    assert replay(service, headers, body) == (200, None)
    assert bodies(service, "jobs-good") == ["good-1", "good-1"]
    assert bodies(service, "jobs-good-h") == ["good-1", "good-1"]


def test_a_tampered_body_with_the_signed_header_kept_is_refused(service):
    """The header still holds the hash of the body that was signed: it no longer matches
    the body received."""
    headers, body = captured_send(service, "jobs-kept", "hash")
    assert replay(service, headers, tampered(body)) == (403, "SignatureDoesNotMatch")
    assert bodies(service, "jobs-kept") == ["good-1"]


def test_a_tampered_body_with_an_unsigned_header_added_is_refused(service):
    """boto3 signs SQS requests without the header; an attacker adds one that holds the
    hash of the captured body, so that the canonical request would be the signed one."""
    headers, body = captured_send(service, "jobs-added")
    added = {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    assert replay(service, headers, tampered(body), add=added) == (403, "SignatureDoesNotMatch")
    assert bodies(service, "jobs-added") == ["good-1"]


def test_a_tampered_body_without_the_header_is_refused(service):
    headers, body = captured_send(service, "jobs-plain")
    assert replay(service, headers, tampered(body)) == (403, "SignatureDoesNotMatch")
    headers, body = captured_send(service, "jobs-dropped", "hash")
    status, code = replay(service, headers, tampered(body), drop=("x-amz-content-sha256",))
    assert (status, code) == (403, "SignatureDoesNotMatch")          # a signed header gone
    assert bodies(service, "jobs-plain") == ["good-1"]
    assert bodies(service, "jobs-dropped") == ["good-1"]


def test_an_unsigned_payload_is_refused_even_untouched(service):
    """UNSIGNED-PAYLOAD (signed as such, the way S3 clients do over TLS) binds no body: SQS
    takes none, neither the body sent nor another."""
    c, sent = signed_client(service, "UNSIGNED-PAYLOAD")
    from botocore.exceptions import ClientError
    with pytest.raises(ClientError) as e:
        c.create_queue(QueueName="jobs-unsigned")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert "UNSIGNED-PAYLOAD" in e.value.response["Error"]["Message"]
    headers, body = sent[-1]
    assert headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    assert replay(service, headers, body) == (403, "SignatureDoesNotMatch")
    admin = client(service.url, "AKIAADMIN", ADMIN)
    assert not [u for u in admin.list_queues().get("QueueUrls", [])
                if u.endswith("/jobs-unsigned")]


def test_a_header_in_capitals_or_with_spaces_is_not_the_hash(service):
    """The header must be the lower-case hex digest, as AWS's signers write it: any other
    spelling is refused, never taken as a match."""
    headers, body = captured_send(service, "jobs-spelling")
    for value in (hashlib.sha256(body).hexdigest().upper(), "", " "):
        status, code = replay(service, headers, body, add={"x-amz-content-sha256": value})
        assert (status, code) == (403, "SignatureDoesNotMatch"), value
    assert bodies(service, "jobs-spelling") == ["good-1"]
