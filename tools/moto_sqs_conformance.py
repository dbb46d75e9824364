"""Run moto's own SQS tests (from moto's source repository, in moto's server mode) against
``ackqueue serve`` and report how many pass and why each other one fails.

    python tools/moto_sqs_conformance.py --moto-src PATH [--out DIR] [-k EXPR]

PATH is a checkout of https://github.com/getmoto/moto (a work tree, or a git directory:
its HEAD is read with ``git archive``).  Only its ``tests/`` files are used, never copied
into this repository.  Needs ``pip install -e ".[bench]" freezegun`` (moto, boto3 and
freezegun, which moto's tests import).

How: moto's ``@mock_aws`` in server mode (TEST_SERVER_MODE=true) points every boto3
client at TEST_SERVER_MODE_ENDPOINT, here a fresh ``ackqueue serve --memory`` on a free
loopback port with ACKQUEUE_SQS_ACCOUNT=123456789012 (the account moto's tests expect in
URLs and ARNs).  moto's reset call (POST /moto-api/reset) gets a 404 and is ignored by
moto, so the queues of one test stay for the next (moto's tests name their queues
uniquely).  Writes DIR/moto_sqs.md and DIR/moto_sqs.json: counts, and every failure with
the first lines of its error.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import io
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
FILES = ["tests/__init__.py", "tests/conftest.py", "tests/markers.py", "tests/test_sqs"]
TEST_FILES = ["tests/test_sqs/test_sqs.py", "tests/test_sqs/test_sqs_message_attributes.py"]


def extract(src, dest):
    """moto's test files from src (a work tree or a git directory) into dest."""
    if os.path.isdir(os.path.join(src, "tests", "test_sqs")):
        for f in FILES:
            s = os.path.join(src, f)
            d = os.path.join(dest, f)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            (shutil.copytree if os.path.isdir(s) else shutil.copy)(s, d)
        return
    data = subprocess.run(["git", "--git-dir", src, "archive", "HEAD", *FILES],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest)


def failures(junit):
    """[(test id, outcome, message)] of a junit XML file, and the count of passes."""
    root = ET.parse(junit).getroot()
    out, passed = [], 0
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = [c for c in case if c.tag in ("failure", "error", "skipped")]
        if not bad:
            passed += 1
            continue
        c = bad[0]
        text = (c.get("message") or c.text or "").strip()
        out.append((name, c.tag, "\n".join(text.splitlines()[:3])[:500]))
    return out, passed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--moto-src", required=True)
    p.add_argument("--out", default="conformance-results")
    p.add_argument("-k", default=None, help="pytest -k expression")
    args = p.parse_args(argv)
    from service_proc import Service
    work = tempfile.mkdtemp(prefix="moto-sqs-")
    os.makedirs(args.out, exist_ok=True)
    os.environ["ACKQUEUE_SQS_ACCOUNT"] = "123456789012"
    service = None
    try:
        extract(args.moto_src, work)
        service = Service(None, os.path.join(work, "service.log"))
        env = dict(os.environ, TEST_SERVER_MODE="true", TEST_SERVER_MODE_ENDPOINT=service.url,
                   AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_DEFAULT_REGION="us-east-1")
        junit = os.path.join(work, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", f"--junitxml={junit}", "--timeout=120", *TEST_FILES]
        if args.k:
            cmd += ["-k", args.k]
        subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL)
        failed, passed = failures(junit)
    finally:
        if service is not None:
            service.stop()
    total = passed + len(failed)
    doc = {"passed": passed, "total": total,
           "failed": [{"test": t, "outcome": o, "message": m} for t, o, m in failed]}
    with open(os.path.join(args.out, "moto_sqs.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = [f"# moto's SQS tests against ackqueue serve: {passed} of {total} pass", "",
             "| test | outcome | error (first lines) |", "|---|---|---|"]
    for t, o, m in failed:
        lines.append(f"| {t.rsplit('::', 1)[-1]} | {o} | "
                     f"{re.sub(r'[|]', '/', m).replace(chr(10), ' ')[:300]} |")
    with open(os.path.join(args.out, "moto_sqs.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{passed} of {total} of moto's SQS tests pass; see {args.out}/moto_sqs.md")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
