"""The service's figures for people and for monitoring.

- ``GET /stats``: an HTML page a person reads (everything inline, no external asset): every
  queue with its ready / in flight / delayed counts, its dead-lettered total, the age of
  the message at its head, and its in/out rates; a small script refreshes it from
  ``/stats.json`` every second.  A client asking for JSON (Accept: application/json or
  ?format=json) gets Sasquatch's /stats instead when that front is installed
  (add_routes' json_first: app.py gives it rpc.sasquatch_stats).
- ``GET /stats.json``: the same figures as JSON.
- ``GET /metrics``: the same figures in Prometheus' text format (prometheus_client).

Figures, per queue:

- ready, in_flight, delayed: ``q.counts()``;
- dead_lettered: the queue's lifetime total of messages dead-lettered (moved to a
  dead-letter queue or dropped after too many receives), from ``q.stats()``.  A queue has
  no fixed dead-letter queue in ackqueue (each get names its own), so "dead" is this total,
  labelled so;
- oldest_age: seconds since the put of the message at the head of the ready set (the
  first message ``q.browse()`` yields; only that one is read).  For a FIFO queue that is
  the oldest ready message; for a LIFO or priority queue it is the next one delivered.
  None when nothing is ready;
- in_rate, out_rate: messages put and acknowledged per second, from the ``put`` and
  ``acked`` totals sampled each time the figures are read (at most every half second),
  over the last RATE_WINDOW seconds; None until two samples exist.
"""
import inspect
import json
import threading
import time
from collections import deque

from aiohttp import web

from .errors import error_response

__all__ = ["add_routes", "Figures", "snapshot", "STATS_PAGE"]

RATE_WINDOW = 10.0          # seconds of samples the rates average over
MIN_SAMPLE_GAP = 0.5        # a read sooner than this after the last sample adds none


def head_age(q):
    """Age in seconds of the first message of q's ready set, or None (reads one message)."""
    it = q.browse()
    try:
        m = next(iter(it), None)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    if m is None or m.state != "ready":
        return None
    return max(0.0, float(m.age))


def snapshot(service):
    """{name: figures} of every queue of service's storage (blocking: call from the pool)."""
    listed = service.list_queues()
    out = {}
    for name in sorted(listed):
        row = {"name": name, "ready": None, "in_flight": None, "delayed": None,
               "dead_lettered": None, "oldest_age": None, "totals": {}}
        try:
            q = service.queue(name)
            st = q.stats()
            row["oldest_age"] = head_age(q)
        except Exception as exc:       # e.g. a queue of another kind: counts from the store
            st = dict(listed[name] or {})
            row["note"] = f"{type(exc).__name__}: {exc}"
        for key in ("ready", "in_flight", "delayed"):
            row[key] = st.pop(key, None)
        row["totals"] = {k: v for k, v in st.items() if isinstance(v, int)}
        row["dead_lettered"] = row["totals"].get("dead_lettered")
        out[name] = row
    return out


class Figures:
    """Snapshots of the service's queues and the rates between them."""

    def __init__(self, api, *, window=RATE_WINDOW, clock=time.monotonic):
        self.api = api
        self.window = window
        self.clock = clock
        self.samples = deque()        # (clock time, {name: (put, acked)})

    def _sample(self, now, queues):
        if self.samples and now - self.samples[-1][0] < MIN_SAMPLE_GAP:
            return
        self.samples.append((now, {n: (r["totals"].get("put"), r["totals"].get("acked"))
                                   for n, r in queues.items()}))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()

    def _rates(self, now, queues):
        """Adds in_rate and out_rate to every row; returns the seconds they cover."""
        first = self.samples[0] if self.samples else None
        span = now - first[0] if first is not None else 0.0
        for name, row in queues.items():
            row["in_rate"] = row["out_rate"] = None
            then = first[1].get(name) if first is not None else None
            if then is None or span <= 0:
                continue
            put, acked = row["totals"].get("put"), row["totals"].get("acked")
            if put is not None and then[0] is not None:
                row["in_rate"] = max(0.0, (put - then[0]) / span)
            if acked is not None and then[1] is not None:
                row["out_rate"] = max(0.0, (acked - then[1]) / span)
        return span if span > 0 else None

    def service_figures(self):
        api = self.api
        return {"long_polls": sum(len(w) for w in api.waiters.values()),
                "threads": threading.active_count(),
                "clients": len(api.service.leases.sessions),
                "queues_open": len(api.service.queues),
                "uptime": time.time() - api.started}

    async def read(self):
        """The figures now (a snapshot in the pool), with rates."""
        queues = await self.api.run(snapshot, self.api.service)
        now = self.clock()
        self._sample(now, queues)
        span = self._rates(now, queues)
        return {"time": time.time(), "rate_window": span, "service": self.service_figures(),
                "queues": list(queues.values())}


# -- the page -----------------------------------------------------------------------------

STATS_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ackqueue: queues</title>
<style>
body{font:15px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;
color:#1d2330;background:#f6f7f9}
h1{font-size:20px;margin:0 0 4px}
#meta{color:#5a6372;margin-bottom:16px}
#meta span{margin-right:18px}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 3px rgba(0,0,0,.12);
min-width:900px}
th,td{padding:8px 14px;border-bottom:1px solid #e4e7ec;text-align:right;
font-variant-numeric:tabular-nums}
th{background:#eef1f5;font-weight:600;font-size:13px;color:#3b4352}
th:first-child,td:first-child{text-align:left;font-weight:600}
td.zero{color:#a0a7b4}
td.dead{color:#b42318}
#status.err{color:#b42318;font-weight:600}
footer{margin-top:14px;color:#7a8391;font-size:13px}
</style></head>
<body>
<h1>ackqueue: queues</h1>
<div id="meta"><span id="status">loading&hellip;</span><span id="service"></span></div>
<table id="queues" data-refreshes="0">
<thead><tr><th>Queue</th><th>Ready</th><th>In flight</th><th>Delayed</th>
<th title="lifetime total of messages dead-lettered (moved to a dead-letter queue or dropped after too many receives)">Dead-lettered (total)</th>
<th title="seconds since the put of the message at the head of the ready set">Oldest ready</th>
<th title="messages put per second">In /s</th>
<th title="messages acknowledged per second">Out /s</th></tr></thead>
<tbody><tr><td colspan="8">loading&hellip;</td></tr></tbody>
</table>
<footer>Refreshed every second from <a href="stats.json">stats.json</a>; rates over the
last <span id="window">&ndash;</span> s. Figures for monitoring: <a href="metrics">/metrics</a>.</footer>
<script>
"use strict";
(function () {
  var table = document.getElementById("queues");
  var tbody = table.tBodies[0];
  function age(s) {
    if (s === null || s === undefined) return "\\u2013";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor(s % 86400 / 3600) + " h";
  }
  function num(v) { return v === null || v === undefined ? "\\u2013" : String(v); }
  function rate(v) { return v === null || v === undefined ? "\\u2013" : v.toFixed(1); }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }
  function render(doc) {
    var rows = document.createDocumentFragment();
    doc.queues.forEach(function (q) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-queue", q.name);
      cell(tr, q.name);
      [["ready", q.ready], ["in_flight", q.in_flight], ["delayed", q.delayed]].forEach(
        function (p) { cell(tr, num(p[1]), p[1] === 0 ? "zero" : "").setAttribute("data-field", p[0]); });
      cell(tr, num(q.dead_lettered), q.dead_lettered ? "dead" : "zero").setAttribute("data-field", "dead_lettered");
      cell(tr, age(q.oldest_age)).setAttribute("data-field", "oldest_age");
      cell(tr, rate(q.in_rate)).setAttribute("data-field", "in_rate");
      cell(tr, rate(q.out_rate)).setAttribute("data-field", "out_rate");
      rows.appendChild(tr);
    });
    if (!doc.queues.length) {
      var tr = document.createElement("tr");
      cell(tr, "no queues yet").colSpan = 8;
      rows.appendChild(tr);
    }
    tbody.replaceChildren(rows);
    var s = doc.service;
    document.getElementById("service").textContent =
      doc.queues.length + " queues \\u00b7 " + s.long_polls + " long polls \\u00b7 " +
      s.clients + " clients \\u00b7 " + s.threads + " threads \\u00b7 up " + age(s.uptime);
    document.getElementById("window").textContent =
      doc.rate_window === null ? "\\u2013" : doc.rate_window.toFixed(0);
    var st = document.getElementById("status");
    st.className = "";
    st.textContent = "updated " + new Date(doc.time * 1000).toLocaleTimeString();
    table.setAttribute("data-refreshes", String(Number(table.getAttribute("data-refreshes")) + 1));
  }
  function refresh() {
    fetch("stats.json", {cache: "no-store", credentials: "same-origin"})
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(render)
      .catch(function (e) {
        var st = document.getElementById("status");
        st.className = "err";
        st.textContent = "not updated: " + e.message;
      })
      .then(function () { setTimeout(refresh, 1000); });
  }
  refresh();
})();
</script>
</body></html>
"""


FIGURES = web.AppKey("figures", Figures)
JSON_FIRST = web.AppKey("json_first", object)     # add_routes' json_first


def _wants_json(request):
    return (request.query.get("format") == "json"
            or "application/json" in request.headers.get("Accept", ""))


async def stats_page(request):
    if _wants_json(request):
        other = request.app[JSON_FIRST]
        if other is not None:
            response = other(request)
            if inspect.isawaitable(response):
                response = await response
            if response is not None:
                return response
        return await stats_json(request)
    return web.Response(text=STATS_PAGE, content_type="text/html",
                        headers={"Cache-Control": "no-store"})


async def stats_json(request):
    doc = await request.app[FIGURES].read()
    return web.Response(text=json.dumps(doc), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


async def metrics(request):
    try:
        from .metrics import render
    except ImportError as exc:
        return error_response(501, "NotImplemented", f"/metrics needs prometheus_client "
                              f"(pip install 'ackqueue[service]'): {exc}")
    doc = await request.app[FIGURES].read()
    body, content_type = render(doc)
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_routes(app, api, json_first=None):
    """Serve /stats, /stats.json and /metrics from app (api: the runtime.Api).
    json_first(request): another front's JSON answer to GET /stats (Sasquatch's request
    counters), or None to leave it to this page's figures."""
    app[FIGURES] = Figures(api)
    app[JSON_FIRST] = json_first
    app.router.add_get("/stats", stats_page)
    app.router.add_get("/stats.json", stats_json)
    app.router.add_get("/metrics", metrics)
