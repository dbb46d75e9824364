"""Reading a queue others write: AckQueue(allowed_classes=...) limits
what a pickled item may name, and an item naming anything else is refused without running
any of it.  Real storages: in memory and on a file."""
import datetime
import pathlib
import pickle

import pytest

from ackqueue import AckPriorityQueue, AckQueue, AckQueueError, ForbiddenClass


@pytest.fixture(params=["memory", "file"])
def where(request, tmp_path):
    return None if request.param == "memory" else str(tmp_path / "q.fs")


class Exploit:
    """What a hostile producer puts: unpickling it touches a file (any code could run)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_an_item_naming_a_class_not_allowed_is_refused_and_never_runs(where, tmp_path):
    witness = tmp_path / "ran"
    with AckQueue(path=where, name="jobs") as producer:
        producer.put_many([pickle.dumps(Exploit(str(witness))), pickle.dumps({"ok": [1]})],
                          encoded=True)
        consumer = AckQueue(db=producer.db, name="jobs", allowed_classes=[])
        with pytest.raises(AckQueueError) as caught:
            consumer.get(block=False)
        assert isinstance(caught.value.__cause__, ForbiddenClass)
        assert "pathlib.Path.touch" in str(caught.value) or "Path" in str(caught.value)
        assert not witness.exists(), "nothing of the refused item ran"
        assert consumer.get(block=False) == {"ok": [1]}    # plain data needs no entry
        consumer.task_done()
        [m] = [m for m in consumer.browse() if m.state == "delayed"]   # set aside
        with pytest.raises(ForbiddenClass):
            m.item
        assert not witness.exists()
        consumer.close()


def test_allowed_classes_let_their_items_through(where):
    when = datetime.datetime(2026, 11, 25, 9, 30)
    with AckQueue(path=where, allowed_classes=[datetime.datetime, "datetime.date"]) as q:
        q.put_many([when, when.date(), {"plain": (1, 2.5, None, True, b"x", {3})}])
        assert q.get(block=False) == when
        assert q.get(block=False) == when.date()
        assert q.get(block=False)["plain"][-1] == {3}
        for _ in range(3):
            q.task_done()


def test_a_bad_allow_list_is_refused():
    with pytest.raises(TypeError):
        AckQueue(allowed_classes="datetime.datetime")
    with pytest.raises(ValueError):
        AckQueue(allowed_classes=["datetime"])


class Witnessed:
    """An orderable item whose unpickling leaves a trace (any code could run there)."""

    def __init__(self, path):
        self.path = path

    def __setstate__(self, state):
        self.__dict__.update(state)
        pathlib.Path(state["path"]).touch()

    def __lt__(self, other):
        return False

    def __gt__(self, other):
        return False


def test_a_priority_queue_orders_without_running_a_forbidden_item(tmp_path):
    """A priority queue reads its items to order them when it opens: with an allow-list,
    a forbidden item is ordered without being unpickled, and refused when received."""
    path = str(tmp_path / "p.fs")
    witness = tmp_path / "ran"
    with AckPriorityQueue(path=path) as q:      # a trusted producer (it reads its items)
        q.put(Witnessed(str(witness)), priority=900)
        q.put_many([3, 1])
    witness.unlink()
    with AckPriorityQueue(path=path, allowed_classes=[]) as q:
        assert not witness.exists(), "opening ordered it without unpickling it"
        with pytest.raises(AckQueueError) as caught:
            q.get(block=False)                               # the highest priority first
        assert isinstance(caught.value.__cause__, ForbiddenClass)
        assert [q.get(block=False), q.get(block=False)] == [1, 3]
        q.task_done()
        q.task_done()
    assert not witness.exists(), "nothing of the refused item ran"
