"""SQS queue attributes: which exist, their defaults, how a CreateQueue or
SetQueueAttributes value is checked, and the queue names, URLs and ARNs SDKs parse."""
import json
import os
import re

from ackqueue import jsontext

from .errors import SqsError

__all__ = ["DEFAULTS", "check_name", "check_attributes", "arn", "name_of_arn", "ACCOUNT",
           "REGION"]

# The account id in queue URLs and ARNs (SDKs parse it; nothing checks it):
# ACKQUEUE_SQS_ACCOUNT overrides it, e.g. 123456789012, what moto's tests expect.
ACCOUNT = os.environ.get("ACKQUEUE_SQS_ACCOUNT", "000000000000")
REGION = "us-east-1"
_QUEUE = re.compile(r"[A-Za-z0-9_\-]{1,80}\Z")
_FIFO_QUEUE = re.compile(r"[A-Za-z0-9_\-]{1,75}\.fifo\Z")

DEFAULTS = {"DelaySeconds": "0", "MaximumMessageSize": "1048576",
            "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
            "VisibilityTimeout": "30", "SqsManagedSseEnabled": "true"}
FIFO_DEFAULTS = {"FifoQueue": "true", "ContentBasedDeduplication": "false",
                 "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
_RANGES = {"DelaySeconds": (0, 900), "MaximumMessageSize": (1024, 1048576),
           "MessageRetentionPeriod": (60, 1209600), "ReceiveMessageWaitTimeSeconds": (0, 20),
           "VisibilityTimeout": (0, 43200), "KmsDataKeyReusePeriodSeconds": (60, 86400)}
_FREE = {"Policy", "KmsMasterKeyId", "RedriveAllowPolicy"}
_BOOLS = {"SqsManagedSseEnabled", "FifoQueue", "ContentBasedDeduplication"}
_FIFO_ONLY = {"ContentBasedDeduplication": None,
              "DeduplicationScope": ("messageGroup", "queue"),
              "FifoThroughputLimit": ("perQueue", "perMessageGroupId")}
READ_ONLY = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp",
             "LastModifiedTimestamp", "QueueArn")


def check_name(name):
    if not isinstance(name, str) or not (_QUEUE.match(name) or _FIFO_QUEUE.match(name)):
        raise SqsError("InvalidParameterValue",
                       "Can only include alphanumeric characters, hyphens, or underscores. "
                       "1 to 80 in length")
    return name


def is_fifo(name):
    return name.endswith(".fifo")


def arn(name, region=REGION):
    return f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"


def name_of_arn(value):
    """The queue name an SQS ARN names, or None."""
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"]:
        return None
    return parts[5] or None


def _invalid(key, value, why=""):
    raise SqsError("InvalidAttributeValue",
                   f"Invalid value for the parameter {key}.{(' Reason: ' + why) if why else ''}")


def check_attributes(attrs, name, *, creating, exists):
    """attrs (CreateQueue's or SetQueueAttributes' Attributes) checked for queue name:
    {key: str value}; exists(queue name) says whether a dead-letter target exists."""
    if attrs is None:
        attrs = {}
    if not isinstance(attrs, dict):
        raise SqsError("InvalidParameterValue", "Attributes must be a map")
    fifo = is_fifo(name)
    out = {}
    for key, value in attrs.items():
        if isinstance(value, (dict, list)) or value is None:
            _invalid(key, "", "an attribute's value is a string")
        if not isinstance(value, str):
            value = str(value)
        if key in _RANGES:
            lo, hi = _RANGES[key]
            if not re.fullmatch(r"-?\d+", value) or not lo <= int(value) <= hi:
                _invalid(key, value, f"must be an integer between {lo} and {hi}")
            value = str(int(value))
        elif key in _BOOLS:
            if value.lower() not in ("true", "false"):
                _invalid(key, value, "must be true or false")
            value = value.lower()
            if key == "FifoQueue":
                if not creating:
                    _invalid(key, value, "FifoQueue is set when the queue is created")
                if (value == "true") != fifo:
                    raise SqsError("InvalidParameterValue",
                                   "The name of a FIFO queue can only include alphanumeric "
                                   "characters, hyphens, or underscores, must end with .fifo "
                                   "suffix and be 1 to 80 in length" if value == "true" else
                                   "a queue whose name ends in .fifo is a FIFO queue")
            if key == "ContentBasedDeduplication" and not fifo:
                raise SqsError("InvalidAttributeName",
                               f"Unknown Attribute {key}.")
        elif key in _FIFO_ONLY:
            if not fifo:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
            if value not in _FIFO_ONLY[key]:
                _invalid(key, value, f"one of {', '.join(_FIFO_ONLY[key])}")
        elif key == "RedrivePolicy":
            value = _redrive(value, fifo, exists)
        elif key in _FREE:
            pass
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
        out[key] = value
    if creating and fifo and "FifoQueue" not in out:
        raise SqsError("InvalidParameterValue",
                       "The attribute FifoQueue must be set to true for a queue whose name "
                       "ends in .fifo")
    return out


def _redrive(value, fifo, exists):
    """A RedrivePolicy's JSON (normalised), or "" to remove it."""
    if value == "":
        return ""
    try:
        doc = jsontext.loads(value)
    except ValueError:
        _invalid("RedrivePolicy", value, "Redrive policy is not a valid JSON map.")
    if not isinstance(doc, dict) or "deadLetterTargetArn" not in doc or (
            "maxReceiveCount" not in doc):
        _invalid("RedrivePolicy", value, "Redrive policy does not contain mandatory "
                                         "attribute: deadLetterTargetArn / maxReceiveCount.")
    try:
        count = int(doc["maxReceiveCount"])
    except (TypeError, ValueError, OverflowError):      # (OverflowError: an infinity)
        count = 0
    if not 1 <= count <= 1000:
        _invalid("RedrivePolicy", value, "Invalid value for maxReceiveCount: "
                                         f"{doc['maxReceiveCount']}, valid values are from "
                                         "1 to 1000 both inclusive.")
    target = name_of_arn(doc["deadLetterTargetArn"])
    if target is None or not exists(target):
        raise SqsError("InvalidParameterValue",
                       "Value "
                       f"{json.dumps(doc)} for parameter RedrivePolicy is invalid. Reason: "
                       "Dead letter target does not exist.")
    if is_fifo(target) != fifo:
        raise SqsError("InvalidParameterValue",
                       "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter "
                       "queue must be same type of queue as the source.")
    return json.dumps({"deadLetterTargetArn": doc["deadLetterTargetArn"],
                       "maxReceiveCount": count}, separators=(",", ":"))


def redrive_of(attributes):
    """(maxReceiveCount, dead-letter queue name) of a queue's attributes, or (None, None)."""
    raw = attributes.get("RedrivePolicy")
    if not raw:
        return None, None
    doc = json.loads(raw)
    return int(doc["maxReceiveCount"]), name_of_arn(doc["deadLetterTargetArn"])
