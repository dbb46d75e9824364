"""Chaos through the queue service: 2 producer and 3 consumer processes
on AckQueue(path="http://..."), consumers SIGKILLed at random moments and restarted, the
service SIGKILLed once and restarted on its port.  Every item put is processed at least
once, none acknowledged comes back, and the queue drains.

Every process appends its events (put, got, acked, stale) as single small O_APPEND
writes to one log, so the log's order is the order in which they happened.  A consumer
writes "got" after its get() returned and "acked" after its ack() returned (durable); a
"got X" after an "acked X" would be an acknowledged item delivered again.  No visibility
timeout is set: a live consumer never loses what it holds, so only a dead one's items (its
lease, 1 s) or the service's restart give items back."""
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue                     # noqa: E402

from service_proc import Service                  # noqa: E402

PER_PRODUCER = 120

PRODUCER = """
import os, sys, time
from ackqueue import AckQueue
url, log, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
q = AckQueue(path=url, name="chaos")
for i in range(n):
    q.put((who, i))                   # a pickled tuple
    os.write(fd, f"put {who}-{i}\\n".encode())
    time.sleep(0.02)
q.close()
"""

CONSUMER = """
import os, queue, sys
from ackqueue import AckQueue, ServerUnavailable, StaleAck
url, log = sys.argv[1], sys.argv[2]
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
q = AckQueue(path=url, name="chaos")
while True:
    try:
        who, i = q.get(timeout=1)
    except (queue.Empty, ServerUnavailable):
        continue
    os.write(fd, f"got {who}-{i} {os.getpid()}\\n".encode())
    try:
        q.task_done()                 # durable on return
    except StaleAck:
        os.write(fd, f"stale {who}-{i} {os.getpid()}\\n".encode())
        continue
    except ServerUnavailable:
        continue
    os.write(fd, f"acked {who}-{i} {os.getpid()}\\n".encode())
"""


def test_chaos_producers_consumers_killed_service_killed(tmp_path):
    log = str(tmp_path / "events.log")
    svc = Service(tmp_path / "chaos.fs", tmp_path / "service.log", "--lease-timeout", "1")
    rng = random.Random(23)

    def spawn(code, *args):
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args])

    producers = [spawn(PRODUCER, svc.url, log, f"p{k}", str(PER_PRODUCER)) for k in range(2)]
    consumers = [spawn(CONSUMER, svc.url, log) for _ in range(3)]
    kills = 0
    service_killed = False
    start = time.monotonic()
    try:
        while any(p.poll() is None for p in producers):
            assert time.monotonic() - start < 90, "the producers did not finish"
            time.sleep(rng.uniform(0.2, 0.7))
            k = rng.randrange(len(consumers))
            consumers[k].send_signal(signal.SIGKILL)
            consumers[k].wait(30)
            kills += 1
            consumers[k] = spawn(CONSUMER, svc.url, log)
            if not service_killed and time.monotonic() - start > 2.5:
                svc.kill()
                service_killed = True
                time.sleep(0.3)
                svc.start()                      # same port: clients reconnect
        assert [p.wait(30) for p in producers] == [0, 0]
        assert service_killed and kills >= 3
        q = AckQueue(path=svc.url, name="chaos")
        try:
            end = time.monotonic() + 60             # failure bound: the queue drains
            while True:
                c = q.counts()
                if c == {"ready": 0, "in_flight": 0, "delayed": 0}:
                    break
                assert time.monotonic() < end, f"the queue did not drain: {c}"
                time.sleep(0.1)
        finally:
            q.close()
    finally:
        for p in consumers + producers:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(30)
        if svc.proc.poll() is None:
            assert svc.stop() == 0

    with open(log) as f:
        events = [line.split() for line in f if line.strip()]
    put = {e[1] for e in events if e[0] == "put"}
    assert len(put) == 2 * PER_PRODUCER            # every put returned
    got, acked_at = {}, {}
    for n, e in enumerate(events):
        if e[0] == "got":
            assert e[1] not in acked_at, f"{e[1]} was delivered again after its ack"
            got[e[1]] = got.get(e[1], 0) + 1
        elif e[0] == "acked":
            acked_at[e[1]] = n
    assert set(got) == put                          # processed at least once, none lost
    assert set(acked_at) <= put
    redelivered = sum(v - 1 for v in got.values())
    print(f"chaos: {len(put)} items, {kills} consumer kills, service killed once, "
          f"{redelivered} redeliveries, {len(acked_at)} acks logged")
