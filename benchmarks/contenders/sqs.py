"""SQS servers for the (sqs) scenario, each driven by boto3 clients, unmodified:

- ``ackqueue serve`` (fsync'd commits, the default), its SQS protocol on POST /
  (benchmarks.contenders.service.ServiceServer);
- moto's server (``python -m moto.server``, moto[server] from the bench extra) on a free
  loopback port: the in-memory SQS that tests commonly run against.

SqsClient is the adapter: send / send_batch / receive / delete(_batch) with boto3, one
client (one keep-alive connection pool) per process."""
import hashlib
import os
import socket
import subprocess
import sys
import time

from benchmarks.children import stop_server
from benchmarks.common import REPO

START_TIMEOUT = 60


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MotoServer:
    """moto's server in a child process; stderr goes to DIR/moto.log."""

    def __init__(self, directory):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(directory, "moto.log"), "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, cwd=REPO)
        self._wait()
        import psutil
        self.ps = psutil.Process(self.proc.pid)

    def _wait(self):
        deadline = time.monotonic() + START_TIMEOUT
        while True:                        # failure bound only: wait for its port
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{type(self).__name__} did not start")
                time.sleep(0.1)

    def cpu(self):
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self):
        return {"exit_code": stop_server(self.proc, (self.log,), 30)}


def make_server(kind, directory):
    if kind == "moto":
        return MotoServer(directory)
    if kind == "null":
        return NullServer(directory)
    from benchmarks.contenders.service import ServiceServer
    return ServiceServer(directory)


class SqsClient:
    """boto3's SQS client of one server and queue (the adapter of the scenario)."""

    def __init__(self, url, queue="bench"):
        import boto3
        from botocore.config import Config
        self.sqs = boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                                aws_access_key_id="bench", aws_secret_access_key="bench",
                                config=Config(retries={"max_attempts": 0},
                                              max_pool_connections=4))
        self.url = self.sqs.create_queue(QueueName=queue)["QueueUrl"]

    def send(self, body):
        self.sqs.send_message(QueueUrl=self.url, MessageBody=body)

    def send_batch(self, bodies):
        r = self.sqs.send_message_batch(QueueUrl=self.url, Entries=[
            {"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)])
        if r.get("Failed"):
            raise RuntimeError(f"send_message_batch failed: {r['Failed'][:2]}")

    def receive(self, n, wait):
        return self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=n,
                                        WaitTimeSeconds=wait).get("Messages", [])

    def delete(self, messages):
        if len(messages) == 1:
            self.sqs.delete_message(QueueUrl=self.url,
                                    ReceiptHandle=messages[0]["ReceiptHandle"])
        elif messages:
            self.sqs.delete_message_batch(QueueUrl=self.url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(messages)])


class NullServer:
    """The floor: a bare aiohttp app speaking just enough SQS (an in-memory deque, no
    visibility, no durability) through the same boto3 clients, so that the cost of the
    clients, boto3 and HTTP on this machine is measured in the same run."""

    def __init__(self, directory):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(directory, "null.log"), "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks", "--child", "qnull", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, cwd=REPO)
        MotoServer._wait(self)
        import psutil
        self.ps = psutil.Process(self.proc.pid)

    cpu = MotoServer.cpu
    stop = MotoServer.stop


def null_server_main(port):
    import collections
    import itertools
    import json

    from aiohttp import web
    messages, ids = collections.deque(), itertools.count()

    def reply(doc):
        return web.Response(body=json.dumps(doc).encode(),
                            content_type="application/x-amz-json-1.0")

    async def handle(request):
        action = request.headers["X-Amz-Target"].split(".", 1)[1]
        p = await request.json()
        if action == "CreateQueue":
            return reply({"QueueUrl": f"http://127.0.0.1:{port}/0/{p['QueueName']}"})
        if action in ("SendMessage", "SendMessageBatch"):
            entries = p.get("Entries") or [p]
            ok = []
            for e in entries:
                messages.append(e["MessageBody"])
                ok.append({"Id": e.get("Id", ""), "MessageId": str(next(ids)),
                           "MD5OfMessageBody": hashlib.md5(
                               e["MessageBody"].encode()).hexdigest()})
            return reply({"Successful": ok} if "Entries" in p else ok[0])
        if action == "ReceiveMessage":
            out = []
            while messages and len(out) < p.get("MaxNumberOfMessages", 1):
                body = messages.popleft()
                out.append({"MessageId": "0", "ReceiptHandle": "r", "Body": body,
                            "MD5OfBody": hashlib.md5(body.encode()).hexdigest()})
            return reply({"Messages": out} if out else {})
        if action == "DeleteMessageBatch":
            return reply({"Successful": [{"Id": e["Id"]} for e in p["Entries"]]})
        return reply({})
    app = web.Application()
    app.router.add_post("/", handle)
    web.run_app(app, host="127.0.0.1", port=int(port), print=None, access_log=None)
