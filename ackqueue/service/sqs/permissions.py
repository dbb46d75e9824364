"""AddPermission and RemovePermission: statements in the queue's Policy attribute, as SQS
writes them (Sid = Label, Principal arn:aws:iam::ACCOUNT:root, Action SQS:<action>).  The
policy is recorded and returned, not enforced: who may do what is ``--auth``'s rights."""
import json

from ackqueue import jsontext

from .errors import SqsError
from .params import queue_name_of_url, string, string_list

__all__ = ["ACTIONS"]

MAX_ACTIONS = 7
_OWNER_ONLY = {"AddPermission", "RemovePermission", "CreateQueue", "DeleteQueue",
               "SetQueueAttributes", "TagQueue", "UntagQueue"}


def _policy(rec, call, name):
    raw = rec["attributes"].get("Policy")
    if raw:
        try:
            doc = jsontext.loads(raw)
            if isinstance(doc, dict) and isinstance(doc.get("Statement"), list):
                return doc
        except ValueError:
            pass
    return {"Version": "2012-10-17", "Id": f"{call.arn(name)}/SQSDefaultPolicy",
            "Statement": []}


async def _save(sqs, name, rec, policy):
    attrs = dict(rec["attributes"])
    if policy["Statement"]:
        attrs["Policy"] = json.dumps(policy, separators=(",", ":"))
    else:
        attrs.pop("Policy", None)
    await sqs.run(sqs.registry.put, name, dict(rec, attributes=attrs))


async def add_permission(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    label = string(call.params, "Label", need=True)
    actions = string_list(call.params, "Actions")
    if not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Actions.")
    accounts = string_list(call.params, "AWSAccountIds")
    if not accounts:
        raise SqsError("InvalidParameterValue", "Value [] for parameter PrincipalId is "
                                                "invalid. Reason: Unable to verify.")
    if len(actions) > MAX_ACTIONS:
        raise SqsError("OverLimit", f"{len(actions)} Actions were found, maximum allowed is "
                                    f"{MAX_ACTIONS}.")
    for a in actions:
        if a in _OWNER_ONLY:
            raise SqsError("InvalidParameterValue",
                           f"Value SQS:{a} for parameter ActionName is invalid. Reason: Only "
                           "the queue owner is allowed to invoke this action.")
    policy = _policy(rec, call, name)
    if any(s.get("Sid") == label for s in policy["Statement"]):
        raise SqsError("InvalidParameterValue",
                       f"Value {label} for parameter Label is invalid. Reason: Already exists.")
    principals = [f"arn:aws:iam::{a}:root" for a in accounts]
    sqs_actions = [f"SQS:{a}" for a in actions]
    policy["Statement"].append({
        "Sid": label, "Effect": "Allow",
        "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
        "Action": sqs_actions[0] if len(sqs_actions) == 1 else sqs_actions,
        "Resource": call.arn(name)})
    await _save(sqs, name, rec, policy)
    return {}


async def remove_permission(sqs, call):
    name = queue_name_of_url(call.params.get("QueueUrl"))
    rec = await sqs.record(name)
    label = string(call.params, "Label", need=True)
    policy = _policy(rec, call, name)
    kept = [s for s in policy["Statement"] if s.get("Sid") != label]
    if len(kept) == len(policy["Statement"]):
        raise SqsError("InvalidParameterValue",
                       f"Value {label} for parameter Label is invalid. Reason: can't find "
                       "label on existing policy.")
    policy["Statement"] = kept
    await _save(sqs, name, rec, policy)
    return {}


ACTIONS = {
    "AddPermission": (add_permission, "admin", "url"),
    "RemovePermission": (remove_permission, "admin", "url"),
}
