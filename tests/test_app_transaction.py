"""A queue in the application's own database: transaction.manager blocks govern it.

Real FileStorage files, real ZODB transactions; the application's object change and the
queue's operations must commit or roll back as one."""
import os

import pytest
import transaction
import ZODB
from ZODB.FileStorage import FileStorage

import ackqueue


@pytest.fixture
def app(tmp_path):
    db = ZODB.DB(FileStorage(os.path.join(tmp_path, "app.fs")))
    conn = db.open()
    conn.root()["done"] = 0
    transaction.commit()
    q = ackqueue.AckQueue(db=db, name="jobs")
    yield db, conn, q
    transaction.abort()
    q.close()
    conn.close()
    db.close()


def test_commit_joins_the_application_transaction(app):
    db, conn, q = app
    q.put("a")
    q.put("b")
    with transaction.manager:
        x = q.get()
        conn.root()["done"] += 1
        q.put("child-of-" + x)
        assert q.qsize() == 1            # the child is not visible before the commit
    assert x == "a"
    assert conn.root()["done"] == 1
    assert q.unfinished_tasks == 2       # "a" acknowledged by the commit, its child added
    assert [q.get_nowait(), q.get_nowait()] == ["b", "child-of-a"]


def test_exception_rolls_back_both(app):
    db, conn, q = app
    q.put("a")
    q.put("b")
    with pytest.raises(RuntimeError):
        with transaction.manager:
            assert q.get() == "a"
            conn.root()["done"] += 1
            q.put("never")
            raise RuntimeError("worker failed")
    assert conn.root()["done"] == 0
    assert q.unfinished_tasks == 2
    assert q.get_message().body == "a"          # back at its original place
    assert q.get_nowait() == "b"
    with pytest.raises(ackqueue.Empty):
        q.get_nowait()


def test_attempts_and_reopen(app, tmp_path):
    db, conn, q = app
    for i in range(3):
        q.put(i)
    for attempt in transaction.manager.attempts():
        with attempt:
            item = q.get()
            conn.root()["done"] += item + 10
    assert conn.root()["done"] == 10
    q.close()
    conn.close()
    db.close()
    db2 = ZODB.DB(FileStorage(os.path.join(tmp_path, "app.fs")))
    try:
        q2 = ackqueue.AckQueue(db=db2, name="jobs")
        assert q2.unfinished_tasks == 2
        assert [q2.get_nowait(), q2.get_nowait()] == [1, 2]
        assert db2.open().root()["done"] == 10
        q2.close()
    finally:
        db2.close()


def test_outside_a_transaction_operations_commit_at_once(app):
    db, conn, q = app
    q.put("x")                      # no transaction in progress: durable on return
    other = db.open(transaction_manager=transaction.TransactionManager())
    rec = other.root()["ackqueue"].queues["jobs"]
    assert len(rec.messages) == 1
    other.close()


def test_a_savepoint_rolled_back_undoes_the_batches_put_after_it(app):
    """A batch is one store operation (a PutRun) for several messages: rolling back to a
    savepoint drops the batches put after it, message for message."""
    db, conn, q = app
    with transaction.manager as txn:
        q.put_many(["a", "b", "c"])
        conn.root()["done"] += 1
        savepoint = txn.savepoint()
        q.put_many(["d", "e"])
        q.put("f")
        conn.root()["done"] += 1
        savepoint.rollback()
        q.put_many(["g", "h"])
    assert conn.root()["done"] == 1
    assert q.unfinished_tasks == 5
    assert q.get_many(10, timeout=1) == ["a", "b", "c", "g", "h"]
