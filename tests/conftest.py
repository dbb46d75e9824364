"""Fixtures more than one test module uses."""
import pytest


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
