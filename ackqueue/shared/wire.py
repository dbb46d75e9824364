"""The lean wire between a queue file's owner and its clients: length-prefixed frames.

A frame is ``u32 length`` (big-endian, what follows) then ``u32 request id``, ``u8 kind``
(an operation in a request; OK or ERROR in an answer), ``u32 header length``, the header
(JSON: the operation's arguments or its answer), and the blobs: each ``u32 length`` and
its bytes (message bodies, never parsed here).  One request, one answer, in order on one
connection; the request id lets a client check that an answer is the one it waits for.

Nothing here unpickles or evaluates: a header is JSON, a body stays bytes (ackqueue.codec
decides, in the client, what may be decoded).
"""
import json
import struct

__all__ = ["OPS", "OK", "ERROR", "MAX_FRAME", "WireError", "encode", "read_frame"]

OK, ERROR = 0, 1
# Operations: the request's kind byte.
OPS = {name: code for code, name in enumerate(
    ("hello", "ping", "codec", "put", "get", "ack", "nack", "visibility", "stats", "purge",
     "browse", "queues", "redrive", "pack"), start=10)}
OP_NAMES = {code: name for name, code in OPS.items()}

MAX_FRAME = 1 << 30           # a frame longer than this is a broken peer, not a message
_HEAD = struct.Struct(">IIBI")
_LEN = struct.Struct(">I")
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class WireError(OSError):
    """The peer sent what is not a frame, or closed the connection mid-frame."""


def encode(request_id, kind, header, blobs=()):
    """One frame, as bytes to send in one write."""
    head = _dumps(header).encode("utf-8")
    parts = [b"", _HEAD.pack(0, request_id, kind, len(head))[4:], head]
    size = _HEAD.size - 4 + len(head)
    for blob in blobs:
        parts.append(_LEN.pack(len(blob)))
        parts.append(blob)
        size += 4 + len(blob)
    parts[0] = _LEN.pack(size)
    return b"".join(parts)


def _exactly(sock, n, buf):
    """n bytes from sock, after what buf (a bytearray it consumes) holds already."""
    while len(buf) < n:
        data = sock.recv(max(65536, n - len(buf)))
        if not data:
            if buf:
                raise WireError("the connection ended in the middle of a frame")
            raise EOFError
        buf += data
    out = bytes(buf[:n])
    del buf[:n]
    return out


def read_frame(sock, buf):
    """(request id, kind, header, [blobs]) of the next frame on sock; EOFError when the
    peer closed the connection between frames.  buf: the connection's read buffer."""
    (size,) = _LEN.unpack(_exactly(sock, 4, buf))
    if not _HEAD.size - 4 <= size <= MAX_FRAME:
        raise WireError(f"a frame of {size} bytes")
    data = _exactly(sock, size, buf)
    request_id, kind, head_len = struct.unpack_from(">IBI", data)
    at = 9 + head_len
    if at > size:
        raise WireError("a frame's header runs past its end")
    try:
        header = json.loads(data[9:at])
    except ValueError:
        raise WireError("a frame's header is not JSON") from None
    blobs = []
    while at < size:
        if at + 4 > size:
            raise WireError("a blob's length runs past the frame's end")
        (n,) = _LEN.unpack_from(data, at)
        at += 4
        if at + n > size:
            raise WireError("a blob runs past the frame's end")
        blobs.append(data[at:at + n])
        at += n
    return request_id, kind, header, blobs
