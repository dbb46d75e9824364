"""Messages as JSON lines, for export, import, peek --json and get --json.

One message per line::

    {"body": "send the invoice", "priority": 100, "attributes": {"k": "v"},
     "delay": 12.5, "retention": 345600.0, "state": "delayed", "receive_count": 0,
     "id": "...", "age": 3.2}

Bodies: a str item is the text itself; a bytes item is base64 with
``"encoding": "base64"``; any other item is base64 of its pickle (as the queue stores
it) with ``"encoding": "pickle"``.  ``delay`` is the time left before a delayed message
becomes ready, ``retention`` the time left before it expires; import puts each message
with them again, so a round trip keeps bodies, attributes, priorities, remaining delays
and remaining retention.  state, receive_count, id and age are informative: import
ignores them (an imported message is a new message, ready or delayed)."""
import base64
import json
import pickle

from ..browse import DELAYED

TEXT, BASE64, PICKLE = None, "base64", "pickle"
FIELDS = {"body", "encoding", "priority", "attributes", "delay", "retention", "state",
          "receive_count", "id", "age", "queue_kind"}


def encode_body(item, stored):
    """(body, encoding) for the JSON line: stored is the item's pickle as kept."""
    if isinstance(item, str):
        return item, TEXT
    if isinstance(item, bytes):
        return base64.b64encode(item).decode("ascii"), BASE64
    return base64.b64encode(stored).decode("ascii"), PICKLE


def message_record(m, now, queue_kind=None):
    """The JSON-lines dict of a BrowsedMessage (or a received Message, see record_of);
    queue_kind (fifo, lifo, value) lets an import create the queue with its kind."""
    body, encoding = encode_body(m.item, m.body)
    record = {"id": int(m.id), "body": body, "priority": m.priority,
              "attributes": dict(m.attributes), "state": m.state,
              "receive_count": m.receive_count, "age": round(m.age, 3)}
    if encoding is not TEXT:
        record["encoding"] = encoding
    if m.state == DELAYED and m.visible_at is not None:
        record["delay"] = max(0.0, m.visible_at - now)
    if m.expires_at is not None:
        record["retention"] = max(0.001, m.expires_at - now)
    if queue_kind is not None:
        record["queue_kind"] = queue_kind
    return record


def queue_kind_of(line):
    """The queue_kind a JSON line records (None if none, or not a message line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    kind = record.get("queue_kind") if isinstance(record, dict) else None
    return kind if kind in ("fifo", "lifo", "value") else None


class BadLine(ValueError):
    """A line of a JSON-lines file that is not a message."""


def parse_line(line, number):
    """(item, put options) of one JSON line; BadLine names the line number."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise BadLine(f"line {number}: not JSON ({exc})") from None
    if not isinstance(record, dict) or "body" not in record:
        raise BadLine(f"line {number}: expected an object with a \"body\"")
    unknown = set(record) - FIELDS
    if unknown:
        raise BadLine(f"line {number}: unknown field(s) {', '.join(sorted(unknown))}")
    body, encoding = record["body"], record.get("encoding")
    if not isinstance(body, str):
        raise BadLine(f"line {number}: \"body\" must be a string")
    if encoding not in (TEXT, BASE64, PICKLE):
        raise BadLine(f"line {number}: unknown encoding {encoding!r} "
                      "(expected none, \"base64\" or \"pickle\")")
    try:
        if encoding == TEXT:
            item = body
        else:
            raw = base64.b64decode(body.encode("ascii"), validate=True)
            item = raw if encoding == BASE64 else pickle.loads(raw)
    except Exception as exc:
        raise BadLine(f"line {number}: cannot decode the {encoding} body ({exc})") from None
    options = {}
    for name, kinds in (("priority", int), ("delay", (int, float)),
                        ("retention", (int, float)), ("attributes", dict)):
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise BadLine(f"line {number}: \"{name}\" has the wrong type")
        options[name] = value
    return item, options
