"""AckQueue: a persistent, acknowledging drop-in for queue.Queue.

The queue object is a front: each thread that uses it gets its own QueueConnection
(ackqueue.connection), created on first use, which does the work against the queue's live
state (ackqueue.state), which decides in memory and sends what must survive to the
committer (ackqueue.commit), which writes the ZODB layout (ackqueue.store) to the storage
(ackqueue.database).  Data flows one way through those layers.

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
import math
import operator
import os
import queue as _stdlib_queue
import threading
import time
import weakref

import transaction
from zope.interface import implementer

from . import deferred, store
from .connection import check_visibility
from .codec import allowed_set, check_codec
from .database import open_database
from .errors import CodecMismatch, NotHeld, QueueKindMismatch, QueueLocked, ServerUnavailable
from .interfaces import IQueueFront
from .message import Message
from .remote.database import RemoteDatabase, check_ack_with_next_get, is_url
from .shared import files, holding
from .shared.client import SharedDatabase
from .state import DeadLetterPolicy, PutOptions

__all__ = ["AckQueue", "AckLifoQueue", "AckPriorityQueue", "queues"]

MAX_ATTRIBUTES = 10
MAX_DEDUP_ID = 128
_UNSET = object()


def _kind(kind, lifo):
    """The store kind of a queue class's queue, made LIFO by lifo=True."""
    if lifo not in (False, True):
        raise TypeError("lifo must be True or False")
    if lifo and kind != store.LIFO:
        if kind == store.VALUE:
            raise ValueError("a priority queue orders by item value; it cannot be lifo")
        kind = store.LIFO
    return kind


def _check_basics(maxsize, name, thread_exit, clock):
    """The types of AckQueue's plainest arguments (TypeError, ValueError)."""
    if isinstance(maxsize, bool) or not isinstance(maxsize, int):
        raise TypeError(f"maxsize must be an int, not {type(maxsize).__name__}")
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty str")
    if thread_exit not in ("auto", "give_back"):
        raise ValueError("thread_exit must be 'auto' or 'give_back'")
    if clock is not None and not callable(clock):
        raise TypeError("clock must be a callable returning seconds")


def _prefetch(value, path, kind):
    """A valid prefetch= argument (an int, at least 1; above 1 for a FIFO queue shared
    through a server: checked here, and against the opened storage by AckQueue)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"prefetch must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"prefetch must be at least 1, not {value}")
    if value > 1:
        if is_url(path):
            raise ValueError(
                "prefetch applies to a queue shared through a server (zeo://); through "
                "the queue service (http://) use get_many(n) to receive several messages "
                "in one request, or ack_with_next_get=True")
        if kind != store.FIFO:
            raise ValueError(
                f"prefetch applies to a FIFO queue (AckQueue): a message taken ahead would "
                f"be received before one that {store.KIND_NAMES[kind]} orders ahead of it")
    return value


def _dead_letter(dead_letter, name):
    """A valid dead_letter= argument of queue name."""
    if dead_letter is not None:
        if not isinstance(dead_letter, str) or not dead_letter:
            raise TypeError("dead_letter must be the name (str) of another queue")
        if dead_letter == name:
            raise ValueError("a queue cannot be its own dead-letter queue")
    return dead_letter


def _seconds(value, what, *, positive=False, allow_none=False):
    """A number of seconds: not a bool, not NaN, not negative (or zero, with positive)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if math.isnan(value) or math.isinf(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be a {'positive' if positive else 'non-negative'} "
                         f"number of seconds, not {value!r}")
    return float(value)


def _retention(value):
    value = _seconds(value, "retention", positive=True)
    if value > store.MAX_RETENTION:
        raise ValueError(f"retention can be at most {store.MAX_RETENTION:g} s (14 days), "
                         f"not {value:g}")
    return value


def _priority(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int, not {type(value).__name__}")
    if not 0 <= value <= store.PRIORITY_MAX:
        raise ValueError(f"priority must be between 0 and {store.PRIORITY_MAX}, not {value}")
    return value


def _attributes(value):
    """A dict of at most MAX_ATTRIBUTES str -> str, as a sorted tuple of pairs (or None)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"attributes must be a dict of str to str, not "
                        f"{type(value).__name__}")
    if len(value) > MAX_ATTRIBUTES:
        raise ValueError(f"at most {MAX_ATTRIBUTES} attributes, not {len(value)}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"attributes must map str to str, not {type(k).__name__} to "
                            f"{type(v).__name__}")
    return tuple(sorted(value.items())) or None


def _dedup_id(value):
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"dedup_id must be a str, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_DEDUP_ID:
        raise ValueError(f"dedup_id must have 1 to {MAX_DEDUP_ID} characters")
    return value


def _max_item_size(value):
    """None (no limit, as queue.Queue) or a positive int: the most bytes an item may pickle to."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_item_size must be an int (bytes) or None, not "
                        f"{type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_item_size must be a positive number of bytes or None, not "
                         f"{value}")
    return value


def _prefetch_wait(value, prefetch):
    """A valid prefetch_wait= argument: seconds (0: none), with prefetch above 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"prefetch_wait must be a number of seconds, not "
                        f"{type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"prefetch_wait must be a finite number of seconds, 0 or more, "
                         f"not {value!r}")
    if value and prefetch <= 1:
        raise ValueError("prefetch_wait is how long a get waits for a batch to claim: it "
                         "needs prefetch above 1")
    return float(value)


def _max_receives(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_receives must be an int or None, not {type(value).__name__}")
    if value < 1:
        raise ValueError("max_receives must be at least 1")
    return value


_released = operator.attrgetter("released")     # why a delivery ended (None: it is live)


class FileServing:
    """What the owner of a queue file (ackqueue.shared.owner) serves its clients with:
    fronts on the file in this process, of the class each queue is (``front``), and the
    file's queues (``list_queues``).  Made by the front that opens the file, so that the
    owner, below the front, never imports it."""

    def __init__(self, path, durability):
        self.path = path
        self.durability = durability

    def front(self, name, kind=None):
        return CLASSES.get(kind, AckQueue)(path=self.path, name=name,
                                           durability=self.durability)

    def list_queues(self):
        return queues(self.path)


@implementer(IQueueFront)
class AckQueue(_stdlib_queue.Queue):
    """A persistent, acknowledging FIFO queue with queue.Queue's interface.

    AckQueue(maxsize=0, *, path=None, db=None, name="default", visibility_timeout=None,
    clock=None, thread_exit="auto", durability=None, lifo=False, max_receives=None,
    dead_letter=None, retention=None, dedup_window=300, autopack=None, max_item_size=None,
    repair=False)

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
      acknowledges keeps queue.Queue's final gets); "give_back" always gives it back;
    - lifo: last put, first got (what AckLifoQueue is);
    - max_receives, dead_letter: a message received max_receives times without an ack is
      moved, at the get that would deliver it once more, to the queue named dead_letter
      (in the same storage), or dropped (and counted) without one.  With max_receives set,
      get() makes the receive count durable before it returns, so a message that kills its
      process on every delivery is caught too;
    - retention: seconds a message may wait unprocessed before it expires (default 4 days,
      at most 14; a put can set its own);
    - dedup_window: seconds during which a second put with the same dedup_id is refused;
    - autopack: pack the storage when its file has grown by this many bytes (True: a
      default), in a background thread (see pack());
    - max_item_size: the most bytes an item may take pickled (what the store keeps); a
      put of a larger one raises ItemTooLarge and stores nothing.  None (the default) sets
      no limit, as queue.Queue has none: a drop-in must take every item the code it
      replaces took.  It is this queue object's rule, checked in the putting process before
      the commit, and not recorded in the storage: items already stored (put without a
      limit, or by another process) are still delivered, given back and redriven;
    - repair (files only): a file damaged in its middle (StorageError naming the offset)
      is cut at the damage, the cut bytes kept beside it (see ackqueue.filestorage.repair);
    - allowed_classes: None (the default: any pickled item is unpickled, as queue.Queue
      code expects), or the classes (or "module.Name" strings) a pickled item may name;
      a received item naming any other is refused (ForbiddenClass, the message set aside
      as unreadable) without running anything: for consumers of a queue others write;
    - codec: how puts encode items (ackqueue.codec): "pickle" (the default: a str is
      stored as text and bytes as bytes, so HTTP clients of ackqueue serve read them
      as such; any other object is pickled), "json", "str" or "bytes".  It is stored with
      the queue when first given, so producers and consumers agree: opening a queue with
      another codec raises CodecMismatch; None uses the stored one.  Any front decodes any
      stored body, whatever the codec;
    - acks: "durable" (the default: ack, ack_many and task_done return once the ack is
      durable) or "deferred" (they return at once; the ack is durable with the next
      commit, within a few ms, or after flush(); a crash before then can only bring the
      message back, see ackqueue.deferred).  Not through the queue service (http://).
      An explicit "durable" with ack_with_next_get=True is refused (ValueError): the two
      contradict each other;
    - prefetch (a queue shared through a server, zeo://): the most messages one claim
      commit may take ahead for this process's next gets while its consumers keep up (1,
      the default: none).  A message taken ahead is in flight under this process's lease,
      its visibility deadline running, until a get here receives it; one no get receives
      within a second (or a tenth of its visibility timeout), or still there at close(),
      goes back to its place with its receive count as it was (see ackqueue.arbiters.shared).  It
      saves a server round trip per get; a message put later is never received ahead of
      one already taken ahead.  FIFO queues only;
    - prefetch_wait (with prefetch): seconds a get that finds fewer messages ready than its
      batch waits for more to be put before it claims (0, the default: none), as Kafka's
      fetch.max.wait.ms: a consumer that keeps up then claims batches, not one message per
      commit, and each get may take up to that much longer.  Never past the get's own
      timeout; get(block=False) does not wait;
    - ack_with_next_get (a queue shared with other processes): True makes ack, ack_many
      and task_done return at once, and their ack travel with this process's next round
      trip instead of one of its own.  Through the queue service (http://) it rides on the
      thread's next get request; through a server (zeo://, or a db= on a ZEO storage) it
      is acks="deferred" whose ack waits for the process's next commit (a get's claim,
      typically) up to NEXT_GET_WINDOW (50 ms) instead of a few ms.  Either way a crash in
      that window brings the message back; nothing is lost.
    """

    _kind = store.FIFO

    def __init__(self, maxsize=0, *, path=None, db=None, name="default",
                 visibility_timeout=None, clock=None, thread_exit="auto", durability=None,
                 lifo=False, max_receives=None, dead_letter=None, retention=None,
                 dedup_window=store.DEFAULT_DEDUP_WINDOW, autopack=None, max_item_size=None,
                 repair=False, codec=None, allowed_classes=None, ack_with_next_get=False,
                 acks=None, prefetch=1, prefetch_wait=0.0):
        # What a pickled queue reopens with (__reduce__): every argument but the storage.
        self._reopen_args = {k: v for k, v in locals().items()
                             if k not in ("self", "__class__", "db", "clock")}
        _check_basics(maxsize, name, thread_exit, clock)
        self.visibility_timeout = check_visibility(visibility_timeout)
        kind = _kind(self._kind, lifo)
        self.max_receives = _max_receives(max_receives)
        self.dead_letter = _dead_letter(dead_letter, name)
        self.retention = (store.DEFAULT_RETENTION if retention is None
                          else _retention(retention))
        self.dedup_window = _seconds(dedup_window, "dedup_window")
        self.max_item_size = _max_item_size(max_item_size)
        check_codec(codec)
        self.allowed_classes = allowed_set(allowed_classes)
        if autopack is not None:
            from .maintenance import autopack_threshold
            autopack = autopack_threshold(autopack)
        self.maxsize = maxsize
        self.name = name
        self.is_shutdown = False
        self.shutdown_immediate = False
        self._closed = False
        self._local = threading.local()
        self._default_put = None
        self._connections = weakref.WeakSet()
        self._clock = clock = clock or time.time
        self._pid = os.getpid()
        through_service = is_url(path)
        self._set_acks(acks, ack_with_next_get, through_service)
        self.prefetch = _prefetch(prefetch, path, kind)
        self.prefetch_wait = _prefetch_wait(prefetch_wait, self.prefetch)
        self._database = (RemoteDatabase(self, path, db, durability, repair)
                          if through_service else self._open_storage(path, db, durability,
                                                                     repair))
        # The per-thread proxy the database names: QueueConnection over ZODB,
        # RemoteConnection through the queue service.
        self._proxy_class = self._database.proxy_class
        try:
            self._state = self._open_state(name, kind, clock, codec)
            if self._database.exclusive:
                self._check_alone()
            self._policy = self._dead_letter_policy(self.max_receives, self.dead_letter)
            if autopack is not None:
                self._database.enable_autopack(autopack)
        except BaseException:
            self._database.release()
            raise
        # queue.Queue's names for its lock and conditions, shared by every front of this
        # queue in the process (their waits are one queue's waits).
        if thread_exit == "give_back" or self.visibility_timeout is not None:
            self._state.acknowledging = True
        self._name_state_locks()

    def _name_state_locks(self):
        """queue.Queue's names for its lock and conditions, the state's."""
        self.mutex = self._state.mutex
        self.not_empty = self._state.not_empty
        self.not_full = self._state.not_full
        self.all_tasks_done = self._state.all_tasks_done

    def _open_storage(self, path, db, durability, repair):
        """The storage's database: this process's own handle (a file it opens is served
        to the other processes that open it), or, for a file another process holds and
        serves, a client of that process (ackqueue.shared)."""
        if (db is not None or not isinstance(path, (str, os.PathLike))
                or os.fspath(path).startswith("zeo://")):
            return open_database(path, db, durability, repair)
        file_path = os.path.realpath(os.fspath(path))
        serving = FileServing(file_path, durability)
        try:
            return open_database(path, db, durability, repair, share=serving)
        except QueueLocked as exc:
            if repair or not files.reachable(file_path):
                raise
            holding.joined(file_path)
            try:
                return SharedDatabase(self, file_path,
                                      lambda: holding.take_over(file_path, serving),
                                      lambda: holding.left(file_path))
            except ServerUnavailable as unreachable:
                raise exc from unreachable

    def _set_acks(self, acks, ack_with_next_get, through_service):
        """acks, ack_with_next_get and the ack window, checked against each other."""
        self.ack_with_next_get = check_ack_with_next_get(ack_with_next_get)
        self.acks = deferred.check_acks(acks, through_service, self.ack_with_next_get)
        # The longest a deferred ack waits for a commit to ride on (None: the committer's
        # few ms); through a server, ack_with_next_get waits for the next get's claim.
        self.ack_window = None
        if self.ack_with_next_get and not through_service:
            self.acks, self.ack_window = "deferred", deferred.NEXT_GET_WINDOW

    def _check_alone(self):
        """Refuse the options that only mean something when processes share the storage,
        on a storage this process holds alone."""
        if self.prefetch > 1:
            raise ValueError(
                "prefetch applies to a queue shared through a server (zeo://): this "
                "process holds this storage alone, so its gets make no round trips "
                "to save")
        if self.ack_window is not None:
            raise ValueError(
                "ack_with_next_get=True applies to a queue shared with other "
                "processes, through the queue service (path='http://...') or a server "
                "(path='zeo://...'): this process holds this storage alone, where an "
                "ack is one local commit (acks='deferred' lets it return before even "
                "that)")

    def _open_state(self, name, kind, clock, codec):
        """The queue's live state in this process, checked against this front's class and
        codec; this front's allowed_classes narrow what the state reads to order items."""
        state = self._database.state(name, kind, clock, codec, self.allowed_classes)
        if state.kind != kind:
            raise QueueKindMismatch(
                f"queue {name!r} is open in this process as "
                f"{store.KIND_NAMES[state.kind]}; open it with that class")
        if self.allowed_classes is not None:
            with state.mutex:                 # the state orders by the strictest list
                held = state.allowed_classes
                state.allowed_classes = (self.allowed_classes if held is None
                                         else held & self.allowed_classes)
        if codec is not None and state.codec != codec:
            raise CodecMismatch(
                f"queue {name!r} is open in this process with codec "
                f"{state.codec!r}; open it with that codec (or without codec=)")
        return state

    @property
    def db(self):
        """The ZODB database under this queue.  AckQueue(db=q.db, name="other") opens
        another named queue of the same storage (for an in-memory queue, the only way to
        reach its dead-letter queue)."""
        return self._database.db

    @property
    def codec(self):
        """The queue's codec (ackqueue.codec): how puts encode items, and which bodies the
        queue takes already encoded (put_many(encoded=True)) and reads back: only under
        "pickle" does a get unpickle."""
        return self._state.codec

    def record_codec(self, codec=None):
        """(the queue's codec, whether the storage records one), once codec (None: only
        read the recorded one) is recorded if the queue has none; CodecMismatch, writing
        nothing, if the queue records another.  What the queue service's codec route
        does; AckQueue(codec=...) records it at open."""
        return self._state.record_codec(codec)

    def __repr__(self):
        state = "closed" if self._closed else f"on {self._database.description}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    # -- per-thread connections ----------------------------------------------------------

    def _after_fork(self):
        """A forked child using a queue its parent opened on a file: the parent's handle
        must not be written (ackqueue.database._forked), so the queue reopens the file as a
        client of its holder (the parent, or whoever holds it now), with what it held in
        the parent left to the parent.  A queue in memory (or in an application's ZODB) is
        the parent's alone: ValueError."""
        self._pid = os.getpid()
        database = self._database
        if not getattr(database, "inherited", False):
            return                  # a client (it reconnects by itself) or the child's own
        if database.key[0] != "file":
            raise ValueError(f"{self!r} was opened in the parent process before a fork: a "
                             "queue in memory or in an application's ZODB cannot be used "
                             "in a child process; open it with a path= to share it")
        kind, codec_name = self._state.kind, self._state.codec
        self._local = threading.local()
        self._connections = weakref.WeakSet()
        self._database = self._open_storage(database.key[1], None, None, False)
        self._proxy_class = self._database.proxy_class
        self._state = self._open_state(self.name, kind, self._clock, codec_name)
        self._policy = self._dead_letter_policy(self.max_receives, self.dead_letter)
        self._name_state_locks()

    def _conn(self):
        if self._pid != os.getpid():
            self._after_fork()
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            self._check_open()
            conn = self._local.conn = self._proxy_class(self, self._state)
            self._connections.add(conn)
        return conn

    def connect(self, *, thread_bound=True):
        """A new QueueConnection for the calling thread (its own ZODB connection).  With
        thread_bound=False it belongs to no thread: any thread may use it, one call at a
        time, and what it holds comes back only at a visibility deadline, at its close(),
        or when the process dies (a server holding deliveries for remote clients)."""
        self._check_open()
        if thread_bound not in (False, True):
            raise TypeError("thread_bound must be True or False")
        self._state.acknowledging = True
        conn = self._proxy_class(self, self._state, thread_bound)
        self._connections.add(conn)
        return conn

    def _check_open(self):
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        if self._pid != os.getpid():
            self._after_fork()

    # -- queue.Queue ----------------------------------------------------------------------

    @property
    def unfinished_tasks(self):
        """Messages put and not yet acknowledged (queue.Queue's counter, persistent)."""
        self._check_open()
        with self.mutex:
            return self._state.unfinished()

    def put(self, item, block=True, timeout=None, *, priority=store.DEFAULT_PRIORITY,
            delay=0, retention=None, dedup_id=None, attributes=None):
        """Put item into the queue; returns once it is durable.

        Blocks (or raises queue.Full) as queue.Queue.put does when maxsize is reached.
        Raises UnpicklableItem (a TypeError) if item cannot be pickled, ItemTooLarge (a
        ValueError) if it encodes to more than the queue's max_item_size (bytes stored).  Keyword options:
        priority (0 to 1000, higher first, FIFO within a level; default 100), delay
        (seconds before it becomes visible), retention (seconds until it expires
        unprocessed; the queue's retention by default, at most 14 days), dedup_id (a str:
        a second put with it within the queue's dedup window raises DuplicateMessage, even
        after the first was acknowledged), attributes (up to 10 str: str pairs, returned on
        the Message)."""
        if (priority == store.DEFAULT_PRIORITY and type(priority) is int and delay == 0
                and type(delay) in (int, float) and retention is attributes is dedup_id
                is None):
            self._conn().put(item, block, timeout,      # the usual put: checked already
                             opts=self._default_put_options())
            return
        opts = self._put_options(priority, delay, retention, attributes)
        self._conn().put(item, block, timeout, opts=opts, dedup_id=_dedup_id(dedup_id))

    def put_many(self, items, block=True, timeout=None, *, priority=store.DEFAULT_PRIORITY,
                 delay=0, retention=None, dedup_ids=None, attributes=None, encoded=False,
                 dedup_window=None, then=None, options=None):
        """Put every item of items in one commit (all or nothing) and return their
        MessageIds.  Options as put(), for every item; dedup_ids: None or one dedup id (or
        None) per item; dedup_window: seconds their dedup ids are remembered (None: the
        queue's; the queue service passes a remote client's).  With maxsize, waits for room
        for all of them at once.  One item over max_item_size refuses the whole batch
        (ItemTooLarge, with its index).

        encoded=True: every item is already its stored form, bytes (what pickle.dumps
        gives, or any bytes a remote client sent): stored as given, without pickling; a
        get unpickles it as usual, get_messages(raw=True) returns the bytes.  Not for a
        priority queue ordered by item value (ValueError).

        then (the non-blocking seam: an event loop puts without a thread per put): never
        wait, neither for room (queue.Full at once) nor for the commit: return the
        MessageIds at once and call then(error) once the put is durable (error None; the
        messages are visible by then) or has failed (the exception, e.g.
        DuplicateMessage).  then runs in the committer's thread, so keep it quick and
        never call the queue from it (an asyncio loop bridges it with
        loop.call_soon_threadsafe).  Not inside a transaction block.

        options: what put_options() made, instead of the keyword options (a server putting
        for its clients validates them once per request, not once per put)."""
        items = list(items)
        if isinstance(dedup_ids, (str, bytes)):
            raise TypeError("dedup_ids must be a list with one dedup id (or None) per item")
        if dedup_ids is not None:
            dedup_ids = [_dedup_id(d) for d in dedup_ids]
            if len(dedup_ids) != len(items):
                raise ValueError(f"dedup_ids has {len(dedup_ids)} entries for "
                                 f"{len(items)} items")
        if options is None:
            options = self._put_options(priority, delay, retention, attributes, dedup_window)
        elif not isinstance(options, PutOptions):
            raise TypeError("options must be what put_options() returns")
        elif (priority != store.DEFAULT_PRIORITY or delay != 0 or retention is not None
              or attributes is not None or dedup_window is not None):
            raise TypeError("give put_many either options= or the keyword options, not both")
        return self._conn().put_many(
            items, block, timeout, opts=options, dedup_ids=dedup_ids, encoded=encoded,
            **({} if then is None else {"then": then}))

    def put_options(self, *, priority=store.DEFAULT_PRIORITY, delay=0, retention=None,
                    attributes=None, dedup_window=None):
        """The options of a put (as put() takes them: priority, delay, retention,
        attributes, dedup_window), validated once, for put_many(options=...)."""
        return self._put_options(priority, delay, retention, attributes, dedup_window)

    def receive_policy(self, max_receives, dead_letter=None, *, to_itself=False):
        """The receive rules of a get, as AckQueue's max_receives and dead_letter give
        them (a message received max_receives times goes to the queue named dead_letter,
        or is dropped without one), for a connection's get_many(policy=...); None when
        max_receives is None (no rule).

        dead_letter must name another queue, unless to_itself=True: then it may name
        this one, as an SQS redrive policy may (the SQS front), and such a message goes
        to the back of this queue as a new message."""
        max_receives = _max_receives(max_receives)
        if dead_letter is not None and (not isinstance(dead_letter, str) or not dead_letter
                                        or (dead_letter == self.name and not to_itself)):
            raise ValueError("dead_letter must name another queue of this storage")
        return self._dead_letter_policy(max_receives, dead_letter)

    @property
    def state(self):
        """The queue's live state in this process (ackqueue.interfaces.IQueueState; shared
        by every front of this queue in the process)."""
        return self._state

    @property
    def database(self):
        """The runtime of the queue's storage (ackqueue.interfaces.IDatabase): a
        database.Database, or a remote.database.RemoteDatabase through the service."""
        return self._database

    @property
    def clock(self):
        """The wall clock of this queue's deadlines, delays and retention (clock=)."""
        return self._clock

    @property
    def kind(self):
        """How the queue orders its messages, as stored with it: "fifo", "lifo", or
        "value" (AckPriorityQueue: by item value)."""
        return self._state.kind

    def _default_put_options(self):
        """The PutOptions of a put without options, made once (again if the queue's
        retention or dedup window was changed since)."""
        opts = self._default_put
        if (opts is None or opts.retention != self.retention
                or opts.dedup_window != self.dedup_window):
            opts = self._default_put = self._put_options(store.DEFAULT_PRIORITY, 0, None,
                                                         None)
        return opts

    def _put_options(self, priority, delay, retention, attributes, dedup_window=None):
        return PutOptions(_priority(priority), _seconds(delay, "delay"),
                          self.retention if retention is None else _retention(retention),
                          _attributes(attributes),
                          self.dedup_window if dedup_window is None
                          else _seconds(dedup_window, "dedup_window"))

    def get(self, block=True, timeout=None, *, visibility_timeout=..., shuffle=False,
            max_receives=_UNSET, dead_letter=_UNSET):
        """Remove and return an item, as queue.Queue.get does; it stays in flight, held by
        the calling thread, until acknowledged with ack() or task_done().  shuffle takes a
        random ready item; max_receives and dead_letter override the queue's policy."""
        if (visibility_timeout is ... and shuffle is False and max_receives is _UNSET
                and dead_letter is _UNSET):
            return self._conn().get(block, timeout, visibility_timeout=self.visibility_timeout,
                                    policy=self._policy)         # the usual get
        return self._conn().get(block, timeout, **self._get_options(
            visibility_timeout, shuffle, max_receives, dead_letter))

    def get_message(self, block=True, timeout=None, *, visibility_timeout=..., shuffle=False,
                    max_receives=_UNSET, dead_letter=_UNSET):
        """Like get(), but return a Message (id, body, receive_count, sent_at, deadline,
        attributes, ...)."""
        return self._conn().get_message(block, timeout, **self._get_options(
            visibility_timeout, shuffle, max_receives, dead_letter))

    def get_many(self, n, block=True, timeout=None, *, visibility_timeout=..., shuffle=False):
        """Receive 1 to n items: wait (as get does) for one, then take what else is ready,
        up to n.  Raises queue.Empty as get does when none comes."""
        return self._conn().get_many(n, block, timeout, **self._get_options(
            visibility_timeout, shuffle, _UNSET, _UNSET))

    def get_messages(self, n, block=True, timeout=None, *, visibility_timeout=...,
                     shuffle=False, raw=False):
        """Like get_many(), but return Messages.  raw=True: each Message's body is the
        stored bytes (the pickled item, or what put_many(encoded=True) stored), never
        unpickled."""
        return self._conn().get_many(n, block, timeout, messages=True, raw=raw,
                                     **self._get_options(visibility_timeout, shuffle,
                                                         _UNSET, _UNSET))

    def _get_options(self, visibility_timeout, shuffle, max_receives, dead_letter):
        if visibility_timeout is ...:
            visibility_timeout = self.visibility_timeout
        if shuffle not in (False, True):
            raise TypeError("shuffle must be True or False")
        policy = self._policy
        if max_receives is not _UNSET or dead_letter is not _UNSET:
            policy = self.receive_policy(
                self.max_receives if max_receives is _UNSET else max_receives,
                self.dead_letter if dead_letter is _UNSET else dead_letter)
        return {"visibility_timeout": visibility_timeout, "shuffle": shuffle,
                "policy": policy}

    def _dead_letter_policy(self, max_receives, dead_letter):
        if max_receives is None:
            return None
        target_state = None
        if dead_letter is not None and self._database.exclusive:
            # This process numbers the dead-letter queue's messages: its state must be live.
            target_state = self._database.state(dead_letter, None, self._clock)
        return DeadLetterPolicy(max_receives, dead_letter, target_state)

    def peek(self):
        """The Message the next get() would receive (None if nothing is ready), without
        receiving it: nothing changes."""
        return self._conn().peek()

    # -- the non-blocking seam (an event loop waits without a thread per waiter) ---------

    def add_ready_listener(self, callback):
        """Call callback(queue name) whenever a message may have become ready here: a put,
        a give-back, a delay or visibility deadline passing, another process's change
        through a server.  It runs in whichever thread made the change, with the queue's
        lock held: keep it quick and never call the queue from it (an asyncio loop
        bridges it with loop.call_soon_threadsafe and then tries get_nowait()).  A wake-up
        is a hint: another consumer may take the message first."""
        self._check_open()
        if not callable(callback):
            raise TypeError("callback must be callable")
        self._state.add_listener(callback)

    def remove_ready_listener(self, callback):
        """Stop calling a callback given to add_ready_listener."""
        self._state.remove_listener(callback)

    def next_ready_at(self):
        """When (clock seconds) the next delayed message, or the next message in flight
        with a visibility deadline, becomes ready by itself; None if none will.  A get
        that found nothing (get_nowait raised Empty) needs to look again by then, or when
        a ready listener fires."""
        self._check_open()
        return self._state.next_ready_at()

    def browse(self, *, after=None):
        """Iterate every message of the queue with its state (ready in delivery order,
        then delayed, then in flight), changing nothing: no receive is counted and nothing
        is claimed.  Yields ackqueue.browse.BrowsedMessage (id, state, item, body,
        receive_count, deadline, visible_at, attributes, age, ...); reads the store one
        message at a time from one snapshot (see ackqueue.browse).

        after (a message id): instead, the messages whose id is greater, in id order,
        starting in O(log n): what a paged export reads (ackqueue.browse.browse_after)."""
        self._check_open()
        if after is None:
            return self._state.browse(self.allowed_classes)
        if isinstance(after, bool) or not isinstance(after, int):
            raise TypeError(f"after must be a message id (int), not {type(after).__name__}")
        return self._state.browse(self.allowed_classes, after=after)

    def dedup_lookup(self, dedup_id):
        """The MessageId of the message put with dedup_id if that id still refuses a put
        (within the queue's dedup window), else None.  Reads a fresh snapshot of the
        store; changes nothing."""
        self._check_open()
        return self._state.dedup_lookup(_dedup_id(dedup_id))

    def ack(self, item):
        """Acknowledge a received item (the object get returned, a Message, or its id): it
        leaves the queue for good.  Durable when this returns.  Raises StaleAck if the
        delivery was given back meanwhile (its message may be held by someone else)."""
        own = self._conn()
        own.ack_holding(self._find(item, own))

    def ack_many(self, items, then=None):
        """Acknowledge many received items in one commit: all of them, or (NotHeld,
        StaleAck) none.

        then (the non-blocking seam, as put_many's): return at once and call then(error)
        from the committer's thread once the ack is durable (error None) or has failed.
        What is not held, or no longer the live delivery, raises at once (NotHeld,
        StaleAck) and nothing is submitted."""
        own = self._conn()
        items = list(items)
        holdings = own.find_many(items)
        if None in holdings or any(map(_released, holdings)):
            holdings = [h if h is not None and h.released is None
                        else self._find(item, own)        # peeked, stale, or another's
                        for item, h in zip(items, holdings)]
        holdings = list(dict.fromkeys(holdings))          # an item given twice: once
        if holdings:
            if then is None:
                own.ack_many_holdings(holdings)
            else:
                own.ack_many_holdings(holdings, then=then)
        elif then is not None:
            then(None)

    def change_visibility(self, item, seconds):
        """Give a received item a new visibility deadline, seconds from now; with seconds
        0 or less give it back now.  StaleAck if it was given back meanwhile."""
        self._conn().change_visibility_holding(self._find(item), seconds)

    # -- counts and maintenance -----------------------------------------------------------

    def counts(self):
        """{"ready", "in_flight", "delayed"}: the queue's current sizes."""
        self._check_open()
        return self._state.counts()

    def stats(self):
        """counts() and the queue's lifetime totals: put, acked, redelivered, given_back,
        dead_lettered (moved or dropped), dropped, expired, purged, moved_in, redriven, and
        missing (taken out because their record or body was gone from the store: a file
        changed outside ackqueue, or damaged)."""
        result = self.counts()
        result.update(self._state.totals())
        return result

    def purge(self):
        """Remove every message, ready, delayed or in flight, as SQS's PurgeQueue does: a
        later ack of a purged delivery raises StaleAck (one whose ack was already being
        written is acknowledged instead).  Returns how many were removed."""
        self._check_open()
        return self._state.purge()

    def redrive(self, *, to=None):
        """Move this queue's ready dead letters back to the queue each came from (or to the
        queue named to), where they start a new receive count; returns how many moved."""
        self._check_open()
        if to is not None and (not isinstance(to, str) or not to or to == self.name):
            raise ValueError("to must name another queue of this storage")
        return self._conn().redrive(to)

    def pack(self, keep_seconds=0.0):
        """Pack the storage (ZODB pack) while the queue stays in use: acknowledged messages
        and old revisions go, and the file shrinks.  Returns a maintenance.PackReport."""
        from .maintenance import pack
        self._check_open()
        return pack(self._database, keep_seconds=keep_seconds)

    def nack(self, item, delay=0):
        """Give a received item back now (or after delay seconds), at its original place."""
        self._conn().nack_holding(self._find(item), delay)

    def task_done(self):
        """Acknowledge the oldest item the calling thread received and has not acknowledged
        (another thread's oldest, if this one holds none), keeping queue.Queue's counting:
        ValueError when there is nothing left to acknowledge."""
        self._check_open()
        own = getattr(self._local, "conn", None)
        candidates = [own] if own is not None else []
        candidates += [c for c in list(self._connections) if c is not own]
        for conn in candidates:
            h = conn.oldest_unacked()
            if h is not None:
                self._conn().ack_holding(h)
                return
        unfinished = self._state.unfinished()
        if unfinished:
            raise ValueError(
                f"task_done(): no thread holds an item received from queue {self.name!r} "
                f"through this queue object and not yet acknowledged, so there is nothing "
                f"to acknowledge ({unfinished} unfinished item(s) wait to be received, or "
                "are held through another queue object or process); acknowledge an item "
                "after a get() has received it")
        raise ValueError("task_done() called too many times")

    def join(self):
        """Block until every item put has been acknowledged (ValueError if the queue is
        closed meanwhile)."""
        self._check_open()
        self._state.acknowledging = True
        with self.all_tasks_done:
            while self._state.unfinished() and not self.shutdown_immediate:
                self.all_tasks_done.wait()
                self._check_open()

    def qsize(self):
        """The number of ready items (not counting items in flight), without those whose
        retention has passed."""
        self._check_open()
        self._state.drop_expired()
        with self.mutex:
            self._state.expire_due()
            return self._state.ready_count()

    def empty(self):
        return not self.qsize()

    def full(self):
        self._check_open()
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

    def flush(self):
        """Return once every deferred ack of this queue (acks="deferred") is durable;
        raises the error a deferred ack's commit met (its message was given back).
        Nothing to do in the default mode, where every ack is durable when it returns."""
        self._check_open()
        pending = getattr(self._state, "deferred_acks", None)
        if pending is not None:
            pending.flush()

    def close(self):
        """Flush deferred acks, give back what this queue object's connections hold and
        release the storage."""
        if self._closed:
            return
        failed = None
        if self.acks == "deferred":
            try:
                self.flush()
            except Exception as exc:    # its message was given back; close, then raise
                failed = exc
        self._closed = True
        for conn in list(self._connections):
            conn.close()
        with self.mutex:
            self.all_tasks_done.notify_all()      # a join() in progress raises "closed"
        self._database.release()
        if failed is not None:
            raise failed

    def __reduce__(self):
        """A queue travels to another process (multiprocessing's spawn and forkserver, a
        Pool initializer's arguments) as its path, name and options, and reopens there: a
        file another process holds as a client of that process (ackqueue.shared), a
        service's URL as a client of the service.  A queue in memory or in an
        application's own ZODB (db=), or with clock=, cannot travel: TypeError."""
        args = self._reopen_args
        if args["path"] is None:
            raise TypeError(f"{self!r} cannot be pickled: a queue in memory or in an "
                            "application's ZODB (db=) lives in this process; give it a "
                            "path= to share it with other processes")
        if self._clock is not time.time:
            raise TypeError(f"{self!r} cannot be pickled: its clock= stays in this process")
        return _reopen, (type(self), args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- helpers --------------------------------------------------------------------------

    def _find(self, item, own=None):
        """The delivery item names (own: the calling thread's connection, if known)."""
        if isinstance(item, Message) and item.holding is None:
            raise NotHeld(f"{item!r} was peeked, not received: there is nothing to "
                          "acknowledge")
        if own is None:
            own = self._conn()
        h = own.find(item)
        if h is not None:
            return h
        for conn in list(self._connections):     # received in another thread
            if conn is not own:
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



CLASSES = {store.FIFO: AckQueue, store.LIFO: AckLifoQueue, store.VALUE: AckPriorityQueue}
"""The front class of each queue kind (store.FIFO, LIFO, VALUE)."""


def _reopen(cls, args):
    """A pickled queue, opened again (AckQueue.__reduce__)."""
    args = dict(args)
    return cls(args.pop("maxsize"), **args)


def _listed_through(where):
    """queues() of a storage another process serves (a service's URL, or a file its
    holder shares), asked through a handle on it: nothing is put."""
    probe = AckQueue(path=where)
    try:
        return probe._database.list_queues()
    finally:
        probe.close()


def queues(path_or_db=None):
    """Every named queue of a storage (a file path, a zeo:// URL, a queue service's
    http(s):// URL or a ZODB.DB) with its counts: {name: {"ready": r, "in_flight": f,
    "delayed": d}}: as the live queue in this process knows them when it is open here,
    else as the store (or the service) records them."""
    if isinstance(path_or_db, str) and is_url(path_or_db):
        return _listed_through(path_or_db)
    if isinstance(path_or_db, str) or path_or_db is None or hasattr(path_or_db, "__fspath__"):
        where = None if path_or_db is None else os.fspath(path_or_db)
        if where is not None and not where.startswith("zeo://") and not os.path.exists(where):
            raise FileNotFoundError(f"no queue file at {where!r}")
        try:
            database = open_database(path_or_db, None, None)
        except QueueLocked:
            if where is None or not files.reachable(where):
                raise
            return _listed_through(where)      # the file's holder lists them
    else:
        database = open_database(None, path_or_db, None)
    try:
        database.committer.submit([]).wait()      # what this process wrote is in the store
        tm = transaction.TransactionManager()
        conn = database.db.open(transaction_manager=tm)
        try:
            tm.begin()
            catalog = conn.root().get(store.ROOT_KEY)
            result = {}
            for name, rec in (catalog.queues.items() if catalog is not None else ()):
                live = database.states.get(name) if database.exclusive else None
                if live is not None:
                    # A lone process writes no claims: its live state knows what is out.
                    result[name] = live.counts()
                    continue
                c = rec.counts
                result[name] = {"ready": c.get("ready"), "in_flight": c.get("inflight"),
                                "delayed": c.get("delayed")}
            tm.abort()
            return result
        finally:
            conn.close()
    finally:
        database.release()
