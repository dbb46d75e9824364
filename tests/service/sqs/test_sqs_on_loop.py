"""An SQS receive with messages ready claims them on the event loop's own thread, as the
native receive does (the runtime's poll with Service.receive_now; a FIFO queue's staging
with FifoState.take_now), and its delete acknowledges on the loop through the connection
that received: neither hops to the service's thread pool.  Counted in submissions to the
pool of a real application (the service's app over a queue file, served by aiohttp on a
loopback port, spoken to in the SQS JSON protocol over HTTP); where only the pool may
claim (a redrive policy, whose claim waits for a commit; a VisibilityTimeout of 0) the
receive still goes there."""
import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("aiohttp")

from aiohttp import ClientSession, web                         # noqa: E402

TARGET = "AmazonSQS."
CONTENT_TYPE = "application/x-amz-json-1.0"


class CountingPool(ThreadPoolExecutor):
    """A thread pool that counts what is submitted to it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


class SqsApp:
    """The service's application on a loopback port, its pool counting, and an SQS call."""

    def __init__(self, session, base, pool):
        self.session, self.base, self.pool = session, base, pool

    async def __call__(self, action, **params):
        async with self.session.post(self.base + "/", data=json.dumps(params), headers={
                "X-Amz-Target": TARGET + action, "Content-Type": CONTENT_TYPE}) as r:
            doc = await r.json(content_type=None)
            assert r.status == 200, doc
            return doc

    async def hops(self, action, **params):
        """(answer, pool submissions the call made)."""
        before = self.pool.submitted
        doc = await self(action, **params)
        return doc, self.pool.submitted - before


async def serving(path, scenario):
    from ackqueue.service.backend import Service
    from ackqueue.service.app import API, make_app
    service = Service(str(path))
    app = make_app(service, pool_size=4)
    api = app[API]
    api.pool.shutdown()                       # (no thread started yet) replaced by:
    api.pool = pool = CountingPool(4, thread_name_prefix="ackqueue-service")
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with ClientSession() as session:
            await scenario(SqsApp(session, f"http://127.0.0.1:{port}", pool))
    finally:
        await runner.cleanup()
        pool.shutdown()
        service.close()


async def make_queue(sqs, name, messages, **attributes):
    url = (await sqs("CreateQueue", QueueName=name, Attributes=attributes))["QueueUrl"]
    for body in messages:
        await sqs("SendMessage", QueueUrl=url, MessageBody=body)
    first = await sqs("ReceiveMessage", QueueUrl=url)      # opens the front's connection
    return url, first["Messages"][0]


def test_a_receive_with_messages_ready_and_its_delete_stay_on_the_loop(tmp_path):
    async def scenario(sqs):
        url, first = await make_queue(sqs, "jobs", ["one", "two", "three"])
        got, hops = await sqs.hops("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=2,
                                   VisibilityTimeout=30)
        assert [m["Body"] for m in got["Messages"]] == ["two", "three"]
        assert hops == 0
        _, hops = await sqs.hops("DeleteMessageBatch", QueueUrl=url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
            for i, m in enumerate([first] + got["Messages"])])
        assert hops == 0
        attrs = await sqs("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])
        assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
        assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"
    asyncio.run(serving(tmp_path / "q.fs", scenario))


def test_a_fifo_receive_with_messages_ready_and_its_delete_stay_on_the_loop(tmp_path):
    async def scenario(sqs):
        url = (await sqs("CreateQueue", QueueName="jobs.fifo", Attributes={
            "FifoQueue": "true", "ContentBasedDeduplication": "true"}))["QueueUrl"]
        for group, body in (("a", "a1"), ("a", "a2"), ("b", "b1")):
            await sqs("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId=group)
        await sqs("ReceiveMessage", QueueUrl=url, VisibilityTimeout=0)   # stages them
        first, hops = await sqs.hops("ReceiveMessage", QueueUrl=url, VisibilityTimeout=30)
        assert [m["Body"] for m in first["Messages"]] == ["a1"] and hops == 0
        got, hops = await sqs.hops("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10)
        assert [m["Body"] for m in got["Messages"]] == ["b1"] and hops == 0  # a: a1 out
        _, hops = await sqs.hops("DeleteMessage", QueueUrl=url,
                                 ReceiptHandle=first["Messages"][0]["ReceiptHandle"])
        assert hops == 0
        got, hops = await sqs.hops("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10)
        assert [m["Body"] for m in got["Messages"]] == ["a2"] and hops == 0
    asyncio.run(serving(tmp_path / "q.fs", scenario))


def test_receives_only_the_pool_may_claim_still_go_there(tmp_path):
    async def scenario(sqs):
        await sqs("CreateQueue", QueueName="dead")
        policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:dead",
                             "maxReceiveCount": 3})
        url, _ = await make_queue(sqs, "jobs", ["one", "two"], RedrivePolicy=policy)
        got, hops = await sqs.hops("ReceiveMessage", QueueUrl=url)
        assert [m["Body"] for m in got["Messages"]] == ["two"] and hops >= 1
        plain, _ = await make_queue(sqs, "plain", ["one", "two"])
        got, hops = await sqs.hops("ReceiveMessage", QueueUrl=plain, VisibilityTimeout=0)
        assert [m["Body"] for m in got["Messages"]] == ["two"] and hops >= 1
    asyncio.run(serving(tmp_path / "q.fs", scenario))
