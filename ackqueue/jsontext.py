"""JSON text from outside the process (request bodies and headers, message bodies a
client says are JSON, attributes a client stored), parsed with a bound on its nesting.

json.loads recurses once per level of arrays and objects, so a text of 10^5 opening
brackets raises RecursionError, which no caller expects of bad input.  ``loads`` raises
TooDeep instead, a ValueError: every caller that refuses text that is not JSON with
``except ValueError`` refuses it the same way, with its own error shape.  The bound is
Python's recursion limit less the caller's stack (about a thousand levels): deeper than
any document the service's fronts take, and RFC 8259 (section 9) lets a parser set it.
"""
import json
import sys

__all__ = ["loads", "why", "TooDeep"]


class TooDeep(ValueError):
    """A JSON text nested deeper than this process parses."""


def loads(data):
    """json.loads(data); TooDeep (a ValueError) when data is nested too deeply to parse."""
    try:
        return json.loads(data)
    except RecursionError:
        raise TooDeep(f"the JSON text is nested too deeply (more than about "
                      f"{sys.getrecursionlimit()} levels of arrays and objects)") from None


def why(exc):
    """": the reason" when exc is a TooDeep, else "": what a caller appends to its own
    message for text it refuses, so that the client learns it was the nesting."""
    return f": {exc}" if isinstance(exc, TooDeep) else ""
