"""Durable leases of stream processors' batch parts (the Spark source's micro-batches):
the store record ``root["ackqueue.streams"]`` and the blocking operations on it.

A part, named by (queue, stream, seq, part), is leased by receiving its messages under a
durable hold of the queue (ackqueue.holds, named ``stream/<stream>/<seq>/<part>``) and
writing the part's record in the same commit: the messages stay in the queue, in flight
(the queue's counts show them in flight), and the record names their ids, never a copy of
their bodies (taking a hold writes one small record, whatever the part's size, and no
message: ackqueue.holds).  A hold survives the service's crash (SIGKILL included): when
the queue is opened again, a live hold's messages are held again, in flight, instead of
being delivered to anyone else, so a replay after a restart returns them again: same
ids, bodies, priorities, attributes, sent times, and receive counts that count every
read.

- A replay counts one more receive of the part's messages and renews the lease (one
  commit: the hold's read count and deadline, and the record's).
- A commit of the stream up to seq acknowledges the messages of its parts up to seq,
  deletes their records and remembers seq, in one commit (cumulative and idempotent; a
  part at or below it reads nothing from then on).
- A part whose lease ran out (deadline, wall-clock seconds, passed): its messages go back
  at their original place, with their receive counts counted, as at any delivery's
  visibility deadline (the queue does that by itself at the hold's deadline, or at its
  next open; the service deletes the record then, with the give-back when it comes
  first); a later read of the part takes afresh.
- A part read more than max_receives times is failing its processor each time (see
  Book.lease): halved, or its one message moved to the dead-letter queue (with its
  receive count), in one commit.  The second half goes back at its original place with
  the receive counts it had before the part (the part's failed reads are not blamed on
  each of its messages: the queue's own max_receives rule would dead-letter them all at
  their next receive).

The record is an OOBTree of plain values (no class of this module is named in a file):
``("part", queue, stream, seq, part) -> {"ids": packed 64-bit ids in the order received,
"reads": n, "deadline": t}`` and ``("committed", queue, stream) -> the last seq
committed``.  This process must be the record's only writer (the service holds its
storage alone), so what Book holds in memory is what was committed: the record is read
once, by load(), at start.
"""
import threading
import time
from contextlib import contextmanager

from BTrees.OOBTree import OOBTree

from ackqueue.holds import Held, Holds, pack_ids, unpack_ids

__all__ = ["Book", "Held", "StreamLock", "ROOT_KEY", "hold_name"]

ROOT_KEY = "ackqueue.streams"


def hold_name(stream, key):
    """The name of the durable hold of part key (seq, part) of a stream."""
    return f"stream/{stream}/{key[0]}/{key[1]}"


class Part:
    """A leased part in memory: its message ids, how many reads it had, its deadline."""

    __slots__ = ("ids", "reads", "deadline")

    def __init__(self, ids, reads, deadline):
        self.ids, self.reads, self.deadline = list(ids), reads, deadline

    def stored(self):
        return {"ids": pack_ids(self.ids), "reads": self.reads, "deadline": self.deadline}

    @classmethod
    def from_stored(cls, value):
        return cls(unpack_ids(value["ids"]), value["reads"], value["deadline"])


class StreamLock:
    """Reads of different parts of a stream run at once (their commits can share a group
    commit); reads of one part run one at a time; a commit or an expiry of the stream runs
    alone."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._whole = False
        self._parts = {}                # (seq, part) -> threading.Lock

    @contextmanager
    def part(self, key):
        with self._cond:
            while self._whole:
                self._cond.wait()
            self._readers += 1
            lock = self._parts.setdefault(key, threading.Lock())
        try:
            with lock:
                yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._parts.clear()
                    self._cond.notify_all()

    @contextmanager
    def whole(self):
        with self._cond:
            while self._whole or self._readers:
                self._cond.wait()
            self._whole = True
        try:
            yield
        finally:
            with self._cond:
                self._whole = False
                self._cond.notify_all()


class _Write:
    """A store operation on the record: set keys to values, delete those whose value is
    None.  Logical, so it re-applies cleanly when the commit is retried."""

    def __init__(self, changes):
        self.changes = changes

    def check(self, root):
        pass

    def apply(self, root):
        tree = root.get(ROOT_KEY)
        if tree is None:
            tree = root[ROOT_KEY] = OOBTree()
        for key, value in self.changes:
            if value is None:
                tree.pop(key, None)
            else:
                tree[key] = value


def _part_key(name, stream, key):
    return ("part", name, stream, key[0], key[1])


class Book:
    """Every stream's leased parts, as committed; blocking calls (run them in a pool).

    clock: wall-clock seconds (time.time), injectable; a part's deadline is on it."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.parts = {}             # (queue, stream) -> {(seq, part): Part}
        self.committed = {}         # (queue, stream) -> the last seq committed
        self._locks = {}
        self._holds = {}            # id(AckQueue) -> (the queue, its Holds)
        self._locks_lock = threading.Lock()

    def lock(self, name, stream):
        """The StreamLock of one stream."""
        with self._locks_lock:
            return self._locks.setdefault((name, stream), StreamLock())

    def holds(self, q):
        """The Holds of AckQueue q (made on first use)."""
        with self._locks_lock:
            found = self._holds.get(id(q))
            if found is None or found[0] is not q:
                found = self._holds[id(q)] = (q, Holds(q))
            return found[1]

    def load(self, db):
        """Read the record of db (once, before any other call)."""
        conn = db.open()
        try:
            tree = conn.root().get(ROOT_KEY)
            for key, value in (tree or {}).items():
                if key[0] == "committed":
                    self.committed[key[1:]] = value
                else:
                    _, name, stream, seq, part = key
                    self.parts.setdefault((name, stream), {})[(seq, part)] = \
                        Part.from_stored(value)
        finally:
            conn.close()
        return sum(len(p) for p in self.parts.values())

    def count(self):
        """(parts, messages) leased now."""
        parts = [p for by_key in list(self.parts.values()) for p in list(by_key.values())]
        return len(parts), sum(len(p.ids) for p in parts)

    def streams_of(self, name):
        """{stream: {"committed", "parts", "messages"}} of queue name, as held now."""
        out = {}
        for (queue, stream) in set(self.parts) | set(self.committed):
            if queue == name:
                parts = list(self.parts.get((queue, stream), {}).values())
                out[stream] = {"committed": self.committed.get((queue, stream), -1),
                               "parts": len(parts),
                               "messages": sum(len(p.ids) for p in parts)}
        return out

    # -- a part's read -------------------------------------------------------------------

    def lease(self, q, stream, key, n, visibility_timeout, policy=None, max_receives=None,
              dead_letter=None):
        """(messages, reads before this one) of part key (seq, part) of q's stream: the
        first read receives up to n ready messages and holds them for it; a later read
        returns the same ones, counted as received once more, and renews the lease for
        visibility_timeout seconds.  Read more than max_receives times, the part is
        failing its processor each time, and which message is to blame is not known: one
        message alone goes to the queue dead_letter (an AckQueue of the same database, or
        None: dropped); more are halved, the second half given back to q and the first
        half read again from a fresh count, so a poison message is cornered in about
        max_receives * log2(n) reads while its batch-mates go on.  A part of a committed
        seq returns nothing."""
        name = q.name
        lock, now = self.lock(name, stream), self.clock()
        if self._run_out(name, stream, now):
            with lock.whole():
                self._expire(q, stream, now)
        with lock.part(key):
            if key[0] <= self.committed.get((name, stream), -1):
                return [], 0
            by_key = self.parts.setdefault((name, stream), {})
            part = by_key.get(key)
            holds = self.holds(q)
            hold = hold_name(stream, key)
            if part is not None and part.ids and not holds.held(hold):
                # Its messages are no longer held (the queue gave them back at the hold's
                # deadline, or they were purged): the lease ran out, the part starts over.
                holds.release([hold], also=[_Write([(_part_key(name, stream, key), None)])])
                del by_key[key]
                part = None
            if part is None:
                part = self._first_read(q, stream, key, n, visibility_timeout, policy, now)
                return part, 0
            new = Part(part.ids, part.reads + 1, now + visibility_timeout)
            if max_receives is not None and new.reads > max_receives and new.ids:
                return self._isolate(q, stream, key, new, dead_letter,
                                     visibility_timeout), 0
            record = _Write([(_part_key(name, stream, key), new.stored())])
            got = holds.receive_again(hold, visibility_timeout, also=[record])
            by_key[key] = new
            return got, new.reads - 1

    def _first_read(self, q, stream, key, n, visibility_timeout, policy, now):
        made = []

        def record(held):
            made.append(Part([h.id for h in held], 1, now + visibility_timeout))
            return [_Write([(_part_key(q.name, stream, key), made[0].stored())])]

        got = self.holds(q).take(hold_name(stream, key), n, visibility_timeout, policy,
                                 also=record)
        self.parts[(q.name, stream)][key] = made[0]
        return got

    def _isolate(self, q, stream, key, part, dead_letter, visibility_timeout):
        holds, hold = self.holds(q), hold_name(stream, key)
        if len(part.ids) == 1:
            kept = Part([], part.reads, part.deadline)
            write = _Write([(_part_key(q.name, stream, key), kept.stored())])
            holds.dead_letter(hold, part.ids, dead_letter, also=[write])
        else:
            half = (len(part.ids) + 1) // 2
            kept = Part(part.ids[:half], 1, part.deadline)
            write = _Write([(_part_key(q.name, stream, key), kept.stored())])
            holds.release([hold], seqs=part.ids[half:], also=[write], count=False,
                          why="its part failed its processor too often: halved")
        self.parts[(q.name, stream)][key] = kept
        # This read of the first half counts as a receive of it, as every read does.
        return holds.receive_again(hold, visibility_timeout) if kept.ids else []

    # -- commit and expiry ---------------------------------------------------------------

    def commit(self, q, stream, upto):
        """Acknowledge the messages of the parts of q's stream up to seq upto, delete
        those parts and remember upto, in one commit; (messages acknowledged, the
        stream's last committed seq).  Cumulative and idempotent: a repeat finds nothing
        to acknowledge."""
        name = q.name
        with self.lock(name, stream).whole():
            by_key = self.parts.get((name, stream), {})
            keys = [k for k in by_key if k[0] <= upto]
            done = max(self.committed.get((name, stream), -1), upto)
            acked = 0
            if keys or done != self.committed.get((name, stream)):
                changes = [(_part_key(name, stream, k), None) for k in keys]
                changes.append((("committed", name, stream), done))
                acked = self.holds(q).ack([hold_name(stream, k) for k in keys],
                                          also=[_Write(changes)])
            for k in keys:
                del by_key[k]
            self.committed[(name, stream)] = done
            return acked, done

    def _run_out(self, name, stream, now):
        """Whether a part of the stream has a lease that ran out (a look, no lock)."""
        return any(p.deadline <= now
                   for p in list(self.parts.get((name, stream), {}).values()))

    def _expire(self, q, stream, now):
        """Give back the messages of q's stream's parts whose lease ran out (those the
        queue has not given back by itself already), and delete those parts, in one
        commit (the whole stream locked); how many messages."""
        by_key = self.parts.get((q.name, stream), {})
        keys = sorted(k for k, p in by_key.items() if p.deadline <= now)
        if not keys:
            return 0
        given = self.holds(q).release(
            [hold_name(stream, k) for k in keys],
            also=[_Write([(_part_key(q.name, stream, k), None) for k in keys])],
            why="its stream lease ran out")
        for k in keys:
            del by_key[k]
        return given

    def expire_all(self, open_queue):
        """Expire the run-out parts of every stream; open_queue(name) gives the AckQueue.
        (queue, stream, messages given back) of each stream that gave some back."""
        now = self.clock()
        out = []
        for name, stream in list(self.parts):
            if not self._run_out(name, stream, now):
                continue
            q = open_queue(name)
            with self.lock(name, stream).whole():
                given = self._expire(q, stream, now)
            if given:
                out.append((name, stream, given))
        return out

