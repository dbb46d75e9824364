"""Fixtures more than one test module uses."""
import pytest

from queue_env import Env


@pytest.fixture
def own_service(tmp_path):
    """start(*extra) -> a real ``ackqueue serve`` on tmp_path/q.fs (tests/service_proc.py),
    killed at the end of the test if it still runs."""
    from service_proc import Service
    started = []

    def start(*extra):
        s = Service(tmp_path / "q.fs", tmp_path / "service.log", *extra)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.kill()


@pytest.fixture
def server(tmp_path):
    """A real ``ackqueue server`` (ZEO) on tmp_path/shared.fs and a free loopback port
    (tests/zeo_server.py), stopped with SIGTERM at the end of the test."""
    from zeo_server import Server
    srv = Server(tmp_path / "shared.fs", tmp_path / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(params=["memory", "file"])
def env(request, tmp_path):
    """A queue maker on one backend (tests/queue_env.py's Env): a test using it runs once
    in memory and once on a file."""
    e = Env(request.param, tmp_path)
    yield e
    e.teardown()
