"""The contracts inside ackqueue, written once, as ``transaction.interfaces`` writes its own.

The layers and the way data flows through them are drawn once, in docs/architecture.md;
this module states the contracts between them.

``IQueueState`` is what the front and its proxies rely on: the rules of one named queue
in this process (delivery, give-back, visibility, dead letters, counts), written once.
``IArbiter`` is the one seam under it, the only thing that differs between a process that
holds its storage alone and processes that share it through a server: who decides which
message a get receives, where sequence numbers come from, where the ready set lives, and
whether wake-ups come only from this process or from the server's invalidations too.  It
plays the part that ``_init/_qsize/_put/_get`` play in CPython's ``queue.py``.

Locking: every state has one mutex (``IQueueState.mutex``) and three conditions on it
(``not_empty``, ``not_full``, ``all_tasks_done``).  Methods documented "mutex held" are
called with it held and never block on anything but that mutex's conditions; every other
method takes it itself.  The mutex is never held while waiting for a commit.

Readiness: a message is *ready* when a get may receive it now; *delayed* when it becomes
ready at a known time (a put with delay, a nack with delay); *in flight* while a delivery
holds it (until its ack, or a give-back at its visibility deadline, by nack, by its
thread's death or by its process's death).  A delivery is named by a ``Holding``; its
``token`` is unique, so an ack meant for an earlier delivery of the same message is refused
(``StaleAck``) instead of removing a later one.
"""
from zope.interface import Attribute, Interface

__all__ = ["IQueueFront", "IDatabase", "IProxy", "IQueueConnection", "IRemoteConnection",
           "IFrontState", "IQueueState", "IArbiter", "ILocalArbiter", "ISharedArbiter",
           "ITicket", "IServiceBackend", "IClientConnection", "IServiceRuntime"]


class IQueueFront(Interface):
    """What other layers need of a front (ackqueue.queue.AckQueue and its subclasses),
    beyond queue.Queue's own API (put, get, task_done, join, qsize, ...)."""

    name = Attribute("The queue's name in its storage.")
    kind = Attribute("How the queue orders its messages, as stored: fifo, lifo or value.")
    clock = Attribute("The wall clock of the queue's deadlines, delays and retention.")
    state = Attribute("The queue's live state in this process (IFrontState).")
    database = Attribute("The runtime of the queue's storage (IDatabase).")
    mutex = Attribute("queue.Queue's name for the state's mutex.")
    not_empty = Attribute("queue.Queue's condition, the state's.")
    not_full = Attribute("queue.Queue's condition, the state's.")
    all_tasks_done = Attribute("queue.Queue's condition, the state's.")

    def put(item, block=True, timeout=None):
        """queue.Queue.put, durable once it returns."""

    def get(block=True, timeout=None):
        """queue.Queue.get: the item is in flight until acknowledged."""

    def connect(*, thread_bound=True):
        """A new proxy (IProxy) for the calling thread, or for no thread."""

    def close():
        """Close this front (its database reference is released)."""


class IDatabase(Interface):
    """The runtime of one storage, as a front opens it: ackqueue.database.Database (a
    file, memory, a server, an application's DB) or ackqueue.remote.database.RemoteDatabase
    (the queue service)."""

    exclusive = Attribute("Whether this process holds the storage alone.")
    owned = Attribute("Whether this runtime opened the storage (so it closes it).")
    closed = Attribute("Whether the last reference was released.")
    description = Attribute("Where the storage is, for messages (a file, a URL).")
    proxy_class = Attribute(
        "The front's per-thread proxy class (IProxy), called as proxy_class(front, state, "
        "thread_bound=True): QueueConnection over ZODB, RemoteConnection over the service.")

    def state(name, kind, clock, codec, allowed):
        """The live state (IFrontState) of queue name, made on first use; kind and codec
        (None: the stored one) are checked against the stored queue."""

    def release():
        """Give back one reference; the last one closes the runtime."""

    def enable_autopack(threshold):
        """Pack whenever the storage grew by threshold bytes (NotSupported where the
        storage is packed elsewhere)."""


class IProxy(Interface):
    """One thread's handle on a queue (or one belonging to no thread), as the front uses
    it: ackqueue.connection.QueueConnection, ackqueue.remote.connection.RemoteConnection."""

    closed = Attribute("Whether the proxy was closed (a closed one is replaced).")
    thread_bound = Attribute("Whether the proxy belongs to the thread that made it.")

    def put(item, block=True, timeout=None):
        """Put one item (durable on return)."""

    def put_many(items):
        """Put items in one commit (or one request)."""

    def get(block=True, timeout=None):
        """Receive one item (in flight until acknowledged)."""

    def get_message(block=True, timeout=None):
        """Receive one Message."""

    def get_many(n, block=True, timeout=None):
        """Receive up to n items."""

    def find(x):
        """The live-or-recent delivery x names (a Message, an item got, a MessageId)."""

    def find_many(xs):
        """find for each of xs."""

    def ack_holding(holding):
        """Acknowledge one delivery."""

    def ack_many_holdings(holdings, then=None):
        """Acknowledge deliveries, all or none."""

    def nack_holding(holding, delay=0.0):
        """Give one delivery back (after delay seconds)."""

    def change_visibility_holding(holding, seconds):
        """A new visibility deadline for one delivery."""

    def peek():
        """The Message the next get would receive, or None."""

    def oldest_unacked():
        """The oldest delivery this proxy holds, or None."""

    def redrive(to=None):
        """Move dead letters back; how many."""

    def transaction():
        """A block of puts, gets and acks committed together."""

    def owned_by(thread):
        """Whether this proxy belongs to thread."""

    def alive():
        """Whether its thread (or, for a proxy of no thread, the proxy) is still alive."""

    def close():
        """Give back what it still holds and close."""


class IQueueConnection(IProxy):
    """The proxy over ZODB (ackqueue.connection.QueueConnection)."""

    def load_meta(seq):
        """Read message seq that is not in memory (the state's mutex held)."""


class IRemoteConnection(IProxy):
    """The proxy over the queue service (ackqueue.remote.connection.RemoteConnection);
    ackqueue.remote.block and ackqueue.remote.database use what follows."""

    database = Attribute("Its RemoteDatabase (IDatabase).")
    state = Attribute("Its RemoteState (IFrontState).")
    holdings = Attribute("receipt -> RemoteHolding of the deliveries it holds, oldest first.")
    by_item = Attribute("id(item) -> the RemoteHolding (or list of them) of an item got.")

    def nack_receipts(receipts, delay=0):
        """Give back on the service the deliveries receipts name."""

    def forget(holding):
        """Stop tracking a delivery (acknowledged or given back on the service)."""

    def flush_acks(older_than=None):
        """Send the acks riding on the next receive (ack_with_next_get)."""

    def give_back_all(why):
        """Give back everything this proxy holds."""


class IFrontState(Interface):
    """What a front asks of the live state of its queue, local (IQueueState) or remote
    (ackqueue.remote.database.RemoteState)."""

    name = Attribute("The queue's name in its storage.")
    kind = Attribute("store.FIFO, store.LIFO or store.VALUE (ordered by item value).")
    codec = Attribute("The queue's codec (ackqueue.codec).")
    mutex = Attribute("The one lock of this queue in this process.")
    not_empty = Attribute("queue.Queue's condition on the mutex.")
    not_full = Attribute("queue.Queue's condition on the mutex.")
    all_tasks_done = Attribute("queue.Queue's condition on the mutex.")
    acknowledging = Attribute("Whether this process acknowledges on this queue.")

    def ready_count():
        """Ready messages (qsize)."""

    def size_for_maxsize():
        """What maxsize counts (ready plus delayed)."""

    def unfinished():
        """Messages put and not yet acknowledged (join)."""

    def counts():
        """{"ready", "in_flight", "delayed"}."""

    def totals():
        """The queue's lifetime totals."""

    def purge():
        """Remove every message; how many."""

    def next_ready_at():
        """When the next delayed or in-flight message becomes ready, or None."""

    def add_listener(callback):
        """Call callback(queue name) whenever a message may have become ready."""

    def browse():
        """Iterate every message, changing nothing."""

    def drop_expired():
        """Take out waiting messages past their retention."""

    def record_codec(codec=None):
        """(the codec, whether it is recorded), recording codec if none is."""

    def dedup_lookup(dedup_id):
        """The id of the message a dedup id put, or None."""

    def expire_due():
        """Give back what is due (deadlines passed)."""


class IQueueState(IFrontState):
    """The live state of one named queue in this process (ackqueue.state.QueueState)."""

    name = Attribute("The queue's name in its storage.")
    kind = Attribute("store.FIFO, store.LIFO or store.VALUE (ordered by item value).")
    clock = Attribute("Wall-clock seconds (injectable): deadlines, delays, retention.")
    mutex = Attribute("The one lock of this queue in this process.")
    arbiter = Attribute("The IArbiter that decides claims for this state.")
    acknowledging = Attribute(
        "Whether this process acknowledges on this queue (ack, nack, task_done, join, "
        "connect, transaction, visibility timeouts).  Until it does, a thread that ends "
        "normally keeps what it got, as with queue.Queue.")

    # -- put -------------------------------------------------------------------------------
    def reserve_put(front, count, block, timeout):
        """Wait for room for count messages (queue.Queue.put's rules against
        front.maxsize; raises Full or ShutDown) and return their sequence numbers (None
        each where the store numbers them at commit)."""

    def new_message(seq, item, body, now, opts, dedup_id):
        """(store operation, entry): the Put to commit, and what puts_committed needs to
        make the message visible once that commit is durable."""

    def new_messages(seqs, pairs, now, opts, dedup_ids):
        """new_message for each seq, (item, body) pair and dedup id (dedup_ids None: none),
        in one pass: ([store operations], entries).  The operations may be fewer than the
        messages (store.PutRun: columns); entries is sized and iterates as new_message's
        entries, one per message."""

    def puts_committed(entries):
        """Durable puts become visible (ready, or delayed until their time)."""

    def unreserve(count):
        """Reserved room that will not be used (a failed put, a rolled-back block)."""

    # -- get -------------------------------------------------------------------------------
    def try_claim(front, ask, n=1, moves=None):
        """Never waits for a message: a list of 0 to n Holdings taken for ask.holder now.
        An empty list means nothing is ready now; next_ready_at() says when something
        will be, and add_listener() tells when something is.  Raises ShutDown by
        queue.Queue's shutdown rule.  Through a server the claim is committed before this
        returns (a message another process won is not taken)."""

    def claim(front, ask, block=True, timeout=None, n=1):
        """queue.Queue.get's waiting built on try_claim and the one wait loop: a Holding
        (n == 1) or a list of 1 to n; raises Empty or ShutDown as queue.Queue.get does."""

    def next_ready_at():
        """The clock time at which the next delayed or in-flight message becomes ready
        without anything else happening (its delay or visibility deadline), or None."""

    def add_listener(callback):
        """Call callback(queue name) whenever a message may have become ready (a put,
        a give-back, a delay or deadline passing, another process's change).  It is
        called with the mutex held, from any thread: it must be quick and must not take
        this queue's mutex (an asyncio loop bridges it with call_soon_threadsafe)."""

    def remove_listener(callback):
        """Stop calling callback."""

    # -- settle ----------------------------------------------------------------------------
    def check_current(holding):
        """Raise StaleAck unless holding is the live delivery of its message (mutex held)."""

    def ack_many(holdings):
        """Acknowledge holdings durably, all or none; returns once the commit is durable."""

    def give_back(holding, why, delay=0.0):
        """Return a held message to its original place, now or after delay seconds."""

    def give_back_all(holder, why):
        """Give back everything holder holds (its thread ended, its proxy closed)."""

    def give_back_held(holding, why, delay=0.0):
        """give_back for a delivery known to be current (mutex held)."""

    def forget_holding(holding):
        """Take a delivery out of its holder's table (mutex held; the caller takes it out
        of the in-flight table)."""

    def set_deadline(holding, deadline):
        """Record a delivery's new visibility deadline here (mutex held)."""

    def drop(holdings, why):
        """Forget deliveries the store no longer has in flight for us."""

    def change_visibility(holding, seconds):
        """A new deadline seconds from now; seconds <= 0 gives it back now."""

    # -- reading ---------------------------------------------------------------------------
    def peek(load_meta):
        """(seq, Meta) of the message the next get would receive, or None."""

    def browse():
        """Iterate every message of the queue, changing nothing (ackqueue.browse)."""

    def counts():
        """{"ready", "in_flight", "delayed"} as the arbiter knows them, without the ready
        and delayed messages whose retention has passed (exactly, at the call)."""

    def drop_expired():
        """Take out the waiting messages whose retention has passed, through the store's
        expiry index, before sizes are read (qsize, counts); not under the mutex."""

    def unfinished():
        """Messages put and not yet acknowledged: what join() waits for (mutex held)."""


class IArbiter(Interface):
    """What differs between a lone process and processes sharing a store: who decides a
    claim, where sequence numbers, the ready set and wake-ups come from.

    ackqueue.arbiters.local.LocalArbiter: this process holds the storage alone; the ready set lives
    in its memory and its mutex decides every claim; nothing else can change the queue.
    ackqueue.arbiters.shared.SharedArbiter: processes share the storage through a server; the
    store's ready set is the truth, a claim is a committed Claim that another process's
    claim of the same message makes fail, and the server's invalidations wake waiters."""

    recheck = Attribute(
        "None, or the longest a waiting get sleeps before looking again (changes may come "
        "from other processes without a wake-up, e.g. after a server restart).")

    def load():
        """Create or check the queue record (QueueKindMismatch), set state.kind, and load
        what the arbiter keeps in memory."""

    def has_ready():
        """Whether a get may find a message now (mutex held; may start promotions)."""

    def ready_count():
        """Ready messages (qsize); mutex held."""

    def queued():
        """Ready plus delayed messages (what maxsize counts); mutex held."""

    def unfinished():
        """Messages not yet acknowledged (ready, delayed, in flight); mutex held."""

    def counts():
        """{"ready", "in_flight", "delayed"}; takes the mutex."""

    def reserve_seqs(count):
        """Sequence numbers for count new messages (None each: the store numbers them)."""

    def new_message(seq, item, body, now, opts, dedup_id):
        """See IQueueState.new_message."""

    def new_messages(seqs, pairs, now, opts, dedup_ids):
        """See IQueueState.new_messages."""

    def arrive(entries):
        """Durable puts or moved-in messages become visible here (mutex held)."""

    def check_orderable(items):
        """A priority-by-value queue's items must compare (TypeError)."""

    def take(front, ask, n, moves):
        """Up to n Holdings for ask now, never waiting for a message (see try_claim).
        Applies the receive rules (QueueState.verdict): a message past its retention or
        its receives is taken out on the way, not delivered; dead-letter moves to wait for
        are appended to moves."""

    def ack_op(holding):
        """The store operation that acknowledges a delivery."""

    def ack_ops(holdings):
        """The store operations that acknowledge holdings in one commit: [ack_op(h) for h
        in holdings], or fewer operations that do the same (store.AckRun: columns)."""

    def put_back(holding, visible_at, now):
        """The message of a delivery just given back returns to its place, ready now
        (visible_at None) or at visible_at; writes the Release (mutex held)."""

    def deadline_op(holding, deadline):
        """The store operation that records a new visibility deadline, or None when the
        store need not know it."""

    def candidates(load_meta):
        """(seq, key, Meta) of ready messages in delivery order, for peek (mutex held).
        The caller passes each message it does not want to skip_expired before asking
        for the next one."""

    def skip_expired(seq, key):
        """peek found message seq past its retention (mutex held)."""

    def ready_order(rec):
        """The seqs of ready messages in delivery order, read from rec (a QueueRecord of
        a snapshot) without loading message bodies (browse)."""

    def expire_due(now):
        """Make what is due ready (mutex held)."""

    def next_wake(now):
        """Seconds until the arbiter needs the reaper, or None (mutex held)."""

    def expiry_read_due(now):
        """Whether counts must read the store's expiry index before sizing (mutex held):
        a waiting message may have expired by now (QueueState.drop_expired)."""

    def expiry_read(next_at):
        """The expiry index was read: no other waiting message expires before next_at
        (None: none has a deadline) (mutex held)."""

    def take_out_expired(seqs, keys=None):
        """Forget the listed expired messages that wait here (keys: {seq: store key});
        returns the seqs taken out, for whom the caller writes Expire operations."""

    def reap():
        """The reaper's own pass: look at what other processes left (mutex held)."""

    def purge():
        """Remove every message, in flight too (their acks become stale); how many."""

    def redrive(to, load_meta):
        """Move ready dead letters back to their queues (or to ``to``); how many moved."""

    def stop():
        """The queue is closing in this process (before the reaper stops)."""

    def close():
        """After the reaper stopped: release what the arbiter holds."""


class ILocalArbiter(IArbiter):
    """ackqueue.arbiters.local.LocalArbiter, which durable holds (ackqueue.holds) move
    messages through."""

    def moved_key(meta, seq):
        """The memory key, in this queue, of a message moved here as seq."""


class ISharedArbiter(IArbiter):
    """ackqueue.arbiters.shared.SharedArbiter, whose reads ackqueue.pack_rereads repeats."""

    def abort_reads():
        """End the read connection's snapshot: the next read sees a fresh one."""


class ITicket(Interface):
    """A commit handed to the committer (ackqueue.commit.Ticket)."""

    ops = Attribute("The store operations it commits, as one unit.")
    error = Attribute("None, or the error that prevented the commit.")
    uncertain = Attribute("Whether an earlier attempt was cut off by a lost connection.")

    def wait(timeout=None):
        """Return True after a durable commit (False at timeout), or raise its error."""

    def finished():
        """Whether the outcome is known."""

    def wait_finished():
        """Wait until the outcome is known, without raising its error."""


class IClientConnection(Interface):
    """One service client's connection to one queue (ackqueue.service.backend.ClientConn):
    it holds that client's deliveries, and their acks, nacks and visibility changes go
    through it, the connection that received them, one call at a time under ``lock``."""

    queue = Attribute("The AckQueue front the connection belongs to.")
    conn = Attribute("The queue's connection (connect(thread_bound=False)) that received.")
    lock = Attribute("Held by the one pool thread or loop callback using the connection.")

    def holding(message):
        """The delivery a received Message names; NotHeld when it names none."""

    def submit_acks(messages, then):
        """Acknowledge received messages in one commit, all or (StaleAck) none, without
        waiting: then(error or None) once the commit's outcome is known."""

    def close():
        """Close the connection, giving back what it still holds."""


class IServiceBackend(Interface):
    """The queue service's one backend (ackqueue.service.backend.Service): named queues
    over one storage, client sessions with leases, the receipts of deliveries held for
    remote clients.  Every front reaches the store through it; its blocking methods run in
    the runtime's pool, never on the event loop (receive_now and the maps aside)."""

    path = Attribute("The storage's file, or None for memory.")
    durability = Attribute("The file's durability ('fsync' or 'os').")
    closed = Attribute("True once close() began.")
    db = Attribute("The storage's ZODB database, for records kept beside the queues.")
    queues = Attribute("{name: AckQueue} of the queues open (read on the loop).")
    leases = Attribute("The client sessions and their leases (backend.Leases).")
    receipts = Attribute("{receipt handle: Delivery} of the deliveries held for clients.")

    def queue(name, *, lifo=False):
        """The AckQueue named name, opened on first use and kept until close (blocking)."""

    def open_front(name, maxsize=0, *, lifo=False):
        """A new AckQueue front on queue name, owned by the caller (blocking)."""

    def committer():
        """The storage's committer, which the event loop's bridge listens to."""

    def pack(keep_seconds=0.0):
        """Pack the storage while its queues stay in use (blocking)."""

    def list_queues():
        """{name: counts} of every queue of the storage (blocking)."""

    def client_conn(session, name):
        """session's IClientConnection to queue name (blocking: opens the queue)."""

    def receive(cc, n, visibility_timeout, **dead_letter):
        """Up to n messages received through cc now, never waiting for messages."""

    def receive_now(cc, n, visibility_timeout):
        """receive() for the event loop's own thread (no dead-letter policy); None when
        it would have to wait for a lock or a commit."""

    def register(name, session, cc, messages):
        """Receipt handles for delivered messages (event loop thread)."""

    def forget(receipts):
        """Drop receipt handles whose deliveries ended."""

    def give_back(cc, messages):
        """Deliveries that never reached their client go back (blocking)."""

    def ack_submit(cc, messages, then):
        """cc.submit_acks under cc's lock (blocking for the lock only)."""

    def nack(cc, message, delay):
        """Give a delivery back through cc, ready again after delay seconds (blocking)."""

    def change_visibility(cc, message, seconds):
        """Move a delivery's visibility deadline to seconds from now, through cc."""

    def close_session_conns(session):
        """A session's lease ended: close its connections, giving back what they held."""

    def close():
        """Close every session and queue, then release the storage."""


class IServiceRuntime(Interface):
    """The per-API runtime of the service (ackqueue.service.runtime.Api): the event loop,
    the thread pool, long polls and wake-ups, and the calls every front makes (native,
    Sasquatch's RPC, SQS), so that one message takes one road whatever the front."""

    service = Attribute("The IServiceBackend.")
    loop = Attribute("The event loop (set at startup).")
    pool = Attribute("The thread pool the blocking backend calls run in.")

    def run(fn, *args):
        """Await fn(*args) run in the pool."""

    def put_many(q, bodies, **kwargs):
        """Await q.put_many(bodies, encoded=True, **kwargs) durable, no thread waiting."""

    def ack_many(cc, messages):
        """Await the acks of messages held by cc in one commit, durable: all or none."""

    def queue(name):
        """Await the backend's queue name, with the runtime's ready listener on it."""

    def wake(name):
        """Wake every long poll waiting on queue name (the loop's thread only)."""

    def session(client):
        """client's session (made on first use), its lease renewed."""

    def storage_full(exc):
        """The 503 StorageFull ApiError for exc when the storage is full, else None."""

    def poll(request, name, q, cc, attempt, wait, *, give_back=True, done=None, now=None):
        """The service's one long poll: attempt() until it delivers, wait runs out, or
        the request or the service ends."""

    def close_session(s):
        """Close session s's connections (their deliveries go back) and forget it."""
