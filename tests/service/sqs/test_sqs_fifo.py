"""FIFO queues (.fifo) through boto3 against a real service: message groups in order with
one delivery of a group in flight, groups in parallel, deduplication within 5 minutes
(explicit ids and content-based), sequence numbers; standard queues refuse FIFO-only
parameters."""
import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("boto3")

from botocore.exceptions import ClientError            # noqa: E402

from service_proc import Service                       # noqa: E402
from sqs_helpers import client, name                   # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    d = tmp_path_factory.mktemp("sqsfifo")
    s = Service(d / "q.fs", d / "service.log")
    yield s
    assert s.stop() == 0


@pytest.fixture
def sqs(service):
    return client(service.url)


def fifo(sqs, **attrs):
    return sqs.create_queue(QueueName=name("f") + ".fifo", Attributes=dict(
        FifoQueue="true", **attrs))["QueueUrl"]


def test_groups_in_order_one_in_flight_each_and_in_parallel(sqs):
    url = fifo(sqs)
    for g, i in (("a", 1), ("a", 2), ("b", 1), ("a", 3), ("b", 2)):
        sqs.send_message(QueueUrl=url, MessageBody=f"{g}{i}", MessageGroupId=g,
                         MessageDeduplicationId=f"{g}{i}")
    [m1] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert m1["Body"] == "a1"
    [m2] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert m2["Body"] == "b1"                # group a is busy: b goes on
    assert "Messages" not in sqs.receive_message(QueueUrl=url)   # both groups busy
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                              AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["a2", "a3"]        # a's rest, in order; b busy
    assert [m["Attributes"]["MessageGroupId"] for m in got] == ["a", "a"]
    seqs = [int(m["Attributes"]["SequenceNumber"]) for m in got]
    assert seqs == sorted(seqs)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)
    # a2 came back: a3 (out) still holds group a, so nothing of a; b is busy too
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"])
    [again] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"]
                                  )["Messages"]
    assert again["Body"] == "a2"
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


def test_deduplication_ids_and_content_based(sqs):
    url = fifo(sqs)
    r1 = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g",
                          MessageDeduplicationId="d1")
    r2 = sqs.send_message(QueueUrl=url, MessageBody="y", MessageGroupId="g",
                          MessageDeduplicationId="d1")
    assert r1["MessageId"] == r2["MessageId"] and r1["SequenceNumber"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="z", MessageGroupId="g")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="z", MessageDeduplicationId="q")
    assert e.value.response["Error"]["Code"] == "MissingParameter"
    cb = fifo(sqs, ContentBasedDeduplication="true")
    a = sqs.send_message(QueueUrl=cb, MessageBody="same", MessageGroupId="g")
    b = sqs.send_message(QueueUrl=cb, MessageBody="same", MessageGroupId="g")
    c = sqs.send_message(QueueUrl=cb, MessageBody="other", MessageGroupId="g")
    assert a["MessageId"] == b["MessageId"] != c["MessageId"]
    got = sqs.receive_message(QueueUrl=cb, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in got] == ["same", "other"]
    a = sqs.get_queue_attributes(QueueUrl=cb, AttributeNames=["All"])["Attributes"]
    assert a["FifoQueue"] == "true" and a["ContentBasedDeduplication"] == "true"
    assert a["ApproximateNumberOfMessagesNotVisible"] == "2"


def test_fifo_dead_letter_queue(sqs):
    dlq = fifo(sqs)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                       )["Attributes"]["QueueArn"]
    src = fifo(sqs, RedrivePolicy=json.dumps({"deadLetterTargetArn": dlq_arn,
                                              "maxReceiveCount": 1}))
    sqs.send_message(QueueUrl=src, MessageBody="p", MessageGroupId="g",
                     MessageDeduplicationId="p")
    [m] = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)["Messages"]
    assert "Messages" not in sqs.receive_message(QueueUrl=src)
    [d] = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2)["Messages"]
    assert d["Body"] == "p"


def test_fifo_rules(sqs):
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=name("nofifo") + ".fifo")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=name("std"), Attributes={"FifoQueue": "true"})
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    url = sqs.create_queue(QueueName=name("std"))["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=name("std"), Attributes={"ContentBasedDeduplication":
                                                            "true"})
    assert e.value.response["Error"]["Code"] == "InvalidAttributeName"
    f = fifo(sqs)
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=f, MessageBody="x", MessageGroupId="g",
                         MessageDeduplicationId="d", DelaySeconds=5)
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"

