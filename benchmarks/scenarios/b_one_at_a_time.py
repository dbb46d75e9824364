"""(b) One thread does put, get, ack for one message at a time."""
import time

from benchmarks.common import GET_TIMEOUT, Timeout, make_item

KEY = "b"
TITLE = "(b) one thread: put, get, ack one at a time"
KIND = "n"
COLUMNS = [("cycle_rate", "cycles/s")]


def run(ad, n):
    """One thread: put, get, ack, one message at a time."""
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for it in items:
        ad.put(it)
        h = ad.get(GET_TIMEOUT)
        if h is None:
            raise Timeout("get timed out")
        ad.ack(h)
    t1 = time.perf_counter()
    return {"cycle_rate": n / (t1 - t0)}
