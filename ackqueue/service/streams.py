"""Durable leases of stream processors' batch parts (the Spark source's micro-batches):
the store record ``root["ackqueue.streams"]`` and the blocking operations on it.

A part, named by (queue, stream, seq, part), is leased by taking its messages out of the
queue and writing them into the record in one commit (ackqueue.atomic.transaction and its
write()): the messages leave the queue and the record naming them appears together, or
neither does.  So whatever happens to the service (SIGKILL included), a part's record
holds exactly the messages its first read took, and a replay after a restart returns
them again: same ids, bodies, priorities, attributes, sent times.  While leased, the
messages are in the record, not in the queue (the queue's counts do not show them).

- A replay renews the lease (a commit of the part's read count and deadline).
- A commit of the stream up to seq deletes the records of its parts up to seq and
  remembers seq, in one commit (cumulative and idempotent; a part at or below it reads
  nothing from then on).
- A record whose lease ran out (deadline, wall-clock seconds, passed) is deleted and its
  messages put back into the queue in the same commit: at the queue's tail, as new
  messages (new ids; their receive count starts over), with their bodies, priorities and
  attributes.
- A part read more than max_receives times is failing its processor each time (see
  Book.lease): halved, or its one message moved to the dead-letter queue, in one commit.

The record is an OOBTree of plain values (no class of this module is named in a file):
``("part", queue, stream, seq, part) -> {"messages": PersistentList([(id, body, priority,
attributes, sent_at, receive_count), ...]), "reads": n, "deadline": t}`` and ``("committed", queue,
stream) -> the last seq committed``.  This process must be the record's only writer (the
service holds its storage alone), so what Book holds in memory is what was committed: the
record is read once, by load(), at start.
"""
import threading
import time
from collections import namedtuple
from contextlib import contextmanager

from BTrees.OOBTree import OOBTree
from persistent.list import PersistentList

from ackqueue import atomic

__all__ = ["Book", "Held", "StreamLock", "ROOT_KEY"]

ROOT_KEY = "ackqueue.streams"

# One leased message, as the record keeps it (body: the stored, marked bytes).
Held = namedtuple("Held", "id body priority attributes sent_at receive_count")


class Part:
    """A leased part in memory: its messages, how many reads it had, its deadline."""

    __slots__ = ("messages", "reads", "deadline")

    def __init__(self, messages, reads, deadline):
        self.messages, self.reads, self.deadline = list(messages), reads, deadline

    def stored(self):
        return {"messages": [tuple(h) for h in self.messages], "reads": self.reads,
                "deadline": self.deadline}

    @classmethod
    def from_stored(cls, value):
        return cls([Held(*m) for m in value["messages"]], value["reads"], value["deadline"])


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


class _Renew:
    """A change of a part's read count and deadline alone (its messages stay)."""

    def __init__(self, reads, deadline):
        self.reads, self.deadline = reads, deadline


class _Write:
    """A store operation on the record: set keys to values (a part's messages become an
    object of their own, so that the tree's buckets hold only references and a renewal
    writes no body again), renew parts (_Renew), delete those whose value is None.
    Logical, so it re-applies cleanly when the commit is retried."""

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
            elif isinstance(value, _Renew):
                tree[key] = dict(tree[key], reads=value.reads, deadline=value.deadline)
            elif isinstance(value, dict):
                tree[key] = dict(value, messages=PersistentList(value["messages"]))
            else:
                tree[key] = value


def _part_key(name, stream, key):
    return ("part", name, stream, key[0], key[1])


def _held(m):
    return Held(int(m.id), m.body, m.priority, dict(m.attributes or {}) or None, m.sent_at,
                m.receive_count)


def _put_back(q, held):
    """Put held messages into q, inside the caller's atomic block: one put_many per run of
    neighbours with the same priority and attributes."""
    start = 0
    while start < len(held):
        first, stop = held[start], start + 1
        while stop < len(held) and (held[stop].priority, held[stop].attributes) == (
                first.priority, first.attributes):
            stop += 1
        q.put_many([h.body for h in held[start:stop]], encoded=True,
                   priority=first.priority, attributes=first.attributes)
        start = stop


def _take(q, n, visibility_timeout, policy):
    """Up to n ready messages of q, not waiting, in the calling thread's open block.
    (The thread's own connection, q._conn(), is the one its transaction block is open on;
    the front's get_messages takes no dead-letter policy, hence the private call.)"""
    import queue as stdlib_queue
    try:
        return q._conn().get_many(n, block=False, messages=True, raw=True,
                                  visibility_timeout=visibility_timeout, policy=policy)
    except stdlib_queue.Empty:
        return []


class Book:
    """Every stream's leased parts, as committed; blocking calls (run them in a pool).

    clock: wall-clock seconds (time.time), injectable; a part's deadline is on it."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.parts = {}             # (queue, stream) -> {(seq, part): Part}
        self.committed = {}         # (queue, stream) -> the last seq committed
        self._locks = {}
        self._locks_lock = threading.Lock()

    def lock(self, name, stream):
        """The StreamLock of one stream."""
        with self._locks_lock:
            return self._locks.setdefault((name, stream), StreamLock())

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
        return len(parts), sum(len(p.messages) for p in parts)

    def streams_of(self, name):
        """{stream: {"committed", "parts", "messages"}} of queue name, as held now."""
        out = {}
        for (queue, stream) in set(self.parts) | set(self.committed):
            if queue == name:
                parts = list(self.parts.get((queue, stream), {}).values())
                out[stream] = {"committed": self.committed.get((queue, stream), -1),
                               "parts": len(parts),
                               "messages": sum(len(p.messages) for p in parts)}
        return out

    # -- a part's read -------------------------------------------------------------------

    def lease(self, q, stream, key, n, visibility_timeout, policy=None, max_receives=None,
              dead_letter=None):
        """(messages, reads before this one) of part key (seq, part) of q's stream: the
        first read takes up to n ready messages for it; a later read returns the same ones
        and renews the lease for visibility_timeout seconds.  Read more than max_receives
        times, the part is failing its processor each time, and which message is to blame
        is not known: one message alone goes to the queue dead_letter (an AckQueue of the
        same database, or None: dropped); more are halved, the second half put back into
        q and the first half read again from a fresh count, so a poison message is
        cornered in about max_receives * log2(n) reads while its batch-mates go on.
        A part of a committed seq returns nothing."""
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
            if part is None:
                part = self._first_read(q, stream, key, n, visibility_timeout, policy, now)
                return part.messages, 0
            new = Part(part.messages, part.reads + 1, now + visibility_timeout)
            if max_receives is not None and new.reads > max_receives and new.messages:
                return self._isolate(q, stream, key, new, dead_letter), 0
            self._write(q, [(_part_key(name, stream, key), _Renew(new.reads, new.deadline))])
            by_key[key] = new
            return new.messages, new.reads - 1

    def _first_read(self, q, stream, key, n, visibility_timeout, policy, now):
        with atomic.transaction(q) as t:
            got = _take(q, n, visibility_timeout, policy)
            part = Part([_held(m) for m in got], 1, now + visibility_timeout)
            t.write(_Write([(_part_key(q.name, stream, key), part.stored())]))
        self.parts[(q.name, stream)][key] = part
        return part

    def _isolate(self, q, stream, key, part, dead_letter):
        if len(part.messages) == 1:
            target = q if dead_letter is None else dead_letter
            kept, out = Part([], part.reads, part.deadline), part.messages
        else:
            target = q
            half = (len(part.messages) + 1) // 2
            kept, out = Part(part.messages[:half], 1, part.deadline), part.messages[half:]
        with atomic.transaction(target) as t:
            if target is not q or len(part.messages) > 1:
                _put_back(target, out)          # to the dead-letter queue, or back to q
            t.write(_Write([(_part_key(q.name, stream, key), kept.stored())]))
        self.parts[(q.name, stream)][key] = kept
        return kept.messages

    def _write(self, q, changes):
        """Commit changes of the record alone (through q's committer)."""
        with atomic.transaction(q) as t:
            t.write(_Write(changes))

    # -- commit and expiry ---------------------------------------------------------------

    def commit(self, q, stream, upto):
        """Delete the parts of q's stream up to seq upto and remember upto, in one commit;
        (messages those parts held, the stream's last committed seq).  Cumulative and
        idempotent: a repeat finds nothing to delete."""
        name = q.name
        with self.lock(name, stream).whole():
            by_key = self.parts.get((name, stream), {})
            keys = [k for k in by_key if k[0] <= upto]
            done = max(self.committed.get((name, stream), -1), upto)
            if keys or done != self.committed.get((name, stream)):
                changes = [(_part_key(name, stream, k), None) for k in keys]
                changes.append((("committed", name, stream), done))
                self._write(q, changes)
            acked = sum(len(by_key.pop(k).messages) for k in keys)
            self.committed[(name, stream)] = done
            return acked, done

    def _run_out(self, name, stream, now):
        """Whether a part of the stream has a lease that ran out (a look, no lock)."""
        return any(p.deadline <= now
                   for p in list(self.parts.get((name, stream), {}).values()))

    def _expire(self, q, stream, now):
        """Put back the messages of q's stream's parts whose lease ran out, and delete
        those parts, in one commit (the whole stream locked); how many messages."""
        by_key = self.parts.get((q.name, stream), {})
        keys = [k for k, p in by_key.items() if p.deadline <= now]
        if not keys:
            return 0
        held = [h for k in sorted(keys) for h in by_key[k].messages]
        with atomic.transaction(q) as t:
            _put_back(q, held)
            t.write(_Write([(_part_key(q.name, stream, k), None) for k in keys]))
        for k in keys:
            del by_key[k]
        return len(held)

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
