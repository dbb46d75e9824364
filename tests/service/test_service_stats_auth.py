"""The service's stats page, /stats.json, /metrics, TLS and access control,
against the real console script (ackqueue serve ... --port 0).

The stats page is checked in a real headless browser (Debian's chromium), skipped with
a reason where none is installed.  Waits are bounded failure limits, never
synchronization."""
import base64
import http.client
import json
import re
import select
import shutil
import signal
import ssl
import subprocess
import threading
import time

import pytest

pytest.importorskip("aiohttp")

from tests.certs import self_signed_for_loopback      # noqa: E402
from tests.service.test_service import until                 # noqa: E402
from tests.zeo_server import console_script           # noqa: E402

START_TIMEOUT = 30


class Served:
    """One ackqueue serve process; speaks HTTP or HTTPS (trusting cafile) to it."""

    def __init__(self, tmp_path, *extra, path="q.fs", cafile=None, token=None):
        self.tmp_path = tmp_path
        self.cafile = cafile
        self.token = token
        args = [console_script(), "serve"] + (
            ["--memory"] if path is None else [str(tmp_path / path)]) + ["--port", "0"]
        args += list(extra)
        self.log = open(tmp_path / "service.log", "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        self.line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"listening on (https?)://([0-9.]+):(\d+)", self.line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the service did not start: {self.line!r}")
        self.scheme, self.host, self.port = found.group(1), found.group(2), int(found.group(3))

    def conn(self, timeout=20):
        if self.scheme == "https":
            ctx = ssl.create_default_context(cafile=self.cafile)
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                               context=ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def call(self, method, url, body=None, headers=None, token=...):
        headers = dict(headers or {})
        token = self.token if token is ... else token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        c = self.conn()
        try:
            c.request(method, url, body=body, headers=headers)
            r = c.getresponse()
            data = r.read()
            self.last_headers = r.headers
            if "json" in r.getheader("Content-Type", ""):
                return r.status, json.loads(data)
            return r.status, data
        finally:
            c.close()

    def put(self, queue, body, query="", **kw):
        status, doc = self.call("POST", f"/v1/queues/{queue}/messages?{query}", body, **kw)
        assert status == 200, doc
        return doc["id"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.proc.stdout.close()
            self.log.close()


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(*extra, **kw):
        s = Served(tmp_path, *extra, **kw)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(30)


def _fill(s):
    """jobs: 3 put, 1 of them received (in flight), 1 delayed; mail: 1 put, received."""
    for body in (b"a", b"b", b"c"):
        s.put("jobs", body)
    s.put("jobs", b"later", "delay=600")
    s.put("mail", b"m")
    for queue in ("jobs", "mail"):
        status, doc = s.call("POST", f"/v1/queues/{queue}/receive",
                             headers={"X-Client-Id": "worker"})
        assert status == 200 and len(doc["messages"]) == 1


def _rows(doc):
    return {row["name"]: row for row in doc["queues"]}


# -- /stats.json and /metrics -------------------------------------------------------------

def test_stats_json_counts_ages_and_rates(serve):
    s = serve()
    _fill(s)
    status, doc = s.call("GET", "/stats.json")
    assert status == 200
    rows = _rows(doc)
    assert set(rows) == {"jobs", "mail"}
    jobs, mail = rows["jobs"], rows["mail"]
    assert (jobs["ready"], jobs["in_flight"], jobs["delayed"]) == (2, 1, 1)
    assert (mail["ready"], mail["in_flight"], mail["delayed"]) == (0, 1, 0)
    assert jobs["dead_lettered"] == 0 and jobs["totals"]["put"] == 4
    assert jobs["oldest_age"] is not None and jobs["oldest_age"] >= 0
    assert mail["oldest_age"] is None                  # nothing ready: no age
    assert doc["service"]["clients"] == 1
    # Rates: the put and acked totals between two samples over the seconds between them.
    for body in (b"1", b"2", b"3", b"4", b"5"):
        s.put("mail", body)
    status, doc = s.call("POST", "/v1/queues/jobs/receive",
                         headers={"X-Client-Id": "worker"})
    receipt = doc["messages"][0]["receipt"]
    assert s.call("POST", f"/v1/queues/jobs/ack?receipt={receipt}")[0] == 200
    time.sleep(0.6)            # a sample is taken at most every 0.5 s (not a sync wait)
    status, doc = s.call("GET", "/stats.json")
    rows, span = _rows(doc), doc["rate_window"]
    assert span is not None and span > 0
    assert rows["mail"]["in_rate"] * span == pytest.approx(5)
    assert rows["mail"]["out_rate"] == 0
    assert rows["jobs"]["in_rate"] == 0
    assert rows["jobs"]["out_rate"] * span == pytest.approx(1)
    assert s.stop() == 0


def test_metrics_parse_with_prometheus_client(serve):
    parser = pytest.importorskip("prometheus_client.parser")
    s = serve()
    _fill(s)
    waiter = threading.Thread(target=lambda: s.call(
        "POST", "/v1/queues/empty/receive?wait=20", headers={"X-Client-Id": "poller"}))
    waiter.start()
    until(lambda: s.call("GET", "/health")[1]["long_polls"] == 1)
    status, text = s.call("GET", "/metrics")
    assert status == 200
    assert s.last_headers["Content-Type"].startswith("text/plain")
    samples = {}
    types = {}
    for family in parser.text_string_to_metric_families(text.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("queue"))] = sample.value
    assert samples[("ackqueue_queue_ready", "jobs")] == 2
    assert samples[("ackqueue_queue_in_flight", "jobs")] == 1
    assert samples[("ackqueue_queue_delayed", "jobs")] == 1
    assert samples[("ackqueue_queue_in_flight", "mail")] == 1
    assert samples[("ackqueue_queue_put_total", "jobs")] == 4
    assert samples[("ackqueue_queue_acked_total", "jobs")] == 0
    assert samples[("ackqueue_queue_oldest_ready_age_seconds", "jobs")] >= 0
    assert ("ackqueue_queue_oldest_ready_age_seconds", "mail") not in samples
    assert types["ackqueue_queue_put"] == "counter"
    assert types["ackqueue_queue_ready"] == "gauge"
    assert samples[("ackqueue_service_long_polls", None)] == 1
    assert samples[("ackqueue_service_threads", None)] >= 1
    s.put("empty", b"wake")                          # ends the long poll
    waiter.join(15)
    assert not waiter.is_alive()
    assert s.stop() == 0


# -- the page in a real browser -----------------------------------------------------------

def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_stats_page_in_headless_chromium(serve, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium; "
                    ".ci/run installs it when it runs as root with apt-get)")
    s = serve()
    _fill(s)
    status, html = s.call("GET", "/stats")
    assert status == 200 and b"<script>" in html
    assert b"jobs" not in html               # the rows come from the script, not the server
    out = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000",
         "--dump-dom", f"http://127.0.0.1:{s.port}/stats"],
        capture_output=True, text=True, timeout=120)
    dom = out.stdout
    assert 'data-queue="jobs"' in dom, (dom[-2000:], out.stderr[-2000:])
    refreshes = int(re.search(r'data-refreshes="(\d+)"', dom).group(1))
    assert refreshes >= 1

    def cells(queue):
        row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', dom).group(1)
        return dict(re.findall(r'data-field="(\w+)">([^<]*)<', row))
    jobs, mail = cells("jobs"), cells("mail")
    assert (jobs["ready"], jobs["in_flight"], jobs["delayed"], jobs["dead_lettered"]) == (
        "2", "1", "1", "0")
    assert (mail["ready"], mail["in_flight"], mail["delayed"]) == ("0", "1", "0")
    assert jobs["oldest_age"].endswith(" s") and mail["oldest_age"] == "\u2013"
    assert re.search(r'<span id="status" class="">updated ', dom), dom[:3000]
    assert s.stop() == 0


# -- TLS ------------------------------------------------------------------------------------

@pytest.fixture
def cert(tmp_path):
    """A self-signed certificate for 127.0.0.1 made with the openssl command line."""
    certfile, keyfile = self_signed_for_loopback(tmp_path)
    return str(certfile), str(keyfile)


def test_https_round_trip_and_plain_http_refused(serve, cert):
    certfile, keyfile = cert
    s = serve("--tls-cert", certfile, "--tls-key", keyfile, cafile=certfile)
    assert s.scheme == "https"
    mid = s.put("jobs", b"over tls")
    status, doc = s.call("POST", "/v1/queues/jobs/receive", headers={"X-Client-Id": "c"})
    assert status == 200 and [m["id"] for m in doc["messages"]] == [mid]
    assert base64.b64decode(doc["messages"][0]["body"]) == b"over tls"
    # Plain HTTP on the TLS port gets no HTTP answer.
    plain = http.client.HTTPConnection("127.0.0.1", s.port, timeout=20)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/health")
        plain.getresponse()
    plain.close()
    # A client that does not trust the certificate refuses the service.
    untrusting = http.client.HTTPSConnection("127.0.0.1", s.port, timeout=20,
                                             context=ssl.create_default_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.request("GET", "/health")
    untrusting.close()
    assert s.stop() == 0


# -- access control ---------------------------------------------------------------------------

ALICE, BOB, ADMIN = "alice-secret-0123456789", "bob-secret-0123456789", "admin-secret-012345678"


@pytest.fixture
def auth_file(tmp_path):
    import hashlib
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {
        "alice": {"secret": ALICE, "rights": {"jobs*": ["read", "write"], "*": ["read"]}},
        "bob": {"secret_sha256": hashlib.sha256(BOB.encode()).hexdigest(),
                "rights": {"jobs.in": ["write"], "mail": ["read"]}},
        "root": {"secret": ADMIN, "rights": {"*": ["admin"]}}}}))
    return str(path)


def test_auth_401_without_or_with_a_wrong_token(serve, auth_file):
    s = serve("--auth", auth_file)
    assert s.call("GET", "/health")[0] == 200                 # stays open
    for token in (None, "not-a-secret-of-anyone", ALICE + "x"):
        status, doc = s.call("POST", "/v1/queues/jobs/messages", b"x", token=token)
        assert status == 401 and doc["error"]["code"] == "Unauthenticated", (token, doc)
        challenges = s.last_headers.get_all("WWW-Authenticate")
        assert any(c.startswith("Bearer ") for c in challenges)
    status, _ = s.call("GET", "/v1/queues/jobs", headers={"Authorization": "Basic !!"},
                       token=None)
    assert status == 401
    status, _ = s.call("GET", "/no/such/route", token=None)
    assert status == 401                                    # unknown routes need a client
    status, doc = s.call("GET", "/no/such/route", token=ALICE)
    assert status == 404 and doc["error"]["code"] == "NotFound"
    assert s.stop() == 0


def test_auth_rights_per_queue_pattern(serve, auth_file):
    s = serve("--auth", auth_file)
    # alice: read and write on jobs*, read elsewhere.
    s.put("jobs", b"a", token=ALICE)
    s.put("jobs.urgent", b"b", token=ALICE)
    status, doc = s.call("POST", "/v1/queues/mail/messages", b"c", token=ALICE)
    assert status == 403 and doc["error"]["code"] == "Forbidden"
    assert "write" in doc["error"]["message"] and "mail" in doc["error"]["message"]
    # bob: write on jobs.in only, read on mail only; the hashed secret works.
    s.put("jobs.in", b"d", token=BOB)
    s.put("mail", b"e", token=ADMIN)                        # admin includes write
    status, doc = s.call("POST", "/v1/queues/jobs.in/receive", token=BOB,
                         headers={"X-Client-Id": "bob"})
    assert status == 403                                     # no read on jobs.in
    status, doc = s.call("POST", "/v1/queues/mail/receive", token=BOB,
                         headers={"X-Client-Id": "bob:1"})
    assert status == 200 and len(doc["messages"]) == 1
    receipt = doc["messages"][0]["receipt"]
    status, doc = s.call("POST", f"/v1/queues/mail/ack?receipt={receipt}", token=BOB)
    assert (status, doc) == (200, {"acked": 1})               # consuming needs read only
    status, _ = s.call("POST", "/v1/queues/jobs/messages", b"f", token=BOB)
    assert status == 403
    # alice reads anything: receive from mail is allowed, under her own client ids only.
    status, doc = s.call("POST", "/v1/queues/jobs/receive", token=ALICE,
                         headers={"X-Client-Id": "alice:w1"})
    assert status == 200 and len(doc["messages"]) == 1
    status, doc = s.call("POST", "/v1/queues/jobs/receive", token=ALICE,
                         headers={"X-Client-Id": "bob"})
    assert status == 403 and "client id" in doc["error"]["message"]
    assert s.call("DELETE", "/v1/leases/bob", token=ALICE)[0] == 403
    assert s.call("DELETE", "/v1/leases/alice:w1", token=ALICE)[0] == 200
    assert s.stop() == 0


def test_auth_reads_sasquatch_queue_names_from_the_body(auth_file):
    """Routes added by another front (Sasquatch's /send, /send_batch, /delete_all) are
    checked on the queue names of their JSON body: the middleware before a stand-in
    handler, served over real HTTP in this process."""
    import asyncio
    from aiohttp import web
    from ackqueue.service.auth import load_auth
    auth = load_auth(auth_file)
    bodies = []

    async def handler(request):
        bodies.append(await request.read())               # the body is still there
        return web.json_response({"ok": True})
    app = web.Application(middlewares=[auth.middleware])
    for path in ("/send", "/send_batch", "/delete_all", "/receive"):
        app.router.add_post(path, handler)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever)
    thread.start()

    def post(path, doc, token):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        try:
            c.request("POST", path, json.dumps(doc),
                      {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            return r.status
        finally:
            c.close()
    try:
        assert post("/send", {"queue_name": "jobs", "message_body": "x"}, ALICE) == 200
        assert bodies[-1] == json.dumps({"queue_name": "jobs", "message_body": "x"}).encode()
        assert post("/send", {"queue_name": "mail", "message_body": "x"}, ALICE) == 403
        assert post("/send", {"message_body": "no queue named"}, ALICE) == 403
        batch = {"messages": [{"queue_name": "jobs", "message_body": "1"},
                              {"queue_name": "jobs.x", "message_body": "2"}]}
        assert post("/send_batch", batch, ALICE) == 200
        batch["messages"].append({"queue_name": "mail", "message_body": "3"})
        assert post("/send_batch", batch, ALICE) == 403
        assert post("/receive", {"queue_name": "mail"}, ALICE) == 200
        assert post("/receive", {"queue_name": "mail",
                                 "dead_letter_queue_name": "mail-dlq"}, ALICE) == 403
        assert post("/delete_all", {"queue_name": "*"}, ALICE) == 403
        assert post("/delete_all", {"queue_name": "*"}, ADMIN) == 200
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_auth_admin_only_routes(serve, auth_file):
    s = serve("--auth", auth_file)
    s.put("jobs", b"a", token=ALICE)
    for path in ("/stats", "/stats.json", "/metrics"):
        for token in (ALICE, BOB):
            status, doc = s.call("GET", path, token=token)
            assert status == 403 and doc["error"]["code"] == "Forbidden", (path, token)
        assert s.call("GET", path, token=ADMIN)[0] == 200
    assert s.call("POST", "/v1/queues/jobs/purge", token=ALICE)[0] == 403
    assert s.call("POST", "/v1/queues/jobs/purge", token=ADMIN) == (200, {"purged": 1})
    assert s.call("GET", "/v1/queues", token=BOB)[0] == 403      # needs read on "*"
    assert s.call("GET", "/v1/queues", token=ALICE)[0] == 200
    # A browser sends Basic credentials (name and secret) after the 401's challenge.
    basic = base64.b64encode(f"root:{ADMIN}".encode()).decode()
    assert s.call("GET", "/stats.json", headers={"Authorization": f"Basic {basic}"},
                  token=None)[0] == 200
    wrong = base64.b64encode(f"alice:{ADMIN}".encode()).decode()
    assert s.call("GET", "/stats.json", headers={"Authorization": f"Basic {wrong}"},
                  token=None)[0] == 401
    assert s.stop() == 0


def test_bad_auth_file_refused_at_start(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {"a": {"secret": "short", "rights": {"*": ["fly"]}}}}))
    out = subprocess.run([console_script(), "serve", "--memory", "--port", "0",
                          "--auth", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert "at least 16 characters" in line                      # every problem listed
    assert "rights of '*' are a list among read, write, admin" in line


# -- exposure -------------------------------------------------------------------------------

def test_non_loopback_needs_tls_and_auth_or_insecure(tmp_path, auth_file):
    args = [console_script(), "serve", "--memory", "--host", "0.0.0.0", "--port", "0"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert "refusing to listen on 0.0.0.0" in line and "--insecure" in line
    out = subprocess.run(args + ["--auth", auth_file], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "without TLS" in out.stderr
    # With --insecure it starts: read its line, then stop it.
    proc = subprocess.Popen(args + ["--insecure"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"listening on http://0\.0\.0\.0:(\d+)", line)
        assert found, line
        c = http.client.HTTPConnection("127.0.0.1", int(found.group(1)), timeout=20)
        c.request("GET", "/health")
        assert c.getresponse().status == 200
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        proc.stdout.close()


def test_every_route_has_a_rule_and_the_figures_are_documented():
    """No route of make_app falls to the unknown-route default by oversight, no rule
    names a route that does not exist, and /openapi.json describes the figures and the bearer scheme."""
    from ackqueue.service.auth import ROUTES
    from ackqueue.service.backend import Service
    from ackqueue.service.app import make_app
    from ackqueue.service.openapi import document
    service = Service(None)
    try:
        app = make_app(service, pool_size=1)
        routes = {(r.method, r.resource.canonical) for r in app.router.routes()
                  if r.method != "HEAD"}
    finally:
        from ackqueue.service.app import API
        app[API].pool.shutdown()
        service.close()
    assert routes and routes <= set(ROUTES), routes - set(ROUTES)
    assert set(ROUTES) <= routes, set(ROUTES) - routes      # a rule with no route
    doc = document()
    assert {"/stats", "/stats.json", "/metrics"} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
