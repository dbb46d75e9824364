"""The service's error answers (the native, Sasquatch and batch APIs; the SQS protocol has
its own, sqs/errors.py).

Every client mistake is answered with a status and a JSON body
``{"error": {"code": ..., "message": ..., <extra fields>}}``; a handler raises ApiError
and the runtime's error middleware (runtime.Api.errors) turns it into that answer.  A
body over the limit (413) or one that stalls (408) is answered by a response that also
closes the connection, so that its unread rest is never parsed as a request.
"""
from aiohttp import web

__all__ = ["ApiError", "error_response", "closing_response", "TOO_LARGE", "refused"]

TOO_LARGE = (413, "MessageSizeExceeded", "the request body is over the limit")


class ApiError(Exception):
    """An error answer: status, code and message, extra fields of the error object, and
    headers of the response (Retry-After, say)."""

    def __init__(self, status, code, message, *, headers=None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
        self.headers = headers


def error_response(status, code, message, *, headers=None, **extra):
    """The JSON error answer: {"error": {"code", "message", **extra}} with status."""
    body = {"error": {"code": code, "message": message}}
    body["error"].update(extra)
    return web.json_response(body, status=status, headers=headers)


def closing_response(status, code, message, **extra):
    """An error answer that also closes the connection: the rest of a body over the limit,
    or of a stalled one, is never read."""
    resp = error_response(status, code, message, **extra)
    resp.force_close()
    return resp


def refused(exc):
    """The ApiError (415 UnsupportedEncoding) for an ackqueue.errors.EncodingRefused."""
    return ApiError(415, "UnsupportedEncoding", str(exc), codec=exc.codec,
                    encoding=exc.encoding)
