"""README.md is a user's guide: at most 450 lines, no history (commit hashes, issue
numbers, load averages), one results table between its markers, set-up commands that are
the ones CI and setup.py make true; and every relative link of README and the docs pages
it leads to names a file that exists, and a heading that exists in it."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 450
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# A word of 7 to 40 hex digits with at least one digit and one letter: an abbreviated or
# full commit hash (English words such as "effaced" have no digit; numbers have no letter).
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.IGNORECASE)
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def read(relative):
    with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
        return f.read()


def readme():
    return read("README.md")


def owned_pages():
    """README and the docs pages written as the user's guide (docs/benchmarks*.md are the
    benchmark suite's own pages)."""
    docs = sorted(f for f in os.listdir(os.path.join(ROOT, "docs"))
                  if f.endswith(".md") and not f.startswith("benchmarks"))
    return ["README.md"] + [os.path.join("docs", f) for f in docs]


def test_readme_is_at_most_450_lines():
    lines = readme().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, at most {MAX_LINES}"


@pytest.mark.parametrize("pattern, what", [(HASH, "a commit hash"), (ISSUE, "an issue number"),
                                           (re.compile("load average", re.I), "a load note")],
                         ids=["hashes", "issues", "load"])
def test_readme_carries_no_history(pattern, what):
    found = [(n, line) for n, line in enumerate(readme().splitlines(), 1)
             if pattern.search(line)]
    assert not found, f"README.md has {what} on: {found}"


def test_the_history_patterns_catch_what_they_should():
    assert HASH.search("at 468eaa9 the run") and HASH.search("ackqueue at git 468eaa939b")
    assert not HASH.search("1000000 items, effaced, 2026-11-27, 0xff")
    assert ISSUE.search("issue 28 asks") and ISSUE.search("Issues 22 and 23")
    assert not ISSUE.search("an issue numbers")


def test_one_results_table_between_the_markers():
    text = readme()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", table), "the run's date"
    rows = [line for line in table.splitlines() if line.startswith("| (")]
    assert len(rows) >= 5, table
    # Outside the table no line states a rate of the kind the table holds.
    outside = text.replace(table, "")
    assert not re.search(r"\d[\d,.]* (items|messages|cycles)/s\b", outside)


def test_the_setup_commands_are_the_ones_ci_and_setup_py_make_true():
    text = readme()
    section = text[text.index("## Set up on a fresh machine"):text.index("\n## ", text.index(
        "## Set up on a fresh machine") + 1)]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert commands == ['python -m pip install -e . && ackqueue demo',
                        'python -m pip install -e ".[test]" && python -m pytest -q'], commands
    assert commands[1] in read(".ci/run")               # CI runs README's test command
    setup = read("setup.py")
    assert '"ackqueue=ackqueue.cli:main"' in setup       # the console script of the demo
    assert re.search(r'"test": \[[^]]*"pytest', setup)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(relative):
    text = re.sub(r"```.*?```", "", read(relative), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", owned_pages())
def test_every_relative_link_names_a_file_and_a_heading_that_exist(page):
    text = re.sub(r"```.*?```", "", read(page), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (os.path.normpath(os.path.join(os.path.dirname(page), path)) if path
                    else page)
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{page}: links to nothing: {broken}"


def test_the_link_checker_sees_a_broken_link():
    assert "a-zeo-server-ackqueue-server-and-zeo" == slug(
        "A ZEO server: `ackqueue server` and `zeo://`")
    assert "no-such-heading" not in anchors("README.md")
