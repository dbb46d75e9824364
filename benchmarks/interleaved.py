"""One scenario, run in turn in several ackqueue trees: how to tell a change from the
drift of a shared machine.

    python -m benchmarks.interleaved --scenario c --rounds 9 TREE [TREE ...]

Each TREE is a directory holding an ackqueue checkout (e.g. a git worktree of the revision
to measure); a contender's id instead (``lean``, the lean ZODB queue; ``lean-synced``;
``persist-queue``; any id ``python -m benchmarks --contender`` takes) stands for that
contender, run from the first tree.  A round runs the suite
itself (``python -m benchmarks --scenario S --repeat 1 --contender C``) once in each
tree, one after the other, with the tree as the working directory and first on
PYTHONPATH, so that its ackqueue is the one imported, by the servers the suite starts too;
the rounds repeat.  Printed for each tree: its runs, their median, and the median of its
ratios to the first tree's run of the same round.  A slow spell then falls on every tree
of a round alike, which separate runs minutes apart do not promise (the rule own_cost.cpu
follows too).

The order changes from round to round (--order alternate, the default): round r starts
r//2 trees further along the list, and every other round runs backwards.  Each tree then
runs at each place of a round, and after different trees, as often as the others, so that
what a run leaves behind for the next one (dirty pages still being written back, a
deleted file's blocks being freed) falls on every tree alike instead of always on the
one after the same tree.  --order rotate only starts each round one tree further along
(the tree before each one stays the same but at the rounds' edges); --order fixed keeps
the list's order in every round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import contenders, scenarios


def _metric(key):
    """The column a scenario's ratios are quoted in (its last: the full cycle, or its
    only one); the table scenarios (a)-(e) only."""
    if key not in scenarios.TABLE:
        raise SystemExit(f"scenario {key!r}: only {', '.join(scenarios.TABLE)} run here")
    return scenarios.TABLE[key].COLUMNS[-1][0]


def _env_for(tree):
    """This environment with tree first on PYTHONPATH: the processes the suite starts by
    the ackqueue console script (a ZEO server, the service) then import the tree's
    ackqueue too, not the one installed (for a worktree of another revision, not the one
    measured)."""
    path = [os.path.abspath(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_once(tree, key, contender):
    """The metric of one run of scenario key by contender in tree."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "benchmarks", "--scenario", key,
                        "--repeat", "1", "--contender", contender, "--out", out],
                       cwd=tree, check=True, capture_output=True, text=True,
                       env=_env_for(tree))
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)["scenarios"][key]["results"]
    (only,) = results.values()
    return only["runs"][0]["metrics"][_metric(key)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="c")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--contender", default="ackqueue",
                   help="the contender run in every tree (default %(default)s)")
    p.add_argument("--order", choices=("alternate", "rotate", "fixed"), default="alternate",
                   help="alternate: each other round backwards, and starting further along "
                        "(default); rotate: each round starts one tree further along; "
                        "fixed: the same order every round")
    p.add_argument("trees", nargs="+", metavar="TREE_OR_CONTENDER")
    args = p.parse_args(argv)
    _metric(args.scenario)
    for name in args.trees:
        if not os.path.isdir(name) and name not in contenders.all_ids():
            p.error(f"{name!r} is neither a directory nor a contender id "
                    f"({', '.join(contenders.all_ids())})")
    first = next((t for t in args.trees if os.path.isdir(t)), None)
    if first is None:
        p.error("name at least one tree")
    runs = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        for tree in round_order(args.trees, r, args.order):
            if not os.path.isdir(tree):         # a contender's id, run from the first tree
                runs[tree].append(run_once(first, args.scenario, tree))
            else:
                runs[tree].append(run_once(tree, args.scenario, args.contender))
    base = runs[args.trees[0]]
    print(f"scenario ({args.scenario}), {_metric(args.scenario)}, {args.rounds} rounds "
          f"({args.order} order); ratios to {args.trees[0]}")
    for tree, values in runs.items():
        ratios = [mine / theirs for mine, theirs in zip(values, base)]
        print(f"  {tree:40s} median {_shown(statistics.median(values)):>10s}   "
              f"ratio {statistics.median(ratios):.3f}   runs "
              + ", ".join(map(_shown, values)))


def round_order(trees, r, order="alternate"):
    """The order in which round r (from 0) runs trees (see the module docstring):
    "alternate" rotated by r//2 places and reversed in odd rounds, "rotate" rotated by r
    places, "fixed" as given."""
    trees = list(trees)
    if order == "fixed" or not trees:
        return trees
    start = (r // 2 if order == "alternate" else r) % len(trees)
    out = trees[start:] + trees[:start]
    return out[::-1] if order == "alternate" and r % 2 else out


def _shown(value):
    """A rate as an integer, a latency in ms with its decimals."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"


if __name__ == "__main__":
    main()
