"""SQS's queue actions: CreateQueue, GetQueueUrl, ListQueues, DeleteQueue, PurgeQueue,
Get/SetQueueAttributes, Tag/Untag/ListQueueTags, ListDeadLetterSourceQueues."""
import base64

from .errors import SqsError
from .params import integer, queue_name_of_url, required, string, string_list
from .queueattrs import READ_ONLY, check_attributes, check_name

__all__ = ["ACTIONS"]

MAX_TAGS = 50


def _attrs_equal(rec, attrs):
    have = rec["attributes"]
    return all(have.get(k) == v for k, v in attrs.items())


async def create_queue(sqs, call):
    name = check_name(required(call.params, "QueueName"))
    rec = await sqs.record(name, must_exist=False)
    attrs = check_attributes(call.params.get("Attributes"), name, creating=True,
                             exists=sqs.recorded)
    tags = call.params.get("tags") or {}
    if rec is not None:
        if not _attrs_equal(rec, attrs):
            raise SqsError("QueueNameExists",
                           "A queue already exists with the same name and a different value "
                           "for attribute(s) " + ", ".join(
                               sorted(k for k in attrs if rec["attributes"].get(k) != attrs[k])))
        return {"QueueUrl": call.url(name)}
    new = sqs.new_record(name, {k: v for k, v in attrs.items() if v != ""})
    new["tags"] = _check_tags(tags)
    await sqs.queue(name)                      # the library queue exists from now on
    await sqs.run(sqs.registry.put, name, new)
    return {"QueueUrl": call.url(name)}


async def get_queue_url(sqs, call):
    name = string(call.params, "QueueName", need=True)
    await sqs.record(name)
    return {"QueueUrl": call.url(name)}


def _page(names, params):
    """(page, next token) of sorted names by MaxResults/NextToken."""
    limit = integer(params, "MaxResults", None, 1, 1000)
    token = string(params, "NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            raise SqsError("InvalidParameterValue", "Invalid NextToken value.") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:1000], None
    page = names[:limit]
    more = len(names) > limit
    return page, (base64.urlsafe_b64encode(page[-1].encode()).decode() if more else None)


async def list_queues(sqs, call):
    prefix = string(call.params, "QueueNamePrefix", "")
    names = [n for n in await sqs.names() if n.startswith(prefix)]
    if call.client is not None:
        names = [n for n in names if call.client.may("read", n)]
    page, token = _page(names, call.params)
    out = {"QueueUrls": [call.url(n) for n in page]}
    if token:
        out["NextToken"] = token
    return out


async def delete_queue(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    q, _ = await sqs.queue(name)
    await sqs.purged(name, q)
    await sqs.run(sqs.registry.put, name, dict(rec, deleted=True))
    return {}


async def purge_queue(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    q, _ = await sqs.queue(name)
    await sqs.purged(name, q)
    return {}


async def get_queue_attributes(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    wanted = string_list(call.params, "AttributeNames")
    every = dict(rec["attributes"])
    known = set(every) | set(READ_ONLY) | {"RedrivePolicy", "Policy", "RedriveAllowPolicy",
                                           "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
                                           "FifoQueue", "ContentBasedDeduplication",
                                           "DeduplicationScope", "FifoThroughputLimit",
                                           "All"}
    for w in wanted:
        if w not in known:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    if not wanted:
        return {}
    q, _ = await sqs.queue(name)
    counts = await sqs.counts(name, q)
    every.update({
        "ApproximateNumberOfMessages": str(counts.get("ready", 0)),
        "ApproximateNumberOfMessagesNotVisible": str(counts.get("in_flight", 0)),
        "ApproximateNumberOfMessagesDelayed": str(counts.get("delayed", 0)),
        "CreatedTimestamp": str(int(rec["created"])),
        "LastModifiedTimestamp": str(int(rec.get("modified", rec["created"]))),
        "QueueArn": call.arn(name)})
    every = {k: v for k, v in every.items() if v != ""}
    if "All" not in wanted:
        every = {k: v for k, v in every.items() if k in wanted}
    return {"Attributes": every}


async def set_queue_attributes(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    attrs = check_attributes(required(call.params, "Attributes"), name, creating=False,
                             exists=sqs.recorded)
    merged = dict(rec["attributes"])
    for k, v in attrs.items():
        if v == "":
            merged.pop(k, None)
        else:
            merged[k] = v
    await sqs.run(sqs.registry.put, name, dict(rec, attributes=merged))
    return {}


def _check_tags(tags):
    if not isinstance(tags, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise SqsError("InvalidParameterValue", "Tags must be a map of strings to strings")
    for k, v in tags.items():
        if not 1 <= len(k) <= 128 or len(v) > 256:
            raise SqsError("InvalidParameterValue",
                           "A tag key has 1 to 128 characters and a value at most 256")
    return dict(tags)


async def tag_queue(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    tags = _check_tags(required(call.params, "Tags"))
    merged = dict(rec["tags"], **tags)
    if len(merged) > MAX_TAGS:
        raise SqsError("InvalidParameterValue",
                       f"Too many tags added for queue {name}.")
    await sqs.run(sqs.registry.put, name, dict(rec, tags=merged))
    return {}


async def untag_queue(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    keys = string_list(call.params, "TagKeys")
    if not keys:
        raise SqsError("InvalidParameterValue", "Tag keys must be between 1 and 128 "
                                                "characters in length.")
    tags = {k: v for k, v in rec["tags"].items() if k not in keys}
    await sqs.run(sqs.registry.put, name, dict(rec, tags=tags))
    return {}


async def list_queue_tags(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    return {"Tags": dict(rec["tags"])} if rec["tags"] else {}


async def list_dead_letter_source_queues(sqs, call):
    from .queueattrs import redrive_of
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    sources = []
    for n in await sqs.names():
        rec = await sqs.record(n, must_exist=False)
        if rec is not None and redrive_of(rec["attributes"])[1] == name:
            sources.append(n)
    page, token = _page(sources, call.params)
    out = {"queueUrls": [call.url(n) for n in page]}
    if token:
        out["NextToken"] = token
    return out


# action -> (handler, right, where the queue is: "url", "name", or None: service-wide)
ACTIONS = {
    "CreateQueue": (create_queue, "write", "name"),
    "GetQueueUrl": (get_queue_url, "read", "name"),
    "ListQueues": (list_queues, None, None),
    "DeleteQueue": (delete_queue, "admin", "url"),
    "PurgeQueue": (purge_queue, "admin", "url"),
    "GetQueueAttributes": (get_queue_attributes, "read", "url"),
    "SetQueueAttributes": (set_queue_attributes, "admin", "url"),
    "TagQueue": (tag_queue, "admin", "url"),
    "UntagQueue": (untag_queue, "admin", "url"),
    "ListQueueTags": (list_queue_tags, "read", "url"),
    "ListDeadLetterSourceQueues": (list_dead_letter_source_queues, "read", "url"),
}
