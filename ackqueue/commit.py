"""How queue operations become ZODB commits.

One Committer serves one database in this process.  It owns one ZODB connection and one
thread.  Callers hand it *units* (a list of ackqueue.store operations that must commit as
one) and get a Ticket back.  The committer takes every unit that is waiting, applies them
all through its connection and commits once: with a FileStorage that is one write and one
fsync for the whole group (group commit).  A caller that needs durability waits on its
ticket; one that does not (a delivery, whose loss a crash would repair anyway) does not.

Why a single writer: a FileStorage commit holds a storage-wide lock through its fsync, so
commits from many connections only queue up behind each other, one fsync each.  Gathering
the operations of many threads into one commit is what makes durable operations cheap.

A unit whose operations fail to apply, or a commit that fails for a reason other than a
write conflict, is retried alone so that one bad unit cannot fail its neighbours.  Write
conflicts (another writer, such as an application's own connection or another process
through a server, changed the same objects) are retried on a fresh snapshot: the operations
are logical and re-apply cleanly.  A unit the store refuses (ackqueue.errors.Refused: a
claim of a message another process took, a late ack) writes nothing and fails alone while
the rest of its group commits.

Through a server, a commit cut off by a lost connection is retried once the client has
reconnected (ZEO reconnects by itself).  Its first attempt may have committed, so units
that ran into that are marked ``uncertain`` for their owners to interpret.
"""
import collections
import itertools
import logging
import random
import threading
import time

import transaction
from ZEO.Exceptions import ClientDisconnected
from ZODB.POSException import ConflictError

from .errors import Refused, ServerUnavailable
from .store import apply_unit

__all__ = ["Committer", "Ticket", "CommitterClosed"]

log = logging.getLogger(__name__)

CONFLICT_PATIENCE = 30.0    # seconds of conflict retries before a unit fails
CONFLICT_BACKOFF = 0.005    # at most this long (random, growing) between conflict retries
DISCONNECT_RETRIES = 3      # each waits up to the client storage's wait_timeout


class CommitterClosed(RuntimeError):
    """The queue's storage was closed before the operation could be committed."""


class Ticket:
    """One unit of operations on its way to the store.

    ``on_commit()`` or ``on_fail(error)`` runs in the committer thread once the outcome is
    known, before waiters are released; ``wait()`` returns after a durable commit or raises
    the error that prevented it."""

    __slots__ = ("ops", "on_commit", "on_fail", "error", "uncertain", "_done")

    def __init__(self, ops, on_commit=None, on_fail=None):
        self.ops = ops
        self.on_commit = on_commit
        self.on_fail = on_fail
        self.error = None
        self.uncertain = False    # an earlier attempt was cut off by a lost connection
        self._done = threading.Event()

    def apply(self, root):
        apply_unit(root, self.ops)

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            return False
        if self.error is not None:
            raise self.error
        return True

    def _settle(self, error):
        self.error = error
        callback, arg = (self.on_commit, ()) if error is None else (self.on_fail, (error,))
        try:
            if callback is not None:
                callback(*arg)
        except Exception:  # a callback bug must not stall every later commit
            log.exception("ackqueue: commit callback failed")
        finally:
            self._done.set()


class Committer:
    """The single writer of one database in this process (see the module docstring)."""

    def __init__(self, db, *, description="ackqueue"):
        self._db = db
        self._cond = threading.Condition(threading.Lock())
        self._pending = []
        self._closing = False
        self.commits = 0          # how many ZODB commits were made
        self.units = 0            # how many units they carried
        self.conflicts = 0        # how many commits had to be retried after a conflict
        self.refused = 0          # how many units the store refused (see Refused)
        self.conflicts_by_class = collections.Counter()   # which objects conflicted
        self._thread = threading.Thread(target=self._run, name=f"{description}-committer",
                                        daemon=True)
        self._thread.start()

    def submit(self, ops, on_commit=None, on_fail=None):
        """Queue a unit for the next commit and return its Ticket."""
        ticket = Ticket(ops, on_commit, on_fail)
        with self._cond:
            if self._closing:
                raise CommitterClosed("the queue's storage is closed")
            self._pending.append(ticket)
            self._cond.notify()
        return ticket

    def close(self):
        """Commit what is pending, then stop the thread and close the connection."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self):
        tm = transaction.TransactionManager(explicit=True)
        conn = self._db.open(transaction_manager=tm)
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        self._cond.wait()
                    if not self._pending:
                        return
                    batch, self._pending = self._pending, []
                self._commit_group(conn, tm, batch)
        finally:
            try:
                conn.close()
            except Exception:  # pragma: no cover - closing after a storage failure
                log.exception("ackqueue: closing the committer's connection failed")

    def _commit_group(self, conn, tm, batch):
        if not any(ticket.ops for ticket in batch):
            for ticket in batch:          # barriers only: everything before them is in
                ticket._settle(None)
            return
        error, refused = self._try_commit(conn, tm, batch)
        if error is None:
            for ticket in batch:
                ticket._settle(refused.get(ticket))
            return
        if len(batch) == 1:
            batch[0]._settle(error)
            return
        # Something failed that was not a conflict: find the unit(s) at fault by committing
        # each alone, so the others still go through.
        for ticket in batch:
            error, refused = self._try_commit(conn, tm, [ticket])
            ticket._settle(error or refused.get(ticket))

    def _try_commit(self, conn, tm, batch):
        """Apply and commit batch; return (None or the error, {ticket: Refused})."""
        error, disconnects = None, 0
        give_up = time.monotonic() + CONFLICT_PATIENCE
        for attempt in itertools.count():
            refused = {}
            tm.begin()
            try:
                root = conn.root()
                for ticket in batch:
                    try:
                        ticket.apply(root)
                    except Refused as exc:
                        refused[ticket] = exc
                tm.commit()
            except ConflictError as exc:
                tm.abort()
                self.conflicts += 1
                self.conflicts_by_class[exc.class_name or "?"] += 1
                error = exc
                if time.monotonic() >= give_up:
                    break
                # Writers that collided would collide again if they retried in step.
                time.sleep(random.uniform(0, min(CONFLICT_BACKOFF, 0.0005 * 2 ** attempt)))
                continue
            except ClientDisconnected as exc:
                tm.abort()
                for ticket in batch:
                    ticket.uncertain = True
                disconnects += 1
                error = ServerUnavailable(
                    f"the connection to the queue server was lost while committing ({exc}); "
                    "the operation may or may not have been committed")
                if disconnects >= DISCONNECT_RETRIES:
                    break
                continue
            except Exception as exc:
                tm.abort()
                return exc, {}
            self.commits += 1
            self.units += len(batch) - len(refused)
            self.refused += len(refused)
            return None, refused
        return error, {}
