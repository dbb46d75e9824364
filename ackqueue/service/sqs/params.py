"""Checks of an SQS request's JSON parameters, with SQS's errors."""
from .errors import SqsError

__all__ = ["required", "integer", "string", "string_list", "queue_name_of_url"]


def required(params, key):
    value = params.get(key)
    if value is None or value in ("", {}, []):
        raise SqsError("MissingParameter", f"The request must contain the parameter {key}.")
    return value


def integer(params, key, default, lo, hi):
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SqsError("InvalidParameterValue", f"Value {_short(value)} for parameter {key} is "
                                                "invalid. Reason: must be an integer.")
    try:
        value = int(value)
    except (ValueError, OverflowError):         # not a number, or an infinity
        raise SqsError("InvalidParameterValue", f"Value {_short(value)} for parameter {key} is "
                                                "invalid. Reason: must be an integer.") from None
    if not lo <= value <= hi:
        raise SqsError("InvalidParameterValue",
                       f"Value {value} for parameter {key} is invalid. Reason: must be between "
                       f"{lo} and {hi}.")
    return value


def string(params, key, default=None, *, need=False):
    """The string parameter key (default when absent; MissingParameter when need=True);
    InvalidParameterValue when it is there and not a string."""
    value = required(params, key) if need else params.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"Value {_short(value)} for parameter {key} "
                                                "is invalid. Reason: must be a string.")
    return value


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def string_list(params, key):
    value = params.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SqsError("InvalidParameterValue", f"{key} must be a list of strings")
    return value


def queue_name_of_url(url):
    """The queue name a QueueUrl ends with (a bare name is taken as is)."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise SqsError("InvalidAddress", f"The address {url} is not valid for this endpoint.")
    return name
