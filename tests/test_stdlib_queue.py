"""The running Python's own Lib/test/test_queue.py, run against the three drop-ins.

QueueTest, LifoQueueTest and PriorityQueueTest are the standard library's classes, unchanged;
only the queue module they test is replaced by a namespace whose Queue, LifoQueue and
PriorityQueue are AckQueue, AckLifoQueue and AckPriorityQueue (named like the stdlib classes,
because the tests look at the class name), in memory and on a fresh FileStorage file."""
import os
import queue
import shutil
import tempfile
import types
import unittest

import pytest

import ackqueue

try:
    from test import test_queue as stdlib
except ImportError:  # pragma: no cover - depends on how Python was installed
    stdlib = None

pytestmark = pytest.mark.skipif(
    stdlib is None, reason="this Python ships no 'test' package (Lib/test/test_queue.py); "
                           "install the python3-test/libpython3-testsuite package to run it")

DROP_INS = {"Queue": ackqueue.AckQueue, "LifoQueue": ackqueue.AckLifoQueue,
            "PriorityQueue": ackqueue.AckPriorityQueue}


class _Opened:
    """Remembers the queues a test made, so tearDown can close them."""

    def __init__(self):
        self.queues = []
        self.directory = None

    def kwargs(self, on_file):
        if not on_file:
            return {}
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="ackqueue-stdlib-")
        return {"path": os.path.join(self.directory, f"q{len(self.queues)}.fs")}

    def close(self):
        for q in self.queues:
            q.close()
        self.queues.clear()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def _namespace(on_file, opened):
    ns = types.SimpleNamespace(Empty=queue.Empty, Full=queue.Full, ShutDown=ackqueue.ShutDown)
    for stdlib_name, cls in DROP_INS.items():
        def __init__(self, maxsize=0, _cls=cls):
            _cls.__init__(self, maxsize, **opened.kwargs(on_file))
            opened.queues.append(self)
        setattr(ns, stdlib_name, type(stdlib_name, (cls,), {"__init__": __init__}))
    return ns


def _make(base, on_file):
    class Case(base, unittest.TestCase):
        def setUp(self):
            self.opened = _Opened()
            self.queue = _namespace(on_file, self.opened)
            super().setUp()

        def tearDown(self):
            self.opened.close()
            super().tearDown()

    where = "File" if on_file else "Memory"
    Case.__name__ = Case.__qualname__ = f"{where}{base.__name__}"
    return Case


if stdlib is not None:
    MemoryQueueTest = _make(stdlib.QueueTest, on_file=False)
    MemoryLifoQueueTest = _make(stdlib.LifoQueueTest, on_file=False)
    MemoryPriorityQueueTest = _make(stdlib.PriorityQueueTest, on_file=False)
    FileQueueTest = _make(stdlib.QueueTest, on_file=True)
    FileLifoQueueTest = _make(stdlib.LifoQueueTest, on_file=True)
    FilePriorityQueueTest = _make(stdlib.PriorityQueueTest, on_file=True)
