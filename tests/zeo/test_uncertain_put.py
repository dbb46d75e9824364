"""A put whose commit was cut off after it reached the server: the client
retries it once the connection is back, and the store recognises the retry by the put's
idempotency token, so the item is stored once, never twice.

The cut is real: a TCP proxy, run in this test between the client and a real `ackqueue
server`, forwards every byte until the client asks the server to finish a commit
(tpc_finish), then drops the connection before the server's answer reaches the client.
The server has committed; the client cannot know it.
"""

import pytest

from ackqueue import AckQueue, Empty

from cutting_proxy import CuttingProxy

WAIT = 30


@pytest.mark.parametrize("how", ["put", "put_many", "transaction"])
def test_a_put_cut_off_after_it_reached_the_server_is_stored_once(server, how):
    proxy = CuttingProxy(server.port, marker=b"tpc_finish")
    try:
        url = f"zeo://127.0.0.1:{proxy.port}?lease_timeout=600&wait_timeout={WAIT}"
        with AckQueue(path=url, name="jobs") as q:
            q.put("warm-up")                      # the queue exists; the proxy is idle
            assert q.get(timeout=WAIT) == "warm-up"
            q.task_done()
            proxy.armed.set()
            if how == "put":
                q.put("once")
            elif how == "put_many":
                q.put_many(["once", "twice-not"])
            else:
                with q.transaction():
                    q.put("once")
            assert proxy.cuts == 1, "the commit's answer was cut off"
        expected = ["once", "twice-not"] if how == "put_many" else ["once"]
        with AckQueue(path=server.url, name="jobs") as q:   # around the proxy
            got = []
            while True:
                try:
                    got.append(q.get(timeout=1))
                    q.task_done()
                except Empty:
                    break
            assert got == expected
    finally:
        proxy.close()


def test_put_tokens_are_unique_across_processes_and_ascend_within_one():
    """Tokens ascend within a process (each producer adds to its own part of the store's
    token table) and differ between processes, a forked child included."""
    import os

    from ackqueue.arbiters.shared import PutTokens

    tokens = PutTokens()
    mine = [tokens.next() for _ in range(300)]
    assert mine == sorted(mine) and len(set(mine)) == 300
    assert all(len(token) == 16 for token in mine)
    other = PutTokens().next()
    assert other[:8] != mine[0][:8], "another process's (another arbiter's) prefix"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: its next token, then out
        try:
            os.write(write, tokens.next())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child[:8] != mine[0][:8], "a forked child makes its own prefix"
    assert tokens.next()[:8] == mine[0][:8]

