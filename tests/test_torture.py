"""The SIGKILL torture (tests/torture.py): CI-sized runs, embedded and through a real ZEO
server, and unit tests showing that its checker reports each kind of violation.

ACKQUEUE_LONG=1 runs the long version (many more rounds); `pytest -s` shows the figures.
"""
import signal

import pytest

import torture

SEED = 20261124


# -- the checker catches what it claims to catch --------------------------------------------

def journal(*events):
    """Journal lines from (time, kind, fields...) tuples."""
    return [" ".join(map(str, event)) + "\n" for event in events]


def check(journals, inventory, t_inventory=1000, garbled=()):
    """One round: journals (list of event tuples per process), then the inventory."""
    c = torture.Checker()
    for events in journals:
        c.add_journal(journal(*events))
    c.add_inventory(t_inventory, inventory, garbled)
    c.end_round()
    return c


def violations(c):
    r = c.result()
    return {name: r[name] for name in torture.VIOLATIONS if r[name]}


PRODUCER = [(1, "ready"), (2, "putting", "a"), (3, "put", "a"),
            (4, "putting", "b"), (5, "put", "b"),
            (6, "batch", "B", "put_many", "x", "y"), (7, "batch-done", "B")]


def test_a_clean_round_reports_no_violation():
    consumer = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
                (12, "acking", "a"), (13, "acked", "a"),
                (20, "getting"), (21, "got", "x", 3, 20, 1), (22, "acking", "x")]
    c = check([PRODUCER, consumer], [["b", 2, 1], ["y", 4, 1]])
    # x's ack is in doubt and x is gone: its ack happened.
    assert violations(c) == {}
    r = c.result()
    assert (r["messages_put"], r["acked"], r["acks_in_doubt_completed"]) == (4, 2, 1)
    assert r["kills_landed"] == {"ack": 1, "between": 1}


def test_a_put_that_returned_and_vanished_is_lost():
    c = check([PRODUCER], [["a", 1, 1], ["x", 3, 1], ["y", 4, 1]])
    assert violations(c) == {"lost": 1}
    assert "lost:b" in c.evidence


def test_a_put_in_doubt_may_or_may_not_exist():
    producer = [(1, "ready"), (2, "putting", "a")]
    assert violations(check([producer], [])) == {}
    assert violations(check([producer], [["a", 1, 1]])) == {}


def test_a_delivery_after_the_ack_returned_is_caught():
    first = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
             (12, "acking", "a"), (13, "acked", "a")]
    # A get called at 14, after the ack returned at 13, delivered a again.
    late = [(1, "ready"), (14, "getting"), (15, "got", "a", 1, 14, 2)]
    c = check([PRODUCER[:3], first, late], [])
    assert violations(c) == {"redelivered_after_ack": 1}
    assert "get called after its ack returned" in c.evidence["redelivered_after_ack:a"]
    # A get called at 12 (before the ack returned) whose line was written later proves
    # nothing: no violation.
    early = [(1, "ready"), (12, "getting"), (16, "got", "a", 1, 12, 1)]
    assert violations(check([PRODUCER[:3], first, early], [])) == {}


def test_an_acked_message_still_in_the_queue_is_caught():
    consumer = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
                (12, "acking", "a"), (13, "acked", "a")]
    c = check([PRODUCER[:3], consumer], [["a", 1, 2]])
    assert violations(c) == {"redelivered_after_ack": 1}


def test_an_ack_in_doubt_that_the_checker_relied_on_cannot_come_back():
    consumer = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
                (12, "acking", "a")]
    c = torture.Checker()
    c.add_journal(journal(*PRODUCER[:3]))
    c.add_journal(journal(*consumer))
    c.add_inventory(100, [])              # gone: the ack in doubt happened
    c.end_round()
    assert violations(c) == {}
    c.add_journal(journal((200, "ready"), (201, "getting"), (202, "got", "a", 1, 201, 2)))
    c.add_inventory(300, [])
    c.end_round()
    assert violations(c) == {"redelivered_after_ack": 1}


def test_an_ack_in_doubt_does_not_excuse_a_message_seen_after_it():
    consumer = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
                (12, "acking", "a")]
    c = torture.Checker()
    c.add_journal(journal(*PRODUCER[:3]))
    c.add_journal(journal(*consumer))
    c.add_inventory(100, [["a", 1, 1]])   # still there: that ack did not happen
    c.end_round()
    assert violations(c) == {}
    c.add_inventory(300, [])              # and now gone without any ack
    c.end_round()
    assert violations(c) == {"lost": 1}


def test_torn_batches_and_transactions_are_caught():
    producer = [(1, "ready"), (2, "batch", "B", "put_many", "x", "y", "z")]
    assert violations(check([producer], [["x", 1, 1], ["y", 2, 1]])) == {"torn": 1}
    assert violations(check([producer], [])) == {}
    assert violations(check([producer], [["x", 1, 1], ["y", 2, 1], ["z", 3, 1]])) == {}

    crawler = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
               (12, "txn", "T", "a", "l1", "l2")]
    # Killed before the commit returned: links exist, so the parent's ack happened too.
    assert violations(check([PRODUCER[:3], crawler], [["l1", 5, 1], ["l2", 6, 1]])) == {}
    c = check([PRODUCER[:3], crawler], [["a", 1, 1], ["l1", 5, 1], ["l2", 6, 1]])
    assert violations(c) == {"redelivered_after_ack": 1}
    assert violations(check([PRODUCER[:3], crawler], [["a", 1, 1], ["l1", 5, 1]])) == \
        {"torn": 1}
    assert violations(check([PRODUCER[:3], crawler], [["a", 1, 1]])) == {}
    failed = crawler + [(13, "txn-failed", "T", "StaleAck")]
    assert violations(check([PRODUCER[:3], failed], [["a", 1, 1], ["l2", 6, 1]])) == \
        {"torn": 1}


def test_garbled_phantom_duplicated_and_double_acks_are_caught():
    assert violations(check([PRODUCER[:3]], [["a", 1, 1]], garbled=[[9, "b'junk'"]])) == \
        {"garbled": 1}
    assert violations(check([PRODUCER[:3]], [["a", 1, 1], ["zz", 2, 1]])) == {"phantom": 1}
    assert violations(check([PRODUCER[:3]], [["a", 1, 1], ["a", 2, 1]])) == \
        {"duplicated": 1}
    twice = [(1, "ready"), (10, "getting"), (11, "got", "a", 1, 10, 1),
             (12, "acking", "a"), (13, "acked", "a")]
    c = check([PRODUCER[:3], twice, twice], [])
    assert violations(c) == {"acked_twice": 1}


# -- the torture itself ---------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("mode", ["embedded", "zeo"])
def test_sigkill_torture_loses_nothing_and_resurrects_no_ack(mode, tmp_path):
    rounds = (torture.LONG_ROUNDS if torture.LONG else torture.DEFAULT_ROUNDS)[mode]
    [report] = torture.run(mode, rounds, SEED, workdir=str(tmp_path), long=torture.LONG)
    print("\n" + torture.summary(report))
    details = "\n".join([torture.summary(report)] +
                        [f"{k}: {v}" for k, v in report["evidence"].items()] +
                        report["errors"])
    assert report["rounds"] == rounds, details          # the queue opened every round
    assert report["open_failures"] == 0, details
    assert report["lost"] == 0, details
    assert report["redelivered_after_ack"] == 0, details
    assert report["acked_twice"] == 0, details
    assert report["torn"] == 0 and report["garbled"] == 0, details
    assert report["phantom"] == 0 and report["duplicated"] == 0, details
    assert report["inventory_incomplete"] == 0, details
    assert report["worker_errors"] == 0, details
    assert report["violations"] == 0, details
    # Not vacuous: processes were killed, messages went through, acks were made.
    assert report["kills"] > 0, details
    assert report["messages_put"] > 0 and report["acked"] > 0, details
