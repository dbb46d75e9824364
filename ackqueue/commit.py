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
conflicts (another writer, such as an application's own connection, changed the same
objects) are retried on a fresh snapshot: the operations are logical and re-apply cleanly.
"""
import logging
import threading

import transaction
from ZODB.POSException import ConflictError

__all__ = ["Committer", "Ticket", "CommitterClosed"]

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 20


class CommitterClosed(RuntimeError):
    """The queue's storage was closed before the operation could be committed."""


class Ticket:
    """One unit of operations on its way to the store.

    ``on_commit()`` or ``on_fail(error)`` runs in the committer thread once the outcome is
    known, before waiters are released; ``wait()`` returns after a durable commit or raises
    the error that prevented it."""

    __slots__ = ("ops", "on_commit", "on_fail", "error", "_done")

    def __init__(self, ops, on_commit=None, on_fail=None):
        self.ops = ops
        self.on_commit = on_commit
        self.on_fail = on_fail
        self.error = None
        self._done = threading.Event()

    def apply(self, root):
        for op in self.ops:
            op.apply(root)

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
        error = self._try_commit(conn, tm, batch)
        if error is None:
            for ticket in batch:
                ticket._settle(None)
            return
        if len(batch) == 1:
            batch[0]._settle(error)
            return
        # Something failed that was not a conflict: find the unit(s) at fault by committing
        # each alone, so the others still go through.
        for ticket in batch:
            ticket._settle(self._try_commit(conn, tm, [ticket]))

    def _try_commit(self, conn, tm, batch):
        """Apply and commit batch; return None on success or the error."""
        for attempt in range(CONFLICT_RETRIES):
            tm.begin()
            try:
                root = conn.root()
                for ticket in batch:
                    ticket.apply(root)
                tm.commit()
            except ConflictError as exc:
                tm.abort()
                self.conflicts += 1
                error = exc
                continue
            except Exception as exc:
                tm.abort()
                return exc
            self.commits += 1
            self.units += len(batch)
            return None
        return error
