"""Shared helpers of the reliability tests (test_model, test_torn_writes, test_bad_input,
test_thread_safety): a fake clock, draining, child processes, and the long-run switch.

ACKQUEUE_LONG=1 in the environment turns the CI-sized defaults into long runs (many more
hypothesis examples, every cut offset, more operations per thread)."""
import os
import subprocess
import sys
import textwrap
import threading

from ackqueue import Empty

LONG = os.environ.get("ACKQUEUE_LONG", "") not in ("", "0")
BOUND = 10          # seconds: a failure bound for waits that should end at once
CHILD_TIMEOUT = 120  # seconds: a failure bound for child processes


class FakeClock:
    """A clock the test advances by hand; thread-safe."""

    def __init__(self, now=1_000_000.0):
        self.now = now
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            return self.now

    def advance(self, seconds):
        with self.lock:
            self.now += seconds
            return self.now


def drain_messages(q):
    """get_message() until Empty; returns the messages (still held, not acknowledged)."""
    messages = []
    while True:
        try:
            messages.append(q.get_message(block=False))
        except Empty:
            return messages


def drain_items(q):
    """get() until Empty; returns the items (still held)."""
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except Empty:
            return items


def run_child(script, *args, timeout=CHILD_TIMEOUT):
    """Run ``python -c script *args`` and return the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
