"""The running Python's own Lib/test/test_queue.py, run against the three drop-ins.

QueueTest, LifoQueueTest and PriorityQueueTest are the standard library's classes, unchanged;
only the queue module they test is replaced by a namespace whose Queue, LifoQueue and
PriorityQueue are AckQueue, AckLifoQueue and AckPriorityQueue (named like the stdlib classes,
because the tests look at the class name), in memory, on a fresh FileStorage file, and
through a queue server (``ackqueue server``, started for this module; each queue is a new
named queue on it), and through the queue service (``ackqueue serve``, started for this
module; each queue a new name, AckQueue(path="http://...")), and on a file a child
process holds (each queue a new name of it, opened here as a client of that process).
Through the service only
QueueTest runs: the service opens FIFO queues, so AckLifoQueue and AckPriorityQueue over
http raise NotSupported by design (LIFO order and ordering by item value are not offered
there: the service never unpickles items to compare them)."""
import itertools
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

import pytest

import ackqueue

from service_proc import Service
from zeo_server import Server

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

    def kwargs(self, where):
        if where == "Memory":
            return {}
        if where == "Server":
            return {"path": _server().url, "name": f"q{next(_names)}"}
        if where == "Remote":
            return {"path": _service().url, "name": f"q{next(_names)}"}
        if where == "SharedFile":
            return {"path": _holder(), "name": f"q{next(_names)}"}
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


_names = itertools.count()
_servers = []
_server_dir = []


def _server():
    if not _servers:
        _server_dir.append(tempfile.mkdtemp(prefix="ackqueue-stdlib-server-"))
        _servers.append(Server(os.path.join(_server_dir[0], "shared.fs"),
                               os.path.join(_server_dir[0], "server.log")))
    return _servers[0]


_services = []


def _service():
    if not _services:
        if not _server_dir:
            _server_dir.append(tempfile.mkdtemp(prefix="ackqueue-stdlib-server-"))
        _services.append(Service(os.path.join(_server_dir[0], "service.fs"),
                                 os.path.join(_server_dir[0], "service.log")))
    return _services[0]


_holders = []
HOLDER = """
import sys
from ackqueue import AckQueue
q = AckQueue(path=sys.argv[1], name="held")
print("open", flush=True)
sys.stdin.readline()
q.close()
"""


def _holder():
    """The path of a file another process (a child, for this module) holds and shares:
    every queue of it opened here is a client of that process (ackqueue.shared)."""
    if not _holders:
        if not _server_dir:
            _server_dir.append(tempfile.mkdtemp(prefix="ackqueue-stdlib-server-"))
        path = os.path.join(_server_dir[0], "held.fs")
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "open"
        _holders.append((proc, path))
    return _holders[0][1]


def teardown_module():
    for proc, _ in _holders:
        ackqueue.database._close_all()       # clients first
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
    for svc in _services:
        assert svc.stop() == 0
    for srv in _servers:
        ackqueue.database._close_all()       # clients first, so the server stops cleanly
        assert srv.stop() == 0
    for directory in _server_dir:
        shutil.rmtree(directory, ignore_errors=True)


def _namespace(where, opened):
    ns = types.SimpleNamespace(Empty=queue.Empty, Full=queue.Full, ShutDown=ackqueue.ShutDown)
    for stdlib_name, cls in DROP_INS.items():
        def __init__(self, maxsize=0, _cls=cls):
            _cls.__init__(self, maxsize, **opened.kwargs(where))
            opened.queues.append(self)
        setattr(ns, stdlib_name, type(stdlib_name, (cls,), {"__init__": __init__}))
    return ns


def _make(base, where):
    class Case(base, unittest.TestCase):
        def setUp(self):
            self.opened = _Opened()
            self.queue = _namespace(where, self.opened)
            super().setUp()

        def tearDown(self):
            self.opened.close()
            super().tearDown()

    Case.__name__ = Case.__qualname__ = f"{where}{base.__name__}"
    return Case


if stdlib is not None:
    for _where in ("Memory", "File", "Server"):
        for _base in (stdlib.QueueTest, stdlib.LifoQueueTest, stdlib.PriorityQueueTest):
            _case = _make(_base, _where)
            globals()[_case.__name__] = _case
    # The service opens FIFO queues only (see the module docstring).
    _case = _make(stdlib.QueueTest, "Remote")
    globals()[_case.__name__] = _case
    # A file another process holds: FIFO and LIFO (ordering by item value would make the
    # holder unpickle items).
    for _base in (stdlib.QueueTest, stdlib.LifoQueueTest):
        _case = _make(_base, "SharedFile")
        globals()[_case.__name__] = _case
    del _where, _base, _case
