"""Reads that a simultaneous pack cut short are read again from a fresh snapshot.

A pack drops every revision that was no longer current at its pack time
(ackqueue.maintenance).  A reader whose snapshot began before that time may still need one
of those revisions; when it has to load it (from the file, or from the server because its
caches no longer hold it), ZODB raises ReadConflictError ("object deleted, likely by
simultaneous pack").  Nothing is wrong with the data: a snapshot taken now reads the
current revisions, which every pack keeps.

Contract: ``read_fresh(read, abort)`` calls ``read()``, which must only read (nothing
submitted or changed before it can raise) and take its snapshot itself (a new
transaction).  On ReadConflictError it calls ``abort()`` (end the stale snapshot) and
reads again, up to READ_TRIES times; then the error is raised.  ``fresh_reads`` is the
same as a method decorator for ackqueue.arbiters.shared's reading methods (their snapshot is the
arbiter's reading connection).  Other conflicts and errors are raised at once.
"""
import functools
import logging

from ZODB.POSException import ReadConflictError

__all__ = ["read_fresh", "fresh_reads", "READ_TRIES"]

log = logging.getLogger(__name__)

# Each try reads from a snapshot newer than the last pack that cut one short, so a second
# failure needs a second pack within the read's few milliseconds; a few tries are plenty.
READ_TRIES = 5


def read_fresh(read, abort):
    """read(), read again from a fresh snapshot when a pack removed what it was reading."""
    for attempt in range(READ_TRIES):
        try:
            return read()
        except ReadConflictError as exc:
            abort()
            if attempt == READ_TRIES - 1:
                raise
            log.debug("ackqueue: a pack removed a revision this read needed (%s); "
                      "reading again from a fresh snapshot", exc)
    raise AssertionError("unreachable")     # pragma: no cover


def fresh_reads(method):
    """Decorate a SharedArbiter method that reads through its read connection (its
    abort_reads() starts a fresh snapshot)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return read_fresh(lambda: method(self, *args, **kwargs), self.abort_reads)
    return wrapper
