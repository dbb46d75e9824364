"""The MD5 digests SQS returns with a message, computed exactly as AWS does (the SDKs of
Java, .NET and boto's checks compare them with their own): MD5OfMessageBody is the hex MD5
of the body's UTF-8 bytes; MD5OfMessageAttributes (and MD5OfMessageSystemAttributes) the
hex MD5 of, for each attribute in name order: the name, the data type and the value, each
as a 4-byte big-endian length and its bytes, with a one-byte transport type before the value
(1: a string value, for String and Number types; 2: a binary value)."""
import hashlib
import struct

__all__ = ["md5_of_body", "md5_of_attributes"]

_LEN = struct.Struct(">I")


def md5_of_body(body):
    data = body.encode("utf-8") if isinstance(body, str) else body
    return hashlib.md5(data).hexdigest()


def _field(data):
    return _LEN.pack(len(data)) + data


def md5_of_attributes(attributes):
    """attributes: {name: {"DataType": ..., "StringValue": str | "BinaryValue": bytes}}
    (the JSON protocol's shape, BinaryValue already base64-decoded); None when empty."""
    if not attributes:
        return None
    out = bytearray()
    for name in sorted(attributes):
        a = attributes[name]
        out += _field(name.encode("utf-8"))
        out += _field(a["DataType"].encode("utf-8"))
        if "BinaryValue" in a:
            out += b"\x02" + _field(a["BinaryValue"])
        else:
            out += b"\x01" + _field(a["StringValue"].encode("utf-8"))
    return hashlib.md5(bytes(out)).hexdigest()
