"""A full storage, as the service answers it: 503 with a code and Retry-After, and one log
line per interval rather than a traceback per request.

A commit that does not fit raises the OSError of the write that failed: ENOSPC (the file
system is full), EDQUOT (a quota) or EFBIG (the process's file size limit,
RLIMIT_FSIZE); the storage cuts the transaction off the file (storage.py), so nothing of
that commit is kept and the queues stay usable.  Nothing is wrong with the request: the
native and Sasquatch APIs answer 503 ``StorageFull`` and the SQS protocol 503
``ServiceUnavailable`` (what SDKs retry), each with ``Retry-After: RETRY_AFTER``, and the
service recovers by itself: the first commit that fits once space is freed succeeds.
A request of several commits (a batch of rows, Sasquatch's send_batch) may have stored
the commits before the one that did not fit; Sasquatch's send_batch says which entries
failed, as for any other entry error.
"""
import errno
import logging
import threading
import time

__all__ = ["FULL_ERRNOS", "RETRY_AFTER", "full_error", "message", "Throttled"]

log = logging.getLogger("ackqueue.service")

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


def message(full):
    """What a client is told when the OSError full refused its request's commit."""
    return (f"the service's storage is full ({full.strerror or full}): the request's "
            f"changes were not stored; retry after {RETRY_AFTER} s, once space is freed")


class Throttled:
    """A log of one kind of event that writes at most one line per interval: the first
    event at once, then, at the first event an interval after the last line, one line
    with how many events there were since (clock: injectable, monotonic seconds).
    Thread-safe."""

    def __init__(self, text, interval=LOG_INTERVAL, clock=time.monotonic, logger=log):
        self.text, self.interval, self.clock, self.logger = text, interval, clock, logger
        self.lock = threading.Lock()
        self.count = 0              # events since the last line
        self.next_at = None         # when the next line may be written (None: at once)

    def __call__(self, detail):
        """Count one event; log a line (text, detail, the count) if one is due; whether
        a line was written."""
        with self.lock:
            self.count += 1
            now = self.clock()
            if self.next_at is not None and now < self.next_at:
                return False
            count, self.count = self.count, 0
            self.next_at = now + self.interval
        self.logger.error("%s (%s): %d request%s refused since the last such line (at "
                          "most one line every %g s)", self.text, detail, count,
                          "" if count == 1 else "s", self.interval)
        return True
