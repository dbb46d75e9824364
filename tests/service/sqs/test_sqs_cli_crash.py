"""The SQS protocol with the AWS CLI (awscli from the package index, run as a command),
and a service SIGKILLed in the middle of boto3 traffic and restarted: every SendMessage
that was answered is there or was deleted, and nothing whose DeleteMessage was answered
comes back."""
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("boto3")

from botocore.exceptions import BotoCoreError, ClientError   # noqa: E402

from service_proc import Service                              # noqa: E402
from sqs_helpers import client                                # noqa: E402


def aws_cli():
    path = os.path.join(os.path.dirname(sys.executable), "aws")
    return path if os.path.exists(path) else shutil.which("aws")


def test_the_aws_cli_sends_and_receives(tmp_path):
    aws = aws_cli()
    if aws is None:
        pytest.skip("the AWS CLI (pip install awscli) is not installed")
    s = Service(tmp_path / "cli.fs", tmp_path / "service.log")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="cli", AWS_SECRET_ACCESS_KEY="cli-secret",
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull)

    def run(*args):
        out = subprocess.run([aws, "--endpoint-url", s.url, "--output", "json", "sqs", *args],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if out.stdout.strip() else {}
    try:
        url = run("create-queue", "--queue-name", "cli-jobs")["QueueUrl"]
        sent = run("send-message", "--queue-url", url, "--message-body", "from the cli",
                   "--message-attributes",
                   '{"n": {"DataType": "Number", "StringValue": "7"}}')
        got = run("receive-message", "--queue-url", url, "--message-attribute-names", "All",
                  "--wait-time-seconds", "5")
        [m] = got["Messages"]
        assert m["Body"] == "from the cli" and m["MessageId"] == sent["MessageId"]
        assert m["MessageAttributes"]["n"]["StringValue"] == "7"
        run("delete-message", "--queue-url", url, "--receipt-handle", m["ReceiptHandle"])
        attrs = run("get-queue-attributes", "--queue-url", url, "--attribute-names", "All")
        assert attrs["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"
        assert url in run("list-queues")["QueueUrls"]
    finally:
        assert s.stop() == 0


def test_sigkill_in_the_middle_of_boto3_traffic(tmp_path):
    s = Service(tmp_path / "crash.fs", tmp_path / "service.log")
    url = client(s.url).create_queue(QueueName="crash")["QueueUrl"]
    sent, deleted, tried = set(), set(), set()
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()

    def producer(k):
        c = client(s.url)
        i = 0
        while not stop.is_set():
            body = f"p{k}-{i}"
            try:
                c.send_message(QueueUrl=url, MessageBody=body)
            except (BotoCoreError, ClientError):
                return                               # the service is gone
            with lock:
                sent.add(body)
                if len(sent) >= 300:
                    enough.set()
            i += 1

    def consumer():
        c = client(s.url)
        while not stop.is_set():
            try:
                got = c.receive_message(QueueUrl=url, MaxNumberOfMessages=5,
                                        WaitTimeSeconds=1).get("Messages", [])
                for m in got:
                    with lock:
                        tried.add(m["Body"])   # a delete cut off may have been done
                    c.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
                    with lock:
                        deleted.add(m["Body"])
            except (BotoCoreError, ClientError):
                return
    threads = [threading.Thread(target=producer, args=(k,)) for k in range(2)] + [
        threading.Thread(target=consumer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        assert enough.wait(120), "the traffic did not reach 300 sends (failure bound)"
        s.kill()                                     # SIGKILL with requests in flight
        stop.set()
        for t in threads:
            t.join(60)
        with lock:
            sent_ok, deleted_ok, tried_ok = set(sent), set(deleted), set(tried)
        s.start()
        c = client(s.url)
        left = []
        while True:
            got = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                break
            for m in got:
                left.append(m["Body"])
                c.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        assert len(left) == len(set(left))
        assert not (set(left) & deleted_ok), "a deleted message came back"
        assert sent_ok <= set(left) | tried_ok, "an answered send was lost"
        assert deleted_ok, "the consumers deleted nothing before the kill"
    finally:
        stop.set()
        s.stop()
