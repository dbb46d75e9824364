"""Thread safety: 16 threads mix every operation on one queue for a fixed number of
operations each (put, get, get with a short visibility timeout on a shared fake clock,
ack by item, Message or id, nack with and without delay, task_done, transactions that
commit and that roll back, per-thread connections, sizes), each with its own seeded RNG,
then end holding items (returning, dying of an exception, or closing their connection).

At the end, with every deadline and delay past, the main thread drains the queue, and:
- every item put (by a put that returned or a transaction that committed) was acknowledged
  exactly once, by a thread or by the final drain, and nothing else was ever delivered;
- an acknowledged item never came back: the delivery that acknowledged it is its last;
- each item's deliveries were seen exactly once each, with receive counts 1, 2, ... k;
- a late ack (StaleAck) only ever concerned a delivery that had a visibility deadline;
- the counts match: unfinished_tasks and qsize are 0, join() returns, and (file) the queue
  reopens empty.

ACKQUEUE_LONG=1 runs ten times more operations per thread."""
import collections
import random
import threading

import pytest

from ackqueue import AckQueue, Empty, Full, StaleAck
from helpers_reliability import BOUND, LONG, FakeClock, drain_messages

pytestmark = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning")

THREADS = 16
OPERATIONS = 600 if LONG else 60
SEED = 1606
MAXSIZE = 200


class Boom(Exception):
    """Rolls a transaction block back."""


class WorkerDied(Exception):
    """How some workers end: dying of an exception while holding items."""


class Holding:
    def __init__(self, message, expiring):
        self.message = message
        self.expiring = expiring        # got with a visibility timeout: may be given back


class Worker:
    """One thread's operations and what it saw."""

    OPS = ["put", "put", "put", "get", "get", "get_vt", "ack", "ack", "nack", "task_done",
           "commit", "rollback", "advance", "sizes"]

    def __init__(self, index, q, clock):
        self.index = index
        self.q = q
        self.clock = clock
        self.rng = random.Random(SEED * 100 + index)
        self.use_connection = index % 4 == 3      # some threads use q.connect()
        # How it ends, holding what it holds: returning, dying of an exception, nacking
        # everything, or (the connection users) closing its connection.
        self.ending = ["return", "raise", "nack", "close"][index % 4]
        self.puts = []            # items durably put
        self.dropped = []         # items put in rolled-back transactions: never existed
        self.acks = []            # (item, receive_count) of deliveries this thread acked
        self.deliveries = []      # (item, receive_count) of every delivery it received
        self.holdings = []        # Holding, oldest first
        self.stale = 0
        self.full = 0
        self.errors = []
        self.done = threading.Event()
        self.n = 0

    # -- helpers ------------------------------------------------------------------------

    def new_item(self):
        self.n += 1
        return f"t{self.index}-{self.n}"

    def receive(self, api, visibility_timeout=None):
        kwargs = {} if visibility_timeout is None else \
            {"visibility_timeout": visibility_timeout}
        try:
            m = api.get_message(block=False, **kwargs)
        except Empty:
            return None
        self.deliveries.append((m.body, m.receive_count))
        return m

    def ack_handle(self, m, also=()):
        # An id names the message, not the delivery: with two deliveries of one message in
        # hand (the first given back behind the thread's back), it names the current one.
        # Then only the Message or the item tells which delivery is meant.
        others = [h.message for h in self.holdings] + list(also)
        twice = any(o.id == m.id and o is not m for o in others)
        return self.rng.choice([m, m.body] if twice else [m, m.body, m.id])

    # -- operations -----------------------------------------------------------------------

    def op_put(self, api):
        item = self.new_item()
        try:
            api.put(item, block=False)
        except Full:
            self.full += 1
            return
        self.puts.append(item)

    def op_get(self, api):
        m = self.receive(api)
        if m is not None:
            self.holdings.append(Holding(m, False))

    def op_get_vt(self, api):
        m = self.receive(api, visibility_timeout=self.rng.choice([1, 2, 3]))
        if m is not None:
            self.holdings.append(Holding(m, True))

    def op_ack(self, api):
        if not self.holdings:
            return
        h = self.holdings.pop(self.rng.randrange(len(self.holdings)))
        try:
            api.ack(self.ack_handle(h.message))
        except StaleAck:
            assert h.expiring, "a late ack of a delivery that had no deadline"
            self.stale += 1
            return
        self.acks.append((h.message.body, h.message.receive_count))

    def op_nack(self, api):
        if not self.holdings:
            return
        h = self.holdings.pop(self.rng.randrange(len(self.holdings)))
        try:
            api.nack(self.ack_handle(h.message), delay=self.rng.choice([0, 0, 1, 2]))
        except StaleAck:
            assert h.expiring, "a late nack of a delivery that had no deadline"
            self.stale += 1

    def op_task_done(self, api):
        # task_done acknowledges the thread's oldest delivery; only deterministic when
        # none of them can be given back behind its back, and only on the queue object.
        if (self.use_connection or not self.holdings
                or any(h.expiring for h in self.holdings)):
            return
        self.q.task_done()
        h = self.holdings.pop(0)
        self.acks.append((h.message.body, h.message.receive_count))

    def transaction(self, api, fail):
        got, puts, acked = [], [], None
        try:
            with api.transaction():
                for _ in range(self.rng.randint(0, 2)):
                    m = self.receive(api)
                    if m is not None:
                        got.append(m)
                for _ in range(self.rng.randint(0, 2)):
                    item = self.new_item()
                    try:
                        api.put(item, block=False)
                    except Full:
                        self.full += 1
                        continue
                    puts.append(item)
                if self.holdings and self.rng.random() < 0.5:
                    acked = self.rng.choice(self.holdings)
                    api.ack(self.ack_handle(acked.message, also=got))
                if fail:
                    raise Boom()
        except Boom:
            self.dropped.extend(puts)      # its gets are given back, its ack not made
            return
        except StaleAck:
            # The ack inside was late: the whole block rolled back.
            assert acked is not None and acked.expiring, "a late ack without a deadline"
            self.holdings.remove(acked)
            self.stale += 1
            self.dropped.extend(puts)
            return
        self.puts.extend(puts)
        self.acks.extend((m.body, m.receive_count) for m in got)
        if acked is not None:
            self.holdings.remove(acked)
            self.acks.append((acked.message.body, acked.message.receive_count))

    def op_commit(self, api):
        self.transaction(api, fail=False)

    def op_rollback(self, api):
        self.transaction(api, fail=True)

    def op_advance(self, api):
        self.clock.advance(self.rng.choice([1, 2]))

    def op_sizes(self, api):
        assert self.q.qsize() >= 0
        assert self.q.unfinished_tasks >= 0
        self.q.full()
        self.q.empty()

    # -- the thread -----------------------------------------------------------------------

    def run(self):
        try:
            api = self.q.connect() if self.use_connection else self.q
            for _ in range(OPERATIONS):
                getattr(self, "op_" + self.rng.choice(self.OPS))(api)
            if self.ending == "nack":
                for h in self.holdings:
                    try:
                        api.nack(h.message)
                    except StaleAck:
                        assert h.expiring
                        self.stale += 1
            elif self.ending == "close":
                api.close()             # gives back what the connection holds
        except BaseException as exc:    # reported by the main thread
            self.errors.append(exc)
            raise
        finally:
            self.done.set()
        if self.ending == "raise":
            raise WorkerDied(f"worker {self.index} died holding {len(self.holdings)} items")


@pytest.fixture(params=["memory", "file"])
def queue_and_clock(request, tmp_path):
    clock = FakeClock()
    kwargs = {"clock": clock, "thread_exit": "give_back", "maxsize": MAXSIZE}
    if request.param == "file":
        kwargs["path"] = tmp_path / "threads.fs"
    q = AckQueue(**kwargs)
    yield q, clock, kwargs
    q.close()


def test_sixteen_threads_mixing_every_operation(queue_and_clock):
    q, clock, kwargs = queue_and_clock
    for i in range(50):                      # something to get from the start
        q.put(f"seed-{i}")
    workers = [Worker(i, q, clock) for i in range(THREADS)]
    threads = [threading.Thread(target=w.run, name=f"worker-{w.index}") for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 6)
    assert not any(t.is_alive() for t in threads), "a worker is stuck"
    errors = [(w.index, e) for w in workers for e in w.errors]
    assert not errors, errors

    # Everything given back comes back once its deadline or delay is past and its holder
    # is gone; the main thread drains it all and acknowledges it.
    clock.advance(100)
    drained = drain_messages(q)
    for m in drained:
        q.ack(m)

    put = [f"seed-{i}" for i in range(50)] + [x for w in workers for x in w.puts]
    dropped = {x for w in workers for x in w.dropped}
    acks = [a for w in workers for a in w.acks]
    deliveries = [d for w in workers for d in w.deliveries]
    deliveries += [(m.body, m.receive_count) for m in drained]
    drained_items = [m.body for m in drained]

    assert len(put) == len(set(put))
    acked_items = collections.Counter(item for item, _ in acks)
    assert all(n == 1 for n in acked_items.values()), \
        [item for item, n in acked_items.items() if n > 1]       # acked exactly once
    assert len(drained_items) == len(set(drained_items))
    assert not set(drained_items) & set(acked_items)            # acked never came back
    assert set(drained_items) | set(acked_items) == set(put)    # nothing lost
    assert len(acks) + len(drained) == len(put)                 # the counts match

    # Deliveries: only of items put, never of a rolled-back put; each delivery seen once,
    # receive counts 1..k; the acknowledged delivery is the item's last.
    counts = collections.defaultdict(list)
    for item, count in deliveries:
        counts[item].append(count)
    assert set(counts) <= set(put) and not set(counts) & dropped
    for item, seen in counts.items():
        assert sorted(seen) == list(range(1, len(seen) + 1)), (item, sorted(seen))
    for item, count in acks:
        assert count == max(counts[item]), (item, count, sorted(counts[item]))

    assert q.unfinished_tasks == 0 and q.qsize() == 0
    joined = threading.Thread(target=q.join)
    joined.start()
    joined.join(BOUND)
    assert not joined.is_alive(), "join() did not return with nothing unfinished"

    # The workers did exercise what they were meant to.
    total = collections.Counter()
    for w in workers:
        total.update(stale=w.stale, acks=len(w.acks), dropped=len(w.dropped))
    assert total["acks"] > 100 and total["dropped"] > 0
    assert sum(1 for _, count in deliveries if count > 1) > 10     # redeliveries happened

    if "path" in kwargs:
        q.close()
        with AckQueue(path=kwargs["path"]) as again:
            assert again.unfinished_tasks == 0 and again.qsize() == 0
