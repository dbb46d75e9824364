"""ReceiveMessage, DeleteMessage(+Batch) and ChangeMessageVisibility(+Batch)."""
import base64
import hashlib
import re
import secrets

from ackqueue import codec
from ackqueue.errors import NotHeld, StaleAck

from . import msgattrs
from ..backend import take_now
from .digest import md5_of_attributes
from .errors import SqsError
from .messages import SYSTEM_NAMES, batch_entries, failed_entry, message_id
from .params import integer, queue_name_of_url, required, string_list
from .queueattrs import arn, is_fifo

__all__ = ["ACTIONS"]

MAX_VISIBILITY = 43200
_RECEIPT = re.compile(r"\d+\.[A-Za-z0-9_\-]{24,28}\Z")   # core.Service.register's




def _body_text(raw):
    """A stored body as SQS text: text as is, JSON as its text, bytes and pickles base64
    (never unpickled)."""
    what, data = codec.kind(raw), codec.payload(raw)
    if what in (codec.TEXT, codec.JSON):
        return data.decode("utf-8", "surrogatepass"), data
    text = base64.b64encode(data).decode("ascii")
    return text, text.encode("ascii")


def _system(call, name, m, system, wanted):
    if not wanted:
        return {}
    every = "All" in wanted
    first = m.first_received or m.last_received or m.sent_at
    out = {"SenderId": system.get("sender") or "000000000000",
           "SentTimestamp": str(int(m.sent_at * 1000)),
           "ApproximateReceiveCount": str(m.receive_count),
           "ApproximateFirstReceiveTimestamp": str(int(first * 1000))}
    if system.get("group") is not None:
        out["MessageGroupId"] = system["group"]
        out["SequenceNumber"] = f"{int(m.sequence_number or m.id):020d}"
    if system.get("dedup") is not None and is_fifo(name):
        out["MessageDeduplicationId"] = system["dedup"]
    if system.get("trace") is not None:
        out["AWSTraceHeader"] = system["trace"]
    if m.dead_letter_source:
        out["DeadLetterQueueSourceArn"] = arn(m.dead_letter_source, call.region)
    return out if every else {k: v for k, v in out.items() if k in wanted}


def _message_json(call, name, receipt, m, wanted_system, wanted_attrs):
    body, data = _body_text(m.body)
    user, system = msgattrs.from_store(m.attributes)
    origin = m.dead_letter_source or name
    out = {"MessageId": message_id(origin, m.sequence_number or m.id),
           "ReceiptHandle": receipt, "MD5OfBody": hashlib.md5(data).hexdigest(),
           "Body": body}
    attributes = _system(call, name, m, system, wanted_system)
    if attributes:
        out["Attributes"] = attributes
    chosen = msgattrs.select(user, wanted_attrs)
    if chosen:
        out["MessageAttributes"] = msgattrs.to_json(chosen)
        out["MD5OfMessageAttributes"] = md5_of_attributes(chosen)
    return out


async def receive_message(sqs, call):
    p = call.params
    name = queue_name_of_url(p.get("QueueUrl"))
    rec = await sqs.record(name)
    attrs = rec["attributes"]
    n = integer(p, "MaxNumberOfMessages", 1, 1, 10)
    vt = integer(p, "VisibilityTimeout", int(attrs["VisibilityTimeout"]), 0, MAX_VISIBILITY)
    wait = integer(p, "WaitTimeSeconds", int(attrs["ReceiveMessageWaitTimeSeconds"]), 0, 20)
    wanted_system = set(string_list(p, "AttributeNames")) | set(
        string_list(p, "MessageSystemAttributeNames"))
    for w in wanted_system:
        if w not in SYSTEM_NAMES and w != "All":
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    wanted_attrs = string_list(p, "MessageAttributeNames")
    q, cc = await sqs.queue(name)
    policy = sqs.policy(q, rec)
    if policy is not None and policy.target is not None:
        await sqs.queue(policy.target)        # open: the dead letters' ready listener
    if is_fifo(name):
        return await _receive_fifo(sqs, call, name, q, cc, n, vt, wait, policy,
                                   wanted_system, wanted_attrs)
    messages = await sqs.api.poll(call.request, name, q, cc,
                                  lambda: take_now(cc, n, vt, policy), wait,
                                  now=_on_loop(sqs, cc, n, vt, policy))
    if vt == 0:
        delivered = [(_unheld(m), m) for m in messages]
    else:
        delivered = sqs.service.register(name, sqs.session, cc, messages)
        sqs.remember([r for r, _ in delivered], vt)
    if not delivered:
        return {}                  # SQS leaves Messages out when there are none
    return {"Messages": [_message_json(call, name, r, m, wanted_system, wanted_attrs)
                         for r, m in delivered]}


def _on_loop(sqs, cc, n, vt, policy):
    """The receive's try on the event loop's own thread (the native receive's, no pool
    hop), or None where only the pool may take: a dead-letter policy's claim waits for a
    commit, and a VisibilityTimeout of 0 gives each message back at once."""
    if policy is not None or vt == 0:
        return None
    return lambda: sqs.service.receive_now(cc, n, vt)


async def _receive_fifo(sqs, call, name, q, cc, n, vt, wait, policy, wanted_system,
                        wanted_attrs):
    st = sqs.fifo_state(name)
    target = None
    if policy is not None and policy.target is not None:
        target = await sqs.api.queue(policy.target)
    mr = None if policy is None else policy.max_receives
    got = await sqs.api.poll(call.request, name, q, cc,
                             lambda: st.take(cc, n, vt, mr, target), wait, give_back=False,
                             now=lambda: st.take_now(cc, n, vt, mr, target))
    if not got:
        return {}
    if vt > 0:
        _wake_after(sqs, name, vt)
    out = []
    for receipt, m, count in got:
        j = _message_json(call, name, receipt, m, wanted_system, wanted_attrs)
        if "ApproximateReceiveCount" in j.get("Attributes", {}):
            j["Attributes"]["ApproximateReceiveCount"] = str(count)
        out.append(j)
    return {"Messages": out}


def _wake_after(sqs, name, seconds):
    """Wake name's long polls when a FIFO visibility deadline passes (the library's
    next_ready_at does not know the front's deadlines)."""
    sqs.api.loop.call_later(seconds + 0.01, sqs.api.wake, name)


def _unheld(m):
    """A receipt handle for a delivery given back at once (VisibilityTimeout 0): well
    formed, naming nothing held, so a later delete or change is a no-op."""
    return f"{int(m.id)}.{secrets.token_urlsafe(18)}"


def _check_receipt(sqs, name, receipt):
    """receipt, or ReceiptHandleIsInvalid when it is malformed or names a delivery of
    another queue than name (the queue URL's: the one whose rights were checked)."""
    if not isinstance(receipt, str) or not _RECEIPT.match(receipt):
        raise SqsError("ReceiptHandleIsInvalid",
                       "The input receipt handle is invalid.")
    if sqs.held_elsewhere(name, receipt):
        raise SqsError("ReceiptHandleIsInvalid",
                       f"The input receipt handle \"{receipt}\" is not a valid receipt handle "
                       "for this queue.")
    return receipt


async def _delete(sqs, name, receipts):
    """Acknowledge the deliveries receipts name, in one commit when they are all still
    held; a receipt naming nothing held any more (acknowledged, given back, from before a
    restart) deletes nothing and succeeds, as SQS's does for an old receipt handle."""
    if is_fifo(name):
        _, cc = await sqs.queue(name)
        st = sqs.fifo_state(name)
        messages = st.release(receipts, block=False)
        if messages is None:                 # a pool thread holds the staging
            messages = await sqs.run(st.release, receipts)
        if messages:
            await _ack(sqs, cc, messages)
            sqs.api.wake(name)               # their groups are free: wake long polls
        return
    found = [(r, d) for r in receipts for d in [sqs.delivery(name, r)] if d is not None]
    if found:                              # (all held by the front's one connection)
        await _ack(sqs, found[0][1].cconn, [d.message for _, d in found])
        sqs.service.forget([r for r, _ in found])


async def _ack(sqs, cc, messages):
    """Acknowledge messages cc received, by the runtime's ack_many: in one commit when all
    are still held, else one by one what still is (a message given back or purged
    meanwhile is skipped)."""
    try:
        await sqs.api.ack_many(cc, messages)
    except (StaleAck, NotHeld):
        for m in messages:
            try:
                await sqs.api.ack_many(cc, [m])
            except (StaleAck, NotHeld):
                pass


async def delete_message(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    receipt = _check_receipt(sqs, name, required(call.params, "ReceiptHandle"))
    await _delete(sqs, name, [receipt])
    return {}


async def delete_message_batch(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    entries = batch_entries(call.params, "Entries", "DeleteMessageBatch")
    ok, failed = [], []
    for e in entries:
        try:
            ok.append((e["Id"], _check_receipt(sqs, name, e.get("ReceiptHandle"))))
        except SqsError:
            failed.append(failed_entry(e["Id"], SqsError(
                "ReceiptHandleIsInvalid", f"The input receipt handle \"{e.get('ReceiptHandle')}"
                                          "\" is not a valid receipt handle.")))
    await _delete(sqs, name, [r for _, r in ok])
    return {"Successful": [{"Id": i} for i, _ in ok], "Failed": failed}


async def _change(sqs, name, receipt, seconds):
    _check_receipt(sqs, name, receipt)
    if is_fifo(name):
        if not await sqs.run(sqs.fifo_state(name).change, receipt, seconds):
            raise SqsError("MessageNotInflight", "Message does not exist or is not available "
                                                 "for visibility timeout change.")
        if seconds <= 0:
            sqs.api.wake(name)
        else:
            _wake_after(sqs, name, seconds)
        return
    d = sqs.delivery(name, receipt)
    if d is None:
        raise SqsError("MessageNotInflight", "Message does not exist or is not available "
                                             "for visibility timeout change.")
    try:
        await sqs.run(sqs.service.change_visibility, d.cconn, d.message, seconds)
    except (NotHeld, StaleAck):
        sqs.service.forget([receipt])
        raise SqsError("MessageNotInflight", "Message does not exist or is not available "
                                             "for visibility timeout change.") from None
    if seconds <= 0:
        sqs.service.forget([receipt])
    else:
        sqs.remember([receipt], seconds)


async def change_message_visibility(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    receipt = required(call.params, "ReceiptHandle")
    seconds = integer(call.params, "VisibilityTimeout", None, 0, MAX_VISIBILITY)
    if seconds is None:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                                           "VisibilityTimeout.")
    await _change(sqs, name, receipt, seconds)
    return {}


async def change_message_visibility_batch(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    await sqs.record(name)
    ok, failed = [], []
    for e in batch_entries(call.params, "Entries", "ChangeMessageVisibilityBatch"):
        try:
            seconds = integer(e, "VisibilityTimeout", None, 0, MAX_VISIBILITY)
            if seconds is None:
                raise SqsError("MissingParameter", "The request must contain the parameter "
                                                   "VisibilityTimeout.")
            await _change(sqs, name, e.get("ReceiptHandle"), seconds)
            ok.append({"Id": e["Id"]})
        except SqsError as exc:
            failed.append(failed_entry(e["Id"], exc))
    return {"Successful": ok, "Failed": failed}


ACTIONS = {
    "ReceiveMessage": (receive_message, "read", "url"),
    "DeleteMessage": (delete_message, "read", "url"),
    "DeleteMessageBatch": (delete_message_batch, "read", "url"),
    "ChangeMessageVisibility": (change_message_visibility, "read", "url"),
    "ChangeMessageVisibilityBatch": (change_message_visibility_batch, "read", "url"),
}
