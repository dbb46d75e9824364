"""The native API's framed bodies (content type ``FRAMES``): several byte strings in one
HTTP body, each as a 4-byte big-endian length and its bytes, so message bodies travel as
raw bytes, with no base64 inflation.

One copy for the service (service/http.py), the remote drop-in (ackqueue.remote) and the Spark
client (spark/client.py); it imports nothing but struct, so Spark's Python workers and a
plain ``pip install ackqueue`` can use it without the service's aiohttp.
"""
import struct

__all__ = ["FRAMES", "encode_frames", "decode_frames"]

FRAMES = "application/vnd.ackqueue.frames"
_U32 = struct.Struct(">I")


def encode_frames(parts):
    """bytes parts -> one body: each part as a 4-byte big-endian length and its bytes."""
    out = bytearray()
    for p in parts:
        out += _U32.pack(len(p))
        out += p
    return bytes(out)


def decode_frames(data):
    """One framed body -> its parts (bytes); ValueError when a frame is cut short."""
    parts, i, end = [], 0, len(data)
    while i < end:
        if end - i < 4:
            raise ValueError("a frame's 4-byte length is cut short")
        (n,) = _U32.unpack_from(data, i)
        i += 4
        if n > end - i:
            raise ValueError("a frame is shorter than its length says")
        parts.append(bytes(data[i:i + n]))
        i += n
    return parts
