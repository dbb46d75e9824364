"""The scenarios, one module each, and their registry.

(a)-(e) run in one process and are "table" scenarios: a module with KEY, TITLE, KIND (the
count it takes: "n", "batch_n" or "samples"), COLUMNS (metric, column title) and
run(adapter, count) -> {metric: value}; table.py runs them for every contender.
(e) across processes (e_xproc.py), (f) (f_scale.py) and (g) (g_processes.py) have their
own run(args, contenders, tmp_root), since they start processes.
"""
from benchmarks.scenarios import (a_put_then_get, b_one_at_a_time, c_threads, d_batches,
                                  e_wake, e_xproc)

TABLE = {m.KEY: m for m in (a_put_then_get, b_one_at_a_time, c_threads, d_batches, e_wake)}
SHARED_SCENARIOS = ("e_xproc", "g")       # across processes
ALL_KEYS = ["a", "b", "c", "d", "e", "e_xproc", "f", "g", "service", "sqs", "spark"]

TABLE_COLUMNS = {key: m.COLUMNS for key, m in TABLE.items()}
TABLE_COLUMNS[e_xproc.KEY] = e_xproc.COLUMNS

# metric: (unit, whether higher is better)
METRICS = {
    "put_rate": ("puts/s", True),
    "get_ack_rate": ("get+ack/s", True),
    "cycle_rate": ("items/s", True),
    "throughput": ("items/s", True),
    "p50_ms": ("ms", False),
    "p99_ms": ("ms", False),
    "mean_ms": ("ms", False),
    "put_p50_ms": ("ms", False),          # (e) across processes: put()'s own duration
    "after_put_p50_ms": ("ms", False),    # and the wake path's part after it
}
