"""SQS message attributes, validated as SQS validates them, and their place among a stored
message's attributes (the library keeps up to ten str: str pairs per message, which every
front reads).

A String attribute is stored as its name and value, so that the native API, Sasquatch's and
Python's ``Message.attributes`` read it as is; any other data type (Number, Binary, custom
``String.x`` ...) is stored as its name and its string (Binary in base64), and the reserved
key ``sqs:types`` maps those names to their data types.  Other reserved keys (``sqs:...``;
no SQS attribute name holds a colon) keep what SQS says about a message beyond its
attributes: its message group, deduplication id and trace header.  Attributes put by the
other fronts read back through SQS as String attributes."""
import base64
import binascii
import json
import re

from ackqueue import jsontext

from .errors import SqsError

__all__ = ["validate", "to_store", "from_store", "select", "size_of", "RESERVED"]

MAX_ATTRIBUTES = 10
RESERVED = "sqs:"
TYPES = "sqs:types"
_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,256}\Z")
_TYPE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_\-.]{1,200})?\Z")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\Z")


def _bad(message):
    raise SqsError("InvalidParameterValue", message)


def _check_name(name, what):
    if (not isinstance(name, str) or not _NAME.match(name) or name.startswith(".")
            or name.endswith(".") or ".." in name
            or name.lower().startswith(("aws.", "amazon."))):
        _bad(f"The message attribute name '{name}' is invalid. Attribute name can contain "
             "A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) characters.")


def validate(attributes, what="Message (user) attribute"):
    """The SQS MessageAttributes of a request, checked, with binary values decoded:
    {name: {"DataType", "StringValue" | "BinaryValue" (bytes)}}."""
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        _bad("MessageAttributes must be a map")
    if len(attributes) > MAX_ATTRIBUTES:
        _bad(f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
             f"[{MAX_ATTRIBUTES}].")
    out = {}
    for name, a in attributes.items():
        _check_name(name, what)
        if not isinstance(a, dict):
            _bad(f"{what} '{name}' must be a structure")
        dtype = a.get("DataType")
        if not dtype:
            _bad(f"{what} '{name}' must contain a non-empty attribute type.")
        if not isinstance(dtype, str) or not _TYPE.match(dtype):
            _bad(f"The message attribute '{name}' has an invalid message attribute type, the "
                 "set of supported type prefixes is Binary, Number, and String.")
        if "StringListValues" in a or "BinaryListValues" in a:
            raise SqsError("UnsupportedOperation",
                           f"{what} '{name}': list values are not supported by SQS")
        out[name] = _value(name, dtype, a, what)
    return out


def _value(name, dtype, a, what):
    base = dtype.split(".", 1)[0]
    if base == "Binary":
        raw = a.get("BinaryValue")
        if raw is None or raw == "":
            _bad(f"{what} '{name}' must contain a non-empty value of type 'Binary'.")
        # The JSON protocol carries a binary value as base64 text: only a string is one
        # (bytes() of a number would make that many zero bytes).
        if not isinstance(raw, str):
            _bad(f"{what} '{name}': BinaryValue must be a base64 string")
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            _bad(f"{what} '{name}': BinaryValue is not base64")
        return {"DataType": dtype, "BinaryValue": data}
    value = a.get("StringValue")
    if value is None or value == "" or not isinstance(value, str):
        _bad(f"{what} '{name}' must contain a non-empty value of type '{base}'.")
    if base == "Number":
        digits = re.sub(r"[^0-9]", "", value.split("e")[0].split("E")[0])
        if not _NUMBER.match(value.strip()) or len(digits.lstrip("0")) > 38:
            _bad(f"Can't cast the value of message (user) attribute '{name}' to a number.")
    return {"DataType": dtype, "StringValue": value}


def size_of(attributes):
    """Bytes the attributes count toward MaximumMessageSize (names, types and values)."""
    n = 0
    for name, a in attributes.items():
        n += len(name.encode()) + len(a["DataType"].encode())
        n += len(a["BinaryValue"]) if "BinaryValue" in a else len(
            a["StringValue"].encode())
    return n


def to_store(attributes, system=None):
    """The stored str: str pairs (a sorted tuple, or None) for validated attributes and
    the message's system values (reserved keys without their prefix: group, dedup, ...)."""
    pairs, types = {}, {}
    for name, a in attributes.items():
        if "BinaryValue" in a:
            pairs[name] = base64.b64encode(a["BinaryValue"]).decode("ascii")
        else:
            pairs[name] = a["StringValue"]
        if a["DataType"] != "String":
            types[name] = a["DataType"]
    if types:
        pairs[TYPES] = json.dumps(types, separators=(",", ":"), sort_keys=True)
    for key, value in (system or {}).items():
        if value is not None:
            pairs[RESERVED + key] = value
    return tuple(sorted(pairs.items())) or None


def from_store(pairs):
    """(SQS attributes {name: {...}} with bytes for binary values, system values {key:
    value}) of a stored message's attributes (a dict)."""
    pairs = dict(pairs or {})
    try:
        types = jsontext.loads(pairs.pop(TYPES, "{}"))
    except ValueError:
        types = {}
    attributes, system = {}, {}
    for key, value in pairs.items():
        if key.startswith(RESERVED):
            system[key[len(RESERVED):]] = value
            continue
        dtype = types.get(key, "String")
        if dtype.startswith("Binary"):
            try:
                attributes[key] = {"DataType": dtype, "BinaryValue": base64.b64decode(value)}
                continue
            except (binascii.Error, ValueError):
                dtype = "String"
        attributes[key] = {"DataType": dtype, "StringValue": value}
    return attributes, system


def select(attributes, names):
    """The attributes a ReceiveMessage's MessageAttributeNames ask for ("All", ".*", a name,
    or a prefix ending in ".*")."""
    if not names:
        return {}
    if any(n in ("All", ".*") for n in names):
        return dict(attributes)
    exact = {n for n in names if not n.endswith(".*")}
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {k: v for k, v in attributes.items() if k in exact or k.startswith(prefixes)}


def to_json(attributes):
    """The JSON protocol's MessageAttributes (BinaryValue in base64)."""
    out = {}
    for name, a in attributes.items():
        if "BinaryValue" in a:
            out[name] = {"DataType": a["DataType"],
                         "BinaryValue": base64.b64encode(a["BinaryValue"]).decode("ascii")}
        else:
            out[name] = {"DataType": a["DataType"], "StringValue": a["StringValue"]}
    return out
