"""Runs of puts and acks applied together (apply_run) leave the store exactly as the same
operations applied one at a time: real ZODB databases, compared index by index."""
import pickle

import pytest
import ZODB
from ZODB.MappingStorage import MappingStorage

from ackqueue import store

NAME = "q"


def snapshot(rec):
    """Everything a queue record holds, as plain data."""
    return {
        "messages": list(rec.messages.items()),
        "ready": list(rec.ready),
        "inflight": list(rec.inflight.items()),
        "delayed": list(rec.delayed.items()),
        "bodies": [(seq, b.data) for seq, b in (rec.bodies or {}).items()],
        "dedup": list((rec.dedup or {}).items()),
        "next_seq": rec.next_seq.value,
        "counts": {name: rec.counts.get(name) for name in store.Counters.FIELDS},
        "expiry": [(slot, list(keys)) for slot, keys in rec.expiry.slots.items()],
        "expiry order": rec.counts.order(),
    }


def put(seq, *, priority=100, body=None, delay=None, dedup=None, attributes=None):
    body = body if body is not None else pickle.dumps(f"item {seq}")
    return store.Put(NAME, seq, store.store_key(store.FIFO, priority, seq), body, priority,
                     1000.0 + seq, 2000.0 if delay else None, 5000.0 + seq, attributes,
                     dedup, None if dedup is None else 1300.0)


def ack(seq, priority=100, redelivered=False):
    delivery = (2, 1.0, 2.0) if redelivered else (1, 1.0, 1.0)
    return store.Ack(NAME, seq, store.store_key(store.FIFO, priority, seq), delivery=delivery)


def claim(seq, priority=100):
    return store.Claim(NAME, seq, store.store_key(store.FIFO, priority, seq), 1, 1.5, 9.0)


def apply_units(units, *, one_at_a_time):
    """Apply each unit in its own commit, to a fresh database; return the record's state."""
    db = ZODB.DB(MappingStorage())
    try:
        with db.transaction() as conn:
            store.ensure_queue(conn.root(), NAME, store.FIFO)
        for ops in units:
            with db.transaction() as conn:
                if one_at_a_time:
                    for op in ops:
                        store.apply_unit(conn.root(), [op])
                else:
                    store.apply_unit(conn.root(), ops)
        with db.transaction() as conn:
            return snapshot(conn.root()[store.ROOT_KEY].queues[NAME])
    finally:
        db.close()


BIG = b"x" * (store.LARGE_BODY + 1)

CASES = {
    "plain puts then acks": [
        [put(s) for s in range(1, 41)],
        [ack(s) for s in range(1, 41)],
    ],
    "puts of every kind": [
        [put(1), put(2, delay=True), put(3, body=BIG), put(4, dedup="d4"),
         put(5, attributes=(("k", "v"),)), put(6, priority=900), put(7)],
    ],
    "acks of ready, in-flight, delayed, large, redelivered, repeated and unknown messages": [
        [put(s) for s in range(1, 21)] + [put(21, delay=True), put(22, body=BIG)],
        [claim(3), claim(4)],
        [ack(1), ack(3), ack(21), ack(22), ack(5, redelivered=True), ack(2), ack(2),
         ack(99), ack(4)],
    ],
    "runs broken by other operations": [
        [put(1), put(2), claim(1), put(3), put(4)],
        [ack(2), ack(3), claim(4), ack(1), ack(4)],
    ],
    "acks across many segments": [
        [put(s) for s in range(1, 301)],
        [ack(s) for s in range(300, 0, -3)],
        [ack(s) for s in range(1, 301)],
    ],
}


@pytest.mark.parametrize("units", CASES.values(), ids=list(CASES))
def test_a_run_applied_together_leaves_what_single_operations_leave(units):
    together = apply_units(units, one_at_a_time=False)
    assert together == apply_units(units, one_at_a_time=True)
    assert together["counts"]["put"] == len({op.seq for ops in units for op in ops
                                            if isinstance(op, store.Put)})


def test_acks_applied_together_take_out_each_message_once():
    state = apply_units([[put(s) for s in range(1, 6)],
                         [ack(2), ack(2), ack(4), ack(99)]], one_at_a_time=False)
    assert [seq for seq, _ in state["messages"]] == [1, 3, 5]
    assert state["counts"]["acked"] == 2
    assert state["counts"]["ready"] == 3


# -- columns: PutRun and AckRun do what the Puts and Acks they stand for do ----------------

def plain_put(seq, body=None, expires_at=5000.0, attributes=None):
    body = body if body is not None else pickle.dumps(f"item {seq}")
    return store.Put(NAME, seq, store.store_key(store.FIFO, 100, seq), body, 100, 1000.0,
                     None, expires_at, attributes)


def as_columns(ops):
    """The one PutRun or AckRun that a unit of plain Puts (one put time, deadline and
    attributes) or of Acks stands for."""
    if all(isinstance(op, store.Put) for op in ops):
        first = ops[0]
        return [store.PutRun(NAME, [op.seq for op in ops], [op.key for op in ops],
                             [op.body for op in ops], first.priority, first.sent_at,
                             first.expires_at, first.attributes)]
    return [store.AckRun(NAME, [op.seq for op in ops], [op.key for op in ops],
                         {op.seq for op in ops if op.delivery[0] > 1})]


COLUMN_CASES = {
    "puts then acks of the same run": [
        [plain_put(s) for s in range(1, 41)],
        [ack(s) for s in range(1, 41)],
    ],
    "a large body, attributes, no deadline": [
        [plain_put(1), plain_put(2, body=BIG), plain_put(3)],
        [plain_put(s, expires_at=None, attributes=(("k", "v"),)) for s in range(4, 30)],
        [ack(2), ack(3, redelivered=True)],
    ],
    "puts out of deadline order get expiry entries": [
        [plain_put(s, expires_at=6000.0) for s in range(1, 20)],
        [plain_put(s, expires_at=5500.0) for s in range(20, 40)],
        [ack(s) for s in range(1, 40, 2)],
    ],
    "acks of ready, in-flight, delayed, repeated and unknown messages": CASES[
        "acks of ready, in-flight, delayed, large, redelivered, repeated and unknown "
        "messages"],
    "acks across many segments, in any order": [
        [plain_put(s) for s in range(1, 301)],
        [ack(s) for s in range(300, 0, -3)],
        [ack(s) for s in range(1, 301)],
    ],
}


def applied_as_columns(units):
    """The record after units applied with their plain runs as columns, checked against
    the same operations applied one at a time."""
    columns = [as_columns(ops) if len({type(op) for op in ops}) == 1
               and not any(isinstance(op, store.Claim) for op in ops)
               and not any(isinstance(op, store.Put) and op.visible_at for op in ops)
               else ops for ops in units]
    assert any(isinstance(ops[0], (store.PutRun, store.AckRun)) for ops in columns)
    together = apply_units(columns, one_at_a_time=False)
    assert together == apply_units(units, one_at_a_time=True)
    return together


@pytest.mark.parametrize("units", COLUMN_CASES.values(), ids=list(COLUMN_CASES))
def test_columns_leave_what_the_operations_they_stand_for_leave(units):
    applied_as_columns(units)


def test_columns_of_puts_out_of_deadline_order_index_them():
    state = applied_as_columns(COLUMN_CASES["puts out of deadline order get expiry entries"])
    assert sum(len(seqs) for _, seqs in state["expiry"]) == 10     # 20-38, the even ones
