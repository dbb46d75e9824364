"""put(attributes=...): string attributes returned on the message, copied at put, at most
ten, bad ones refused with nothing put, kept across a reopen.

Each test runs on a memory queue and a file queue (the ``env`` fixture,
tests/conftest.py), with reopen checks for the file where persistence matters.
"""
import pytest

from ackqueue import AckQueue

from queue_env import count, counts_of


def test_attributes_are_returned_on_the_message(env):
    q = env.open()
    attrs = {"trace": "abc", "kind": "email"}
    q.put("with", attributes=attrs)
    q.put("without")
    m = q.get_message()
    assert m.attributes == {"trace": "abc", "kind": "email"}
    assert isinstance(m.attributes, dict)
    n = q.get_message()
    assert n.attributes == {} and isinstance(n.attributes, dict)


def test_attributes_are_copied_at_put(env):
    q = env.open()
    attrs = {"k": "v"}
    q.put("x", attributes=attrs)
    attrs["k"] = "changed"
    attrs["new"] = "key"
    assert q.get_message().attributes == {"k": "v"}


def test_ten_attributes_are_allowed(env):
    q = env.open()
    attrs = {f"k{i}": f"v{i}" for i in range(10)}
    q.put("x", attributes=attrs)
    assert q.get_message().attributes == attrs


@pytest.mark.parametrize("attrs,exc", [
    ({f"k{i}": "v" for i in range(11)}, ValueError),
    ({1: "v"}, TypeError),
    ({"k": 1}, TypeError),
    ({"k": None}, TypeError),
    ({"k": b"v"}, TypeError),
    ([("k", "v")], TypeError),
    ("k=v", TypeError),
])
def test_bad_attributes_are_refused_and_nothing_is_put(env, attrs, exc):
    q = env.open()
    with pytest.raises(exc):
        q.put("x", attributes=attrs)
    with pytest.raises(exc):
        q.put_many(["x", "y"], attributes=attrs)
    assert counts_of(q) == count() and q.unfinished_tasks == 0


def test_attributes_survive_reopen(tmp_path):
    path = tmp_path / "attrs.fs"
    with AckQueue(path=path) as q:
        q.put("x", attributes={"a": "1", "b": "2"})
        q.put("y")
    with AckQueue(path=path) as q:
        x, y = q.get_message(), q.get_message()
        assert x.attributes == {"a": "1", "b": "2"}
        assert y.attributes == {}
