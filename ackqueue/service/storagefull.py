"""A full storage, as the service answers it: 503 with a code and Retry-After, and one log
line per interval rather than a traceback per request.

A commit that does not fit raises the OSError of the write that failed: ENOSPC (the file
system is full), EDQUOT (a quota) or EFBIG (the process's file size limit,
RLIMIT_FSIZE); the storage cuts the transaction off the file (ackqueue.filestorage), so nothing of
that commit is kept and the queues stay usable.  Nothing is wrong with the request: the
native and Sasquatch APIs answer 503 ``StorageFull`` and the SQS protocol 503
``ServiceUnavailable`` (what SDKs retry), each with ``Retry-After: RETRY_AFTER``, and the
service recovers by itself: the first commit that fits once space is freed succeeds.  The
log gets one line, then one each LOG_INTERVAL with how many more requests were refused
(the service's listener.RateLimitedLog), never a traceback per request.
A request of several commits (a batch of rows, Sasquatch's send_batch) may have stored
the commits before the one that did not fit; Sasquatch's send_batch says which entries
failed, as for any other entry error.
"""
import errno

__all__ = ["FULL_ERRNOS", "RETRY_AFTER", "LOG_INTERVAL", "full_error", "message",
           "log_line"]

FULL_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG")
                        if hasattr(errno, n))
RETRY_AFTER = 30          # seconds a client is told to wait before it retries
LOG_INTERVAL = 60.0       # seconds between two log lines about a full storage


def full_error(exc):
    """The OSError of a full storage that exc is or was raised from (its __cause__ or
    __context__ chain), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def log_line(full, path):
    """The log line (and rate-limited log's key) for the OSError full on queue file path."""
    return (f"the storage is full ({full.strerror or full}; queue file {path}): requests "
            f"that write are answered 503 until space is freed")


def message(full):
    """What a client is told when the OSError full refused its request's commit."""
    return (f"the service's storage is full ({full.strerror or full}): the request's "
            f"changes were not stored; retry after {RETRY_AFTER} s, once space is freed")
