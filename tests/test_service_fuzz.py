"""Fuzzing the live service with schemathesis (issue 22 point 8).

The real console script (`ackqueue serve PATH --port 0`) is started once for this module;
the OpenAPI document is loaded from its /openapi.json, and every operation the document
lists becomes a test of its own (so routes other fronts add to the document are fuzzed
as soon as they are described there).  For every generated request, valid or not: no 5xx,
no traceback text in the body, and the response conforms to the document (status code,
content type, body schema)."""
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


def test_the_service_logged_no_internal_error(live):
    # Runs after the fuzzing (pytest keeps the order of a module's tests).
    with open(live[1], encoding="utf-8", errors="replace") as f:
        text = f.read()
    assert "internal error" not in text and "Traceback" not in text, text[-3000:]
