"""(c) 4 producer and 4 consumer threads share one queue object, an ack per item."""
import threading
import time

from benchmarks.common import Timeout, make_item

KEY = "c"
TITLE = "(c) 4 producer + 4 consumer threads, ack per item"
KIND = "n"
COLUMNS = [("throughput", "items/s end to end")]


def _producer(ad, k, per, start, done, errors):
    try:
        start.wait()
        for i in range(per):
            ad.put(make_item(k * per + i))
    except BaseException as exc:      # noqa: BLE001 - reported by run()
        errors.append(repr(exc))
        done.set()


def _consumer(ad, total, start, done, errors, lock, state):
    try:
        start.wait()
        while not done.is_set():
            h = ad.get(0.2)
            if h is None:
                continue
            ad.ack(h)
            with lock:
                state["consumed"] += 1
                if state["consumed"] == total:
                    state["end"] = time.perf_counter()
                    done.set()
    except BaseException as exc:      # noqa: BLE001
        errors.append(repr(exc))
        done.set()


def run(ad, n, producers=4, consumers=4, limit=600.0):
    """4 producer and 4 consumer threads, one ack per item; end-to-end items/s."""
    per = n // producers
    total = per * producers
    lock = threading.Lock()
    state = {"consumed": 0, "end": None}
    done = threading.Event()
    errors = []
    start = threading.Barrier(producers + consumers + 1)
    threads = [threading.Thread(target=_producer, args=(ad, k, per, start, done, errors),
                                daemon=True) for k in range(producers)]
    threads += [threading.Thread(target=_consumer,
                                 args=(ad, total, start, done, errors, lock, state),
                                 daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    finished = done.wait(limit)
    done.set()
    for t in threads:
        t.join(10)
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    if not finished or state["end"] is None:
        raise Timeout(f"only {state['consumed']} of {total} items consumed in {limit}s")
    return {"throughput": total / (state["end"] - t0)}
