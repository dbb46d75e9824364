"""The service's stats page, /stats.json, /metrics, TLS and access control (issue 22
points 6 and 7), against the real console script (ackqueue serve ... --port 0).

The stats page is checked in a real headless browser (Debian's chromium), skipped with
a reason where none is installed.  Waits are bounded failure limits, never
synchronization."""
import base64
import http.client
import json
import os
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

from tests.test_service import until                 # noqa: E402
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
