"""(a) One thread puts N, then gets and acks N, one at a time."""
import time

from benchmarks.common import GET_TIMEOUT, Timeout, make_item

KEY = "a"
TITLE = "(a) one thread: put N, then get+ack N"
KIND = "n"                          # which count it takes (see runner.counts_for)
COLUMNS = [("put_rate", "put/s"), ("get_ack_rate", "get+ack/s"),
           ("cycle_rate", "full cycle items/s")]


def run(ad, n):
    """One thread puts n, then gets and acks n (one get+ack at a time)."""
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for it in items:
        ad.put(it)
    t1 = time.perf_counter()
    for _ in range(n):
        h = ad.get(GET_TIMEOUT)
        if h is None:
            raise Timeout("get timed out")
        ad.ack(h)
    t2 = time.perf_counter()
    return {"put_rate": n / (t1 - t0), "get_ack_rate": n / (t2 - t1),
            "cycle_rate": n / (t2 - t0)}
