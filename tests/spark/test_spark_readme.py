"""README's Spark snippet ("Spark: a queue as a stream") is examples/spark_stream.py, code
for code, and that file runs as written, start to end, on a real local Spark (local[2])
against a real ``ackqueue serve`` on a free port, as a driver process of its own."""
import base64
import os
import shutil
import signal
import subprocess
import sys

import pytest

from service_proc import Service

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "spark_stream.py")
LIMIT = 300         # failure bound only (Spark is slow on a loaded machine)


def readme_snippet():
    """The first python code block of README's section "Spark: a queue as a stream"."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("\n## Spark: a queue as a stream\n"):]
    start = section.index("\n```python\n") + len("\n```python\n")
    return section[start:section.index("\n```\n", start) + 1]


def test_the_readme_snippet_is_the_example_file():
    with open(EXAMPLE, encoding="utf-8") as f:
        assert readme_snippet() == f.read()


@pytest.mark.timeout(LIMIT + 60)
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="no Java runtime (java on PATH or JAVA_HOME): Spark cannot start")
def test_the_example_runs_as_written_against_a_real_service(tmp_path):
    pytest.importorskip("pyspark")
    from ackqueue import AckQueue
    from ackqueue.spark.client import Client
    service = Service(tmp_path / "jobs.fs", tmp_path / "service.log")
    # The script's own ``import ackqueue.spark`` points Spark's workers at this Python.
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["ACKQUEUE_URL"] = service.url
    try:
        driver = subprocess.Popen([sys.executable, EXAMPLE], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=open(tmp_path / "driver.log",
                                                                      "wb"),
                                  text=True, start_new_session=True)
        try:
            out, _ = driver.communicate(timeout=LIMIT)
        finally:
            if driver.poll() is None:         # its JVM and Python workers with it
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
        # The snapshot it printed, and what is in the queues: each row written once (in
        # the order of Spark's two partitions), and every message read acknowledged.
        rows = [tuple(c.strip() for c in line.split("|")[1:3])
                for line in out.splitlines() if line.startswith("|")]
        assert rows[0] == ("text", "state"), out
        assert sorted(rows[1:]) == [("FIRST", "ready"), ("SECOND", "ready"),
                                    ("THIRD", "ready")], out
        page = Client(service.url).browse("results")
        assert sorted(base64.b64decode(m["body"]).decode() for m in page["messages"]) == [
            "FIRST", "SECOND", "THIRD"]
        stats = AckQueue(path=service.url, name="events").stats()
        assert stats["acked"] == 3 and stats["ready"] == stats["in_flight"] == 0, stats
    finally:
        assert service.stop() == 0
