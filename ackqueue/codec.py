"""How an item becomes the bytes a queue stores, and back: one rule for every front.

A stored body says how to read it by its first byte, so any front (Python, the HTTP
service, the command line) reads any body without knowing who wrote it:

- ``\\x01`` + UTF-8: a str, stored as text;
- ``\\x02`` + bytes: a bytes item, stored as it is;
- ``\\x03`` + UTF-8 JSON: a JSON value (a queue opened with codec="json");
- anything else is a pickle (every pickle ackqueue writes starts with ``\\x80``, the PROTO
  opcode of protocol 2 and later; so does every body of a format-1 file).

So an HTTP client reads as text what Python put as a str, and Python gets a str back for
what an HTTP client sent as text, and a server that hands bodies to remote clients never
needs to unpickle anything: ``kind(body)`` and ``payload(body)`` tell it what the bytes are.

A queue's codec (stored with the queue, so producers and consumers agree) decides only how
items are *encoded*:

- ``"pickle"`` (the default): str as text, bytes as bytes, any other object pickled, so
  every picklable item queue.Queue took still works;
- ``"json"``: every item as JSON (TypeError for what JSON cannot encode);
- ``"str"``: str items only, as text;
- ``"bytes"``: bytes items only.

Decoding follows the body's own mark, with one exception that the codec decides: a queue
whose codec is not "pickle" never unpickles.  Its consumers picked a codec whose items
cannot run code, so a pickle body found in it (put by an older ackqueue, or by a process
that wrote the file before the codec was recorded) is refused (PickleRefused) without
being read.  The other way round, the bodies a queue *admits* from fronts that send
already-encoded bytes (the service, ``put_many(encoded=True)``) are those of its codec
alone, except that a "pickle" queue admits every encoding (``check_admitted``).

Unpickling runs code named by the pickle: a consumer that reads a queue it does not fully
trust passes an allow-list (``AckQueue(allowed_classes=...)``), and a pickle that names any
other class or function is refused (ForbiddenClass) without running anything.  Plain data
(str, bytes, numbers, None, bool, and lists, tuples, dicts, sets of them) needs no entry.
"""
import functools
import io
import json
import pickle

from . import jsontext
from .errors import EncodingRefused, ForbiddenClass, PickleRefused, UnpicklableItem

__all__ = ["CODECS", "DEFAULT", "encode", "decode", "kind", "payload", "mark",
           "check_codec", "allowed_set", "TEXT", "BYTES", "JSON", "PICKLE", "MARKS",
           "admits", "check_admitted", "refusal", "mark_text"]

PICKLE, JSON, TEXT, BYTES = "pickle", "json", "str", "bytes"
CODECS = (PICKLE, JSON, TEXT, BYTES)
DEFAULT = PICKLE

_TEXT, _BYTES, _JSON = b"\x01", b"\x02", b"\x03"
_KINDS = {1: TEXT, 2: BYTES, 3: JSON}
MARKS = tuple(_KINDS)      # first bytes of a body that is not a pickle (see decode)


def check_codec(codec):
    """A valid codec name (None: the queue's stored one, or the default)."""
    if codec is None or codec in CODECS:
        return codec
    raise ValueError(f"unknown codec {codec!r}: use one of {', '.join(CODECS)}")


def admits(queue_codec, encoding):
    """Whether a queue with codec queue_codec takes a body of this encoding (kind)."""
    return queue_codec == PICKLE or encoding == queue_codec


def check_admitted(queue_codec, bodies, name=None):
    """Raise EncodingRefused for the first of the stored bodies whose encoding a queue
    with codec queue_codec does not admit (see admits); name: the queue's, for the
    message."""
    if queue_codec == PICKLE:           # admits every encoding: no body to look at
        return
    for index, body in enumerate(bodies):
        encoding = kind(body)
        if not admits(queue_codec, encoding):
            raise refusal(queue_codec, encoding, name, index)


def refusal(queue_codec, encoding, name=None, index=None):
    """The EncodingRefused for a body of encoding sent to a queue of queue_codec."""
    where = "" if index is None else f"message {index}: "
    queue = "the queue" if name is None else f"queue {name!r}"
    return EncodingRefused(
        f"{where}{queue} has codec {queue_codec!r} and takes {queue_codec} bodies only, "
        f"not {encoding}", codec=queue_codec, encoding=encoding, index=index)


def mark_text(queue_codec, data, name=None):
    """The stored body for text a front receives as a string (SQS's and Sasquatch's
    bodies), under the queue's codec: text in a "pickle" or "str" queue, its UTF-8 bytes
    in a "bytes" queue, JSON in a "json" queue (EncodingRefused when it is not JSON).
    data: UTF-8 bytes."""
    if queue_codec in (PICKLE, TEXT):
        return _TEXT + data
    if queue_codec == BYTES:
        return _BYTES + data
    try:
        jsontext.loads(data)
    except ValueError as exc:
        raise EncodingRefused(
            f"{'the queue' if name is None else f'queue {name!r}'} has codec 'json': a "
            f"message body must be a JSON text{jsontext.why(exc)}", codec=JSON,
            encoding=TEXT) from None
    return _JSON + data


def encode(item, codec=DEFAULT):
    """The bytes to store for item under the queue's codec."""
    if codec == PICKLE:
        if type(item) is str:
            return _TEXT + item.encode("utf-8", "surrogatepass")
        if type(item) is bytes:
            return _BYTES + item
        return pickle_item(item)
    if codec == TEXT:
        if not isinstance(item, str):
            raise TypeError(f"a queue with codec 'str' takes str items, not "
                            f"{type(item).__name__}")
        return _TEXT + item.encode("utf-8", "surrogatepass")
    if codec == BYTES:
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise TypeError(f"a queue with codec 'bytes' takes bytes items, not "
                            f"{type(item).__name__}")
        return _BYTES + bytes(item)
    if codec == JSON:
        try:
            return _JSON + json.dumps(item, separators=(",", ":"),
                                      ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a queue with codec 'json' cannot encode a "
                            f"{type(item).__name__!r} item: {exc}") from None
    raise ValueError(f"unknown codec {codec!r}")


def encode_many(items, codec=DEFAULT):
    """[(item, encode(item, codec))] for each of items (a batch: pickles without a call of
    encode per item)."""
    if codec != PICKLE:
        return [(item, encode(item, codec)) for item in items]
    kinds = set(map(type, items))
    if str not in kinds and bytes not in kinds:
        # Every item is pickled: in one pass, without a call per item (the usual batch).
        try:
            bodies = list(map(_dumps, items))
        except Exception:
            pass                      # the loop below names the item pickle refuses
        else:
            return list(zip(items, bodies))
    out = []
    for item in items:
        kind = type(item)
        if kind is str:
            out.append((item, _TEXT + item.encode("utf-8", "surrogatepass")))
        elif kind is bytes:
            out.append((item, _BYTES + item))
        else:
            out.append((item, pickle_item(item)))
    return out


_dumps = functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_item(item):
    """Pickle an item; anything pickle refuses becomes UnpicklableItem."""
    try:
        return pickle.dumps(item, pickle.HIGHEST_PROTOCOL)   # (the protocol as a keyword
                                                             # parses slower, every put)
    except Exception as exc:
        raise UnpicklableItem(
            f"cannot queue a {type(item).__name__!r} item: it cannot be pickled ({exc})"
        ) from exc


def kind(body):
    """What a stored body holds: "str", "bytes", "json" or "pickle"."""
    return _KINDS.get(body[0], PICKLE) if body else PICKLE


def payload(body):
    """A stored body's bytes without its mark (a pickle is its own payload)."""
    return body[1:] if body and body[0] in _KINDS else body


def mark(what, data):
    """The stored body for data (bytes) that a remote client says is a str (UTF-8), bytes,
    JSON or a pickle; ValueError if data is not what it says (never unpickled: a pickle
    is only checked to start as one)."""
    data = bytes(data)
    if what == TEXT:
        data.decode("utf-8", "surrogatepass")          # ValueError if it is not UTF-8
        return _TEXT + data
    if what == BYTES:
        return _BYTES + data
    if what == JSON:
        jsontext.loads(data)                            # ValueError if it is not JSON
        return _JSON + data
    if what == PICKLE:
        if not data.startswith(b"\x80"):
            raise ValueError("a pickle body must be pickled with protocol 2 or later")
        return data
    raise ValueError(f"unknown encoding {what!r}: use one of {', '.join(CODECS)}")


def allowed_set(classes):
    """None (no limit), or the (module, qualified name) pairs of classes, given as classes
    or functions, or as "module.Name" strings (the last dot splits them)."""
    if classes is None:
        return None
    if isinstance(classes, (str, type)):
        raise TypeError("allowed_classes must be a collection of classes or names")
    pairs = set()
    for c in classes:
        if isinstance(c, str):
            module, dot, name = c.rpartition(".")
            if not dot or not module or not name:
                raise ValueError(f"allowed class {c!r} must be 'module.Name'")
            pairs.add((module, name))
        elif hasattr(c, "__module__") and hasattr(c, "__qualname__"):
            pairs.add((c.__module__, c.__qualname__))
        else:
            raise TypeError(f"allowed_classes entries are classes or 'module.Name' strings, "
                            f"not {type(c).__name__}")
    return frozenset(pairs)


class _AllowListUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only allowed classes and functions."""

    def __init__(self, file, allowed):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module, name):
        if (module, name) not in self.allowed:
            raise ForbiddenClass(
                f"the item names {module}.{name}, which is not in allowed_classes; "
                "nothing of it was run")
        return super().find_class(module, name)


def decode(body, allowed=None, queue_codec=PICKLE):
    """The item a stored body holds.  A pickle is unpickled only in a queue whose codec is
    "pickle" (PickleRefused otherwise, nothing of it read): with allowed (allowed_set's
    result) only those classes may be named (ForbiddenClass otherwise)."""
    mark = body[0] if body else None
    if mark == 1:
        return body[1:].decode("utf-8", "surrogatepass")
    if mark == 2:
        return bytes(body[1:])
    if mark == 3:
        return json.loads(body[1:])
    if queue_codec != PICKLE:
        raise PickleRefused(
            f"the body is a pickle and the queue's codec is {queue_codec!r}, which never "
            "unpickles: it was not read", codec=queue_codec)
    if allowed is None:
        return pickle.loads(body)
    return _AllowListUnpickler(io.BytesIO(body), allowed).load()
