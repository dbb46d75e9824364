"""Opening a TARGET (a queue file, a zeo:// URL or a queue service's http(s):// URL) for a
command, and the errors and exit codes the commands share."""
import functools
import logging
import os

import click
import transaction

from .. import store
from ..shared import files
from ..errors import AckQueueError, QueueLocked
from ..queue import CLASSES, AckQueue, queues
from ..database import open_database

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND = 0, 1, 2, 3


class CommandError(click.ClickException):
    """A one-line error, exit code 1."""

    exit_code = EXIT_ERROR


class QueueNotFound(CommandError):
    exit_code = EXIT_NOT_FOUND


def user_errors(func):
    """Turn the errors a user's mistake causes (a bad path, a locked file, a server that
    is not there, a bad option value) into one-line errors instead of tracebacks."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except (AckQueueError, OSError, ValueError, TypeError) as exc:
            raise CommandError(one_line(exc)) from None
    return wrapper


def one_line(exc):
    """The message of exc as one line for the command line's Error: output."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and exc.strerror and str(exc.filename) not in text:
        text = f"{exc.strerror}: {exc.filename}"
    return " ".join(text.split())


def is_server(where):
    return where.startswith("zeo://")


def is_service(where):
    return where.startswith(("http://", "https://"))


class Target:
    """An open TARGET: ``with Target(where) as t: t.queue("jobs")``.  A file that does
    not exist is an error unless create=True (put and import create it)."""

    def __init__(self, where, *, create=False):
        self.where = where
        self._queues = []
        self.shared = is_service(where)     # reached through a service's API
        if is_service(where):
            # Through the queue service: its native API (ackqueue.remote); queues are
            # FIFO there, and the service packs its file itself (POST /v1/pack).
            self.database = None
            return
        if is_server(where):
            # ZEO's client logs its reconnection attempts; the command says it in one line.
            logging.getLogger("ZEO").setLevel(logging.CRITICAL)
        else:
            if os.path.isdir(where):
                raise CommandError(f"{where!r} is a directory, not a queue file")
            if not create and not os.path.exists(where):
                raise CommandError(f"no queue file at {where!r}")
        try:
            self.database = open_database(where)
        except QueueLocked:
            if is_server(where) or not files.reachable(where):
                raise
            # A program holds the file and shares it (ackqueue.shared): through it, with
            # what a client of it can do (the service's drop-in's).
            self.database = None
            self.shared = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        for q in self._queues:
            q.close()
        self._queues = []
        if self.database is not None:
            self.database.release()
            self.database = None

    def catalog(self):
        """{name: {"kind": kind, "ready", "in_flight", "delayed", and the lifetime totals}}
        for every queue of the store, read from a fresh snapshot (changes nothing)."""
        if self.database is None:
            return self._service_catalog()
        tm = transaction.TransactionManager()
        conn = self.database.db.open(transaction_manager=tm)
        try:
            tm.begin()
            root = conn.root().get(store.ROOT_KEY)
            result = {}
            for name, rec in (root.queues.items() if root is not None else ()):
                counts = {f: rec.counts.get(f) for f in store.Counters.FIELDS}
                counts["in_flight"] = counts.pop("inflight")
                result[name] = {"kind": rec.kind, **counts}
            tm.abort()
            return result
        finally:
            conn.close()

    def _service_catalog(self):
        """The catalog as the queue service reports it (GET /v1/queues, then each queue's
        counts and totals)."""
        result = {}
        for name in queues(self.where):
            q = AckQueue(path=self.where, name=name)
            try:
                result[name] = {"kind": store.FIFO, **q.stats()}
            finally:
                q.close()
        return result

    def pack(self):
        """Pack the storage while its queues stay in use; a maintenance.PackReport.  The
        queue service packs its own file, asked through a handle on it (nothing is put)."""
        from ..maintenance import pack
        if self.database is not None:
            return pack(self.database)
        probe = AckQueue(path=self.where)
        try:
            return probe.pack()
        finally:
            probe.close()

    def queue(self, name, *, must_exist=True, kind=None):
        """The queue called name, opened with its own class (FIFO, LIFO or priority).  A
        missing queue raises QueueNotFound (exit 3) unless must_exist is False; then it
        is created with kind (FIFO when None) by the first put."""
        found = self.catalog().get(name, {}).get("kind")
        if found is None and must_exist:
            raise QueueNotFound(f"queue {name!r} not found in {self.where}")
        if self.shared:
            found, kind = store.FIFO, None    # the service opens FIFO queues
        q = CLASSES[found or kind or store.FIFO](path=self.where, name=name)
        self._queues.append(q)
        return q
