"""The constructor's feature keywords (lifo, max_receives, dead_letter, retention,
dedup_window, autopack, clock): accepted together, bad policies refused.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from helpers_reliability import FakeClock
from queue_env import MAX_RETENTION


def test_constructor_accepts_every_new_keyword(env):
    q = env.open(name="main", shared=True, lifo=False, max_receives=3, dead_letter="dlq",
                 retention=60, dedup_window=10, autopack=None, clock=FakeClock())
    q.put("x")
    assert q.get() == "x"


@pytest.mark.parametrize("kwargs,exc", [
    ({"retention": MAX_RETENTION + 1}, ValueError),
    ({"retention": 0}, ValueError),
    ({"retention": -5}, ValueError),
    ({"max_receives": 0}, ValueError),
    ({"max_receives": -1}, ValueError),
    ({"max_receives": "2"}, (TypeError, ValueError)),
    ({"max_receives": 1.5}, (TypeError, ValueError)),
    ({"dead_letter": "default"}, ValueError),                 # its own name
    ({"name": "jobs", "dead_letter": "jobs"}, ValueError),
])
def test_constructor_rejects_bad_policies(env, kwargs, exc):
    with pytest.raises(exc):
        env.open(**kwargs)


def test_constructor_accepts_the_longest_retention(env):
    q = env.open(retention=MAX_RETENTION)
    q.put("x")
    assert q.qsize() == 1
