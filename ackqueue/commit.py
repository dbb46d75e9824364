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

Who commits: whoever holds the *baton*.  A caller that submits a unit it will wait for
(``submit(..., lead=True)``) while it is the only thread doing so (no other thread's
durable unit is on its way or was submitted in the last LEAD_QUIET seconds) does not wake
the committer thread: in ``wait()`` it takes the baton if it is free and commits
everything pending itself.  That saves two thread switches per durable operation when one
thread works alone.  When several threads are at work the committer thread commits as
before, because its wake-up delay is what lets their units gather into one commit.  A
caller that finds the baton busy just waits: whoever releases the baton with units still
pending wakes the thread, which also commits the units nobody waits for (deliveries,
give-backs).  After a group that several threads waited for, the baton holder yields the
GIL before it commits again, so that their next units join that commit.  The connection
is used by one baton holder at a time.

A unit whose operations fail to apply, or a commit that fails for a reason other than a
write conflict, is retried alone so that one bad unit cannot fail its neighbours.  Write
conflicts (another writer, such as an application's own connection or another process
through a server, changed the same objects) are retried on a fresh snapshot: the operations
are logical and re-apply cleanly.  A unit the store refuses (ackqueue.errors.Refused: a
claim of a message another process took, a late ack) writes nothing and fails alone while
the rest of its group commits.

Deferred units (``defer()``: an acknowledgement in ``acks="deferred"`` mode) wait for no
one: they ride on the next commit anyone makes, and if none comes within ``defer_delay``
seconds (or the unit's own delay: ``ack_with_next_get=True`` through a server) the
committer thread commits them by itself.  ``flush()`` commits them now.

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
from zope.interface import implementer
from ZEO.Exceptions import ClientDisconnected
from ZODB.POSException import ConflictError

from .errors import Refused, ServerUnavailable
from .segments import write_alone
from .store import apply_unit
from .interfaces import ITicket

__all__ = ["Committer", "Ticket", "CommitterClosed", "settling"]

log = logging.getLogger(__name__)

CONFLICT_PATIENCE = 30.0    # seconds of conflict retries before a unit fails
CONFLICT_BACKOFF = 0.005    # at most this long (random, growing) between conflict retries
DISCONNECT_RETRIES = 3      # each waits up to the client storage's wait_timeout
LEADER_GRACE = 0.5          # seconds before the thread commits a unit whose leader left
LEAD_QUIET = 0.001          # seconds after another thread's durable submit before leading
DEFER_DELAY = 0.002         # seconds a deferred unit waits for another commit to ride on


_settling = threading.local()


def settling():
    """Whether the calling thread is running the outcome callbacks of a group commit (a
    ticket's on_commit/on_fail, and what they call: the seam's then=, ready listeners).
    The committer calls its group listeners once they have all run, so a bridge to an
    event loop can hold what they post and wake the loop once per group."""
    return getattr(_settling, "on", False)


def notify_waiting(condition, count=1):
    """condition.notify(count) (its lock held), skipped when nobody waits on it: a put, a
    get, an ack and a unit submitted to the committer each notify, and
    threading.Condition.notify is Python code even when there is nobody to wake.
    (Condition._waiters is the deque of its waiters, changed only under its lock; a
    thread not waiting yet looks at what it waits for, under that lock, before it does.)"""
    if condition._waiters:
        condition.notify(count)


class CommitterClosed(RuntimeError):
    """The queue's storage was closed before the operation could be committed."""


class _Done:
    """threading.Event's is_set, set and wait, on a bare lock held until set: a ticket is
    made and settled for every durable operation, and Event's Condition is Python code
    at each step while a lock is one C call."""

    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._set = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def is_set(self):
        return self._set

    def set(self):
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:      # set twice at once: the first one released it
                pass

    def wait(self, timeout=None):
        if self._set:
            return True
        if self._lock.acquire(True, -1 if timeout is None else max(timeout, 0)):
            self._lock.release()      # for the next waiter
        return self._set


@implementer(ITicket)
class Ticket:
    """One unit of operations on its way to the store.

    ``on_commit()`` or ``on_fail(error)`` runs in the committer thread once the outcome is
    known, before waiters are released; ``wait()`` returns after a durable commit or raises
    the error that prevented it."""

    __slots__ = ("ops", "on_commit", "on_fail", "error", "uncertain", "_done", "_leader",
                 "_durable")

    def __init__(self, ops, on_commit=None, on_fail=None, leader=None):
        self.ops = ops
        self.on_commit = on_commit
        self.on_fail = on_fail
        self.error = None
        self.uncertain = False    # an earlier attempt was cut off by a lost connection
        self._done = _Done()
        self._leader = leader     # the Committer whose baton wait() tries to take
        self._durable = False     # counted in the committer's _durable_on_way

    def apply(self, root):
        apply_unit(root, self.ops)

    def wait(self, timeout=None):
        if self._leader is not None and not self._done.is_set():
            self._leader._lead()
        if not self._done.wait(timeout):
            return False
        if self.error is not None:
            raise self.error
        return True

    def finished(self):
        """Whether the outcome is known (durable, or failed: see error)."""
        return self._done.is_set()

    def wait_finished(self):
        """Wait until the outcome is known, without raising its error (see error)."""
        self._done.wait()

    def _settle(self, error):
        self.error = error
        try:
            if error is None:
                if self.on_commit is not None:
                    self.on_commit()
            elif self.on_fail is not None:
                self.on_fail(error)
        except Exception:  # a callback bug must not stall every later commit
            log.exception("ackqueue: commit callback failed")
        finally:
            # The callbacks often close over the ticket (an ack's checks its own first
            # attempt): dropped once run, that cycle, and the deliveries and messages it
            # holds, are freed at once instead of by the garbage collector.
            self.on_commit = self.on_fail = None
            self._done.set()


class Committer:
    """The single writer of one database in this process (see the module docstring).

    Where this process opened the storage and holds it alone (a queue file, memory), it
    is the only writer of its queues' indexes at all, their opening included (alone=True,
    see segments.write_alone): nothing can see the index segments it unlinks."""

    def __init__(self, db, *, description="ackqueue", alone=False):
        """alone: no other connection, in this process or another, ever writes the indexes
        of db's queues (a file or memory storage this process opened and holds: this
        committer writes them, their opening included).  The store then skips the writes
        that only guard against a concurrent writer (segments.write_alone)."""
        self._db = db
        # The hot paths take the condition's lock directly (a Lock's with is C code, a
        # Condition's is two Python calls); wait and notify still go through _cond.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending = []
        self._closing = False
        self._baton = threading.Lock()    # held by whoever commits (see the module doc)
        self._durable_on_way = 0          # units submitted with lead=True, not yet settled
        self._last_submitter = None       # the thread of the latest lead=True submit
        self._last_submit_at = 0.0        # and when it submitted (monotonic)
        self._others_until = 0.0          # monotonic time until which others count as busy
        self._monotonic = time.monotonic  # the clock of the lead and defer rules (tests
                                          # replace it)
        self._deferred = []               # deferred units waiting for a commit to ride on
        self._deferred_due = 0.0          # when the thread commits them by itself
        self.defer_delay = DEFER_DELAY
        self._tm = transaction.TransactionManager(explicit=True)
        self._conn = db.open(transaction_manager=self._tm)
        # The connection's root: the same object in every transaction (conn.root() makes
        # a wrapper around it at each call).
        self._root = self._conn.root()
        self.alone = alone
        if alone:
            write_alone(self._conn)
        self.commits = 0          # how many ZODB commits were made
        self.units = 0            # how many units they carried
        self.conflicts = 0        # how many commits had to be retried after a conflict
        self.refused = 0          # how many units the store refused (see Refused)
        self.conflicts_by_class = collections.Counter()   # which objects conflicted
        self._group_listeners = []        # called after each group's outcomes (see below)
        self._thread = threading.Thread(target=self._run, name=f"{description}-committer",
                                        daemon=True)
        self._thread.start()

    def submit(self, ops, on_commit=None, on_fail=None, lead=False):
        """Queue a unit for the next commit and return its Ticket.

        lead=True: the caller will wait for the ticket at once, and commit it itself in
        wait() if nobody else is committing; the committer thread is not woken for it."""
        ticket = Ticket(ops, on_commit, on_fail)
        with self._lock:
            if self._closing:
                raise CommitterClosed("the queue's storage is closed")
            self._pending.append(ticket)
            if lead:
                ticket._durable = True
                self._durable_on_way += 1
                now, me = self._monotonic(), threading.get_ident()
                if me != self._last_submitter:
                    if self._last_submitter is not None:   # another thread was at work
                        self._others_until = self._last_submit_at + LEAD_QUIET
                    self._last_submitter = me
                self._last_submit_at = now
                lead = self._durable_on_way == 1 and now >= self._others_until
            if lead:
                ticket._leader = self
            else:
                notify_waiting(self._cond)    # a busy thread finds it when it looks again
        return ticket

    def defer(self, ops, on_commit=None, on_fail=None, delay=None):
        """Queue a unit nobody waits for and return its Ticket: it joins the next commit,
        and at the latest delay seconds from now (defer_delay when None) the committer
        thread commits it by itself, with every other deferred unit waiting then."""
        ticket = Ticket(ops, on_commit, on_fail)
        with self._cond:
            if self._closing:
                raise CommitterClosed("the queue's storage is closed")
            due = self._monotonic() + (self.defer_delay if delay is None else delay)
            if not self._deferred or due < self._deferred_due:
                self._deferred_due = due
                self._cond.notify()         # the thread sets its alarm
            self._deferred.append(ticket)
        return ticket

    def flush(self):
        """Commit every deferred unit now; return once they are settled (each ticket
        holds its own outcome)."""
        with self._cond:
            if not self._deferred:
                return
        barrier = self.submit([], lead=True)   # commits with (or after) the deferred ones
        barrier.wait()

    def due(self, now):
        """Whether the deferred units must be committed now (at monotonic time now)."""
        return bool(self._deferred) and now >= self._deferred_due

    def add_group_listener(self, fn):
        """Call fn() in the committing thread after each group commit's outcome callbacks
        have all run (settling() is true while they run); keep it quick.  Adding the same
        fn twice adds it once."""
        with self._cond:
            if fn not in self._group_listeners:
                self._group_listeners = self._group_listeners + [fn]

    def remove_group_listener(self, fn):
        with self._cond:
            self._group_listeners = [f for f in self._group_listeners if f != fn]

    def _group_settled(self):
        for fn in self._group_listeners:
            try:
                fn()
            except Exception:   # a listener's bug must not stall every later commit
                log.exception("ackqueue: a group listener failed")

    def busy(self):
        """Whether a commit is under way or units (deferred ones too) wait for one (a hint:
        not locked)."""
        return self._baton.locked() or bool(self._pending) or bool(self._deferred)

    def _lead(self):
        """Commit what is pending in the calling thread, if the baton is free."""
        # acquire(False): do not block (not blocking=False: C parses a keyword slowly)
        if not self._baton.acquire(False):
            return                  # the holder, or the thread it wakes, commits ours
        try:
            self._commit_pending()
        finally:
            self._release_baton()

    def _commit_pending(self):
        """With the baton: commit every pending unit as one group (False if none)."""
        with self._lock:
            batch, self._pending = self._deferred + self._pending, []
            self._deferred = []
        if not batch:
            return False
        _settling.on = True
        try:
            if self._conn is None:  # closed under us: cannot happen after a clean close
                for ticket in batch:
                    ticket._settle(CommitterClosed("the queue's storage is closed"))
            else:
                self._commit_group(self._conn, self._tm, batch)
        except BaseException as exc:    # e.g. KeyboardInterrupt in a leading caller
            self._tm.abort()
            for ticket in batch:
                if not ticket._done.is_set():
                    ticket._settle(CommitterClosed(f"the commit was interrupted: {exc!r}"))
            raise
        finally:
            _settling.on = False
            if self._group_listeners:
                self._group_settled()
            durable = 0
            for ticket in batch:
                durable += ticket._durable
            if durable:
                with self._lock:
                    self._durable_on_way -= durable
        if durable > 1:
            # Several threads were waiting for this group (durable units: lead=True), and
            # settling it woke them.  Give them the GIL before the next commit starts:
            # their next units then join that commit, instead of their Python running
            # inside it at its first system call (each releases the GIL) while it holds
            # the storage.  4 putting and 4 getting threads (benchmarks, scenario (c)) made
            # 0.32 commits per item instead of 0.50.  A thread alone commits groups of one,
            # and units nobody waits on in a thread (the service's, whose event loop a
            # group listener wakes) do not sleep here.
            time.sleep(0)
        return True

    def _release_baton(self):
        self._baton.release()
        with self._lock:
            if self._pending:       # units that arrived meanwhile: the thread takes them
                notify_waiting(self._cond)

    def close(self):
        """Commit what is pending, then stop the thread and close the connection."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self):
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closing:
                        if self.due(self._monotonic()):
                            break
                        # The timeout matters if a leading caller never came to wait
                        # (an exception between submit and wait): its unit still commits;
                        # and for deferred units, which must not wait longer than their delay.
                        wait = LEADER_GRACE
                        if self._deferred:
                            wait = min(wait, max(0.0, self._deferred_due - self._monotonic()))
                        self._cond.wait(wait)
                    closing = self._closing
                with self._baton:
                    if not self._commit_pending() and closing:
                        return
        finally:
            with self._baton:
                conn, self._conn = self._conn, None
                try:
                    conn.close()
                except Exception:  # pragma: no cover - closing after a storage failure
                    log.exception("ackqueue: closing the committer's connection failed")

    def _commit_group(self, conn, tm, batch):
        if not (batch[0].ops if len(batch) == 1 else any(ticket.ops for ticket in batch)):
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
        error, disconnects, give_up = None, 0, None
        for attempt in itertools.count():
            refused = {}
            tm.begin()
            try:
                root = self._root
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
                if give_up is None:       # read the clock on the first conflict only
                    give_up = time.monotonic() + CONFLICT_PATIENCE
                elif time.monotonic() >= give_up:
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
            self.units += len(batch)
            if refused:
                self.units -= len(refused)
                self.refused += len(refused)
            return None, refused
        return error, {}
