"""Fuzzing the live service: schemathesis for what the OpenAPI document describes (the
native API and Sasquatch's), hypothesis for the SQS JSON protocol, which it does not.

The real console script (`ackqueue serve PATH --port 0`) is started once for this module;
the OpenAPI document is loaded from its /openapi.json, and every operation the document
lists becomes a test of its own (so routes other fronts add to the document are fuzzed
as soon as they are described there).  For every generated request, valid or not: no 5xx,
no traceback text in the body, and the response conforms to the document (status code,
content type, body schema).  Every SQS action is a test of its own too: its parameters,
each present or not, of its own kind (queue URLs and ARNs of queues that exist, receipt
handles, attributes) or of any JSON type; and bodies that are not an SQS request at all.
No 5xx, no traceback, an SQS JSON answer (errors in SQS's shape), and at the end nothing
in the service's log.  The same examples every run (derandomized; ACKQUEUE_FUZZ_RANDOM=1
explores new ones, ACKQUEUE_FUZZ_EXAMPLES and ACKQUEUE_FUZZ_SQS_EXAMPLES set how many).
Each 500 they found has its regression test in test_service_errors.py."""
import json
import os
import re
import select
import signal
import subprocess

import pytest

pytest.importorskip("aiohttp")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings             # noqa: E402
from hypothesis import strategies as st                         # noqa: E402
from schemathesis import GenerationMode                         # noqa: E402
from schemathesis.checks import not_a_server_error              # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance)

from tests.zeo_server import console_script                     # noqa: E402

EXAMPLES = int(os.environ.get("ACKQUEUE_FUZZ_EXAMPLES", "40"))
# the same examples every run (deterministic); ACKQUEUE_FUZZ_RANDOM=1 explores new ones
DERANDOMIZE = not os.environ.get("ACKQUEUE_FUZZ_RANDOM")
TRACEBACK = re.compile(rb"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")


@schemathesis.serializer("application/vnd.ackqueue.frames")
def _frames(ctx, value):
    # the batch body is length-prefixed frames; the fuzzer's bytes go as they are, so
    # the service's frame parser gets every kind of cut and overlong frame
    if isinstance(value, (bytes, bytearray)):
        return {"data": bytes(value)}
    return {"data": str(value).encode("utf-8", "surrogatepass")}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    log = open(d / "service.log", "wb")
    proc = subprocess.Popen([console_script(), "serve", str(d / "q.fs"), "--port", "0",
                             "--lease-timeout", "5"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"the service did not start: {line!r}")
    yield found.group(1), d / "service.log"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log.close()


@pytest.fixture(scope="module")
def api_schema(live):
    return schemathesis.openapi.from_url(live[0] + "/openapi.json")


def _operations():
    """(method, path) of every operation in the document the service serves."""
    from ackqueue.service.openapi import document
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return [(m.upper(), path) for path, item in document()["paths"].items()
            for m in item if m in methods and path != "/openapi.json"]


OPERATIONS = _operations()


def test_the_fuzzed_operations_are_those_the_live_service_describes(api_schema):
    # schemathesis leaves out the document's own route (GET /openapi.json)
    live = {(r.ok().method.upper(), r.ok().path) for r in api_schema.get_all_operations()}
    assert live == set(OPERATIONS) and len(live) >= 10


def _check(case):
    # A long poll that finds nothing waits up to ?wait= seconds (60 at most): keep the
    # run bounded by answering at once when the fuzzer asks for a long wait (a wait it
    # sends that is not a valid number is sent as it is).
    query = case.query or {}
    wait = query.get("wait")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > 0.2:
        query["wait"] = 0.2
    # Sasquatch's receive waits wait_time_seconds (default 20) when its body does not say:
    # bound it the same way.
    if case.path in ("/receive", "/dequeue") and isinstance(case.body, dict):
        wait = case.body.get("wait_time_seconds")
        if wait is None or (isinstance(wait, (int, float)) and not isinstance(wait, bool)
                            and wait > 0.2):
            case.body["wait_time_seconds"] = 0
    response = case.call(timeout=30)
    assert not TRACEBACK.search(response.content), response.content[:2000]
    case.validate_response(response, checks=[
        not_a_server_error, status_code_conformance, content_type_conformance,
        response_schema_conformance])


@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzz_operation_no_5xx_no_traceback_conforms(api_schema, method, path):
    op = api_schema[path][method]
    # valid requests and invalid ones (an operation without parameters has only valid
    # ones: one_of draws from the other strategy when one cannot be satisfied)
    strategy = st.one_of(op.as_strategy(GenerationMode.POSITIVE),
                         op.as_strategy(GenerationMode.NEGATIVE))

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
              suppress_health_check=list(HealthCheck))
    def fuzz(case):
        _check(case)
    fuzz()


# -- the SQS JSON protocol (POST / with X-Amz-Target), which the document does not describe --

SQS_EXAMPLES = int(os.environ.get("ACKQUEUE_FUZZ_SQS_EXAMPLES", "80"))
SQS_TYPE = "application/x-amz-json-1.0"
_ACCOUNT = "000000000000"

# Any JSON value: the wrong types (numbers where strings go, lists, objects, null, an
# infinity or NaN, which Python's json module writes and reads) for every parameter.
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_ANY = st.recursive(_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=8), kids, max_size=3)),
    max_leaves=8)
_NAMES = ["fz", "fz-dlq", "fz.fifo", "gone", "bad name!", ""]
_ATTRIBUTE_NAMES = ["All", "DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod",
                    "ReceiveMessageWaitTimeSeconds", "VisibilityTimeout", "RedrivePolicy",
                    "Policy", "FifoQueue", "ContentBasedDeduplication", "QueueArn",
                    "SentTimestamp", "ApproximateReceiveCount", "MessageGroupId", "Nope"]


def _sqs_kinds(base):
    """Strategies of values of the right kind for an SQS parameter, by kind."""
    name = st.one_of(st.sampled_from(_NAMES),
                     st.from_regex(r"[A-Za-z0-9_\-]{1,12}", fullmatch=True))
    number = st.one_of(st.integers(-5, 50000), st.sampled_from(
        ["0", "1", "10", "-1", "x", "1e3", 1.5, float("inf"), float("nan"), 2 ** 64, True]))
    text = st.one_of(st.text(max_size=30), st.sampled_from(["", "a", "0", "-"]))
    policies = st.sampled_from([
        '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:fz-dlq", '
        '"maxReceiveCount": 3}', '{"maxReceiveCount": Infinity, "deadLetterTargetArn": 1}',
        '{"Statement": 1}', "true", "false"])
    attrs = st.dictionaries(st.sampled_from(_ATTRIBUTE_NAMES),
                            st.one_of(number, text, policies), max_size=4)
    msg_attr = st.fixed_dictionaries({}, optional={
        "DataType": st.sampled_from(["String", "Number", "Binary", "String.x", "Nope", ""]),
        "StringValue": st.one_of(text, number, _ANY),
        "BinaryValue": st.one_of(st.sampled_from(["AAEC", "!!", "", 10 ** 12, 3]), _ANY)})
    receipt = st.one_of(st.from_regex(r"[0-9]{1,3}\.[A-Za-z0-9_\-]{24}", fullmatch=True),
                        text)
    return {
        "url": st.one_of(st.sampled_from([f"{base}/{_ACCOUNT}/{n}" for n in _NAMES] + _NAMES),
                         text),
        "name": name, "int": number, "str": text,
        "strs": st.lists(st.one_of(st.sampled_from(_ATTRIBUTE_NAMES + ["SendMessage"]), text),
                         max_size=4),
        "attrs": attrs, "tags": st.dictionaries(text, text, max_size=3),
        "msgattrs": st.dictionaries(st.one_of(st.sampled_from(["a", "b.c", "AWS.x"]), text),
                                    st.one_of(msg_attr, _ANY), max_size=3),
        "receipt": receipt,
        "arn": st.one_of(st.sampled_from([f"arn:aws:sqs:us-east-1:{_ACCOUNT}:{n}"
                                          for n in _NAMES] + ["arn:aws:sqs"]), text),
    }


_SEND = {"MessageBody": "str", "DelaySeconds": "int", "MessageAttributes": "msgattrs",
         "MessageSystemAttributes": "msgattrs", "MessageGroupId": "str",
         "MessageDeduplicationId": "str"}
# action -> {parameter: kind}; "entries:" + action: a batch's entries with these fields.
SQS_PARAMS = {
    "CreateQueue": {"QueueName": "name", "Attributes": "attrs", "tags": "tags"},
    "GetQueueUrl": {"QueueName": "name", "QueueOwnerAWSAccountId": "str"},
    "ListQueues": {"QueueNamePrefix": "str", "NextToken": "str", "MaxResults": "int"},
    "GetQueueAttributes": {"QueueUrl": "url", "AttributeNames": "strs"},
    "SetQueueAttributes": {"QueueUrl": "url", "Attributes": "attrs"},
    "TagQueue": {"QueueUrl": "url", "Tags": "tags"},
    "UntagQueue": {"QueueUrl": "url", "TagKeys": "strs"},
    "ListQueueTags": {"QueueUrl": "url"},
    "ListDeadLetterSourceQueues": {"QueueUrl": "url", "NextToken": "str", "MaxResults": "int"},
    "SendMessage": {"QueueUrl": "url", **_SEND},
    "SendMessageBatch": {"QueueUrl": "url", "Entries": "entries:send"},
    "ReceiveMessage": {"QueueUrl": "url", "MaxNumberOfMessages": "int",
                       "VisibilityTimeout": "int", "WaitTimeSeconds": "int",
                       "AttributeNames": "strs", "MessageSystemAttributeNames": "strs",
                       "MessageAttributeNames": "strs", "ReceiveRequestAttemptId": "str"},
    "DeleteMessage": {"QueueUrl": "url", "ReceiptHandle": "receipt"},
    "DeleteMessageBatch": {"QueueUrl": "url", "Entries": "entries:delete"},
    "ChangeMessageVisibility": {"QueueUrl": "url", "ReceiptHandle": "receipt",
                                "VisibilityTimeout": "int"},
    "ChangeMessageVisibilityBatch": {"QueueUrl": "url", "Entries": "entries:change"},
    "StartMessageMoveTask": {"SourceArn": "arn", "DestinationArn": "arn",
                             "MaxNumberOfMessagesPerSecond": "int"},
    "ListMessageMoveTasks": {"SourceArn": "arn", "MaxResults": "int"},
    "CancelMessageMoveTask": {"TaskHandle": "str"},
    "AddPermission": {"QueueUrl": "url", "Label": "str", "AWSAccountIds": "strs",
                      "Actions": "strs"},
    "RemovePermission": {"QueueUrl": "url", "Label": "str"},
    "PurgeQueue": {"QueueUrl": "url"},
    "DeleteQueue": {"QueueUrl": "url"},          # last: it removes the queues drawn above
}
_ENTRY_FIELDS = {"send": _SEND, "delete": {"ReceiptHandle": "receipt"},
                 "change": {"ReceiptHandle": "receipt", "VisibilityTimeout": "int"}}


def _fields(fields, kinds):
    """A JSON object of some of fields, each of its kind or of any JSON type."""
    return st.fixed_dictionaries({}, optional={
        key: st.one_of(kinds[kind], kinds[kind], _ANY) for key, kind in fields.items()})


def sqs_params(action, base):
    """The strategy of an action's parameters: right and wrong types, some missing."""
    kinds = _sqs_kinds(base)
    entry_id = st.one_of(st.sampled_from(["a", "b", "c"]), st.text(max_size=5), _ANY)
    for what, fields in _ENTRY_FIELDS.items():
        entry = st.builds(lambda e, i: dict(e, Id=i), _fields(fields, kinds), entry_id)
        kinds["entries:" + what] = st.lists(st.one_of(entry, entry, _ANY), max_size=11)
    return _fields(SQS_PARAMS[action], kinds)


def _bounded(action, params):
    """The params with no long wait: a receive's WaitTimeSeconds and a queue's
    ReceiveMessageWaitTimeSeconds that are numbers become 0 (kept when they are not, so
    that the service's checks of them are fuzzed)."""
    wait = params.get("WaitTimeSeconds")
    if action == "ReceiveMessage" and not isinstance(wait, bool):
        try:
            if int(wait) > 0:                   # what the service's integer() reads
                params["WaitTimeSeconds"] = 0
        except (TypeError, ValueError, OverflowError):
            pass
    attrs = params.get("Attributes")
    if isinstance(attrs, dict) and "ReceiveMessageWaitTimeSeconds" in attrs:
        attrs["ReceiveMessageWaitTimeSeconds"] = "0"
    return params


def sqs_call(session, base, action, body):
    """POST body to the SQS endpoint as action: the response, checked to be no 5xx, no
    traceback, and an SQS JSON answer (an error in SQS's shape)."""
    r = session.post(base + "/", data=body, timeout=30,
                     headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": SQS_TYPE})
    assert r.status_code < 500, (action, body[:1000], r.status_code, r.content[:1000])
    assert not TRACEBACK.search(r.content), r.content[:2000]
    assert r.headers["Content-Type"].startswith(SQS_TYPE), r.headers
    doc = r.json()
    assert isinstance(doc, dict), doc
    if r.status_code >= 400:
        assert doc["__type"].startswith("com.amazonaws.sqs#"), doc
        assert isinstance(doc["message"], str) and r.headers["x-amzn-query-error"], doc
    return r


@pytest.fixture(scope="module")
def sqs(live):
    """(base URL, a requests session) with queues the fuzzed requests name: fz (its
    dead letters to fz-dlq), fz-dlq and fz.fifo, each holding a few messages."""
    import requests
    base, session = live[0], requests.Session()
    redrive = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{_ACCOUNT}:fz-dlq",
                          "maxReceiveCount": 2})
    for name, attrs in (("fz-dlq", {}), ("fz", {"RedrivePolicy": redrive}),
                        ("fz.fifo", {"FifoQueue": "true",
                                     "ContentBasedDeduplication": "true"})):
        assert sqs_call(session, base, "CreateQueue", json.dumps(
            {"QueueName": name, "Attributes": attrs})).status_code == 200
        for i in range(3):
            extra = {"MessageGroupId": "g"} if name.endswith(".fifo") else {}
            assert sqs_call(session, base, "SendMessage", json.dumps(dict(
                QueueUrl=f"{base}/{_ACCOUNT}/{name}", MessageBody=f"m{i}",
                **extra))).status_code == 200
    yield base, session
    session.close()


@pytest.mark.parametrize("action", list(SQS_PARAMS))
def test_fuzz_sqs_action_no_5xx(sqs, action):
    base, session = sqs

    @given(params=sqs_params(action, base))
    @settings(max_examples=SQS_EXAMPLES, deadline=None, database=None,
              derandomize=DERANDOMIZE, suppress_health_check=list(HealthCheck))
    def fuzz(params):
        sqs_call(session, base, action, json.dumps(_bounded(action, params)).encode())
    fuzz()


def test_the_fuzzed_sqs_actions_are_every_action_the_service_has():
    from ackqueue.service.sqs import ACTIONS
    assert set(SQS_PARAMS) == set(ACTIONS)


# Bodies that are not an SQS request: not JSON, not UTF-8, JSON but not an object,
# deeply nested, and any target, known or not.
_BODIES = st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                    _ANY.map(lambda v: json.dumps(v).encode()),
                    st.integers(1, 200000).map(lambda n: b"[" * n),
                    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n))


@given(action=st.one_of(st.sampled_from(list(SQS_PARAMS)), st.text(max_size=20)),
       body=_BODIES)
@settings(max_examples=4 * SQS_EXAMPLES, deadline=None, database=None,
          derandomize=DERANDOMIZE, suppress_health_check=list(HealthCheck))
def test_fuzz_sqs_malformed_bodies_and_targets_no_5xx(sqs, action, body):
    # a header cannot carry every character: the fuzzer's target goes as UTF-8 bytes,
    # what is left of it once control characters are taken out
    action = "".join(c for c in action if c.isprintable())
    sqs_call(sqs[1], sqs[0], action.encode("utf-8").decode("latin-1"), body)


def test_the_service_logged_no_internal_error(live):
    # Runs after the fuzzing (pytest keeps the order of a module's tests).
    with open(live[1], encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert "internal error" not in text and "Traceback" not in text, text[-3000:]
