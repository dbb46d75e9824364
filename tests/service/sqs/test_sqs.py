"""The SQS JSON protocol of ``ackqueue serve`` driven by boto3 itself, unmodified, against a
real service started by the console script on a free loopback port.  Waits are failure
bounds; nothing asserts a duration."""
import json

import pytest

pytest.importorskip("aiohttp")
boto3 = pytest.importorskip("boto3")

from botocore.exceptions import ClientError          # noqa: E402

import ackqueue                                       # noqa: E402
from service_proc import Service                      # noqa: E402
from sqs_helpers import aws_md5_of_attributes, client, name   # noqa: E402


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    d = tmp_path_factory.mktemp("sqs")
    s = Service(d / "sqs.fs", d / "service.log")
    yield s
    assert s.stop() == 0


@pytest.fixture
def sqs(service):
    return client(service.url)


def code(exc_info):
    return exc_info.value.response["Error"]["Code"]


def test_create_get_url_list_and_delete(sqs):
    n = name("life")
    url = sqs.create_queue(QueueName=n)["QueueUrl"]
    assert url.endswith(f"/000000000000/{n}")
    assert sqs.get_queue_url(QueueName=n)["QueueUrl"] == url
    assert sqs.create_queue(QueueName=n)["QueueUrl"] == url      # same attributes: same
    assert url in sqs.list_queues(QueueNamePrefix=n)["QueueUrls"]
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=n)
    assert url not in sqs.list_queues(QueueNamePrefix=n).get("QueueUrls", [])


def test_queue_errors_carry_sqs_codes_and_the_query_error_header(sqs, service):
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=f"{service.url}/000000000000/missing", MessageBody="x")
    assert code(e) == "AWS.SimpleQueueService.NonExistentQueue"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "x-amzn-query-error" in e.value.response["ResponseMetadata"]["HTTPHeaders"]
    n = name("exists")
    sqs.create_queue(QueueName=n, Attributes={"VisibilityTimeout": "10"})
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=n, Attributes={"VisibilityTimeout": "11"})
    assert code(e) == "QueueAlreadyExists"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName="bad name!")
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=name(), Attributes={"VisibilityTimeout": "99999"})
    assert code(e) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=name(), Attributes={"NoSuchThing": "1"})
    assert code(e) == "InvalidAttributeName"


def test_list_queues_prefix_and_pagination(sqs):
    prefix = name("page") + "-"
    made = sorted(sqs.create_queue(QueueName=f"{prefix}{i}")["QueueUrl"] for i in range(5))
    seen, token = [], None
    while True:
        kwargs = {"QueueNamePrefix": prefix, "MaxResults": 2}
        if token:
            kwargs["NextToken"] = token
        r = sqs.list_queues(**kwargs)
        assert len(r["QueueUrls"]) <= 2
        seen += r["QueueUrls"]
        token = r.get("NextToken")
        if not token:
            break
    assert seen == made
    assert sorted(sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]) == made


def test_attributes_and_tags(sqs):
    url = sqs.create_queue(QueueName=name("attrs"), Attributes={
        "VisibilityTimeout": "45", "DelaySeconds": "0", "MessageRetentionPeriod": "3600",
        "ReceiveMessageWaitTimeSeconds": "0", "MaximumMessageSize": "2048"},
        tags={"team": "a"})["QueueUrl"]
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["VisibilityTimeout"] == "45" and a["MessageRetentionPeriod"] == "3600"
    assert a["QueueArn"].startswith("arn:aws:sqs:us-east-1:000000000000:")
    assert int(a["CreatedTimestamp"]) > 0
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "7"})
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout",
                                                                "ApproximateNumberOfMessages"])
    assert a["Attributes"] == {"VisibilityTimeout": "7", "ApproximateNumberOfMessages": "0"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 2049)
    assert code(e) == "InvalidParameterValue"


ATTRS = {"s": {"DataType": "String", "StringValue": "välue"},
         "n": {"DataType": "Number", "StringValue": "-12.5e3"},
         "b": {"DataType": "Binary", "BinaryValue": b"\x00\xffbin"},
         "custom": {"DataType": "String.json", "StringValue": "{}"},
         "nb": {"DataType": "Number.int", "StringValue": "42"},
         "bc": {"DataType": "Binary.gz", "BinaryValue": b"\x1f\x8b"}}


def test_send_receive_with_every_attribute_type_and_aws_digests(sqs):
    url = sqs.create_queue(QueueName=name("md5"))["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo ✓", MessageAttributes=ATTRS,
                            MessageSystemAttributes={"AWSTraceHeader": {
                                "DataType": "String", "StringValue": "Root=1-abc"}})
    import hashlib
    assert sent["MD5OfMessageBody"] == hashlib.md5("héllo ✓".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == aws_md5_of_attributes(ATTRS)
    assert sent["MD5OfMessageSystemAttributes"] == aws_md5_of_attributes(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}})
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"])["Messages"]
    [m] = got
    assert m["Body"] == "héllo ✓" and m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MessageAttributes"] == ATTRS
    assert m["MD5OfMessageAttributes"] == aws_md5_of_attributes(ATTRS)
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert m["Attributes"]["AWSTraceHeader"] == "Root=1-abc"
    assert int(m["Attributes"]["SentTimestamp"]) > 0
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_receive_selects_attributes_by_name_and_prefix(sqs):
    url = sqs.create_queue(QueueName=name("sel"))["QueueUrl"]
    attrs = {"a.x": {"DataType": "String", "StringValue": "1"},
             "a.y": {"DataType": "String", "StringValue": "2"},
             "b": {"DataType": "String", "StringValue": "3"}}
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=attrs)
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["a.*"],
                              AttributeNames=["SentTimestamp"],
                              VisibilityTimeout=0)["Messages"]
    assert set(m["MessageAttributes"]) == {"a.x", "a.y"}
    assert m["MD5OfMessageAttributes"] == aws_md5_of_attributes(
        {k: attrs[k] for k in ("a.x", "a.y")})
    assert set(m["Attributes"]) == {"SentTimestamp"}
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["b"],
                              VisibilityTimeout=0)["Messages"]
    assert set(m["MessageAttributes"]) == {"b"}
    assert m.get("Attributes") is None
    [m] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert "MessageAttributes" not in m and "MD5OfMessageAttributes" not in m


def test_invalid_message_attributes_are_refused(sqs):
    url = sqs.create_queue(QueueName=name("badattr"))["QueueUrl"]
    for attrs in ({"n": {"DataType": "Number", "StringValue": "abc"}},
                  {"AWS.x": {"DataType": "String", "StringValue": "v"}},
                  {"x": {"DataType": "Float", "StringValue": "1"}},
                  {"x": {"DataType": "String", "StringValue": ""}},
                  {f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}):
        with pytest.raises(ClientError) as e:
            sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=attrs)
        assert code(e) == "InvalidParameterValue", attrs
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char")
    assert code(e) == "InvalidMessageContents"


def test_batches_and_batch_errors(sqs):
    url = sqs.create_queue(QueueName=name("batch"))["QueueUrl"]
    r = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": f"m{i}", "MessageAttributes": {
            "i": {"DataType": "Number", "StringValue": str(i)}}} for i in range(9)] + [
        {"Id": "bad", "MessageBody": ""}])
    assert sorted(x["Id"] for x in r["Successful"]) == sorted(f"e{i}" for i in range(9))
    assert [(f["Id"], f["SenderFault"]) for f in r["Failed"]] == [("bad", True)]
    for x in r["Successful"]:
        i = x["Id"][1:]
        assert x["MD5OfMessageAttributes"] == aws_md5_of_attributes(
            {"i": {"DataType": "Number", "StringValue": i}})
    got = []
    while len(got) < 9:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                   WaitTimeSeconds=1)["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(f"m{i}" for i in range(9))
    d = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)] + [
        {"Id": "junk", "ReceiptHandle": "not-a-handle"}])
    assert len(d["Successful"]) == 9
    assert [(f["Id"], f["Code"]) for f in d["Failed"]] == [("junk", "ReceiptHandleIsInvalid")]
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["ApproximateNumberOfMessages"] == a["ApproximateNumberOfMessagesNotVisible"] == "0"
    for entries, expected in (
            ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
            ([{"Id": "a", "MessageBody": "x"}] * 2, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
            ([{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)],
             "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
            ([{"Id": "bad id!", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId")):
        with pytest.raises(ClientError) as e:
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert code(e) == expected


def test_visibility_change_and_redelivery(sqs):
    url = sqs.create_queue(QueueName=name("vis"), Attributes={"VisibilityTimeout": "600"}
                           )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    [m] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url)       # in flight
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)              # back now
    [m2] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"],
                               WaitTimeSeconds=2)["Messages"]
    assert m2["MessageId"] == m["MessageId"]
    assert m2["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=5)
    assert code(e) == "AWS.SimpleQueueService.MessageNotInflight"
    r = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "ok", "ReceiptHandle": m2["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "old", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}])
    assert [x["Id"] for x in r["Successful"]] == ["ok"]
    assert [x["Id"] for x in r["Failed"]] == ["old"]
    [m3] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m3["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m3["ReceiptHandle"])   # old: no-op
    with pytest.raises(ClientError) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="garbage")
    assert code(e) == "ReceiptHandleIsInvalid"


def test_delay_and_long_poll(sqs):
    url = sqs.create_queue(QueueName=name("delay"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    assert a["ApproximateNumberOfMessagesDelayed"] == "1"
    # The long poll is woken when the delay ends (bounded by its 20 s, a failure limit).
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)["Messages"]
    assert [m["Body"] for m in got] == ["later"]


def test_purge(sqs):
    url = sqs.create_queue(QueueName=name("purge"))["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"}
                                                  for i in range(3)])
    sqs.purge_queue(QueueUrl=url)
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_the_same_queue_through_the_native_api_and_the_drop_in(sqs, service):
    n = name("shared")
    url = sqs.create_queue(QueueName=n)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="from sqs", MessageAttributes={
        "k": {"DataType": "String", "StringValue": "v"}})
    q = ackqueue.AckQueue(path=service.url, name=n)
    try:
        m = q.get_message(timeout=10)
        assert m.body == "from sqs" and m.attributes["k"] == "v"
        q.ack(m)
        q.put("from python")
    finally:
        q.close()
    [m] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "from python"
    other = name("native")
    q = ackqueue.AckQueue(path=service.url, name=other)
    try:
        q.put("made natively")
    finally:
        q.close()
    url2 = sqs.get_queue_url(QueueName=other)["QueueUrl"]
    [m] = sqs.receive_message(QueueUrl=url2, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "made natively"


def test_redrive_policy_dead_letters_and_move_task(sqs):
    dlq = sqs.create_queue(QueueName=name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                       )["Attributes"]["QueueArn"]
    src = sqs.create_queue(QueueName=name("src"), Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})})["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    sent = sqs.send_message(QueueUrl=src, MessageBody="poison")
    for _ in range(2):
        [m] = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, WaitTimeSeconds=2
                                  )["Messages"]
    assert "Messages" not in sqs.receive_message(QueueUrl=src)      # moved on this receive
    [d] = sqs.receive_message(QueueUrl=dlq, AttributeNames=["All"], WaitTimeSeconds=2,
                              VisibilityTimeout=0)["Messages"]
    assert d["Body"] == "poison" and d["MessageId"] == sent["MessageId"]
    assert d["Attributes"]["DeadLetterQueueSourceArn"].endswith(src.rsplit("/", 1)[1])
    task = sqs.start_message_move_task(SourceArn=dlq_arn)
    assert task["TaskHandle"]
    listed = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert listed[0]["Status"] == "COMPLETED"
    assert listed[0]["ApproximateNumberOfMessagesMoved"] == 1
    [back] = sqs.receive_message(QueueUrl=src, WaitTimeSeconds=2)["Messages"]
    assert back["Body"] == "poison"
    with pytest.raises(ClientError) as e:
        sqs.start_message_move_task(SourceArn=src.replace("http", "arn"))
    assert code(e) == "InvalidParameterValue"
    with pytest.raises(ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn + "-missing", "maxReceiveCount": 2})})
    assert code(e) == "InvalidParameterValue"


def test_queue_attributes_and_tags_survive_a_sigkill_and_restart(tmp_path):
    s = Service(tmp_path / "restart.fs", tmp_path / "service.log")
    try:
        sqs = client(s.url)
        dlq = sqs.create_queue(QueueName="dead")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                           )["Attributes"]["QueueArn"]
        policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3},
                            separators=(",", ":"))
        url = sqs.create_queue(QueueName="kept", Attributes={
            "VisibilityTimeout": "77", "DelaySeconds": "5", "RedrivePolicy": policy},
            tags={"t": "1"})["QueueUrl"]
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "600"})
        sqs.tag_queue(QueueUrl=url, Tags={"u": "2"})
        gone = sqs.create_queue(QueueName="gone")["QueueUrl"]
        sqs.delete_queue(QueueUrl=gone)
        before = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        s.kill()
        s.start()
        sqs = client(s.url)
        url = sqs.get_queue_url(QueueName="kept")["QueueUrl"]
        after = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert after == before
        assert after["RedrivePolicy"] == policy and after["VisibilityTimeout"] == "77"
        assert after["MessageRetentionPeriod"] == "600"
        assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"t": "1", "u": "2"}
        with pytest.raises(sqs.exceptions.QueueDoesNotExist):
            sqs.get_queue_url(QueueName="gone")
    finally:
        s.stop()


def test_what_sdks_read_besides_the_body(sqs):
    """A request id on every answer, AWS's current 1 MiB default MaximumMessageSize, and
    a FIFO batch refused whole when an entry has no MessageGroupId (moto's tests found
    these three missing)."""
    r = sqs.create_queue(QueueName=name("meta"))
    assert r["ResponseMetadata"]["RequestId"]
    url = r["QueueUrl"]
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])[
        "Attributes"]["MaximumMessageSize"] == "1048576"
    sqs.send_message(QueueUrl=url, MessageBody="x" * 300000)
    with pytest.raises(ClientError) as e:
        sqs.get_queue_url(QueueName=name("nothere"))
    assert e.value.response["ResponseMetadata"]["RequestId"]
    f = sqs.create_queue(QueueName=name("metaf") + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message_batch(QueueUrl=f, Entries=[{"Id": "a", "MessageBody": "x"}])
    assert code(e) == "MissingParameter"


def test_add_and_remove_permission_write_the_queue_policy(sqs):
    url = sqs.create_queue(QueueName=name("perm"))["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="a", AWSAccountIds=["111111111111"],
                       Actions=["SendMessage"])
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])[
        "Attributes"]["Policy"])
    assert [(s["Sid"], s["Action"], s["Principal"]["AWS"]) for s in policy["Statement"]] == [
        ("a", "SQS:SendMessage", "arn:aws:iam::111111111111:root")]
    with pytest.raises(ClientError) as e:
        sqs.add_permission(QueueUrl=url, Label="a", AWSAccountIds=["1"], Actions=["*"])
    assert code(e) == "InvalidParameterValue"
    sqs.remove_permission(QueueUrl=url, Label="a")
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])[
        "Attributes"]
    with pytest.raises(ClientError) as e:
        sqs.remove_permission(QueueUrl=url, Label="a")
    assert code(e) == "InvalidParameterValue"


# -- a move task that moves nothing says why --------------------------------------------

def test_a_move_task_that_moves_nothing_is_failed_with_its_reason(own_service):
    from sqs_helpers import client
    service = own_service()
    sqs = client(service.url)
    dlq = sqs.create_queue(QueueName="dead")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                   )["Attributes"]["QueueArn"]
    sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": (
        f'{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": 1}}')})

    def last_task():
        sqs.start_message_move_task(SourceArn=arn)
        [task] = sqs.list_message_move_tasks(SourceArn=arn)["Results"]
        assert task["ApproximateNumberOfMessagesMoved"] == 0, task
        return task["Status"], task["FailureReason"]

    status, reason = last_task()                       # empty
    assert status == "FAILED" and "no messages" in reason, reason
    sqs.send_message(QueueUrl=dlq, MessageBody="sent here directly")
    status, reason = last_task()                       # ready, but from no other queue
    assert status == "FAILED" and "DestinationArn" in reason, reason
    [m] = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=600)["Messages"]
    status, reason = last_task()                       # in flight
    assert status == "FAILED" and "1 in flight" in reason, reason
    sqs.close()
