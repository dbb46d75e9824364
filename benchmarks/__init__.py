"""ackqueue's side-by-side benchmark suite: a package run as ``python -m
benchmarks`` from the repository root (see benchmarks/README.md).

Layout:

- ``runner``: the command line; picks scenarios and contenders, runs them, writes results.
- ``contenders/``: one adapter module per queue library and the registry
  (``contenders/__init__.py``) that names them; ``contenders/base.py`` documents what an
  adapter must do.
- ``scenarios/``: one module per scenario, (a)-(g), and their registry.
- ``children``: the plumbing of the helper processes (start, report lines, stop); it
  imports no scenario or contender.
- ``child_tasks``: the registry of child tasks (``python -m benchmarks --child TASK``),
  the one module that imports the children's entry points.
- ``bare_server``: the parts of the bare floor servers (a group committer, a keep-alive
  HTTP/1.1 protocol).
- ``machine``: machine info, the git state of the code under test, the fsync probe.
- ``report/``: results.md, results.json and results.png; the docs' current run
  (``current``, ``python -m benchmarks --report``).
- ``floors`` and ``lean``: bare ZODB commits, and the lean ZODB queue (references).

Nothing here is a test: no number is asserted.  tests/test_benchmark_tools.py runs the tools
briefly; tests/test_benchmarks_report.py checks the docs' current run (report/current.py).
"""
