"""The ZODB layout of ackqueue, and the operations that change it.

Layout, under the database root::

    root["ackqueue"]            Catalog
      .queues[name]             QueueRecord (one per named queue)
        .messages[seq]          Msg: the pickled item and its delivery history (inline;
                                its recent changes in .counts' journal, format 7)
        .ready                  set of store keys: what can be delivered, in delivery order
                                (its recent changes in .counts' journal, format 5)
        .inflight[seq]          what is out: its deadline (a time.time() float, 0.0 for none)
        .leased[lease id][seq]  the same, for messages claimed through a server: one index per
                                process, so that consumers in different processes never
                                write the same in-flight bucket
        .delayed[seq]           time at which a given-back or delayed message becomes ready
        .dedup[dedup id]        (until, seq): until when a put with that id is refused as
                                a duplicate, and the id (seq) of the message put with it
                                (format 6; before, the until alone, and the seq in
                                .dedup_ids, which the migration folds in)
        .codec                  how puts encode items (ackqueue.codec), None for the default
        .next_seq               SeqCounter: the next sequence number (never reused)
        .counts                 Counters: ready/inflight/delayed sizes and lifetime totals,
                                the expiry order marker and the journals of the ready set
                                and of the messages
        .holds[name]            (deadline, reads, packed ids): named durable holds
                                (ackqueue.holds; made by the first hold)
      .leases[lease id]         LeaseRecord: one per process using the storage through a server

Why this shape:
- A message is a plain tuple (ackqueue.segments.Msg) kept inline in its index segment
  (its run of 16 neighbours, pickled as one bytes object).  A put or an ack of one message
  writes one record, the queue's Counters, which hold the recent changes of the ready set
  (ackqueue.journal, format 5) and of the messages (segments.MessageIndex, format 7: the
  messages put since the index's last fold, and the seqs deleted since then), and
  nothing else; the commit that passes a journal's bound also writes the segments it
  folds into (once per 16 puts, once per 256 acks).  A batch of more than 16 (put_many,
  ack_many) writes its segments and the Counters.  A body over LARGE_BODY bytes is kept
  in a Body record of its own (``.bodies[seq]``), so that big items are not rewritten
  with every change to their neighbours; one over BODY_PART (4 MB) in parts of that size
  (Body.parts, format 3), so that no record reaches ZODB's large-record warning.
- messages and ready are segmented indexes (ackqueue.segments): runs of neighbouring keys
  per persistent segment (16 messages; 256 ready keys, packed 8 bytes each, so that an
  open loads few objects; the ready set's recent changes wait in its journal, folded
  into these segments once they pass 4,096 keys or 16 runs), whose conflict resolution (the
  journal's too) merges concurrent changes to different messages, including at the head
  of the queue, where BTree buckets refuse to merge ("Delete of first key").  So writers
  that touch different messages (the committer, an application's own connection, other
  processes through a server) do not conflict, and two claims of one message do.  The
  other indexes are small BTrees of integers.  Sizes and totals live in Counters, which
  resolves conflicts by adding deltas (like BTrees.Length); SeqCounter resolves by
  taking the larger.
- A store key orders the ready set: priority first (higher first), then the sequence number
  (FIFO) or its complement (LIFO).  Priority queues ordered by item value use the sequence
  number as store key and order by value in memory (see ackqueue.state).

Messages can move between queues of one storage: to a dead-letter queue after too many
receives (DeadLetter) and back (Redrive).  A moved message gets a sequence number of its new
queue and keeps its first one (Msg.sequence) and the name of the queue it left (Msg.source).

Operations (Put, Claim, Release, Ack, ...) are small value objects with two methods,
``check(root)`` and ``apply(root)``; ``apply_unit`` runs every check of a unit before any
apply, so a refused unit writes nothing.  Two flavours:

- In a storage this process holds alone, the process's memory decides (ackqueue.state) and
  operations are tolerant: an ack of a message whose claim has not been applied yet, or a
  claim of a message already acknowledged, does the right thing.
- Through a server (ackqueue.arbiters.shared), the store decides: a Claim names its lease and is
  refused (ClaimLost) unless the message is still ready; Ack and Release name the receive
  count of their delivery and are refused (StaleAck) unless it is still the live one; Put
  takes its sequence number from the store at commit.

Either can be applied by the committer (ackqueue.commit) or by an application's own
connection inside its transaction (ackqueue.connection).

The format contract:
- FORMAT is the version of this layout that this code writes; the catalog records the
  version of its storage (Catalog.format; every catalog ackqueue ever wrote has it).
- A storage is opened through open_catalog(), at open (ackqueue.database) and by
  ensure_queue/ensure_leases: a catalog of a newer format is refused (UnsupportedFormat)
  and nothing is written; one of an older format is migrated in the transaction that opens
  it, by MIGRATIONS[v] for each version v up to FORMAT, and records FORMAT.
- A change to this layout either still reads what older code wrote (as Counters,
  SeqCounter and QueueRecord.upgrade() read the shapes of ackqueue 0.1, within format 1),
  or bumps FORMAT and adds a migration, with a test in tests/test_format.py.
- Persistent classes must not be moved or renamed; tests/test_format.py opens a file
  written by format 1.
"""
import pickle
import time

from BTrees.LOBTree import LOBTree
from BTrees.OOBTree import OOBTree
from persistent import Persistent
from ZODB.POSException import ConflictError

# The order of ready messages lives below the store and the expiry index (both file by
# store_key); its names stay the store's too (store.FIFO, store.store_key, ...).
from .order import (FIFO, KINDS, LIFO, PRIORITY_MAX, SEQ_BITS, SEQ_MASK,  # noqa: F401
                    VALUE, seq_of_key, store_key)
from .expiry import ExpiryIndex, NO_ORDER, build as build_expiry_index, split_ordered
from .journal import ADDED, REMOVED, KeyJournal, KeyRuns, merge_runs, merge_states
from .segments import KeySet, MessageIndex, Msg, SegmentedIndex, merge_entries

from .version import __version__
from .errors import DuplicateMessage, Refused, StaleAck, UnsupportedFormat

__all__ = [
    "ROOT_KEY", "FORMAT", "KINDS", "PRIORITY_MAX", "DEFAULT_PRIORITY",
    "store_key", "seq_of_key", "Catalog", "QueueRecord", "MessageRecord",
    "Counters", "SeqCounter", "LeaseRecord", "Put", "PutRun", "Claim", "Release", "Unclaim",
    "Ack", "AckRun", "Promote",
    "Compact", "needs_compaction", "DeadLetter", "Redrive", "Expire", "Purge", "PruneDedup",
    "RecordCodec",
    "SetDeadline", "DEFAULT_RETENTION", "MAX_RETENTION", "DEFAULT_DEDUP_WINDOW",
    "RegisterLease", "Beat", "DropLease", "ExpireLease", "ClaimLost", "LeaseLost",
    "ensure_queue", "ensure_leases", "apply_unit", "Operation", "MIGRATIONS",
    "UNRECORDED_FORMAT",
    "catalog_format", "open_catalog",
]

ROOT_KEY = "ackqueue"
FORMAT = 7          # the version of the layout this code writes (see "The format contract")
# The format of a catalog that records none.  Catalog has recorded its format since the
# first commit of ackqueue, so only a catalog made by other means lacks it; it is read
# as format 1, the only layout it could have.
UNRECORDED_FORMAT = 1
# Migrations: MIGRATIONS[v](root) turns a storage of format v into format v + 1 (in the
# transaction that opens it; open_catalog records the new version).  Bumping FORMAT means
# adding MIGRATIONS[FORMAT - 1] and a test that a format-1 file still opens and drains.


def _format_1_to_2(root):
    """Format 2 marks a body's encoding by its first byte (ackqueue.codec: text, bytes,
    JSON) and may record a queue's codec (QueueRecord.codec).  Every format-1 body is a
    pickle starting with the PROTO opcode, which format 2 reads as a pickle, and a queue
    without a codec uses the default: nothing to rewrite.  The version is bumped so that
    an ackqueue that knows only format 1 refuses files whose bodies it could not read."""


def _format_2_to_3(root):
    """Format 3 splits a body over BODY_PART bytes into parts (Body.parts), so that no
    record reaches ZODB's large-record size (16 MB), which made it warn about blobs for
    every such put.  A format-2 Body (one record with its data) reads as before: nothing
    to rewrite.  The version is bumped so that an ackqueue that knows only format 2
    refuses files whose split bodies it would read as None."""


def _format_3_to_4(root):
    """Format 4 keeps each queue's expiry index (QueueRecord.expiry, ackqueue.expiry),
    written with every put and delete, so that counts leave out expired messages
    exactly.  It is built here, once, from the messages.  The version is bumped so that
    an ackqueue that knows only format 3 (and would put and ack without updating the
    index) refuses the file."""
    catalog = root.get(ROOT_KEY)
    for rec in (catalog.queues.values() if catalog is not None else ()):
        if getattr(rec, "expiry", None) is None:
            rec.expiry, marker = build_expiry_index(rec)
            rec.counts.set_order(marker)


def _format_4_to_5(root):
    """Format 5 keeps the recent changes of each queue's ready set in a journal inside
    its Counters (ackqueue.journal; segments.KeySet.journal_holder), so that a put or an
    ack writes two records instead of three.  Each ready set is pointed at its queue's
    Counters here; its journal starts empty, so nothing else is rewritten.  The version
    is bumped so that an ackqueue that knows only format 4 (which would read the ready
    set without its journal) refuses the file."""
    catalog = root.get(ROOT_KEY)
    for rec in (catalog.queues.values() if catalog is not None else ()):
        if isinstance(rec.ready, KeySet) and rec.ready.journal_holder is None:
            rec.ready.keep_journal_in(rec.counts)


def _format_5_to_6(root):
    """Format 6 keeps a dedup id's window and the id of the message put with it in one
    entry of QueueRecord.dedup, (until, seq), instead of two trees (dedup: until, and
    dedup_ids: seq), so that a put with a dedup id (every put of the remote drop-in
    carries an idempotency key) writes one bucket of them, not two.  The seqs are folded
    in here and dedup_ids dropped.  The version is bumped so that an ackqueue that knows
    only format 5 (which would read an entry as a number) refuses the file."""
    catalog = root.get(ROOT_KEY)
    for rec in (catalog.queues.values() if catalog is not None else ()):
        dedup, seqs = rec.dedup, getattr(rec, "dedup_ids", None)
        if dedup is not None:
            for dedup_id, value in list(dedup.items()):
                if not isinstance(value, tuple):
                    seq = seqs.get(dedup_id) if seqs is not None else None
                    dedup[dedup_id] = (value, seq)
        if seqs is not None:
            rec.dedup_ids = None


def _format_6_to_7(root):
    """Format 7 keeps a message index's recent changes (the messages put, and the seqs
    deleted, since its last fold) in its queue's Counters (segments.MessageIndex
    .journal_holder), as format 5 did for the ready set, so that a put or an ack of one
    message writes one record instead of two.  Each message index is pointed at its
    queue's Counters here; its journal starts empty, so nothing else is rewritten.  The
    version is bumped so that an ackqueue that knows only format 6 (which would read the
    index without its journal) refuses the file."""
    catalog = root.get(ROOT_KEY)
    for rec in (catalog.queues.values() if catalog is not None else ()):
        if isinstance(rec.messages, MessageIndex) and rec.messages.journal_holder is None:
            rec.messages.keep_journal_in(rec.counts)


MIGRATIONS = {1: _format_1_to_2, 2: _format_2_to_3, 3: _format_3_to_4, 4: _format_4_to_5,
              5: _format_5_to_6, 6: _format_6_to_7}

KIND_NAMES = {FIFO: "a FIFO queue (AckQueue)", LIFO: "a LIFO queue (AckLifoQueue)",
              VALUE: "a priority queue (AckPriorityQueue)"}

DEFAULT_PRIORITY = 100
LARGE_BODY = 4096           # bodies above this many bytes get a record of their own
BODY_PART = 4 << 20         # bodies above this are split into records of at most this size
DEFAULT_RETENTION = 4 * 86400.0     # seconds a message may wait unprocessed (SQS's default)
MAX_RETENTION = 14 * 86400.0        # the longest retention a put may ask for
DEAD_LETTER_RETENTION = MAX_RETENTION   # a dead letter is kept this long for inspection
DEFAULT_DEDUP_WINDOW = 300.0        # seconds during which a dedup id refuses a second put
PUT_TOKEN_WINDOW = 600.0            # seconds a put's token recognises a retried commit
SEQ_BLOCK = 1024            # sequence numbers reserved in the store at a time (see Put)
_EXPIRES_AT = Msg._fields.index("expires_at")
_PICKLE_PROTOCOL = 4        # of the bytes states (Counters here, Segment in segments.py)
INBOX, GONE, FOLDS = "messages+", "messages-", "messages~"   # the names the message
                                        # index's journal is stored under (Counters, format 7)


class Counters(Persistent):
    """Named integer counters that resolve write conflicts by adding both sides' deltas.

    Its state is one bytes object (the values pickled with the standard pickle), for the
    reason Segment gives: ZODB's pickler would otherwise call back into Python for each of
    the 28 names and numbers, in nearly every commit.  States written as a plain dict (by
    earlier versions) still load and merge.

    It also holds, because every commit that changes the queue writes it anyway, the
    expiry order marker (below) and, since format 5, the journal of the queue's ready
    set (``journal``, ackqueue.journal: the keys added and removed since the set's last
    fold, stored under two names beside the values; see segments.KeySet) and, since
    format 7, the journal of its message index (``inbox`` and ``gone``: the messages
    put and the seqs deleted since the index's last fold; see segments.MessageIndex), so
    that a put or an ack of one message writes this record alone."""

    FIELDS = ("ready", "inflight", "delayed", "put", "acked", "redelivered",
              "given_back", "recovered", "expired", "dead_lettered", "dropped", "purged",
              "moved_in", "redriven", "missing")
    TOTALS = FIELDS[3:]         # lifetime totals (the first three are current sizes)

    def __init__(self):
        self.values = dict.fromkeys(self.FIELDS, 0)
        self.journal = KeyJournal()
        # The message index's journal (format 7, segments.MessageIndex): new messages not
        # yet in its segments (seq -> stored tuple), and deleted seqs they still hold.
        self.inbox = {}
        self.gone = KeyRuns()
        self.folds = 0          # writes of new messages to the segments (see _p_resolveConflict)

    def add(self, **deltas):
        values = self.values
        for name, delta in deltas.items():
            values[name] = values.get(name, 0) + delta
        self._p_changed = True

    def get(self, name):
        return self.values.get(name, 0)

    # The expiry order marker (ackqueue.expiry): (expires_at, seq) of the last message
    # stored without an index entry.  Kept here because Counters is written with every
    # put already; unlike the counters it does not merge (see _p_resolveConflict).
    ORDER = "expiry_order"

    def order(self):
        return self.values.get(self.ORDER, NO_ORDER)

    def set_order(self, marker):
        if marker != self.values.get(self.ORDER, NO_ORDER):
            self.values[self.ORDER] = marker
            self._p_changed = True

    def __getstate__(self):
        # Written by nearly every commit: each attribute is read once (a read of a
        # persistent object's attribute costs about as much as copying a small dict),
        # and values is copied with copy(), which clones a dict in one step where
        # {**values} inserts key by key once the dict has held deleted keys, as one
        # loaded from the file has (__setstate__ pops the journal's names): 87 against
        # 366 ns here.  The dict pickled is the same, in the same order.
        values, journal, inbox, gone, folds = (self.values, self.journal, self.inbox,
                                               self.gone, self.folds)
        if journal or inbox or gone.count or folds:
            values = values.copy()
            values.update(journal.stored())
            if inbox:
                values[INBOX] = inbox
            if gone.count:
                values[GONE] = gone.flat()
            if folds:
                values[FOLDS] = folds
        return pickle.dumps(values, protocol=_PICKLE_PROTOCOL)

    def __setstate__(self, state):
        self.values = values = _counter_values(state)
        self.journal = KeyJournal.take_from(values)
        self.inbox = values.pop(INBOX, None) or {}
        self.gone = KeyRuns(values.pop(GONE, ()))
        self.folds = values.pop(FOLDS, 0)

    def _p_resolveConflict(self, old, committed, new):
        old, committed, new = map(_counter_values, (old, committed, new))
        journal = merge_states(*({name: state.pop(name) for name in (ADDED, REMOVED)
                                  if name in state} for state in (old, committed, new)))
        inboxes = [state.pop(INBOX, None) or {} for state in (old, committed, new)]
        folds = [state.pop(FOLDS, 0) for state in (old, committed, new)]
        journal.update(_merge_folds(inboxes, folds))
        inbox = merge_entries(*inboxes, what="queue message")
        if inbox:
            journal[INBOX] = inbox
        gone = merge_runs(*(state.pop(GONE, ()) for state in (old, committed, new)),
                          "deleted message")
        if gone:
            journal[GONE] = gone
        order = [state.pop(self.ORDER, NO_ORDER) for state in (old, committed, new)]
        if order[1] != order[0] and order[2] != order[0]:
            # Two commits each stored ordered messages against the same marker: their
            # seqs and deadlines may interleave, so one must be retried (expiry.py).
            raise ConflictError("two commits moved the expiry order marker at once")
        names = set(old) | set(committed) | set(new)
        values = {n: committed.get(n, 0) + new.get(n, 0) - old.get(n, 0) for n in names}
        marker = order[2] if order[2] != order[0] else order[1]
        if marker != NO_ORDER:
            values[self.ORDER] = marker
        values.update(journal)
        return pickle.dumps(values, protocol=_PICKLE_PROTOCOL)


def _merge_folds(inboxes, folds):
    """{FOLDS: n} of a merge, or ConflictError when one side wrote new messages to the
    segments (a fold, a batch) while the other put a new message in the inbox.  Through a
    server two puts may take one seq (SeqCounter merges by taking the larger): what sends
    one back is that both wrote that message, and when one wrote it to a segment and the
    other to the inbox, only this rule sees it."""
    (old_inbox, theirs, ours), (before, theirs_folds, our_folds) = inboxes, folds
    they_folded, we_folded = theirs_folds != before, our_folds != before
    if ((they_folded and ours.keys() - old_inbox.keys())
            or (we_folded and theirs.keys() - old_inbox.keys())
            or (they_folded and we_folded)):
        raise ConflictError("new queue messages were written beside a fold of them")
    merged = our_folds if we_folded else theirs_folds
    return {FOLDS: merged} if merged else {}


def _stored_put(op, body):
    """The message of a Put as a MessageIndex stores it (segments._stored: no trailing
    None fields), with body as the record keeps it (None when it has a Body of its own)."""
    if op.attributes is not None:
        return (body, op.priority, op.sent_at, 0, None, None, None, op.expires_at,
                op.attributes)
    if op.expires_at is not None:
        return (body, op.priority, op.sent_at, 0, None, None, None, op.expires_at)
    return (body, op.priority, op.sent_at, 0, None, None, None)


def _counter_values(state):
    """A Counters state (bytes, or a dict from an earlier version) as a fresh dict."""
    return pickle.loads(state) if isinstance(state, bytes) else dict(state)


class SeqCounter(Persistent):
    """The next sequence number of a queue.

    Two ways to move it: advance_past(seq), for a process that numbers messages itself
    (it holds the storage alone), and take(n), which hands out numbers from the store (under
    a server, where several processes put).  Concurrent advances resolve to the larger
    value; concurrent takes must not (both would hand out the same numbers), so a conflict
    between two takes stays a conflict and one of the commits is retried."""

    def __init__(self, value=1):
        self.value = value
        self.taken = 0            # how many take() calls: tells a take from an advance

    def advance_past(self, seq):
        if seq >= self.value:
            self.value = seq + 1

    def take(self, count=1):
        first = self.value
        self.value = first + count
        self.taken += 1
        return first

    def __getstate__(self):
        return {"value": self.value, "taken": self.taken}

    def __setstate__(self, state):
        if isinstance(state, int):          # written by an earlier version
            state = {"value": state, "taken": 0}
        self.value = state["value"]
        self.taken = state.get("taken", 0)

    def _p_resolveConflict(self, old, committed, new):
        old, committed, new = (s if isinstance(s, dict) else {"value": s, "taken": 0}
                               for s in (old, committed, new))
        if committed["taken"] != old["taken"] and new["taken"] != old["taken"]:
            raise ConflictError("two commits took sequence numbers at once")
        return {"value": max(committed["value"], new["value"]),
                "taken": max(committed["taken"], new["taken"])}


class MessageRecord(Persistent):
    """One queued message, as queues made by ackqueue 0.1 stored them (read to migrate)."""

    def __init__(self, seq, body, priority, sent_at):
        self.seq = seq
        self.body = body                  # bytes: pickle of the item
        self.priority = priority
        self.sent_at = sent_at
        self.receive_count = 0
        self.first_received = None
        self.last_received = None

    holder = None                         # the lease holding it in flight (shared queues)


class Body(Persistent):
    """The pickled item of a large message (see LARGE_BODY).  One over BODY_PART bytes is
    kept in parts, Body records of at most BODY_PART bytes each (format 3), so that no
    record comes near ZODB's large-record size (16 MB: it warns about each one)."""

    parts = None        # a tuple of Body records whose data, joined, is the body

    def __init__(self, data):
        if len(data) <= BODY_PART:
            self.data = data
            return
        self.data = None
        view = memoryview(data)
        self.parts = tuple(Body(bytes(view[start:start + BODY_PART]))
                           for start in range(0, len(data), BODY_PART))

    def read(self):
        """The body's bytes."""
        if self.parts is None:
            return self.data
        return b"".join(part.data for part in self.parts)


class QueueRecord(Persistent):
    """One named queue: its messages, the indexes of where each one is, and its counters."""

    bodies = None       # LOBTree seq -> Body, made by the first large message

    leased = None       # OOBTree lease id -> LOBTree, made by the first claim through a server

    dedup = None        # OOBTree dedup id -> (until, seq), made on first use (format 6)

    dedup_ids = None    # format 5 and older: dedup id -> seq (folded into dedup by 5 -> 6)

    codec = None        # how puts encode items (ackqueue.codec); None: the default, pickle

    put_tokens = None   # OOBTree token -> (seq, until): puts through a server (see Put.token)

    expiry = None       # ExpiryIndex (format 4; made by the migration for older records)

    holds = None        # OOBTree name -> (deadline, reads, ids): ackqueue.holds, first use

    def __init__(self, name, kind):
        if kind not in KINDS:
            raise ValueError(f"unknown queue kind {kind!r}")
        self.name = name
        self.kind = kind
        self.created = time.time()
        self.counts = Counters()
        self.messages = MessageIndex(journal_holder=self.counts)
        self.ready = KeySet(journal_holder=self.counts)
        self.inflight = LOBTree()
        self.delayed = LOBTree()
        self.next_seq = SeqCounter()
        self.expiry = ExpiryIndex()

    def body_of(self, seq, msg):
        """The pickled item of message seq (msg: its Msg)."""
        return msg.body if msg.body is not None else self.bodies[seq].read()

    def has_body(self, seq, msg):
        """Whether body_of(seq, msg) can be read: False when a large item's Body record is
        gone (the file was changed outside ackqueue, or damaged)."""
        return msg.body is not None or (self.bodies is not None and seq in self.bodies)

    def add_message(self, seq, body, priority, sent_at, **fields):
        """Store message seq; fields are further Msg fields (expires_at, attributes, ...),
        None for a field being its default."""
        msg = (self._inline(seq, body), priority, sent_at, 0, None, None, None)  # 7 fields
        if any(value is not None for value in fields.values()):
            msg = Msg(*msg)._replace(**fields)
        self.messages[seq] = msg
        if self.expiry is not None and fields.get("expires_at") is not None:
            self._index_expiry([(seq, fields["expires_at"])])

    def add_put(self, op):
        """Store the message of one Put operation (add_message, without its keywords: the
        one-message put of every single put)."""
        body = op.body if len(op.body) <= LARGE_BODY else self._inline(op.seq, op.body)
        self.messages.set_stored_one(op.seq, _stored_put(op, body))
        if self.expiry is not None and op.expires_at is not None:
            self._index_expiry_one(op.seq, op.expires_at)

    def add_puts(self, puts):
        """Store the messages of Put operations (add_message for each, in one pass)."""
        stored = []
        for op in puts:
            body = op.body if len(op.body) <= LARGE_BODY else self._inline(op.seq, op.body)
            stored.append((op.seq, _stored_put(op, body)))
        self.messages.set_stored(stored)
        if self.expiry is not None:
            self._index_expiry([(op.seq, op.expires_at) for op in puts])

    def add_put_run(self, seqs, bodies, priority, sent_at, expires_at, attributes):
        """Store the messages of a PutRun (add_puts, from columns: one priority, put time,
        deadline and attributes for all)."""
        if attributes is not None:
            tail = (priority, sent_at, 0, None, None, None, expires_at, attributes)
        elif expires_at is not None:
            tail = (priority, sent_at, 0, None, None, None, expires_at)
        else:
            tail = (priority, sent_at, 0, None, None, None)
        if max(map(len, bodies)) > LARGE_BODY:
            bodies = [self._inline(seq, body) for seq, body in zip(seqs, bodies)]
        self.messages.set_run(seqs, [(body,) + tail for body in bodies])
        if self.expiry is not None and expires_at is not None:
            last_at, last_seq = self.counts.order()
            if expires_at >= last_at and seqs[0] > last_seq:    # seqs ascend (PutRun)
                self.counts.set_order((expires_at, seqs[-1]))   # all ordered: no entry
            else:
                self._index_expiry([(seq, expires_at) for seq in seqs])

    def _index_expiry(self, pairs):
        """Give the new messages (seq, expires_at) that are out of order an entry in the
        expiry index; the ordered ones only move the marker (ackqueue.expiry)."""
        counts = self.counts
        indexed, marker = split_ordered(pairs, counts.order())
        counts.set_order(marker)
        if indexed:
            self.expiry.add_many(indexed)

    def _index_expiry_one(self, seq, expires_at):
        """_index_expiry of one message (every single put): split_ordered's rule, without
        the lists it builds for a batch."""
        counts = self.counts
        last_at, last_seq = counts.order()
        if expires_at >= last_at and seq > last_seq:
            counts.set_order((expires_at, seq))     # ordered: the marker moves, no entry
        else:
            self.expiry.add_many(((seq, expires_at),))

    def _inline(self, seq, body):
        """What a message record keeps of body: itself, or None when it is large enough for
        a Body record of its own (made here)."""
        if len(body) <= LARGE_BODY:
            return body
        if self.bodies is None:
            self.bodies = LOBTree()
        self.bodies[seq] = Body(body)
        return None

    def take_out(self, seq):
        """Remove message seq from every index and return its Msg, body inline."""
        msg = self.messages[seq]
        body = self.body_of(seq, msg)
        self.detach(seq, self.key_of(seq))
        self.delete_message(seq)
        return msg._replace(body=body, holder=None)

    def move_in(self, seq, msg):
        """Add a message that left another queue (msg from take_out), ready at once."""
        fields = msg._replace(body=None, priority=None, sent_at=None)._asdict()
        for name in ("body", "priority", "sent_at"):
            del fields[name]
        self.next_seq.advance_past(seq)
        self.add_message(seq, msg.body, msg.priority, msg.sent_at, **fields)
        self.make_ready(seq, self.key_of(seq))
        self.counts.add(moved_in=1)

    def is_ready(self, seq, msg=None):
        msg = msg if msg is not None else self.messages.get(seq)
        return msg is not None and msg.holder is None and self.key_of(seq) in self.ready

    def dedup_table(self):
        if self.dedup is None:
            self.dedup = OOBTree()
        return self.dedup

    def remember_put_token(self, token, seq, until):
        """A put through a server with this token was applied as seq (kept until then)."""
        if self.put_tokens is None:
            self.put_tokens = OOBTree()
        self.put_tokens[token] = (seq, until)

    def remember_dedup(self, dedup_id, until, seq):
        """A put with dedup_id refuses others until then; seq is kept to name it."""
        self.dedup_table()[dedup_id] = (until, seq)

    def dedup_entry(self, dedup_id):
        """(until, seq of the message put with it, or None) of dedup_id, or None."""
        if self.dedup is None:
            return None
        value = self.dedup.get(dedup_id)
        return None if value is None else dedup_value(value)

    def delete_message(self, seq):
        # (Runs with every ack: each persistent attribute is read once.)
        expiry = self.expiry
        if expiry is not None and expiry.slots:
            self._unexpire(expiry, [seq])
        del self.messages[seq]
        bodies = self.bodies
        if bodies is not None and seq in bodies:
            del bodies[seq]

    def delete_messages(self, seqs):
        """delete_message() each of seqs (present ones, in ascending order), in one pass
        over the index."""
        expiry = self.expiry
        if expiry is not None and expiry.slots:
            self._unexpire(expiry, seqs)
        self.messages.discard_sorted(seqs)
        bodies = self.bodies
        if bodies is not None:
            for seq in seqs:
                if seq in bodies:
                    del bodies[seq]

    def _unexpire(self, expiry, seqs):
        """Take messages about to be deleted out of the expiry index (reading each one's
        stored tuple as it is: this runs with every ack).  Messages put in deadline order
        have no entry (expiry.py): callers skip an index without entries, unread."""
        stored_of, missing = self.messages.stored, ()
        pairs = []
        for seq in seqs:
            stored = stored_of(seq, missing)
            if len(stored) > _EXPIRES_AT:
                pairs.append((seq, stored[_EXPIRES_AT]))
        expiry.discard_many(pairs)

    def key_of(self, seq):
        """The store key of a message (its ready-set position)."""
        return store_key(self.kind, self.messages[seq].priority, seq)

    def detach(self, seq, key, **counts):
        """Take a message out of whichever index holds it; return where it was (or None).
        counts: further counter deltas, added in the same step."""
        where = self.unindex(seq, key)
        if where is not None:
            counts[where] = counts.get(where, 0) - 1
        if counts:
            self.counts.add(**counts)
        return where

    def unindex(self, seq, key):
        """detach() without counting: the caller adjusts the counter of where it was."""
        if self.ready.discard(key):
            return "ready"
        msg = self.messages.get(seq)
        if msg is not None and msg.holder is not None:
            del self.leased[msg.holder][seq]
            self.messages[seq] = msg._replace(holder=None)
            return "inflight"
        if seq in self.inflight:
            del self.inflight[seq]
            return "inflight"
        if seq in self.delayed:
            del self.delayed[seq]
            return "delayed"
        return None

    def make_ready(self, seq, key, visible_at=None, **counts):
        """Put a message in the ready set, or in the delayed index until visible_at.
        counts: further counter deltas, added in the same step."""
        if visible_at:
            self.delayed[seq] = float(visible_at)
            self.counts.add(delayed=1, **counts)
        else:
            self.ready.add(key)
            self.counts.add(ready=1, **counts)

    def deliver(self, seq, deadline, lease, at):
        """Move a ready message in flight (claimed through a server) and count the receive."""
        msg = self.messages[seq]
        self.detach(seq, store_key(self.kind, msg.priority, seq))
        leased = self.leased_by(lease, create=True)
        leased[seq] = float(deadline or 0.0)
        msg = self.messages[seq] = received(msg, msg.receive_count + 1, at)._replace(
            holder=lease)
        self.counts.add(inflight=1)
        if msg.receive_count > 1:
            self.counts.add(redelivered=1)
        return msg

    def leased_by(self, lease, create=False):
        """The in-flight index (seq -> deadline or 0.0) of one lease, or None."""
        by_lease = self.leased
        if by_lease is None:
            if not create:
                return None
            by_lease = self.leased = OOBTree()
        tree = by_lease.get(lease)
        if tree is None and create:
            tree = by_lease[lease] = LOBTree()
        return tree

    def leased_items(self):
        """(lease id, seq, deadline or None) of everything in flight under a lease."""
        for lease, tree in list((self.leased or {}).items()):
            for seq, deadline in list(tree.items()):
                yield lease, seq, (deadline or None)

    def give_back(self, seq, visible_at=None, **counts):
        """Return an in-flight message to its place (or to the delayed index)."""
        self.detach(seq, self.key_of(seq))
        self.make_ready(seq, self.key_of(seq), visible_at)
        self.counts.add(given_back=1, **counts)

    def upgrade(self):
        """Move a queue made by ackqueue 0.1 (BTrees of MessageRecords) to the merging
        indexes; True if anything changed (the caller commits)."""
        changed = False
        if not isinstance(self.messages, MessageIndex):
            old, changed = self.messages, True
            self.messages = MessageIndex(journal_holder=self.counts)
            for seq, m in old.items():
                self.add_message(seq, m.body, m.priority, m.sent_at)
                self.messages[seq] = self.messages[seq]._replace(
                    receive_count=m.receive_count, first_received=m.first_received,
                    last_received=m.last_received)
        if not isinstance(self.ready, SegmentedIndex):
            ready = KeySet(journal_holder=self.counts)
            for key in self.ready:
                ready.add(key)
            self.ready, changed = ready, True
        return changed

    def recover_inflight(self):
        """Give back every message in flight (the process that held them is gone).

        Only for a storage this process holds alone: under a shared server other processes'
        messages are in flight legitimately.  That includes what processes held under
        leases when the file was last served (their leases cannot be beaten any more).
        Returns how many were given back."""
        seqs = list(self.inflight.keys())
        for seq in seqs:
            key = self.key_of(seq)
            del self.inflight[seq]
            self.ready.add(key)
        leased = [seq for _lease, seq, _deadline in self.leased_items()]
        for seq in leased:
            key = self.key_of(seq)
            self.unindex(seq, key)
            self.ready.add(key)
        seqs += leased
        if seqs:
            self.counts.add(inflight=-len(seqs), ready=len(seqs), recovered=len(seqs),
                            given_back=len(seqs))
        return len(seqs)


def received(msg, receive_count, at):
    """msg after its receive number receive_count, at time at."""
    return msg._replace(receive_count=receive_count, last_received=at,
                        first_received=at if msg.first_received is None else msg.first_received)


class LeaseRecord(Persistent):
    """A process that uses the storage through a server; alive while its beat advances.

    Liveness is judged by other processes from the beat alone (did it change within the
    lease timeout, on their own monotonic clock), never by comparing machines' clocks."""

    def __init__(self, lease_id, timeout, pid, host, started):
        self.lease_id = lease_id
        self.timeout = timeout
        self.pid = pid
        self.host = host
        self.started = started
        self.beat = 0


class Catalog(Persistent):
    """The root of ackqueue's data: named queues in one storage, and the leases of the
    processes that share it through a server."""

    def __init__(self):
        self.format = FORMAT
        self.queues = OOBTree()
        self.leases = OOBTree()


def catalog_format(catalog):
    """The format version a catalog records (UNRECORDED_FORMAT when it records none)."""
    return getattr(catalog, "format", UNRECORDED_FORMAT)


def open_catalog(root, where=None):
    """The catalog of a storage (None if it has none yet), checked against FORMAT.

    A catalog of a newer format raises UnsupportedFormat before anything is changed.  One
    of an older format is migrated (MIGRATIONS, one version at a time) and records FORMAT:
    the caller commits, so the migration is written with whatever the caller writes, or
    not at all.  where names the storage in errors (by default, from the storage)."""
    catalog = root.get(ROOT_KEY)
    if catalog is None:
        return None
    found = catalog_format(catalog)     # loads the catalog, so __dict__ below is its state
    if found == FORMAT and "format" in catalog.__dict__:
        return catalog                  # the common case: current, and recorded
    if not isinstance(found, int) or isinstance(found, bool):
        raise UnsupportedFormat(
            f"{where or _describe(root)} records ackqueue's store format as {found!r}, "
            f"which this ackqueue ({_version()}, format {FORMAT}) does not recognise. "
            "It was left as it is", found=found, supported=FORMAT,
            where=where or _describe(root))
    if found > FORMAT:
        raise UnsupportedFormat(
            f"{where or _describe(root)} is in ackqueue's store format {found!r}, which "
            f"is newer than format {FORMAT}, the newest this ackqueue "
            f"({_version()}) reads; upgrade ackqueue to open it. It was left as it is",
            found=found, supported=FORMAT, where=where or _describe(root))
    missing = [v for v in range(found, FORMAT) if v not in MIGRATIONS]
    if missing:
        raise UnsupportedFormat(
            f"{where or _describe(root)} is in ackqueue's store format {found!r}, which "
            f"this ackqueue ({_version()}, format {FORMAT}) cannot migrate (no "
            f"migration from format {missing[0]}). It was left as it is",
            found=found, supported=FORMAT, where=where or _describe(root))
    for version in range(found, FORMAT):
        MIGRATIONS[version](root)
        catalog = root[ROOT_KEY]        # a migration may replace the catalog
        catalog.format = version + 1
    catalog.format = FORMAT             # also records the format of a catalog without one
    return catalog


def _describe(root):
    """How errors name the storage root belongs to: a file by its path."""
    jar = getattr(root, "_p_jar", None)
    if jar is None:
        return "the storage"
    storage = jar.db().storage
    path = getattr(storage, "_file_name", None)
    if path is not None:
        return f"queue file {path!r}"
    return f"storage {storage.getName()!r}"


def _version():
    return __version__


def ensure_queue(root, name, kind):
    """The QueueRecord called name, created with kind (FIFO for None) if missing (the
    caller commits).  Refuses a storage of a newer format (see open_catalog)."""
    catalog = open_catalog(root)
    if catalog is None:
        catalog = root[ROOT_KEY] = Catalog()
    record = catalog.queues.get(name)
    if record is None:
        record = catalog.queues[name] = QueueRecord(name, kind or FIFO)
    record.upgrade()
    return record


def ensure_leases(root):
    """The catalog's lease table, created if missing (catalogs older than leases).
    Refuses a storage of a newer format (see open_catalog)."""
    catalog = open_catalog(root)
    if catalog is None:
        catalog = root[ROOT_KEY] = Catalog()
    leases = getattr(catalog, "leases", None)
    if leases is None:
        leases = catalog.leases = OOBTree()
    return leases


def _queue(root, name):
    return root[ROOT_KEY].queues[name]


def apply_unit(root, ops):
    """Apply the operations of one unit: every check first, so a refused unit writes nothing.

    A run of neighbouring operations of one class on one queue is applied by the class's
    apply_run when it has one (a batch of puts or acks: the queue, its counters and each
    index segment are looked up once per run instead of once per message)."""
    if len(ops) == 1:                 # a put or an ack of one message: no runs to find
        op = ops[0]
        op.check(root)
        op.apply(root)
        return
    runs = _runs(ops)
    for cls, start, stop in runs:
        if stop - start > 1 and cls.check_run is not None:
            cls.check_run(root, ops[start:stop])
        else:
            for op in ops[start:stop]:
                op.check(root)
    for cls, start, stop in runs:
        if stop - start > 1:
            cls.apply_run(root, ops[start:stop])
        else:
            ops[start].apply(root)


def _runs(ops):
    """(class, start, stop) of each run of neighbouring operations of one class on one
    queue that the class applies together (apply_run), and of each other operation."""
    runs = []
    start, end = 0, len(ops)
    while start < end:
        op = ops[start]
        cls, stop = type(op), start + 1
        if cls.apply_run is not None:
            while stop < end and type(ops[stop]) is cls and ops[stop].name == op.name:
                stop += 1
        runs.append((cls, start, stop))
        start = stop
    return runs


class ClaimLost(Refused):
    """The message was no longer ready when the claim was committed (another process took it)."""


class LeaseLost(Refused):
    """This process's lease was expired by others: what it held has been given back."""


class _Op:
    __slots__ = ()

    apply_run = None    # or a classmethod applying a run of ops (see apply_unit)
    check_run = None    # or a classmethod checking a run of ops (see apply_unit)

    def check(self, root):
        """Raise Refused if this operation must not be applied (the default: always apply)."""


# The base of a unit's operations defined outside this module (ackqueue.holds,
# LocalArbiter's opening): check() and apply(root), applied alone unless they give an
# apply_run.
Operation = _Op


class OwnWrite(_Op):
    """A caller's own write as one of a unit's operations: op has check(root) and
    apply(root), must re-apply cleanly on a retried commit and never touch
    root[ROOT_KEY] (ackqueue.atomic's t.write, ackqueue.holds' also=)."""

    __slots__ = ("op",)
    name = None

    def __init__(self, op):
        self.op = op

    def check(self, root):
        self.op.check(root)

    def apply(self, root):
        self.op.apply(root)


class Put(_Op):
    """A new message, ready at once or at visible_at.

    With seq None the store numbers it at commit (shared queues); ``seq`` then holds the
    number it was given once the unit committed."""

    __slots__ = ("name", "seq", "key", "body", "priority", "sent_at", "visible_at", "numbered",
                 "expires_at", "attributes", "dedup_id", "dedup_until", "token")

    def __init__(self, name, seq, key, body, priority, sent_at, visible_at=None,
                 expires_at=None, attributes=None, dedup_id=None, dedup_until=None,
                 token=None):
        self.name, self.seq, self.key, self.body = name, seq, key, body
        self.priority, self.sent_at, self.visible_at = priority, sent_at, visible_at
        self.numbered = seq is None
        self.expires_at, self.attributes = expires_at, attributes
        self.dedup_id, self.dedup_until = dedup_id, dedup_until
        # Through a server a commit cut off after it reached the server is retried: the
        # token (random bytes made by the putting process) lets the store recognise the
        # retry of a put it has already applied (QueueRecord.put_tokens).
        self.token = token

    def _applied_before(self, rec):
        """The seq this very put got when an earlier attempt of its commit was applied."""
        if self.token is None or rec.put_tokens is None:
            return None
        seen = rec.put_tokens.get(self.token)
        return None if seen is None else seen[0]

    @classmethod
    def check_run(cls, root, puts):
        for op in puts:
            if op.dedup_id is not None:
                op.check(root)

    def check(self, root):
        if self.dedup_id is None:
            return
        rec = _queue(root, self.name)
        if self._applied_before(rec) is not None:
            return                            # its own first attempt used the dedup id
        until, original = rec.dedup_entry(self.dedup_id) or (None, None)
        if until is not None and until > self.sent_at:
            exc = DuplicateMessage(
                f"a message with dedup_id {self.dedup_id!r} was put in queue {self.name!r} "
                f"less than its dedup window ago ({until - self.sent_at:.1f} s left); "
                "this put was refused")
            exc.original_id = original
            raise exc

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.token is not None:
            earlier = self._applied_before(rec)
            if earlier is not None:           # a retry of a commit that did go through
                self.seq = earlier
                self.key = store_key(rec.kind, self.priority, earlier)
                return
        if self.numbered:
            self.seq = rec.next_seq.take()
            self.key = store_key(rec.kind, self.priority, self.seq)
        elif self.seq >= rec.next_seq.value:
            # Numbered in memory by the one process that holds the storage: the counter
            # is moved a block ahead at a time, so that it is written once per SEQ_BLOCK
            # puts; the next open starts after the block (numbers are never reused).
            rec.next_seq.advance_past(self.seq + SEQ_BLOCK - 1)
        rec.add_put(self)
        rec.make_ready(self.seq, self.key, self.visible_at, put=1)
        if self.dedup_id is not None:
            rec.remember_dedup(self.dedup_id, self.dedup_until, self.seq)
        if self.token is not None:
            rec.remember_put_token(self.token, self.seq, self.sent_at + PUT_TOKEN_WINDOW)

    @classmethod
    def apply_run(cls, root, puts):
        for op in puts:
            if op.numbered:                   # numbered by the store, one after the other
                for op in puts:
                    op.apply(root)
                return
        rec = _queue(root, puts[0].name)
        _advance_seq(rec, [op.seq for op in puts])
        rec.add_puts(puts)
        ready = [op.key for op in puts if not op.visible_at]
        rec.ready.add_many(ready)
        for op in puts:
            if op.visible_at:
                rec.delayed[op.seq] = float(op.visible_at)
            if op.dedup_id is not None:
                rec.remember_dedup(op.dedup_id, op.dedup_until, op.seq)
        rec.counts.add(put=len(puts), ready=len(ready), delayed=len(puts) - len(ready))


def _advance_seq(rec, seqs):
    """Move the queue's sequence counter past seqs (numbered in memory by the one process
    that holds the storage) as Put.apply does, one seq after the other: a block ahead at a
    time, so that it is written once per SEQ_BLOCK puts."""
    value = rec.next_seq.value
    if max(seqs) < value:
        return
    for seq in seqs:
        if seq >= value:
            value = seq + SEQ_BLOCK
    rec.next_seq.advance_past(value - 1)


class PutRun(_Op):
    """New messages, ready at once, given as columns: what a batch of Puts that share
    one priority, put time, deadline and attributes, with no delay and no dedup id, does
    (a put_many by the process that holds the storage), without an operation object, a
    Msg and an index lookup per message.  seqs ascend; keys are their store keys."""

    __slots__ = ("name", "seqs", "keys", "bodies", "priority", "sent_at", "expires_at",
                 "attributes")

    def __init__(self, name, seqs, keys, bodies, priority, sent_at, expires_at=None,
                 attributes=None):
        self.name, self.seqs, self.keys, self.bodies = name, seqs, keys, bodies
        self.priority, self.sent_at = priority, sent_at
        self.expires_at, self.attributes = expires_at, attributes

    def apply(self, root):
        rec = _queue(root, self.name)
        seqs = self.seqs
        _advance_seq(rec, seqs)
        rec.add_put_run(seqs, self.bodies, self.priority, self.sent_at, self.expires_at,
                        self.attributes)
        rec.ready.add_many(self.keys)
        rec.counts.add(put=len(seqs), ready=len(seqs))


class Claim(_Op):
    """A delivery: the message goes in flight, with its receive count and deadline.

    With a lease (shared queues) the claim is refused unless the message is still ready,
    the store counts the receive, and ``result`` holds its Msg (body inline) once applied."""

    __slots__ = ("name", "seq", "key", "receive_count", "at", "deadline", "lease", "result")

    def __init__(self, name, seq, key, receive_count, at, deadline, lease=None):
        self.name, self.seq, self.key = name, seq, key
        self.receive_count, self.at, self.deadline = receive_count, at, deadline
        self.lease = lease
        self.result = None

    def check(self, root):
        if self.lease is None:
            return
        rec = _queue(root, self.name)
        if self.key not in rec.ready or self.seq not in rec.messages:
            raise ClaimLost(f"message {self.seq} of queue {self.name!r} is no longer ready")

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.lease is not None:
            msg = rec.deliver(self.seq, self.deadline, self.lease, self.at)
            self.result = msg._replace(body=rec.body_of(self.seq, msg))
            return
        msg = rec.messages.get(self.seq)
        if msg is None:          # acknowledged before this claim reached the store
            return
        rec.detach(self.seq, self.key)
        rec.inflight[self.seq] = float(self.deadline or 0.0)
        rec.counts.add(inflight=1)
        if self.receive_count > msg.receive_count:
            rec.messages[self.seq] = received(msg, self.receive_count, self.at)
            if self.receive_count > 1:
                rec.counts.add(redelivered=1)


def _check_delivery(root, name, seq, expect, what):
    """Refuse (StaleAck) unless delivery number expect of message seq is still in flight."""
    if expect is None:
        return
    rec = _queue(root, name)
    msg = rec.messages.get(seq)
    if msg is None:
        reason, why = "acked", "it was acknowledged already"
    elif msg.holder is None:
        reason, why = "given_back", ("it was given back (its deadline passed or its holder's "
                                     "lease expired)")
    elif msg.receive_count != expect:
        reason, why = "redelivered", (f"it was delivered again meanwhile (receive "
                                      f"{msg.receive_count})")
    else:
        return
    error = StaleAck(f"{what} of message {seq} of queue {name!r} (receive {expect}) was "
                     f"refused: {why}. The message was left as it is")
    error.reason = reason
    raise error


def _record_delivery(rec, seq, msg, delivery):
    """Write the receive count of a delivery whose Claim was never written (a process that
    holds its storage alone writes none): (receive count, first, last receive time)."""
    if delivery is None:
        return
    receive_count, first, last = delivery
    if receive_count > msg.receive_count:
        rec.messages[seq] = msg._replace(receive_count=receive_count, last_received=last,
                                         first_received=msg.first_received or first)
        if receive_count > 1:
            rec.counts.add(redelivered=1)


class Release(_Op):
    """A give-back: an in-flight message returns to its place, now or at visible_at.

    With expect (shared queues: the receive count of the delivery giving it back) it is
    refused unless that delivery is still the live one."""

    __slots__ = ("name", "seq", "key", "visible_at", "expect", "at", "delivery")

    def __init__(self, name, seq, key, visible_at=None, expect=None, at=None, delivery=None):
        self.name, self.seq, self.key, self.visible_at = name, seq, key, visible_at
        self.expect, self.at, self.delivery = expect, at, delivery

    def check(self, root):
        _check_delivery(root, self.name, self.seq, self.expect, "the give-back")

    def apply(self, root):
        rec = _queue(root, self.name)
        msg = rec.messages.get(self.seq)
        if msg is None:
            return
        if self.at is not None and msg.expires_at is not None and msg.expires_at <= self.at:
            rec.take_out(self.seq)            # given back after its retention: it expires
            rec.counts.add(expired=1)
            return
        _record_delivery(rec, self.seq, msg, self.delivery)
        rec.detach(self.seq, self.key)
        rec.make_ready(self.seq, self.key, self.visible_at)
        rec.counts.add(given_back=1)


class Unclaim(_Op):
    """A claim made ahead that no thread ever received (ackqueue.arbiters.shared's prefetch): the
    message returns to its place as if the claim had never been, its receive count,
    receive times and redelivery count as they were before it.

    Refused (StaleAck) unless the claim, receive number expect, is still the live one."""

    __slots__ = ("name", "seq", "key", "expect", "first_received", "last_received")

    def __init__(self, name, seq, key, expect, first_received, last_received):
        self.name, self.seq, self.key, self.expect = name, seq, key, expect
        self.first_received, self.last_received = first_received, last_received

    def check(self, root):
        _check_delivery(root, self.name, self.seq, self.expect, "the unclaim")

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.seq not in rec.messages:
            return
        # Undone: the receive the claim counted (store.QueueRecord.deliver), and its
        # redelivery count if it was one.
        rec.detach(self.seq, self.key, **({"redelivered": -1} if self.expect > 1 else {}))
        msg = rec.messages[self.seq]
        rec.messages[self.seq] = msg._replace(receive_count=self.expect - 1,
                                              first_received=self.first_received,
                                              last_received=self.last_received)
        rec.make_ready(self.seq, self.key)


class Ack(_Op):
    """An acknowledgement: the message leaves the queue for good.

    With expect (shared queues) it is refused unless that delivery is still the live one."""

    __slots__ = ("name", "seq", "key", "expect", "delivery")

    def __init__(self, name, seq, key, expect=None, delivery=None):
        self.name, self.seq, self.key, self.expect = name, seq, key, expect
        self.delivery = delivery

    def check(self, root):
        if self.expect is not None:
            _check_delivery(root, self.name, self.seq, self.expect, "the acknowledgement")

    @classmethod
    def check_run(cls, root, acks):
        for op in acks:
            if op.expect is not None:
                op.check(root)

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.seq not in rec.messages:
            return
        if self.delivery is not None and self.delivery[0] > 1:
            rec.detach(self.seq, self.key, acked=1, redelivered=1)
        else:
            rec.detach(self.seq, self.key, acked=1)
        rec.delete_message(self.seq)

    @classmethod
    def apply_run(cls, root, acks):
        # The same as an AckRun of their columns (no expect here: check_run has checked
        # it); a seq acknowledged twice counts as its first Ack says.
        first = {}
        for op in acks:
            first.setdefault(op.seq, op)
        AckRun(acks[0].name, [op.seq for op in acks], [op.key for op in acks],
               {seq for seq, op in first.items()
                if op.delivery is not None and op.delivery[0] > 1}).apply(root)


class AckRun(_Op):
    """Acknowledgements given as columns: what a batch of Acks without expect does (an
    ack_many by the process that holds the storage), without an operation object per
    message.  redelivered: the seqs among them received more than once."""

    __slots__ = ("name", "seqs", "keys", "redelivered")

    def __init__(self, name, seqs, keys, redelivered=()):
        self.name, self.seqs, self.keys = name, seqs, keys
        self.redelivered = redelivered

    def apply(self, root):
        rec = _queue(root, self.name)
        seqs = self.seqs
        # A process that holds its storage alone writes no claims, so what it acks is
        # still in the ready set there: take those keys out in one pass first.
        was_ready = rec.ready.discard_many(self.keys)
        if len(was_ready) == len(seqs) and len(set(seqs)) == len(seqs):
            gone = seqs                       # all of them, all ready: the usual batch
            counts = {"acked": len(seqs), "ready": -len(seqs)}
            redelivered = len(self.redelivered)
        else:
            counts = {"acked": 0, "ready": 0, "inflight": 0, "delayed": 0}
            redelivered, gone, seen = 0, [], set()
            for seq, key in zip(seqs, self.keys):
                if seq in seen:
                    continue
                if key in was_ready:
                    where = "ready"
                elif seq in rec.messages:
                    where = rec.unindex(seq, key)
                else:
                    continue                  # acknowledged already
                seen.add(seq)
                gone.append(seq)
                if where is not None:
                    counts[where] -= 1
                counts["acked"] += 1
                redelivered += seq in self.redelivered
        if redelivered:
            counts["redelivered"] = redelivered
        rec.delete_messages(sorted(gone))
        rec.counts.add(**{name: delta for name, delta in counts.items() if delta})


class Promote(_Op):
    """A delayed message whose time has come becomes ready (shared queues' reapers)."""

    __slots__ = ("name", "seq", "now")

    def __init__(self, name, seq, now):
        self.name, self.seq, self.now = name, seq, now

    def apply(self, root):
        rec = _queue(root, self.name)
        visible_at = rec.delayed.get(self.seq)
        if visible_at is None or visible_at > self.now or self.seq not in rec.messages:
            return
        del rec.delayed[self.seq]
        rec.ready.add(rec.key_of(self.seq))
        rec.counts.add(delayed=-1, ready=1)


class Compact(_Op):
    """Drop index segments that concurrent merges left empty at the head of a queue."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def apply(self, root):
        rec = _queue(root, self.name)
        for index in (rec.ready, rec.messages):
            index.compact()
        if rec.expiry is not None:
            rec.expiry.compact()


def needs_compaction(rec):
    return rec.ready.has_empty_head() or rec.messages.has_empty_head()


class RegisterLease(_Op):
    """A process starts using the storage through a server."""

    __slots__ = ("lease_id", "timeout", "pid", "host", "started")

    def __init__(self, lease_id, timeout, pid, host, started):
        self.lease_id, self.timeout = lease_id, timeout
        self.pid, self.host, self.started = pid, host, started

    def apply(self, root):
        ensure_leases(root)[self.lease_id] = LeaseRecord(
            self.lease_id, self.timeout, self.pid, self.host, self.started)


class Beat(_Op):
    """A lease's heartbeat; refused (LeaseLost) when others expired the lease meanwhile."""

    __slots__ = ("lease_id",)

    def __init__(self, lease_id):
        self.lease_id = lease_id

    def check(self, root):
        if self.lease_id not in ensure_leases(root):
            raise LeaseLost(f"lease {self.lease_id} was expired by another process")

    def apply(self, root):
        ensure_leases(root)[self.lease_id].beat += 1


class DropLease(_Op):
    """A process stops cleanly: its lease goes, and anything it still held without a
    deadline (a give-back that did not reach the store) is given back with it."""

    __slots__ = ("lease_id",)

    def __init__(self, lease_id):
        self.lease_id = lease_id

    def apply(self, root):
        leases = ensure_leases(root)
        if self.lease_id in leases:
            del leases[self.lease_id]
        _give_back_unleased(root)


def _give_back_unleased(root):
    """Give back what is held without a deadline under a lease that no longer exists."""
    leases = ensure_leases(root)
    count = 0
    for rec in root[ROOT_KEY].queues.values():
        for lease, seq, deadline in rec.leased_items():
            if lease not in leases and deadline is None:
                rec.give_back(seq, recovered=1)
                count += 1
        for lease, tree in list((rec.leased or {}).items()):
            if lease not in leases and not tree:
                del rec.leased[lease]
    return count


class ExpireLease(_Op):
    """Another process's lease stopped beating: drop it and give back what it held without
    a visibility deadline (what has a deadline comes back at its deadline).  Refused if
    the lease beat again since it was judged dead."""

    __slots__ = ("lease_id", "beat", "given_back")

    def __init__(self, lease_id, beat):
        self.lease_id, self.beat = lease_id, beat
        self.given_back = 0

    def check(self, root):
        lease = ensure_leases(root).get(self.lease_id)
        if lease is None or lease.beat != self.beat:
            raise Refused(f"lease {self.lease_id} is gone or alive")

    def apply(self, root):
        del ensure_leases(root)[self.lease_id]
        self.given_back = _give_back_unleased(root)


def dead_lettered(msg, seq, source, at):
    """How message seq of queue source (a Msg) reads once moved to a dead-letter queue
    at time at: its history kept, its first sequence number and source queue recorded."""
    return msg._replace(sequence=msg.sequence or seq, source=source,
                        expires_at=at + DEAD_LETTER_RETENTION)


def redriven(msg, seq, at):
    """How dead letter seq (a Msg) reads once redriven at time at: a fresh receive count
    and retention, its first sequence number kept."""
    return msg._replace(receive_count=0, first_received=None, last_received=None,
                        source=None, sequence=msg.sequence or seq,
                        expires_at=at + DEFAULT_RETENTION)


class DeadLetter(_Op):
    """A message received too many times leaves its queue: it moves to the queue named
    target (created if missing) with its history, or is dropped when target is None.

    In a storage this process holds alone, target_seq is chosen in memory; through a server
    the store numbers it, and the move is refused (ClaimLost) unless the message is still
    ready with receive count expect."""

    __slots__ = ("name", "seq", "target", "target_seq", "at", "expect")

    def __init__(self, name, seq, target, target_seq, at, expect=None):
        self.name, self.seq, self.target, self.target_seq = name, seq, target, target_seq
        self.at, self.expect = at, expect

    def check(self, root):
        if self.expect is None:
            return
        rec = _queue(root, self.name)
        msg = rec.messages.get(self.seq)
        if not rec.is_ready(self.seq, msg) or msg.receive_count != self.expect:
            raise ClaimLost(f"message {self.seq} of queue {self.name!r} is no longer ready")

    def apply(self, root):
        rec = _queue(root, self.name)
        if self.seq not in rec.messages:
            return
        msg = rec.take_out(self.seq)
        rec.counts.add(dead_lettered=1)
        if self.target is None:
            rec.counts.add(dropped=1)
            return
        target = ensure_queue(root, self.target, None)
        if self.target_seq is None:
            self.target_seq = target.next_seq.take()
        target.move_in(self.target_seq, dead_lettered(msg, self.seq, self.name, self.at))


class Redrive(_Op):
    """Dead letters go back to the queue they came from (or to ``to``), with a new sequence
    number there, their first one kept, and their receive count started again.

    moves: [(seq, target name, target seq)] chosen in memory; None (through a server): every
    ready message of the queue that came from another queue, numbered by the store.
    ``moved`` lists (seq, target, target seq) once applied."""

    __slots__ = ("name", "moves", "to", "at", "moved")

    def __init__(self, name, moves, at, to=None):
        self.name, self.moves, self.at, self.to = name, moves, at, to
        self.moved = []

    def apply(self, root):
        rec = _queue(root, self.name)
        moves = self.moves
        if moves is None:
            moves = [(seq, self.to or msg.source, None) for seq, msg in rec.messages.items()
                     if (msg.source or self.to) and rec.is_ready(seq, msg)]
        self.moved = []
        for seq, target_name, target_seq in moves:
            if not rec.is_ready(seq):
                continue
            msg = rec.take_out(seq)
            rec.counts.add(redriven=1)
            target = ensure_queue(root, target_name, None)
            if target_seq is None:
                target_seq = target.next_seq.take()
            target.move_in(target_seq, redriven(msg, seq, self.at))
            self.moved.append((seq, target_name, target_seq))


class Expire(_Op):
    """A message that waited past its retention leaves the queue (unless it is in flight:
    then it expires when it is given back)."""

    __slots__ = ("name", "seq", "at")

    def __init__(self, name, seq, at):
        self.name, self.seq, self.at = name, seq, at

    def apply(self, root):
        rec = _queue(root, self.name)
        msg = rec.messages.get(self.seq)
        if (msg is None or msg.expires_at is None or msg.expires_at > self.at
                or msg.holder is not None or self.seq in rec.inflight):
            return
        rec.take_out(self.seq)
        rec.counts.add(expired=1)


class DropMissing(_Op):
    """A message the ready set names but whose record or body is missing from the store
    (the file was changed outside ackqueue, or damaged) can never be delivered: its entry
    and what is left of it go, counted as missing.  Nothing happens if it is there after
    all."""

    __slots__ = ("name", "seq", "key")

    def __init__(self, name, seq, key):
        self.name, self.seq, self.key = name, seq, key

    def apply(self, root):
        rec = _queue(root, self.name)
        msg = rec.messages.get(self.seq)
        if msg is not None and rec.has_body(self.seq, msg):
            return
        if rec.detach(self.seq, self.key) is None:
            return                        # not indexed (anymore): nothing to drop
        if msg is not None:
            del rec.messages[self.seq]
        rec.counts.add(missing=1)


class Purge(_Op):
    """Remove every message of the queue, in flight too, as SQS's PurgeQueue does: the
    listed seqs, or (seqs None, through a server) all of them.  A later ack of a purged
    delivery is refused as stale.  ``removed`` lists the seqs that went."""

    __slots__ = ("name", "seqs", "removed")

    def __init__(self, name, seqs=None):
        self.name, self.seqs = name, seqs
        self.removed = []

    @property
    def count(self):
        return len(self.removed)

    def apply(self, root):
        rec = _queue(root, self.name)
        seqs = self.seqs
        if seqs is None:
            seqs = [seq_of_key(rec.kind, key) for key in rec.ready] + list(rec.delayed.keys())
            seqs += list(rec.inflight.keys())
            seqs += [seq for _lease, seq, _deadline in rec.leased_items()]
        self.removed = []
        for seq in seqs:
            if seq in rec.messages:
                rec.take_out(seq)
                self.removed.append(seq)
        rec.counts.add(purged=len(self.removed))


class RecordCodec(_Op):
    """Record wanted as the queue's codec when it records none (the default, pickle, is not
    recorded, as opening a queue does not).  After apply: ``codec`` is the queue's recorded
    codec (None: none, so the default), ``conflict`` whether another one was recorded, in
    which case nothing was written."""

    __slots__ = ("name", "wanted", "codec", "conflict")

    def __init__(self, name, wanted):
        self.name, self.wanted = name, wanted
        self.codec, self.conflict = None, False

    def apply(self, root):
        rec = _queue(root, self.name)
        stored, wanted = rec.codec, self.wanted
        self.conflict = stored is not None and stored != wanted
        if stored is None and wanted != "pickle":
            rec.codec = stored = wanted
        self.codec = stored


def dedup_value(value):
    """(until, seq or None) of a QueueRecord.dedup value: format 6 keeps both; a value
    read while an older file is being migrated is the until alone."""
    return value if isinstance(value, tuple) else (value, None)


class PruneDedup(_Op):
    """Forget the entries of one table ("dedup": dedup ids, "tokens": put tokens) whose
    window has passed by clock time at: one step of a walk through it, at most limit
    entries after the key ``after`` (None: from the start; limit None: to the end), so that
    no one commit scans a whole table.  apply() leaves in ``next_after`` where the next
    step starts (None once the table's end was reached).  QueueState.sweep chains the
    steps."""

    __slots__ = ("name", "at", "table", "after", "limit", "next_after")

    def __init__(self, name, at, table, after=None, limit=None):
        self.name, self.at = name, at
        self.table, self.after, self.limit = table, after, limit
        self.next_after = None

    def apply(self, root):
        entries, until_of = prune_table(_queue(root, self.name), self.table)
        self.next_after = None
        if entries is None:
            return
        after = self.after
        items = entries.items() if after is None else entries.items(after, excludemin=True)
        due = []
        for count, (key, value) in enumerate(items, 1):
            if until_of(value) <= self.at:
                due.append(key)
            if count == self.limit:
                self.next_after = key         # more may follow
                break
        for key in due:
            del entries[key]


PRUNE_TABLES = ("dedup", "tokens")


def prune_table(rec, table):
    """(entries or None, until_of) of a table of a queue record that PruneDedup walks:
    "dedup" (dedup id -> its value) or "tokens" (put token -> (seq, until)); until_of(value)
    is when an entry's window ends."""
    if table == "tokens":
        return rec.put_tokens, _token_until
    return rec.dedup, _dedup_until


def _dedup_until(value):
    return dedup_value(value)[0]


def _token_until(value):
    return value[1]


class SetDeadline(_Op):
    """A new visibility deadline for a delivery held through a server (change_visibility);
    refused (StaleAck) unless that delivery is still the live one."""

    __slots__ = ("name", "seq", "deadline", "lease", "expect")

    def __init__(self, name, seq, deadline, lease, expect):
        self.name, self.seq, self.deadline = name, seq, deadline
        self.lease, self.expect = lease, expect

    def check(self, root):
        _check_delivery(root, self.name, self.seq, self.expect, "the visibility change")

    def apply(self, root):
        rec = _queue(root, self.name)
        rec.leased_by(self.lease, create=True)[self.seq] = float(self.deadline or 0.0)
