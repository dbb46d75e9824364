"""StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask: moving a dead-letter
queue's messages back to the queues they came from (or to DestinationArn), through the
library's redrive (queue.redrive).  A task runs to its end before StartMessageMoveTask
answers (the move is a few commits), so it is COMPLETED when listed; a task that moved
nothing is FAILED, with a FailureReason saying why (AWS gives a reason to failed tasks
only): the queue was empty, its messages were in flight or delayed (only ready messages
move), or none of its ready ones came from another queue (without DestinationArn)."""
import uuid

from .errors import SqsError
from .params import integer, string
from .queueattrs import name_of_arn, redrive_of

__all__ = ["ACTIONS"]


async def _sources_of(sqs, name):
    found = []
    for n in await sqs.names():
        rec = await sqs.record(n, must_exist=False)
        if rec is not None and redrive_of(rec["attributes"])[1] == name:
            found.append(n)
    return found


def _queue_of(arn_value, what):
    name = name_of_arn(arn_value)
    if name is None:
        raise SqsError("InvalidParameterValue", f"Value {arn_value} for parameter {what} is "
                                                "invalid. Reason: not an SQS queue ARN.")
    return name


async def start_message_move_task(sqs, call):
    source_arn = string(call.params, "SourceArn", need=True)
    source = _queue_of(source_arn, "SourceArn")
    if await sqs.record(source, must_exist=False) is None:
        raise SqsError("ResourceNotFoundException", "The resource that you specified for "
                                                    "the SourceArn parameter doesn't exist.")
    if not await _sources_of(sqs, source):
        raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead "
                                                "Letter Queue.")
    dest_arn = string(call.params, "DestinationArn")
    rate = integer(call.params, "MaxNumberOfMessagesPerSecond", None, 1, 500)
    dest = None
    if dest_arn:
        dest = _queue_of(dest_arn, "DestinationArn")
        if dest == source:
            raise SqsError("InvalidParameterValue",
                           f"Value {dest_arn} for parameter DestinationArn is invalid. "
                           "Reason: the destination must be another queue than the source.")
        await sqs.record(dest)
    q, _ = await sqs.queue(source)
    if dest is not None:
        await sqs.queue(dest)
    before = await sqs.run(q.counts)
    moved = await sqs.run(lambda: q.redrive(to=dest))
    handle = str(uuid.uuid4())
    task = {"TaskHandle": handle, "Status": "COMPLETED", "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": moved,
            "ApproximateNumberOfMessagesToMove": before.get("ready", 0),
            "StartedTimestamp": int(sqs.clock() * 1000)}
    if not moved:
        task["Status"], task["FailureReason"] = "FAILED", _why_nothing_moved(before)
    if dest_arn:
        task["DestinationArn"] = dest_arn
    if rate is not None:
        task["MaxNumberOfMessagesPerSecond"] = rate
    sqs.tasks.setdefault(source_arn, []).insert(0, task)
    return {"TaskHandle": handle}


def _why_nothing_moved(counts):
    """Why a move task found nothing to move, from the source queue's counts before it."""
    ready, in_flight, delayed = (counts.get(k, 0) for k in ("ready", "in_flight", "delayed"))
    if ready:
        return (f"None of the {ready} available messages was moved to a dead-letter queue "
                "from another queue (they were sent to it directly): give DestinationArn "
                "to move them.")
    if in_flight or delayed:
        return (f"No message was available to move: {in_flight} in flight (received and "
                f"not deleted; they move once their visibility timeout ends) and {delayed} "
                "delayed. A move task moves the available messages only.")
    return "The source queue has no messages to move."


async def list_message_move_tasks(sqs, call):
    source_arn = string(call.params, "SourceArn", need=True)
    await sqs.record(_queue_of(source_arn, "SourceArn"))
    limit = integer(call.params, "MaxResults", 1, 1, 10)
    return {"Results": [{k: v for k, v in t.items() if k != "TaskHandle"}
                        for t in sqs.tasks.get(source_arn, [])[:limit]]}


async def cancel_message_move_task(sqs, call):
    handle = string(call.params, "TaskHandle", need=True)
    for tasks in sqs.tasks.values():
        for t in tasks:
            if t["TaskHandle"] == handle:
                raise SqsError("UnsupportedOperation", "Only active tasks can be "
                               f"cancelled: this task has {t['Status'].lower()}.")
    raise SqsError("ResourceNotFoundException", "Task does not exist.")


ACTIONS = {
    "StartMessageMoveTask": (start_message_move_task, "admin", "arn:SourceArn"),
    "ListMessageMoveTasks": (list_message_move_tasks, "read", "arn:SourceArn"),
    "CancelMessageMoveTask": (cancel_message_move_task, "admin", None),
}
