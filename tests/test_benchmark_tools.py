"""The measuring tools in benchmarks/ still run against the code they measure.

They are not run by the suite's own tests otherwise, and they reach into ackqueue's
storage classes (own_cost's lean queue without fsync borrows ackqueue's commit ending):
a change there broke `own_cost --cpu` once without any test noticing.  These run each tool
briefly, in a real subprocess, and check what it prints; they time nothing."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_own_cost_cpu_runs_every_contender():
    done = _run("benchmarks.own_cost", "--cpu", "--n", "30", "--reps", "1")
    assert done.returncode == 0, done.stderr
    headers = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert [h.split(":")[0] for h in headers] == [
        "== ackqueue (durability os)", "== ZODB lean (no fsync)",
        "== ZODB lean + Counters (no fsync)", "== ZODB lean + delivery records (no fsync)",
        "== floor (durability os)"]
    for phase in ("put", "get+ack", "put_many(100)", "get_many+ack_many(100)"):
        assert done.stdout.count(f"  {phase} ") == len(headers), phase


def test_interleaved_refuses_a_name_that_is_neither_a_tree_nor_a_contender():
    done = _run("benchmarks.interleaved", "--scenario", "a", "--rounds", "1", ROOT,
                "no-such-queue")
    assert done.returncode == 2
    assert "'no-such-queue' is neither a directory nor a contender id" in done.stderr


def test_interleaved_rounds_vary_each_trees_place_and_the_tree_before_it():
    from benchmarks.interleaved import round_order
    trees = ["main", "base", "lean", "pq"]
    orders = [round_order(trees, r) for r in range(2 * len(trees))]
    for order in orders:
        assert sorted(order) == sorted(trees)
    for place in range(len(trees)):    # every tree twice at every place in 2k rounds
        column = [order[place] for order in orders]
        assert all(column.count(tree) == 2 for tree in trees)
    for tree in trees:                 # and after more than one other tree
        before = {order[order.index(tree) - 1] for order in orders if order[0] != tree}
        assert len(before) > 1
    assert round_order(trees, 1, "rotate") == ["base", "lean", "pq", "main"]
    assert round_order(trees, 3, "fixed") == trees


def test_the_suite_runs_every_other_repetition_backwards(tmp_path, capsys):
    """The order function, and the scenario loop that uses it: (b) with two in-memory
    contenders over two repetitions (in this process: the suite's runner also reads the
    machine with psutil, which only the bench extra installs)."""
    import types

    from benchmarks.contenders import ackqueue, stdlib
    from benchmarks.scenarios.table import repetition_order, run_scenario
    contenders = ["persist-queue", "ackqueue", "lean"]
    assert repetition_order(contenders, 0) == contenders
    assert repetition_order(contenders, 1) == contenders[::-1]
    assert repetition_order(contenders, 2) == contenders
    args = types.SimpleNamespace(repeat=2, quick=True)
    result = run_scenario("b", [stdlib.CONTENDER, ackqueue.MEMORY], args, str(tmp_path),
                          {"n": (30, 30), "batch_n": (100, 100), "samples": (5, 5)})
    runs = [line.split("]", 1)[1].split()[0] for line in capsys.readouterr().out.splitlines()
            if line.strip().startswith("[")]
    assert runs == ["queue.Queue", "ackqueue", "ackqueue", "queue.Queue"]
    assert all(len(r["runs"]) == 2 for r in result["results"].values())
