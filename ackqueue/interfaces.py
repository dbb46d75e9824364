"""The contracts inside ackqueue, written once, as ``transaction.interfaces`` writes its own.

An operation flows one way::

    front (queue.AckQueue)  ->  proxy (connection.QueueConnection)  ->  state (state.QueueState)
        ->  committer (commit.Committer)  ->  store (store.py operations)  ->  ZODB storage

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

__all__ = ["IQueueState", "IArbiter"]


class IQueueState(Interface):
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

    def sweep():
        """Take out messages past their retention and forget passed dedup ids."""

    def stop():
        """The queue is closing in this process (before the reaper stops)."""

    def close():
        """After the reaper stopped: release what the arbiter holds."""
