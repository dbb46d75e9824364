"""SQS's sends, SendMessage(+Batch), through the library's queues: a send is one put of
the body as text (a batch's entries concurrently, so that they share group commits),
answered once durable; the batch checks and the MessageId shared with receive.py (which
has ReceiveMessage, DeleteMessage and ChangeMessageVisibility)."""
import asyncio
import hashlib
import re
import uuid

from ackqueue import codec
from ackqueue.errors import DuplicateMessage, EncodingRefused
from ackqueue.state import PutOptions
from ackqueue import store

from . import msgattrs
from .digest import md5_of_attributes, md5_of_body
from .errors import SqsError
from .params import integer, queue_name_of_url
from .queueattrs import is_fifo

__all__ = ["ACTIONS", "SYSTEM_NAMES", "batch_entries", "failed_entry", "message_id"]

MAX_BATCH = 10
DEDUP_WINDOW = 300.0
_NS = uuid.UUID("6b1d3c2e-5f0a-4c8e-9a51-0d7e2f4b8c19")
_ENTRY_ID = re.compile(r"[A-Za-z0-9_\-]{1,80}\Z")
_BAD_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
SYSTEM_NAMES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount",
                "ApproximateFirstReceiveTimestamp", "SequenceNumber", "MessageGroupId",
                "MessageDeduplicationId", "AWSTraceHeader", "DeadLetterQueueSourceArn")


def message_id(queue, seq):
    """A message's MessageId: a UUID, as SQS's, fixed by the queue it was first put in and
    its sequence number there (so it is kept when the message moves to a dead-letter
    queue)."""
    return str(uuid.uuid5(_NS, f"{queue}/{int(seq)}"))


# -- sending ------------------------------------------------------------------------------

class _Send:
    """One checked message to send."""
    __slots__ = ("body", "opts", "dedup", "md5", "md5_attrs", "md5_system", "fifo_group")


def _check_send(sqs, call, rec, name, p, queue_codec):
    body = p.get("MessageBody")
    if body is None:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                                           "MessageBody.")
    if not isinstance(body, str) or body == "":
        raise SqsError("InvalidParameterValue", "One or more parameters are invalid. Reason: "
                                                "Message must be at least one character.")
    if _BAD_CHARS.search(body):
        raise SqsError("InvalidMessageContents",
                       "Invalid characters found. Valid unicode characters are #x9 | #xA | "
                       "#xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    attrs = rec["attributes"]
    user = msgattrs.validate(p.get("MessageAttributes"))
    system_in = msgattrs.validate(p.get("MessageSystemAttributes"),
                                  "Message system attribute") if p.get(
        "MessageSystemAttributes") else {}
    for k in system_in:
        if k != "AWSTraceHeader":
            raise SqsError("InvalidParameterValue",
                           f"Message system attribute name '{k}' is invalid.")
    data = body.encode("utf-8")
    limit = int(attrs["MaximumMessageSize"])
    size = len(data) + msgattrs.size_of(user)
    if size > limit:
        raise SqsError("InvalidParameterValue",
                       f"One or more parameters are invalid. Reason: Message must be shorter "
                       f"than {limit} bytes.")
    fifo = is_fifo(name)
    delay, group, dedup = _fifo_fields(p, attrs, data, fifo)
    trace = system_in.get("AWSTraceHeader", {}).get("StringValue")
    s = _Send()
    try:
        s.body = codec.mark_text(queue_codec, data, name)
    except EncodingRefused as exc:
        raise SqsError("InvalidParameterValue", f"One or more parameters are invalid. "
                                                f"Reason: {exc}") from None
    s.opts = PutOptions(store.DEFAULT_PRIORITY, float(delay),
                        float(attrs["MessageRetentionPeriod"]),
                        msgattrs.to_store(user, {"group": group if fifo else None,
                                                 "dedup": dedup, "trace": trace,
                                                 "sender": call.key_id}),
                        DEDUP_WINDOW)
    s.dedup = dedup
    s.md5 = md5_of_body(data)
    s.md5_attrs = md5_of_attributes(user)
    s.md5_system = md5_of_attributes(system_in)
    s.fifo_group = group if fifo else None
    return s


def _fifo_fields(p, attrs, data, fifo):
    """(delay, message group, dedup id) of a send: a FIFO queue needs a group and a dedup
    id (or ContentBasedDeduplication: the body's SHA-256) and takes no per-message delay;
    a standard queue takes no dedup id."""
    delay = integer(p, "DelaySeconds", int(attrs["DelaySeconds"]), 0, 900)
    group, dedup = p.get("MessageGroupId"), p.get("MessageDeduplicationId")
    if fifo:
        if p.get("DelaySeconds") not in (None, 0):
            raise SqsError("InvalidParameterValue",
                           f"Value {delay} for parameter DelaySeconds is invalid. Reason: The "
                           "request include parameter that is not valid for this queue type.")
        delay = 0
        if not group:
            raise SqsError("MissingParameter", "The request must contain the parameter "
                                               "MessageGroupId.")
        if dedup is None:
            if attrs.get("ContentBasedDeduplication") != "true":
                raise SqsError("InvalidParameterValue",
                               "The queue should either have ContentBasedDeduplication "
                               "enabled or MessageDeduplicationId provided explicitly")
            dedup = hashlib.sha256(data).hexdigest()
    elif dedup is not None:
        raise SqsError("InvalidParameterValue",
                       f"Value {dedup} for parameter MessageDeduplicationId is invalid. "
                       "Reason: The request includes a parameter that is not valid for this "
                       "queue type.")
    for what, v in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
        if v is not None and (not isinstance(v, str)
                              or not re.fullmatch(r"[!-~]{1,128}", v)):
            raise SqsError("InvalidParameterValue", f"Value {v} for parameter {what} is "
                           "invalid. Reason: 1 to 128 printable ASCII characters.")
    return delay, group, dedup


async def _put(sqs, name, s):
    q, _ = await sqs.queue(name)
    try:
        [mid] = await sqs.api.put_many(q, [s.body], block=False, options=s.opts,
                                       dedup_ids=[s.dedup])
    except DuplicateMessage as exc:         # FIFO: a duplicate is accepted, not stored
        mid = exc.original_id if exc.original_id is not None else 0
    return _answer(name, s, mid)


async def _put_same(sqs, name, sends):
    """Messages of a standard queue with the same options (no dedup ids) in one put_many,
    so one commit; their answers in order."""
    q, _ = await sqs.queue(name)
    ids = await sqs.api.put_many(q, [s.body for s in sends], block=False,
                                 options=sends[0].opts)
    return [_answer(name, s, mid) for s, mid in zip(sends, ids)]


def _answer(name, s, mid):
    out = {"MessageId": message_id(name, mid), "MD5OfMessageBody": s.md5}
    if s.md5_attrs:
        out["MD5OfMessageAttributes"] = s.md5_attrs
    if s.md5_system:
        out["MD5OfMessageSystemAttributes"] = s.md5_system
    if s.fifo_group is not None:
        out["SequenceNumber"] = f"{int(mid):020d}"
    return out


async def send_message(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    q, _ = await sqs.queue(name)
    return await _put(sqs, name, _check_send(sqs, call, rec, name, call.params, q.codec))


def batch_entries(params, key, action):
    """The entries of a batch request (params[key]): 1 to MAX_BATCH structures with
    distinct, well-formed Ids; else the SqsError SQS answers for the whole batch."""
    entries = params.get(key)
    if not entries:
        raise SqsError("EmptyBatchRequest" if entries == [] else "MissingParameter",
                       f"There should be at least one {action}RequestEntry in the request."
                       if entries == [] else f"The request must contain the parameter {key}.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", f"{key} must be a list of structures")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_BATCH}. You have sent "
                       f"{len(entries)}.")
    ids = [e.get("Id") for e in entries]
    for i in ids:
        if not isinstance(i, str) or not _ENTRY_ID.match(i):
            raise SqsError("InvalidBatchEntryId",
                           "A batch entry id can only contain alphanumeric characters, "
                           "hyphens and underscores. It can be at most 80 letters long.")
    seen = set()
    for i in ids:
        if i in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {i} repeated.")
        seen.add(i)
    return entries


def failed_entry(entry_id, exc):
    """A batch answer's Failed entry for entry_id, from the SqsError it failed with."""
    return {"Id": entry_id, "SenderFault": exc.status < 500, "Code": exc.legacy_code
            if exc.code == "QueueDoesNotExist" else exc.code, "Message": exc.message}


async def send_message_batch(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    entries = batch_entries(call.params, "Entries", "SendMessageBatch")
    if is_fifo(name):          # SQS refuses the whole batch for these, not an entry
        for e in entries:
            if not e.get("MessageGroupId"):
                raise SqsError("MissingParameter", "The request must contain the parameter "
                                                   "MessageGroupId.")
            if not e.get("MessageDeduplicationId") and rec["attributes"].get(
                    "ContentBasedDeduplication") != "true":
                raise SqsError("InvalidParameterValue",
                               "The queue should either have ContentBasedDeduplication "
                               "enabled or MessageDeduplicationId provided explicitly")
    total = sum(len(str(e.get("MessageBody", "")).encode()) for e in entries)
    if total > 1048576:
        raise SqsError("BatchRequestTooLong",
                       f"Batch requests cannot be longer than 1048576 bytes. You have sent "
                       f"{total} bytes.")

    q, _ = await sqs.queue(name)
    if is_fifo(name):        # one after another: their sequence numbers keep their order
        results = []
        for e in entries:
            try:
                results.append((e["Id"], await _put(sqs, name, _check_send(
                    sqs, call, rec, name, e, q.codec)), None))
            except SqsError as exc:
                results.append((e["Id"], None, exc))
    else:
        results = await _standard_batch(sqs, call, rec, name, entries, q.codec)
    return {"Successful": [dict(Id=i, **ok) for i, ok, _ in results if ok is not None],
            "Failed": [failed_entry(i, exc) for i, _, exc in results if exc is not None]}


async def _standard_batch(sqs, call, rec, name, entries, queue_codec):
    """[(entry id, answer or None, SqsError or None)]: the valid entries with the same
    options (delay, retention, attributes) go in one put_many each, concurrently."""
    checked, groups = [], {}
    for e in entries:
        try:
            s = _check_send(sqs, call, rec, name, e, queue_codec)
        except SqsError as exc:
            checked.append((e["Id"], None, exc))
            continue
        checked.append((e["Id"], s, None))
        groups.setdefault((s.opts.delay, s.opts.retention, s.opts.attributes), []).append(s)
    answers = {}
    for sends, outs in zip(groups.values(), await asyncio.gather(
            *(_put_same(sqs, name, sends) for sends in groups.values()))):
        answers.update((id(s), out) for s, out in zip(sends, outs))
    return [(i, None, exc) if exc is not None else (i, answers[id(s)], None)
            for i, s, exc in checked]


ACTIONS = {
    "SendMessage": (send_message, "write", "url"),
    "SendMessageBatch": (send_message_batch, "write", "url"),
}
