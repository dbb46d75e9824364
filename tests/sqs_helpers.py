"""Helpers of the SQS tests: a boto3 client of a real ``ackqueue serve``, and AWS's MD5 of
message attributes written out independently of the service's (from AWS's documentation),
so that a digest the service computes wrongly fails the tests."""
import hashlib
import itertools
import struct

import boto3
from botocore.config import Config

_names = itertools.count()


def client(url, key="test", secret="test-secret-0123456789", **config):
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 0}, **config))


def name(prefix="q"):
    return f"{prefix}{next(_names)}"


def aws_md5_of_attributes(attrs):
    """AWS's documented algorithm, over the request's shape (BinaryValue: bytes)."""
    out = b""
    for n in sorted(attrs):
        a = attrs[n]
        out += struct.pack(">I", len(n.encode())) + n.encode()
        out += struct.pack(">I", len(a["DataType"].encode())) + a["DataType"].encode()
        if "BinaryValue" in a:
            out += b"\x02" + struct.pack(">I", len(a["BinaryValue"])) + a["BinaryValue"]
        else:
            v = a["StringValue"].encode()
            out += b"\x01" + struct.pack(">I", len(v)) + v
    return hashlib.md5(out).hexdigest()
