"""A floor for (e) across processes through a queue service: what a put in one process
and a long poll in another allow with no queue at all, beside the 2 ms asked of a
wake-up through the service.

The bare mechanism a service wake-up needs, and nothing else: a bare asyncio.Protocol
HTTP/1.1 server (a child process) where ``POST /put`` hands its body to a writer thread
that commits it to a ZODB FileStorage (one record, fsync'd, as ackqueue's commits are)
and, once durable, answers the POST and hands the body to a waiting ``GET /wait`` (a long
poll), or keeps it for the next one.  The clients are the benchmark's processes, each
with one keep-alive ackqueue.remote.http connection: put() is one POST, get() one long poll.
No acks, no ids, no receive rules: a floor, not a queue.

The same floor on aiohttp (``service-wake-floor-aiohttp``): the put and the long poll are
aiohttp handlers awaiting futures the writer settles, as the service's are: what the
service's own HTTP stack allows a wake-up, with the same commit and no queue.
"""
import asyncio
import collections
import functools
import os
import pickle
import re
import select
import subprocess

from benchmarks.bare_server import Proto, Writer, answer
from benchmarks.children import child_command, report, serve_app, stop_server, until_terminated
from benchmarks.common import REPO
from benchmarks.contenders.base import Adapter, SharedContender

START_TIMEOUT = 60
STOP_TIMEOUT = 30


class _Server:
    """The floor server's state, on its event loop: durable bodies no poll took yet, and
    the long polls waiting for one; the group commits are bare_server.Writer's (one
    FileStorage record per group, fsync'd)."""

    def __init__(self, loop, path):
        self.ready = collections.deque()
        self.polls = collections.deque()
        self.writer = Writer("zodb", path, loop, durable=self._durable)

    def request(self, line, transport, body):
        if line.startswith(b"POST"):
            self.writer.submit(transport, body)
        elif self.ready:
            answer(transport, self.ready.popleft())
        else:
            self.polls.append(transport)

    def _durable(self, group):
        for transport, body in group:
            while self.polls and self.polls[0].is_closing():
                self.polls.popleft()
            if self.polls:
                answer(self.polls.popleft(), body)      # the wake-up first
            else:
                self.ready.append(body)
            answer(transport)


class _AiohttpServer:
    """_Server's exchange as aiohttp handlers: a put awaits its durable commit, a poll
    awaits a body (futures settled on the loop by the writer's durable callback)."""

    def __init__(self, loop, path):
        self.loop = loop
        self.ready = collections.deque()
        self.polls = collections.deque()
        self.writer = Writer("zodb", path, loop, durable=self._durable)

    async def put(self, request):
        from aiohttp import web
        body = await request.read()
        done = self.loop.create_future()
        self.writer.submit(done, body)
        await done
        return web.Response(body=b"{}", content_type="application/json")

    async def wait(self, request):
        from aiohttp import web
        if self.ready:
            body = self.ready.popleft()
        else:
            poll = self.loop.create_future()
            self.polls.append(poll)
            body = await poll
        return web.Response(body=body, content_type="application/octet-stream")

    def _durable(self, group):
        for done, body in group:
            while self.polls and self.polls[0].done():     # a poll whose client left
                self.polls.popleft()
            if self.polls:
                self.polls.popleft().set_result(body)      # the wake-up first
            else:
                self.ready.append(body)
            if not done.done():
                done.set_result(None)


async def _serve_aiohttp(path):
    from aiohttp import web
    server = _AiohttpServer(asyncio.get_running_loop(), path)
    app = web.Application()
    app.router.add_post("/put", server.put)
    app.router.add_get("/wait", server.wait)
    await serve_app(app)


def child_server(path, stack="protocol"):
    """python -m benchmarks --child swakefloor PATH [protocol|aiohttp]: serve until
    SIGTERM."""
    if stack == "aiohttp":
        asyncio.run(_serve_aiohttp(path))
        return

    async def main():
        loop = asyncio.get_running_loop()
        server = _Server(loop, path)
        srv = await loop.create_server(lambda: Proto(server.request), "127.0.0.1", 0)
        report(event="ready", port=srv.sockets[0].getsockname()[1])
        await until_terminated()
    asyncio.run(main())


class FloorServer:
    """The floor server in a child process, on a fresh file in the run's directory."""

    def __init__(self, directory, stack="protocol"):
        self.log = open(os.path.join(directory, "wake-floor.log"), "ab")
        self.proc = subprocess.Popen(
            child_command("swakefloor", os.path.join(directory, "floor.fs"), stack),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log, cwd=REPO)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline().decode() if ready else ""
        found = re.search(r'"port": (\d+)', line)
        if not found:
            self.stop()
            raise RuntimeError(f"the wake floor server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{found.group(1)}"

    def stop(self):
        code = stop_server(self.proc, (self.proc.stdout, self.log), STOP_TIMEOUT)
        return {"exit_code": code, "log_errors": []}


class FloorAdapter(Adapter):
    """put(): one POST answered once durable; get(): one long poll."""

    def __init__(self, url):
        from ackqueue.remote.http import Connection
        port = int(url.rsplit(":", 1)[1])
        self.conn = Connection("127.0.0.1", port, 60)

    def put(self, item):
        self.conn.request("POST", "/put", pickle.dumps(item, protocol=5))

    def get(self, timeout):
        return self.conn.request("GET", "/wait")[2]

    def item(self, handle):
        return pickle.loads(handle)

    def ack(self, handle):
        pass                                     # the floor keeps nothing to acknowledge

    def close(self):
        self.conn.close()


def _provision(directory, stack="protocol"):
    server = FloorServer(directory, stack)
    return server.url, server


SHARED = SharedContender(
    "service-wake-floor", "floor: bare server, FileStorage commit, long poll", "floor",
    "blocking",
    "a floor, not a queue: a bare asyncio.Protocol server that commits each put's body "
    "to a FileStorage (fsync'd) and then hands it to a waiting long poll; ackqueue.remote.http "
    "clients", _provision, lambda location, mode: FloorAdapter(location),
    scenarios=("e_xproc",))


SHARED_AIOHTTP = SharedContender(
    "service-wake-floor-aiohttp", "floor: aiohttp, FileStorage commit, long poll", "floor",
    "blocking",
    "a floor, not a queue: the same exchange as the bare floor, served by aiohttp (the "
    "service's HTTP stack): a put handler awaits its FileStorage commit (fsync'd), a long "
    "poll handler awaits a body; ackqueue.remote.http clients",
    functools.partial(_provision, stack="aiohttp"),
    lambda location, mode: FloorAdapter(location), scenarios=("e_xproc",))
