"""Two connections of one ZODB database, each with its own transaction, on one object of
its root: for tests of concurrent commits that merge (or conflict)."""
import contextlib

import transaction


@contextlib.contextmanager
def two_connections(db, key):
    """[(transaction manager, root[key] as its connection sees it)] for two connections;
    db is closed at the end."""
    managers = [transaction.TransactionManager() for _ in range(2)]
    conns = [db.open(transaction_manager=tm) for tm in managers]
    try:
        yield [(tm, conn.root()[key]) for tm, conn in zip(managers, conns)]
    finally:
        for tm in managers:
            tm.abort()
        db.close()


def keys_after(pair):
    """The keys of one side's object, read in a new transaction (after both committed)."""
    tm, index = pair
    tm.begin()
    return list(index)
