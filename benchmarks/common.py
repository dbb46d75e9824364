"""What every part of the suite shares: the item, timeouts, percentiles, paths."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PAYLOAD = "x" * 70                 # with the "n" key: 105 bytes as a pickle
GET_TIMEOUT = 30.0
REFERENCE = "persist-queue"          # ratios are taken against this label
LEAN = "ZODB lean (reference)"       # benchmarks/lean.py: what ZODB allows
SHARED_QUEUE_NAME = "bench"


def make_item(n):
    """The item every contender queues: a small dict, ~100 bytes pickled."""
    return {"n": n, "payload": PAYLOAD}


class Timeout(Exception):
    """A scenario did not finish in its time limit (reported, never hidden)."""


def one_line(doc):
    return " ".join(doc.split())


def percentile(sorted_values, p):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1,
                   int(round(p / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def latency_metrics(ms):
    """p50, p99 and mean of sorted latencies in ms."""
    import statistics
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": statistics.fmean(ms)}


def dir_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if v != v:
        return "nan"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"
