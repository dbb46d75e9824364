"""(service) The durable request floor: what a bare server allows when every request must
be durable before it is answered, with the clients of the service scenario.

The service's one-at-a-time and batch targets (and the remote drop-in's in (g)) ask for a
rate of durable requests: a put, or a receive carrying the previous ack, is answered only
once its commit is on disk.  The request floor (a bare server answering GETs) says what
HTTP alone allows; this says what HTTP plus the durable write allows, with no queue at all:

- ``fsync``: a bare asyncio.Protocol HTTP/1.1 server; every POST's body is appended to a
  file by one writer thread, which writes and fsyncs whatever gathered meanwhile as one
  group (group commit) and then wakes the loop once to answer the whole group;
- ``zodb``: the same, but the group is one ZODB FileStorage commit (fsync'd, as
  ackqueue's are) of one persistent record holding the group's bodies: the least a queue
  on FileStorage writes to make those bytes durable;
- ``aiohttp-zodb``: ``zodb`` served by aiohttp, the service's HTTP stack, instead of a
  bare protocol: one POST route whose handler awaits the group commit.  What the stack
  the service runs on allows before any queue work.

4 client processes (as 2 producers + 2 consumers) each send sequential keep-alive POSTs
through ackqueue.remote.http, the client the scenario's processes use, each with the body of
one pickled benchmark item, or of 10 in frames for the batch floor.  One message at a time
costs two durable requests per message (its put, and the receive carrying its ack), a
batch of 10 two per 10 messages; so the floor on items/s is rps / 2 and rps * 10 / 2.
"""
import asyncio
import os
import pickle
import shutil
import sys
import tempfile
import time

from benchmarks.bare_server import Proto, Writer
from benchmarks.children import Child, report, serve_app, until_terminated
from benchmarks.common import make_item
from benchmarks.scenarios.shared import record_failure

KINDS = ("fsync", "zodb", "aiohttp-zodb")
CLIENTS = 4
LABELS = {"fsync": "bare asyncio.Protocol, group-committed append + fsync",
          "zodb": "bare asyncio.Protocol, group-committed ZODB FileStorage commit",
          "aiohttp-zodb": "aiohttp (the service's stack), group-committed ZODB FileStorage "
                          "commit"}


def _aiohttp_server(path):
    from aiohttp import web

    async def main():
        loop = asyncio.get_running_loop()

        def durable(group):
            for future, _ in group:
                if not future.done():
                    future.set_result(None)

        writer = Writer("zodb", path, loop, durable)

        async def post(request):
            body = await request.read()
            future = loop.create_future()
            writer.submit(future, body)
            await future
            return web.Response(body=b"{}", content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/queues/{name}/messages", post)
        await serve_app(app)
    asyncio.run(main())


def child_server(kind, path):
    """A durable floor server on a free loopback port (stopped with SIGTERM)."""
    if kind == "aiohttp-zodb":
        return _aiohttp_server(path)

    async def main():
        loop = asyncio.get_running_loop()
        writer = Writer(kind, path, loop)
        srv = await loop.create_server(
            lambda: Proto(lambda line, transport, body: writer.submit(transport, body)),
            "127.0.0.1", 0)
        report(event="ready", port=srv.sockets[0].getsockname()[1])
        await until_terminated()
    asyncio.run(main())


def child_client(port, batch, seconds):
    from ackqueue.remote.http import Connection
    from benchmarks.contenders.service import encode_frames
    report(event="ready", pid=os.getpid())
    sys.stdin.readline()                                   # "go"
    items = [pickle.dumps(make_item(n), protocol=5) for n in range(int(batch))]
    body = items[0] if int(batch) == 1 else encode_frames(items)
    c = Connection("127.0.0.1", int(port), 30)
    n, t0 = 0, time.perf_counter()
    end = t0 + float(seconds)
    while time.perf_counter() < end:
        c.request("POST", "/v1/queues/bench/messages", body,
                  {"Content-Type": "application/x-python-pickle", "X-Client-Id": "floor"})
        n += 1
    report(event="done", n=n, seconds=time.perf_counter() - t0)


def floor_one(kind, batch, seconds, tmp_root, cpu_of):
    """{"metrics": {"rps", "items_per_s", "server_cpu"}} of one floor run."""
    directory = tempfile.mkdtemp(prefix=f"ackbench-svc-durable-{kind}-", dir=tmp_root)
    out, server, clients = {"kind": kind, "batch": batch}, None, []
    try:
        server = Child(directory, f"durable-{kind}", "sdurablesrv", kind,
                       os.path.join(directory, "floor.data"))
        port = server.expect("ready", 60)["port"]
        clients = [Child(directory, f"client{k}", "sdurablecli", port, batch, seconds)
                   for k in range(CLIENTS)]
        for c in clients:
            c.expect("ready", 60)
        cpu0, t0 = cpu_of(server), time.time()
        for c in clients:
            c.send("go")
        reps = [c.expect("done", float(seconds) + 60) for c in clients]
        wall, cpu1 = time.time() - t0, cpu_of(server)
        rps = sum(r["n"] / r["seconds"] for r in reps)
        out["metrics"] = {"rps": rps, "items_per_s": rps * batch / 2}
        if cpu0 is not None and cpu1 is not None:
            out["metrics"]["server_cpu"] = (cpu1 - cpu0) / wall
    except Exception as exc:   # noqa: BLE001
        record_failure(out, exc)
    finally:
        for c in clients:
            c.finish(10)
        if server is not None:
            server.proc.terminate()
            out["exit_code"] = server.finish(10)
        shutil.rmtree(directory, ignore_errors=True)
    return out
