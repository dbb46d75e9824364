"""AckQueue: a persistent, acknowledging drop-in for queue.Queue.

The queue object is a front: each thread that uses it gets its own QueueConnection
(ackqueue.connection), created on first use, which does the work against the queue's live
state (ackqueue.state), which decides in memory and sends what must survive to the
committer (ackqueue.commit), which writes the ZODB layout (ackqueue.store) to the storage
(ackqueue.storage).  Data flows one way through those layers.

What differs from queue.Queue, by design:
- get() hands the item out *in flight*; it leaves the queue only when acknowledged (ack(),
  or task_done() in plain queue.Queue code).  Otherwise it comes back at its original place
  when its visibility deadline passes, when the thread that got it ends, or when the
  process dies (on the next open).
- put() returns once the item is durable, and only then can a get() receive it.
- qsize()/empty()/full() count ready messages (not those in flight), as queue.Queue counts
  what is still in the queue; maxsize bounds ready + delayed + being-put messages, so a
  given-back message may briefly take the queue above maxsize.
- join() waits until every message put has been acknowledged, including messages left by
  an earlier process.
"""
import queue as _stdlib_queue
import threading
import time
import weakref

from . import store
from .connection import QueueConnection, check_visibility
from .errors import NotHeld, QueueKindMismatch
from .storage import open_database

__all__ = ["AckQueue", "AckLifoQueue", "AckPriorityQueue"]


class AckQueue(_stdlib_queue.Queue):
    """A persistent, acknowledging FIFO queue with queue.Queue's interface.

    AckQueue(maxsize=0, *, path=None, db=None, name="default", visibility_timeout=None,
    clock=None)

    - no path and no db: an in-memory ZODB storage (same semantics, nothing survives);
    - path="jobs.fs": a ZODB FileStorage file, created if missing;
    - db=: an application's own ZODB.DB (its transaction.manager blocks govern the queue's
      operations too); several named queues can share one storage;
    - visibility_timeout: default seconds a received item may stay unacknowledged before it
      is given back (None: until acked, its thread ends, or the process dies);
    - clock: the time source for deadlines (time.time); tests inject a fake one;
    - durability (files only): "fsync" (the default) makes every commit durable against
      power loss; "os" writes commits to the operating system without fsync: they survive
      a process crash but the latest ones may be lost to a power cut or an OS crash;
    - thread_exit: "auto" gives back what an ended thread held if it died of an exception
      or once the program acknowledges on this queue (plain queue.Queue code that never
      acknowledges keeps queue.Queue's final gets); "give_back" always gives it back.
    """

    _kind = store.FIFO

    def __init__(self, maxsize=0, *, path=None, db=None, name="default",
                 visibility_timeout=None, clock=None, thread_exit="auto", durability=None):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, not {type(maxsize).__name__}")
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty str")
        self.visibility_timeout = check_visibility(visibility_timeout)
        if thread_exit not in ("auto", "give_back"):
            raise ValueError("thread_exit must be 'auto' or 'give_back'")
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning seconds")
        self.maxsize = maxsize
        self.name = name
        self.is_shutdown = False
        self.shutdown_immediate = False
        self._closed = False
        self._local = threading.local()
        self._connections = weakref.WeakSet()
        self._database = open_database(path, db, durability)
        try:
            kind, clock = self._kind, clock or time.time
            self._state = self._database.state(name, kind, clock)
            if self._state.kind != kind:
                raise QueueKindMismatch(
                    f"queue {name!r} is open in this process as "
                    f"{store.KIND_NAMES[self._state.kind]}; open it with that class")
        except BaseException:
            self._database._release()
            raise
        # queue.Queue's names for its lock and conditions, shared by every front of this
        # queue in the process (their waits are one queue's waits).
        if thread_exit == "give_back" or self.visibility_timeout is not None:
            self._state.acknowledging = True
        self.mutex = self._state.mutex
        self.not_empty = self._state.not_empty
        self.not_full = self._state.not_full
        self.all_tasks_done = self._state.all_tasks_done

    def __repr__(self):
        state = "closed" if self._closed else f"on {self._database.description}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    # -- per-thread connections ----------------------------------------------------------

    def _conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            self._check_open()
            conn = self._local.conn = QueueConnection(self, self._state)
            self._connections.add(conn)
        return conn

    def connect(self):
        """A new QueueConnection for the calling thread (its own ZODB connection)."""
        self._check_open()
        self._state.acknowledging = True
        conn = QueueConnection(self, self._state)
        self._connections.add(conn)
        return conn

    def _check_open(self):
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    # -- queue.Queue ----------------------------------------------------------------------

    @property
    def unfinished_tasks(self):
        """Messages put and not yet acknowledged (queue.Queue's counter, persistent)."""
        with self.mutex:
            return self._state.unfinished()

    def put(self, item, block=True, timeout=None):
        """Put item into the queue; returns once it is durable.

        Blocks (or raises queue.Full) as queue.Queue.put does when maxsize is reached.
        Raises UnpicklableItem (a TypeError) if item cannot be pickled."""
        self._conn().put(item, block, timeout)

    def get(self, block=True, timeout=None, *, visibility_timeout=...):
        """Remove and return an item, as queue.Queue.get does; it stays in flight, held by
        the calling thread, until acknowledged with ack() or task_done()."""
        if visibility_timeout is ...:
            visibility_timeout = self.visibility_timeout
        return self._conn().get(block, timeout, visibility_timeout=visibility_timeout)

    def get_message(self, block=True, timeout=None, *, visibility_timeout=...):
        """Like get(), but return a Message (id, body, receive_count, sent_at, deadline)."""
        if visibility_timeout is ...:
            visibility_timeout = self.visibility_timeout
        return self._conn().get_message(block, timeout, visibility_timeout=visibility_timeout)

    def ack(self, item):
        """Acknowledge a received item (the object get returned, a Message, or its id): it
        leaves the queue for good.  Durable when this returns.  Raises StaleAck if the
        delivery was given back meanwhile (its message may be held by someone else)."""
        self._conn().ack_holding(self._find(item))

    def nack(self, item, delay=0):
        """Give a received item back now (or after delay seconds), at its original place."""
        self._conn().nack_holding(self._find(item), delay)

    def task_done(self):
        """Acknowledge the oldest item the calling thread received and has not acknowledged
        (another thread's oldest, if this one holds none), keeping queue.Queue's counting:
        ValueError when there is nothing left to acknowledge."""
        own = getattr(self._local, "conn", None)
        candidates = [own] if own is not None else []
        candidates += [c for c in list(self._connections) if c is not own]
        for conn in candidates:
            h = conn.oldest_unacked()
            if h is not None:
                self._conn().ack_holding(h)
                return
        raise ValueError("task_done() called too many times")

    def join(self):
        """Block until every item put has been acknowledged."""
        self._state.acknowledging = True
        with self.all_tasks_done:
            while self._state.unfinished() and not self.shutdown_immediate:
                self.all_tasks_done.wait()

    def qsize(self):
        """The number of ready items (not counting items in flight)."""
        with self.mutex:
            self._state._expire()
            return self._state.ready_count()

    def empty(self):
        return not self.qsize()

    def full(self):
        with self.mutex:
            return 0 < self.maxsize <= self._state.size_for_maxsize()

    def put_nowait(self, item):
        return self.put(item, block=False)

    def get_nowait(self):
        return self.get(block=False)

    def shutdown(self, immediate=False):
        """Python 3.13's Queue.shutdown: put() raises ShutDown from now on, get() raises it
        once nothing is ready; blocked callers wake.  With immediate, get() raises at once
        and join() returns, but the stored items stay for the next open: shutting a queue
        object down never deletes persistent messages."""
        with self.mutex:
            self.is_shutdown = True
            if immediate:
                self.shutdown_immediate = True
                self.all_tasks_done.notify_all()
            self.not_empty.notify_all()
            self.not_full.notify_all()

    # -- transactions and closing ---------------------------------------------------------

    def transaction(self):
        """``with q.transaction():`` makes the calling thread's gets, puts and acks inside
        one atomic commit; an exception rolls them all back (and propagates)."""
        return self._conn().transaction()

    def close(self):
        """Give back what this queue object's connections hold and release the storage."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._connections):
            conn.close()
        self._database._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- helpers --------------------------------------------------------------------------

    def _find(self, item):
        own = self._conn()
        for conn in [own] + [c for c in list(self._connections) if c is not own]:
            h = conn.find(item)
            if h is not None:
                return h
        raise NotHeld(f"{item!r} is not an item received from queue {self.name!r} and not "
                      "yet acknowledged")


class AckLifoQueue(AckQueue):
    """A persistent, acknowledging drop-in for queue.LifoQueue (last put, first got)."""

    _kind = store.LIFO


class AckPriorityQueue(AckQueue):
    """A persistent, acknowledging drop-in for queue.PriorityQueue: lowest item value first
    (items must be orderable, as with heapq), ties in put order."""

    _kind = store.VALUE

