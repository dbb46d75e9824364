"""Bad input and a full disk through the real service: each is a clear 4xx (or a 503 that
says to retry), in the error shape of the front it came through, never a 500.

Covered: JSON nested 10^5 deep on every route that parses JSON (the native API, its
batches and rows, Sasquatch's API, the SQS protocol, the auth middleware's look at a
body), SQS parameters of the wrong JSON type (each one the fuzzer in
test_service_fuzz.py found or could find), a full disk (the service's real file size
limit, RLIMIT_FSIZE, set on the running child process with prlimit, makes its writes
fail with EFBIG as a full disk makes them fail with ENOSPC), and ``ackqueue serve --host``
with a name that does not resolve."""
import http.client
import json
import re
import resource
import struct
import subprocess

import pytest

pytest.importorskip("aiohttp")

from service_proc import Service, serve_with_clients  # noqa: E402
from zeo_server import console_script                           # noqa: E402

DEEP = b"[" * 100000
NESTED = "nested too deeply"
SQS_TYPE = "application/x-amz-json-1.0"
ACCOUNT = "000000000000"


def call(url, method, path, body=None, headers=None):
    """(status, headers, JSON document or bytes) of one request to the service at url."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        c.request(method, path, body=body, headers=dict(headers or {}))
        r = c.getresponse()
        data = r.read()
        doc = json.loads(data) if "json" in r.getheader("Content-Type", "") else data
        return r.status, r.headers, doc
    finally:
        c.close()


def sqs(url, action, params, raw=None):
    body = raw if raw is not None else json.dumps(params).encode()
    return call(url, "POST", "/", body, {"X-Amz-Target": f"AmazonSQS.{action}",
                                         "Content-Type": SQS_TYPE})


def frames(*parts):
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A real service with a queue "js" whose codec is json, and SQS queues "sq" (its
    dead letters to "sq-dlq") and "sq-dlq"."""
    d = tmp_path_factory.mktemp("errors")
    s = Service(d / "q.fs", d / "service.log")
    assert call(s.url, "PUT", "/v1/queues/js/codec?codec=json")[0] == 200
    assert sqs(s.url, "CreateQueue", {"QueueName": "sq-dlq"})[0] == 200
    redrive = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:sq-dlq",
                          "maxReceiveCount": 2})
    assert sqs(s.url, "CreateQueue", {"QueueName": "sq",
                                      "Attributes": {"RedrivePolicy": redrive}})[0] == 200
    yield s
    assert s.stop() == 0
    with open(s.log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]


# -- JSON nested 10^5 deep ------------------------------------------------------------------

J = {"Content-Type": "application/json"}
NATIVE_DEEP = [
    ("POST", "/v1/queues/a/messages", DEEP, J),                 # a JSON body, by its type
    ("POST", "/v1/queues/a/messages?encoding=json", DEEP, {}),
    ("POST", "/v1/queues/a/messages", b"x", {"X-Attributes": "[" * 8000}),
    ("POST", "/v1/queues/a/batch?encoding=json", frames(b"1", DEEP), {}),
    ("POST", "/v1/queues/a/ack", DEEP, J),
    ("DELETE", "/v1/queues/a/messages", DEEP, J),
    ("POST", "/v1/queues/a/nack", DEEP, J),
    ("POST", "/v1/queues/a/visibility?visibility_timeout=1", DEEP, J),
    ("POST", "/v1/batch", DEEP, J),
    ("POST", "/v1/batch", frames(DEEP), {"Content-Type": "application/vnd.ackqueue.frames"}),
    ("POST", "/v1/batch", json.dumps({"puts": [{"queue": "a", "encoding": "json",
                                                "body": "[" * 100000}]}).encode(), J),
    ("POST", "/v1/queues/a/rows", frames(DEEP, b"x"), {}),
    ("POST", "/v1/queues/js/rows?encoding=json",
     frames(json.dumps({"dedup_ids": ["d"]}).encode(), DEEP), {}),
]
SASQUATCH_DEEP = [("POST", p, DEEP, J) for p in (
    "/send", "/send_batch", "/receive", "/dequeue", "/delete", "/change_visibility",
    "/delete_all", "/queue_length")] + [
    # text into a queue whose codec is json must be JSON: checked with the same bound
    ("POST", "/enqueue?queue_name=js", DEEP, {"Content-Type": "text/plain"}),
    ("POST", "/send", json.dumps({"queue_name": "js",
                                  "message_body": "[" * 100000}).encode(), J)]


@pytest.mark.parametrize("method,path,body,headers", NATIVE_DEEP + SASQUATCH_DEEP,
                         ids=[f"{m} {p} {i}" for i, (m, p, _, _) in
                              enumerate(NATIVE_DEEP + SASQUATCH_DEEP)])
def test_deeply_nested_json_is_a_4xx_in_the_native_error_shape(served, method, path, body,
                                                              headers):
    status, _, doc = call(served.url, method, path, body, headers)
    assert status in (400, 415), (status, doc)
    assert set(doc) == {"error"} and doc["error"]["code"] in (
        "InvalidRequest", "ValidationError", "UnsupportedEncoding"), doc
    assert NESTED in doc["error"]["message"], doc


def test_deeply_nested_json_is_a_400_on_every_sqs_action(served):
    from ackqueue.service.sqs import ACTIONS
    for action in ACTIONS:
        status, headers, doc = sqs(served.url, action, None, raw=DEEP)
        assert status == 400, (action, status, doc)
        assert doc["__type"] == "com.amazonaws.sqs#InvalidParameterValue", doc
        assert NESTED in doc["message"], doc
        assert headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"


def test_deeply_nested_json_inside_sqs_parameters(served):
    url = f"{served.url}/{ACCOUNT}/sq"
    status, _, doc = sqs(served.url, "SetQueueAttributes", {
        "QueueUrl": url, "Attributes": {"RedrivePolicy": "[" * 100000}})
    assert status == 400 and doc["__type"].endswith("#InvalidAttributeValue"), doc
    # A Policy is stored as given; a permission added to it later reads it.
    assert sqs(served.url, "SetQueueAttributes", {
        "QueueUrl": url, "Attributes": {"Policy": "[" * 100000}})[0] == 200
    status, _, doc = sqs(served.url, "AddPermission", {
        "QueueUrl": url, "Label": "p1", "AWSAccountIds": ["111122223333"],
        "Actions": ["SendMessage"]})
    assert status == 200, doc
    # Text into a queue whose codec is json must be JSON that can be read back.
    assert sqs(served.url, "CreateQueue", {"QueueName": "js"})[0] == 200
    status, _, doc = sqs(served.url, "SendMessage", {
        "QueueUrl": f"{served.url}/{ACCOUNT}/js", "MessageBody": "[" * 100000})
    assert status == 400 and NESTED in doc["message"], doc


def test_deeply_nested_json_through_the_auth_middleware(tmp_path):
    s = serve_with_clients(tmp_path, {"root": {
        "secret": "root-secret-0123456789", "rights": {"*": ["admin"]}}})
    try:
        token = {"Authorization": "Bearer root-secret-0123456789", **J}
        for path in ("/send", "/send_batch", "/receive", "/v1/batch"):   # it reads them
            status, _, doc = call(s.url, "POST", path, DEEP, token)
            assert status == 400 and NESTED in doc["error"]["message"], (path, doc)
    finally:
        assert s.stop() == 0
    text = open(s.log_path, encoding="utf-8", errors="replace").read()
    assert "Traceback" not in text, text[-3000:]


# -- SQS parameters of the wrong type -------------------------------------------------------

URL, DLQ_URL = "<queue url>", "<dlq url>"        # replaced by the running service's
DLQ = f"arn:aws:sqs:us-east-1:{ACCOUNT}:sq-dlq"
SQS_BAD_PARAMS = [
    ("ListQueues", {"QueueNamePrefix": 1}),
    ("ListQueues", {"QueueNamePrefix": ["s"]}),
    ("ListQueues", {"QueueNamePrefix": {"a": 1}}),
    ("ListQueues", {"NextToken": 7}),
    ("ListQueues", {"NextToken": ["x"]}),
    ("ListQueues", {"MaxResults": float("inf")}),
    ("ListDeadLetterSourceQueues", {"QueueUrl": DLQ_URL, "NextToken": True}),
    ("GetQueueUrl", {"QueueName": [None]}),
    ("GetQueueUrl", {"QueueName": {"x": 1}}),
    ("SendMessage", {"QueueUrl": URL, "MessageBody": "x", "DelaySeconds": float("inf")}),
    ("SendMessage", {"QueueUrl": URL, "MessageBody": "x", "MessageAttributes": {
        "a": {"DataType": "Binary", "BinaryValue": 10 ** 12}}}),
    ("SendMessage", {"QueueUrl": URL, "MessageBody": "x", "MessageAttributes": {
        "a": {"DataType": "Binary", "BinaryValue": 3}}}),
    ("ReceiveMessage", {"QueueUrl": URL, "MaxNumberOfMessages": float("-inf")}),
    ("SetQueueAttributes", {"QueueUrl": URL, "Attributes": {"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": DLQ, "maxReceiveCount": float("inf")})}}),
    ("SetQueueAttributes", {"QueueUrl": URL, "Attributes": {"Policy": {"a": 1}}}),
    ("SetQueueAttributes", {"QueueUrl": URL, "Attributes": {"Policy": None}}),
    ("StartMessageMoveTask", {"SourceArn": DLQ, "DestinationArn": DLQ}),
    ("StartMessageMoveTask", {"SourceArn": DLQ, "DestinationArn": 5}),
    ("StartMessageMoveTask", {"SourceArn": DLQ, "MaxNumberOfMessagesPerSecond": "x"}),
    ("StartMessageMoveTask", {"SourceArn": ["arn"]}),
    ("ListMessageMoveTasks", {"SourceArn": DLQ, "MaxResults": "x"}),
    ("ListMessageMoveTasks", {"SourceArn": DLQ, "MaxResults": [1]}),
    ("CancelMessageMoveTask", {"TaskHandle": ["h"]}),
    ("AddPermission", {"QueueUrl": URL, "Label": 5, "AWSAccountIds": ["111122223333"],
                       "Actions": ["SendMessage"]}),
    ("RemovePermission", {"QueueUrl": URL, "Label": {"a": 1}}),
]


@pytest.mark.parametrize("action,params", SQS_BAD_PARAMS,
                         ids=[f"{a}-{i}" for i, (a, _) in enumerate(SQS_BAD_PARAMS)])
def test_sqs_parameters_of_the_wrong_type_are_400_invalid_parameter_value(served, action,
                                                                          params):
    urls = {URL: f"{served.url}/{ACCOUNT}/sq", DLQ_URL: f"{served.url}/{ACCOUNT}/sq-dlq"}
    params = {k: urls.get(v, v) if isinstance(v, str) else v for k, v in params.items()}
    status, headers, doc = sqs(served.url, action, params)
    assert status == 400, (action, params, status, doc)
    code = doc["__type"].split("#")[1]
    assert code in ("InvalidParameterValue", "InvalidAttributeValue"), (action, doc)
    assert headers["x-amzn-query-error"].startswith(code), headers


def test_sqs_parameters_of_the_right_type_still_work(served):
    status, _, doc = sqs(served.url, "ListQueues", {"QueueNamePrefix": "sq"})
    assert status == 200 and len(doc["QueueUrls"]) == 2, doc
    status, _, doc = sqs(served.url, "ListQueues", {"MaxResults": 1})
    assert status == 200 and len(doc["QueueUrls"]) == 1 and doc["NextToken"], doc
    status, _, doc = sqs(served.url, "ListQueues", {"MaxResults": 1,
                                                    "NextToken": doc["NextToken"]})
    assert status == 200 and len(doc["QueueUrls"]) == 1, doc
    status, _, doc = sqs(served.url, "SendMessage", {
        "QueueUrl": f"{served.url}/{ACCOUNT}/sq", "MessageBody": "x",
        "MessageAttributes": {"a": {"DataType": "Binary", "BinaryValue": "AAEC"}}})
    assert status == 200, doc


# -- a full disk -----------------------------------------------------------------------------

FULL_LINE = "ackqueue serve: the storage is full (File too large; queue file "


def _set_file_size_limit(pid, limit):
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if limit is None else limit, hard))


def _fill(s, queue, body):
    """Put body into queue until the service refuses; how many were put, and the refusal."""
    for n in range(1000):
        status, headers, doc = call(s.url, "POST", f"/v1/queues/{queue}/messages", body)
        if status != 200:
            return n, (status, headers, doc)
    raise AssertionError("the file size limit never refused a put")


def _assert_storage_full(status, headers, doc):
    assert status == 503, (status, doc)
    assert doc["error"]["code"] == "StorageFull", doc
    assert "storage is full" in doc["error"]["message"], doc
    assert headers["Retry-After"] == "30", headers


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)")
def test_a_full_disk_is_503_with_retry_after_on_every_front_and_logs_no_traceback(tmp_path):
    s = Service(tmp_path / "q.fs", tmp_path / "service.log")
    try:
        assert sqs(s.url, "CreateQueue", {"QueueName": "sq"})[0] == 200
        size = (tmp_path / "q.fs").stat().st_size
        _set_file_size_limit(s.proc.pid, size + 200_000)   # its writes past it: EFBIG
        put, refusal = _fill(s, "jobs", b"x" * 10_000)
        assert put > 0
        _assert_storage_full(*refusal)
        refused = 1
        for _ in range(3):
            _assert_storage_full(*call(s.url, "POST", "/v1/queues/jobs/messages",
                                       b"y" * 10_000))
            _assert_storage_full(*call(s.url, "POST", "/v1/batch", json.dumps({"puts": [
                {"queue": "jobs", "body": "z" * 10_000, "encoding": "str"}]}).encode(), J))
            _assert_storage_full(*call(s.url, "POST", "/send", json.dumps(
                {"queue_name": "sasq", "message_body": "s" * 10_000}).encode(), J))
            _assert_storage_full(*call(s.url, "POST", "/send_batch", json.dumps(
                {"messages": [{"queue_name": "sasq", "message_body": "s" * 10_000}] * 3}
            ).encode(), J))
            status, headers, doc = sqs(s.url, "SendMessage", {
                "QueueUrl": f"{s.url}/{ACCOUNT}/sq", "MessageBody": "q" * 10_000})
            assert status == 503 and doc["__type"] == "com.amazonaws.sqs#ServiceUnavailable"
            assert headers["x-amzn-query-error"] == "ServiceUnavailable;Receiver"
            assert headers["Retry-After"] == "30" and "storage is full" in doc["message"]
            refused += 5 + 2           # (send_batch: each of its 3 entries is counted)
        # The remote drop-in retries (space may be freed), then says what it was.
        from ackqueue import AckQueue, ServerUnavailable
        with AckQueue(path=s.url + "?wait_timeout=0.5", name="jobs") as q:
            with pytest.raises(ServerUnavailable, match="HTTP 503: the service's storage "
                                                        "is full"):
                q.put("r" * 10_000)
        # Space again: the service goes on by itself, nothing put before was lost.
        _set_file_size_limit(s.proc.pid, None)
        assert call(s.url, "POST", "/v1/queues/jobs/messages", b"after")[0] == 200
        status, _, doc = call(s.url, "GET", "/v1/queues/jobs")
        assert status == 200 and doc["stats"]["ready"] == put + 1, doc
        assert sqs(s.url, "SendMessage", {"QueueUrl": f"{s.url}/{ACCOUNT}/sq",
                                          "MessageBody": "ok"})[0] == 200
    finally:
        assert s.stop() == 0
    text = open(s.log_path, encoding="utf-8", errors="replace").read()
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if FULL_LINE in line]
    # one line at the first refusal, then at most one a minute with a count (and one at
    # the stop with the count not written yet)
    assert lines and lines[0].endswith("until space is freed"), text[-3000:]
    assert len(lines) < refused / 2, lines
    more = re.search(r"; ([\d,]+) more (before stopping|in the last 60 s)$", lines[-1])
    assert more and int(more.group(1).replace(",", "")) >= 1, lines


# -- ackqueue serve --host NAME that does not resolve ---------------------------------------

def _error_lines(stderr):
    """The Error: lines of stderr, which must end with the one there is (before it, only
    the service's log lines: the limits it starts with)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error: "), stderr
    assert all(" INFO " in line for line in lines[:-1]), stderr
    return [line for line in lines if line.startswith("Error: ")]


def test_serve_on_a_host_name_that_does_not_resolve_is_one_error_line(tmp_path):
    proc = subprocess.run([console_script(), "serve", "--memory", "--port", "0", "--host",
                           "no-such-host.invalid", "--insecure"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and errors[0].startswith("Error: --host no-such-host.invalid"), \
        proc.stderr
    assert proc.stdout == ""



def test_serve_on_a_port_in_use_or_a_held_file_is_one_error_line(tmp_path):
    import socket
    from ackqueue import AckQueue
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = subprocess.run([console_script(), "serve", "--memory", "--port",
                               str(taken.getsockname()[1])],
                              capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    held = AckQueue(path=str(tmp_path / "held.fs"))
    try:
        proc2 = subprocess.run([console_script(), "serve", str(tmp_path / "held.fs"),
                                "--port", "0"], capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    for p, what in ((proc, "address already in use"), (proc2, "already open")):
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        errors = _error_lines(p.stderr)
        assert len(errors) == 1 and what in errors[0], p.stderr


def test_under_auth_a_queue_name_of_the_wrong_type_is_400(tmp_path):
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config
    from botocore.exceptions import ClientError
    s = serve_with_clients(tmp_path, {"AKIAROOT": {
        "secret": "root-secret-0123456789", "rights": {"*": ["admin"]}}})
    try:
        # signed by botocore, its own checks of the parameters' types turned off
        c = boto3.client("sqs", endpoint_url=s.url, region_name="us-east-1",
                         aws_access_key_id="AKIAROOT",
                         aws_secret_access_key="root-secret-0123456789",
                         config=Config(retries={"max_attempts": 0},
                                       parameter_validation=False))
        for call_it in (lambda: c.get_queue_url(QueueName=123),
                        lambda: c.create_queue(QueueName=["a"])):
            with pytest.raises(ClientError) as e:
                call_it()
            assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
            assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    finally:
        assert s.stop() == 0
    text = open(s.log_path, encoding="utf-8", errors="replace").read()
    assert "Traceback" not in text, text[-3000:]
