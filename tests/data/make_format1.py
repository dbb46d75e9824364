"""Write tests/data/format1.fs: a small queue file in ackqueue's store format 1.

tests/test_format.py opens a copy of it with the code of the day and drains every queue,
so that no change to the store's layout (or a moved persistent class) goes unnoticed:
a later format must read this file or migrate it on open.

    python tests/data/make_format1.py [--force]

It was run with the code that writes format 1 (ackqueue.store.FORMAT == 1), and must never
be run again with code of a later format: the file's point is to be what format 1 wrote.
Every time in it comes from a fixed clock (T0 + a few seconds), so its content is the same
on every run except ZODB's transaction ids and QueueRecord.created.  What it holds (and
what the test expects when it drains it):

- "jobs" (FIFO): one message put and acked; then "a", "b" (priority 900), "c" (priority
  10, attributes), "d" (dedup_id "order-17"), BIG (a body over store.LARGE_BODY, kept in a
  Body record) and "later" (delay 60 s).  "b" was received once and given back (nack).
- "work" (FIFO, max_receives=2, dead_letter="work-dead"): "poison", received and given back
  twice, then dead-lettered; "held", received (its claim is durable: max_receives) by a
  process that ended without acking or closing (os._exit), so it is in flight in the file
  and must come back on the next open; "after", ready.
- "work-dead": the dead letter "poison", from "work".
- "stack" (AckLifoQueue): 1, 2, 3, then "urgent" (priority 500).
- "prio" (AckPriorityQueue): (3, "c"), (1, "a"), (2, "b"), then (5, "z") at priority 900.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))   # this checkout's ackqueue

PATH = os.path.join(HERE, "format1.fs")
T0 = 1_767_225_600.0            # 2026-01-01 00:00:00 UTC
BIG = bytes(range(256)) * 40    # 10,240 bytes: over store.LARGE_BODY (4096)


class Clock:
    """A clock that shows what it was set to."""

    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def write(path):
    """Write the queues (in a child process: it ends with os._exit holding a message)."""
    from ackqueue import AckLifoQueue, AckPriorityQueue, AckQueue, Empty, queues, store

    assert store.FORMAT == 1, "this script writes format 1; run it only with that code"
    clock = Clock(T0)

    jobs = AckQueue(path=path, name="jobs", clock=clock)
    jobs.put("acked")
    m = jobs.get_message()
    jobs.ack(m)
    clock.now = T0 + 1
    jobs.put("a")
    clock.now = T0 + 2
    jobs.put("b", priority=900)
    clock.now = T0 + 3
    jobs.put("c", priority=10, attributes={"tenant": "acme", "kind": "c"})
    clock.now = T0 + 4
    jobs.put("d", dedup_id="order-17")
    clock.now = T0 + 5
    jobs.put(BIG)
    clock.now = T0 + 6
    jobs.put("later", delay=60)
    clock.now = T0 + 7
    m = jobs.get_message()
    assert m.body == "b", m
    jobs.nack(m)

    clock.now = T0 + 10
    work = AckQueue(path=path, name="work", max_receives=2, dead_letter="work-dead",
                    clock=clock)
    work.put("poison")
    for at in (T0 + 11, T0 + 12):
        clock.now = at
        m = work.get_message()
        assert m.body == "poison", m
        work.nack(m)
    clock.now = T0 + 13
    try:
        work.get_nowait()       # its third receive: it moves to work-dead instead
    except Empty:
        pass
    else:
        raise AssertionError("poison was not dead-lettered")
    clock.now = T0 + 14
    work.put("held")
    clock.now = T0 + 15
    work.put("after")

    clock.now = T0 + 20
    stack = AckLifoQueue(path=path, name="stack", clock=clock)
    for n in (1, 2, 3):
        stack.put(n)
    stack.put("urgent", priority=500)

    clock.now = T0 + 30
    prio = AckPriorityQueue(path=path, name="prio", clock=clock)
    for item in ((3, "c"), (1, "a"), (2, "b")):
        prio.put(item)
    prio.put((5, "z"), priority=900)

    clock.now = T0 + 40
    m = work.get_message()      # its claim is durable before get returns (max_receives)
    assert m.body == "held", m
    print(queues(path))         # waits until everything this process sent is written
    sys.stdout.flush()
    os._exit(0)                 # ends holding "held": no ack, no give-back, no close


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        write(sys.argv[2])
        return
    if os.path.exists(PATH) and "--force" not in sys.argv[1:]:
        sys.exit(f"{PATH} exists: it must stay what format 1 wrote (--force to rewrite it)")
    for suffix in ("", ".index", ".lock", ".tmp"):
        if os.path.exists(PATH + suffix):
            os.remove(PATH + suffix)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", PATH], check=True)
    for suffix in (".index", ".lock", ".tmp"):
        if os.path.exists(PATH + suffix):
            os.remove(PATH + suffix)
    print(f"wrote {PATH} ({os.path.getsize(PATH):,} bytes)")


if __name__ == "__main__":
    main()
