"""The demo runs end to end: dying workers, a SIGKILLed child process, nothing lost."""
import os
import re
import subprocess
import sys

import pytest

from ackqueue.demo import run_demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The demo's workers die of uncaught exceptions on purpose.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_run_demo_loses_nothing(tmp_path, capsys):
    assert run_demo(jobs=400, workers=3, directory=str(tmp_path), seed=7, quiet=True) == 0
    out = capsys.readouterr().out
    m = re.search(r"verify: put (\d+), acked (\d+), redelivered (\d+), lost (\d+)", out)
    assert m, out
    put, acked, _, lost = map(int, m.groups())
    assert put == acked == 400 + 3 * 20          # 400 jobs, 20 parents with 3 children
    assert lost == 0
    assert "(exit -9)" in out                    # the child process really was SIGKILLed


def test_command_line_demo(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "ackqueue", "demo", "--jobs", "300",
                           "--quiet"], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lost 0" in proc.stdout
    assert "Traceback" not in proc.stderr


# -- the demo's header counts what its totals count -------------------------------------

@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_demos_header_counts_what_its_totals_count(tmp_path, capsys):
    from ackqueue.demo import run_demo
    assert run_demo(jobs=300, workers=2, directory=str(tmp_path), seed=3) == 0
    out = capsys.readouterr().out
    header = re.match(r"ackqueue demo: (\d+) messages: (\d+) jobs", out)
    assert header, out.splitlines()[0]
    total = int(header.group(1))
    assert int(header.group(2)) == 300 and total > 300
    put, acked = map(int, re.search(r"verify: put (\d+), acked (\d+)", out).groups())
    assert put == acked == total
    progress = re.findall(r"put (\d+)/(\d+)  acked (\d+)", out)
    assert progress and all(int(of) == total for _, of, _ in progress)
    assert progress[-1] == (str(total), str(total), str(total))
