"""(e) Wake latency in one process: put call to item in hand."""
import random
import threading
import time

from benchmarks.common import GET_TIMEOUT, Timeout, latency_metrics, make_item

KEY = "e"
TITLE = "(e) wake latency in one process: put call to item in hand"
KIND = "samples"
COLUMNS = [("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("mean_ms", "mean ms")]


def _consumer(ad, samples, waiting, lat, errors):
    try:
        for _ in range(samples):
            waiting.set()
            h = ad.get(GET_TIMEOUT)
            t1 = time.perf_counter()
            if h is None:
                raise Timeout("get timed out")
            lat.append(t1 - ad.item(h)["t0"])
            ad.ack(h)
    except BaseException as exc:      # noqa: BLE001
        errors.append(repr(exc))
        waiting.set()


def run(ad, samples, seed=5):
    """Wake latency in one process: a consumer blocked in get(); the producer records
    time.perf_counter() and then puts; latency = put call to item in hand."""
    rng = random.Random(seed)
    waiting = threading.Event()
    lat = []
    errors = []
    t = threading.Thread(target=_consumer, args=(ad, samples, waiting, lat, errors),
                         daemon=True)
    t.start()
    for i in range(samples):
        if not waiting.wait(GET_TIMEOUT) or errors:
            break
        waiting.clear()
        time.sleep(rng.uniform(0.002, 0.005))    # let the consumer block in get()
        item = make_item(i)
        item["t0"] = time.perf_counter()
        ad.put(item)
    t.join(GET_TIMEOUT)
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    if len(lat) != samples:
        raise Timeout(f"{len(lat)} of {samples} samples")
    return latency_metrics(sorted(x * 1000 for x in lat))
