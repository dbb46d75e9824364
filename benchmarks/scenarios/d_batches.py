"""(d) Batches of 100: put N in batches, then get and ack N in batches."""
import time

from benchmarks.common import GET_TIMEOUT, make_item

KEY = "d"
TITLE = "(d) batches of 100: put N, then get+ack N"
KIND = "batch_n"
COLUMNS = [("put_rate", "put/s"), ("get_ack_rate", "get+ack/s"),
           ("cycle_rate", "full cycle items/s")]


def run(ad, n, batch=100):
    """Batches of 100: put n in batches, then get+ack n in batches."""
    batches = max(1, n // batch)
    n = batches * batch
    items = [make_item(i) for i in range(n)]
    t0 = time.perf_counter()
    for b in range(batches):
        ad.put_batch(items[b * batch:(b + 1) * batch])
    t1 = time.perf_counter()
    for b in range(batches):
        ad.get_ack_batch(batch, GET_TIMEOUT)
    t2 = time.perf_counter()
    return {"put_rate": n / (t1 - t0), "get_ack_rate": n / (t2 - t1),
            "cycle_rate": n / (t2 - t0)}
