"""Model-based tests: random interleavings of every queue operation, checked after every
step against a small reference model of the contract.

The model (plain Python) knows, for every message put: whether it is ready, in flight
(held by the main thread, with its deadline), delayed (with the time it becomes ready) or
acknowledged, and how many times it was received.  It predicts what each get returns (the
ready message at the head of the queue's order: FIFO, LIFO or item value), its
receive_count, qsize(), unfinished_tasks, which late acks are refused, and that an
acknowledged message never comes back.

Machines: FIFO, LIFO and priority queues in memory (thread_exit="give_back"), and a FIFO
queue on a FileStorage file (thread_exit="auto"; the program acknowledges on it from the
start, through connect()) that is also closed and reopened: everything in flight comes
back at its original place with its receive count kept, delayed messages stay delayed.

Items are distinct strings (or tuples), so that every get returns a new object and ack by
item names one delivery; test_ack_by_item_after_a_redelivery_to_the_same_thread covers
items that unpickle to one shared object (small ints, None, one-character strings).

Deadlines use a fake clock that only the ``advance`` rule moves, so nothing sleeps.
ACKQUEUE_LONG=1 runs many more examples."""
import shutil
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from ackqueue import (AckLifoQueue, AckPriorityQueue, AckQueue, Empty, MessageId, NotHeld,
                      StaleAck)
from helpers_reliability import BOUND, LONG, FakeClock

pytestmark = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning")

TIMEOUTS = st.sampled_from([1, 2, 3, 5])     # visibility timeouts and nack delays
STEPS = st.sampled_from([1, 2, 3, 5, 8])     # clock advances


class Boom(Exception):
    """Raised inside a transaction block to roll it back."""


class Delivery:
    """One delivery the main thread holds (or held): what it can ack it with."""

    def __init__(self, mid, item, message, deadline, epoch):
        self.mid = mid              # the model's id of the message
        self.epoch = epoch          # which opening of the queue delivered it
        self.acked = False          # gone by an ack (for good), not by a nack
        self.item = item            # the object get returned
        self.message = message      # the Message, when got with get_message
        self.deadline = deadline    # fake-clock time, or None
        self.tried = False          # a stale ack was already tried with it


class Model:
    """The contract, in plain Python."""

    def __init__(self, kind):
        self.kind = kind
        self.values = {}          # mid -> the item put
        self.ready = set()        # mids
        self.inflight = set()     # mids held by someone (the main thread or a txn)
        self.delayed = {}         # mid -> time it becomes ready
        self.count = {}           # mid -> receive count so far
        self.acked = set()
        self.dropped = set()      # put inside a rolled-back transaction: never existed
        self.next = 0

    def new(self, value):
        mid = self.next
        self.next += 1
        self.values[mid] = value
        self.count[mid] = 0
        return mid

    def order(self, mid):
        """The queue's delivery order: put order, reversed put order, or item value."""
        if self.kind == "fifo":
            return mid
        if self.kind == "lifo":
            return -mid
        return (self.values[mid], mid)

    def head(self, exclude=()):
        candidates = [m for m in self.ready if m not in exclude]
        return min(candidates, key=self.order) if candidates else None

    def ready_in_order(self):
        return sorted(self.ready, key=self.order)

    def unfinished(self):
        return len(self.ready) + len(self.inflight) + len(self.delayed)

    def receive(self, mid):
        self.ready.remove(mid)
        self.inflight.add(mid)
        self.count[mid] += 1

    def give_back(self, mid, visible_at=None):
        self.inflight.remove(mid)
        if visible_at is None:
            self.ready.add(mid)
        else:
            self.delayed[mid] = visible_at

    def ack(self, mid):
        self.inflight.remove(mid)
        self.acked.add(mid)

    def check_disjoint(self):
        states = [self.ready, self.inflight, set(self.delayed), self.acked, self.dropped]
        assert sum(map(len, states)) == len(set().union(*states)) == self.next


class QueueMachine(RuleBasedStateMachine):
    KIND = "fifo"
    BACKEND = "memory"
    THREAD_EXIT = "give_back"
    CLASSES = {"fifo": AckQueue, "lifo": AckLifoQueue, "value": AckPriorityQueue}

    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        self.dir = tempfile.mkdtemp(prefix="ackqueue-model-") if self.BACKEND == "file" \
            else None
        self.model = Model(self.KIND)
        self.held = []            # Delivery objects the main thread holds, oldest first
        self.stale = []           # deliveries given back behind the holder's back
        self.gone = []            # deliveries acknowledged or nacked
        self.q = None
        self.epoch = 0            # how many times the queue was opened
        self.open()

    # -- opening and closing -------------------------------------------------------------

    def open(self):
        kwargs = {"clock": self.clock, "thread_exit": self.THREAD_EXIT}
        if self.dir is not None:
            kwargs["path"] = f"{self.dir}/model.fs"
        self.q = self.CLASSES[self.KIND](**kwargs)
        self.epoch += 1
        if self.THREAD_EXIT == "auto":
            # The program acknowledges on this queue (connect() is one of the ways to say
            # so): from now on what an ended thread held is given back even if it
            # returned normally, not only if it died of an exception.
            self.q.connect().close()

    def teardown(self):
        if self.q is not None:
            self.q.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------------

    def value(self, mid):
        return self.model.values[mid]

    def new_value(self):
        n = self.model.next
        if self.KIND == "value":
            return ((n * 7) % 4, f"v-{n}")     # priorities collide; the tag makes it unique
        return f"v-{n}"

    def expect_received(self, m, mid, visibility_timeout):
        assert m.body == self.value(mid), (m.body, self.value(mid))
        assert mid not in self.model.acked
        assert isinstance(m.id, MessageId)
        assert m.receive_count == self.model.count[mid] + 1, (m, self.model.count[mid])
        if visibility_timeout is None:
            assert m.deadline is None
        else:
            assert m.deadline == self.clock() + visibility_timeout

    def receive(self, via, visibility_timeout):
        """A get in the main thread; returns the Delivery, or None when Empty was right."""
        mid = self.model.head()
        kwargs = {} if visibility_timeout is None else \
            {"visibility_timeout": visibility_timeout}
        if mid is None:
            with pytest.raises(Empty):
                (self.q.get if via == "get" else self.q.get_message)(block=False, **kwargs)
            return None
        if via == "get":
            item = self.q.get(block=False, **kwargs)
            assert item == self.value(mid), (item, self.value(mid))
            message = None
        else:
            message = self.q.get_message(block=False, **kwargs)
            self.expect_received(message, mid, visibility_timeout)
            item = message.body
        self.model.receive(mid)
        deadline = None if visibility_timeout is None else self.clock() + visibility_timeout
        return Delivery(mid, item, message, deadline, self.epoch)

    def handle(self, d, form):
        if form == "message" and d.message is not None:
            return d.message
        if form == "id" and d.message is not None:
            return d.message.id
        return d.item

    # -- rules ---------------------------------------------------------------------------

    @initialize(n=st.integers(0, 6))
    def fill(self, n):
        self.put(n)

    @rule(n=st.integers(1, 3))
    def put(self, n):
        for _ in range(n):
            value = self.new_value()
            self.q.put(value)
            self.model.ready.add(self.model.new(value))

    @rule(via=st.sampled_from(["get", "get_message"]),
          visibility_timeout=st.none() | TIMEOUTS)
    def get(self, via, visibility_timeout):
        d = self.receive(via, visibility_timeout)
        if d is not None:
            self.held.append(d)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), form=st.sampled_from(["item", "message", "id"]))
    def ack(self, data, form):
        d = self.held.pop(data.draw(st.integers(0, len(self.held) - 1), label="which"))
        self.q.ack(self.handle(d, form))
        self.model.ack(d.mid)
        d.acked = True
        self.gone.append(d)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), form=st.sampled_from(["item", "message", "id"]),
          delay=st.just(0) | TIMEOUTS)
    def nack(self, data, form, delay):
        d = self.held.pop(data.draw(st.integers(0, len(self.held) - 1), label="which"))
        if delay:
            self.q.nack(self.handle(d, form), delay=delay)
            self.model.give_back(d.mid, self.clock() + delay)
        else:
            self.q.nack(self.handle(d, form))
            self.model.give_back(d.mid)
        self.gone.append(d)

    @rule()
    def task_done(self):
        if not self.held:
            with pytest.raises(ValueError):
                self.q.task_done()
            return
        d = self.held.pop(0)              # the oldest delivery the thread holds
        self.q.task_done()
        self.model.ack(d.mid)
        d.acked = True
        self.gone.append(d)

    @rule(seconds=STEPS)
    def advance(self, seconds):
        now = self.clock.advance(seconds)
        for d in [d for d in self.held if d.deadline is not None and d.deadline <= now]:
            self.held.remove(d)
            self.model.give_back(d.mid)
            self.stale.append(d)
        for mid, visible_at in list(self.model.delayed.items()):
            if visible_at <= now:
                del self.model.delayed[mid]
                self.model.ready.add(mid)

    @precondition(lambda self: self.stale)
    @rule(data=st.data(), op=st.sampled_from(["ack", "nack"]),
          form=st.sampled_from(["item", "message"]))
    def late_ack_is_refused(self, data, op, form):
        """An ack or nack of a delivery given back meanwhile (deadline passed, queue
        reopened) is refused and changes nothing."""
        d = self.stale[data.draw(st.integers(0, len(self.stale) - 1), label="which")]
        x = self.handle(d, form)
        # A Message names its delivery: always StaleAck.  A bare item is StaleAck the first
        # time (the thread remembers that delivery), NotHeld once told, or after a reopen.
        if x is d.message or (d.epoch == self.epoch and not d.tried):
            expected = StaleAck
        else:
            expected = NotHeld
        with pytest.raises(expected):
            (self.q.ack if op == "ack" else self.q.nack)(x)
        d.tried = True            # refused: the thread forgets that delivery

    @precondition(lambda self: self.gone)
    @rule(data=st.data(), form=st.sampled_from(["item", "message", "id"]))
    def second_ack_is_refused(self, data, form):
        """Acknowledging (or nacking) the same delivery twice is refused."""
        d = self.gone[data.draw(st.integers(0, len(self.gone) - 1), label="which")]
        if form == "id" and not d.acked:
            form = "message"   # an id names the message, which may be held again by now
        with pytest.raises(NotHeld):
            self.q.ack(self.handle(d, form))
        if form == "id":
            # An id finds the thread's latest remembered delivery of that message: an
            # earlier delivery given back behind its back, if one is still remembered.
            # Refusing it makes the thread forget that delivery.
            remembered = [s for s in self.stale
                          if s.mid == d.mid and s.epoch == self.epoch and not s.tried]
            if remembered:
                remembered[-1].tried = True

    def run_transaction(self, data, ops, fail):
        got, acks, puts = [], [], []
        try:
            with self.q.transaction():
                for op in ops:
                    if op == "get":
                        mid = self.model.head(exclude=got)
                        if mid is None:
                            with pytest.raises(Empty):
                                self.q.get_message(block=False)
                            continue
                        m = self.q.get_message(block=False)
                        self.expect_received(m, mid, None)
                        self.model.count[mid] += 1
                        got.append(mid)
                    elif op == "put":
                        value = self.new_value()
                        self.q.put(value)
                        puts.append(self.model.new(value))
                    else:
                        free = [d for d in self.held if d not in acks]
                        if not free:
                            continue
                        d = data.draw(st.sampled_from(free), label="ack in txn")
                        form = data.draw(st.sampled_from(["item", "message", "id"]),
                                         label="form")
                        self.q.ack(self.handle(d, form))
                        acks.append(d)
                    # Inside the block: its gets are out, its puts not visible yet, its
                    # acks not done yet.
                    assert self.q.qsize() == len(self.model.ready) - len(got)
                    assert self.q.unfinished_tasks == self.model.unfinished()
                if fail:
                    raise Boom()
        except Boom:
            assert fail
            # Rolled back: what it got is ready again (that receive counted), its puts
            # never existed, its acks did not happen (those deliveries are still held).
            self.model.dropped.update(puts)
            return
        assert not fail
        for mid in got:
            self.model.ready.remove(mid)
            self.model.acked.add(mid)
        for d in acks:
            self.held.remove(d)
            self.model.ack(d.mid)
            d.acked = True
            self.gone.append(d)
        self.model.ready.update(puts)

    @rule(data=st.data(),
          ops=st.lists(st.sampled_from(["get", "put", "ack"]), min_size=1, max_size=4))
    def transaction_commit(self, data, ops):
        self.run_transaction(data, ops, fail=False)

    @rule(data=st.data(),
          ops=st.lists(st.sampled_from(["get", "put", "ack"]), min_size=1, max_size=4))
    def transaction_rollback(self, data, ops):
        self.run_transaction(data, ops, fail=True)

    @rule(how=st.sampled_from(["raises", "returns"]))
    def thread_gets_and_ends(self, how):
        """A real thread gets the head and ends without acknowledging: dying of an exception,
        or returning.  The queue gives the item back at its place (checked on every
        qsize/get, so no waiting), its receive count kept."""
        mid = self.model.head()
        seen = []

        def worker():
            try:
                m = self.q.get_message(block=False)
            except Empty:
                seen.append(Empty)
                return
            seen.append((m.body, m.receive_count))
            if how == "raises":
                raise RuntimeError("worker died holding an item")

        t = threading.Thread(target=worker, name=f"model-worker-{how}")
        t.start()
        t.join(BOUND)
        assert not t.is_alive()
        if mid is None:
            assert seen == [Empty]
            return
        assert seen == [(self.value(mid), self.model.count[mid] + 1)]
        self.model.count[mid] += 1              # received, then given back: still ready

    @precondition(lambda self: len(self.model.ready) > 1)
    @rule()
    def drain_and_give_back(self):
        """Receive everything ready, check order and counts, and nack it all back."""
        expected = self.model.ready_in_order()
        messages = []
        while True:
            try:
                messages.append(self.q.get_message(block=False))
            except Empty:
                break
        assert [m.body for m in messages] == [self.value(mid) for mid in expected]
        assert [m.receive_count for m in messages] == \
            [self.model.count[mid] + 1 for mid in expected]
        for m in messages:
            self.q.nack(m)
        for mid in expected:
            self.model.count[mid] += 1

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def sizes_match_the_model(self):
        self.model.check_disjoint()
        assert self.q.qsize() == len(self.model.ready)
        assert self.q.unfinished_tasks == self.model.unfinished()
        assert {d.mid for d in self.held} <= self.model.inflight


class FileQueueMachine(QueueMachine):
    BACKEND = "file"
    THREAD_EXIT = "auto"

    @rule()
    def reopen(self):
        """Close and open again: what was held comes back at its place with its receive
        count kept; delayed messages stay delayed; Messages from before name deliveries
        that are over (a late ack with one is refused)."""
        self.q.close()
        for d in self.held:
            self.model.give_back(d.mid)
            self.stale.append(d)
        self.held = []
        self.open()


class LifoQueueMachine(QueueMachine):
    KIND = "lifo"


class PriorityQueueMachine(QueueMachine):
    KIND = "value"


def _settings(examples, steps):
    return settings(max_examples=examples * (50 if LONG else 1),
                    stateful_step_count=steps * (2 if LONG else 1),
                    deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


TestFifoMemory = QueueMachine.TestCase
TestFifoMemory.settings = _settings(150, 50)
TestLifoMemory = LifoQueueMachine.TestCase
TestLifoMemory.settings = _settings(50, 50)
TestPriorityMemory = PriorityQueueMachine.TestCase
TestPriorityMemory.settings = _settings(50, 50)
TestFifoFile = FileQueueMachine.TestCase
TestFifoFile.settings = _settings(100, 50)


@pytest.mark.parametrize("item", [5, None, True, "a"], ids=repr)
def test_ack_by_item_after_a_redelivery_to_the_same_thread(item):
    """A value that unpickles to a shared object (small int, None, True, a one-character
    str) names both the given-back delivery and the current one: ack(item) must take the
    current one (it used to find the old one and raise StaleAck forever)."""
    clock = FakeClock()
    with AckQueue(clock=clock) as q:
        q.put(item)
        assert q.get(visibility_timeout=1) == item
        clock.advance(1)                    # given back; this thread receives it again
        again = q.get(block=False, visibility_timeout=1)
        assert again == item
        q.ack(again)
        assert q.unfinished_tasks == 0
        clock.advance(10)
        assert q.qsize() == 0                       # acknowledged: it never comes back
