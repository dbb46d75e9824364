"""The current run in the docs is what the recorded results give, never typed by hand.

docs/benchmarks.md's block between ``<!-- current-run:begin -->`` and
``<!-- current-run:end -->`` and README.md's between ``<!-- results:begin -->`` and
``<!-- results:end -->`` are written by ``python -m benchmarks --report`` from
benchmarks/results/results.json (benchmarks/report/current.py).  These tests make them
again from that file and fail on any difference (a hand edit, a new run recorded without
``--report``, a change of the report code without the docs), and check how the blocks are
made: the ratios' orientation, the date and machine read from the run, the text around
the markers left alone, and the command line.
"""
import copy
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "results.json")
REGENERATE = "python -m benchmarks --report"

from benchmarks.report import current   # noqa: E402  (the repository root is on sys.path)


def _recorded():
    with open(RESULTS, encoding="utf-8") as f:
        return json.load(f)


def _read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def test_docs_benchmarks_shows_the_recorded_run():
    text = _read("docs", "benchmarks.md")
    assert current.CURRENT_RUN in current.blocks_of(text)
    assert current.render(text, _recorded()) == text, \
        f"docs/benchmarks.md's current run differs from results.json: run `{REGENERATE}`"


def test_docs_benchmarks_stays_short():
    assert len(_read("docs", "benchmarks.md").splitlines()) <= 600


def test_readme_results_table_is_the_recorded_run():
    text = _read("README.md")
    if current.RESULTS not in current.blocks_of(text):
        pytest.skip("README.md has no <!-- results:begin --> / <!-- results:end --> markers")
    assert current.render(text, _recorded()) == text, \
        f"README.md's results table differs from results.json: run `{REGENERATE}`"


def _row(table, key):
    return next(line for line in table if line.startswith(f"| ({key}) "))


def test_a_ratio_above_one_is_ackqueue_ahead_for_rates_and_for_times():
    report = copy.deepcopy(_recorded())
    for key, ours, theirs in (("b", 2000.0, 1000.0), ("e", 0.5, 1.0)):
        results = report["scenarios"][key]["results"]
        metric = "cycle_rate" if key == "b" else "p50_ms"
        results["ackqueue (fsync)"]["median"][metric] = ours
        results["persist-queue"]["median"][metric] = theirs
    table = current.results_table(report)
    assert "| 2.00× persist-queue," in _row(table, "b")
    assert "| 2.00× persist-queue," in _row(table, "e")


def test_the_date_and_machine_come_from_the_run():
    report = copy.deepcopy(_recorded())
    report["machine"].update(date="2031-02-03T04:05:06+00:00", cpu_count=64,
                             cpu_model="Some CPU")
    head = current.results_table(report)[0]
    assert head.startswith("Measured 2031-02-03 (04:05 UTC), 64 CPUs (Some CPU)")
    assert "2031-02-03T04:05:06" in "\n".join(current.current_run(report))


def test_only_the_marked_block_changes():
    text = "before\n<!-- results:begin -->\nstale\n<!-- results:end -->\nafter  \n"
    new = current.replace_block(text, current.RESULTS, ["one", "two"])
    assert new == "before\n<!-- results:begin -->\none\ntwo\n<!-- results:end -->\nafter  \n"
    assert current.replace_block(new, current.RESULTS, ["one", "two"]) == new


@pytest.mark.parametrize("text", [
    "no markers at all\n",
    "<!-- results:begin -->\nonly a beginning\n",
    "<!-- results:end -->\nthe end first\n<!-- results:begin -->\n",
    "<!-- results:begin -->\n<!-- results:end -->\n<!-- results:begin -->\n"
    "<!-- results:end -->\n",
])
def test_markers_missing_repeated_or_out_of_order_are_refused(text):
    with pytest.raises(ValueError, match="expected one <!-- results:begin -->"):
        current.replace_block(text, current.RESULTS, ["x"])


def _report_command(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", "--report", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_the_report_command_writes_every_marked_block_and_check_finds_drift(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "results.json").write_text(_read("benchmarks", "results", "results.json"))
    doc = tmp_path / "doc.md"
    stale = ("# A page\n<!-- current-run:begin -->\nold\n<!-- current-run:end -->\n"
             "between\n<!-- results:begin -->\nold\n<!-- results:end -->\nend\n")
    doc.write_text(stale)
    plain = tmp_path / "plain.md"
    plain.write_text("nothing marked\n")

    done = _report_command("--out", str(out), "--into", str(doc), "--into", str(plain),
                           "--check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{doc}: would change" in done.stdout
    assert f"{plain}: no markers, left alone" in done.stdout
    assert doc.read_text() == stale

    done = _report_command("--out", str(out), "--into", str(doc), "--into", str(plain))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{doc}: updated" in done.stdout
    written = doc.read_text()
    assert written == current.render(stale, _recorded(), f"{out}/results.json")
    assert f"from {out}/results.json: edit the suite" in written
    assert written.startswith("# A page\n<!-- current-run:begin -->\n## The current run\n")
    assert "\n<!-- current-run:end -->\nbetween\n<!-- results:begin -->\nMeasured " in written
    assert written.endswith("<!-- results:end -->\nend\n")
    assert plain.read_text() == "nothing marked\n"

    done = _report_command("--out", str(out), "--into", str(doc), "--check")
    assert done.returncode == 0 and f"{doc}: up to date" in done.stdout


def test_the_report_command_says_what_is_wrong_with_a_broken_file(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- results:begin -->\nno end\n")
    done = _report_command("--into", str(doc))
    assert done.returncode == 2
    assert "expected one <!-- results:begin --> followed by one <!-- results:end -->" \
        in done.stderr
