"""The long poll's wake-up (ackqueue.service.waker.Waker) on a real asyncio loop.  Bounds
are failure limits only (asyncio.wait_for around each wait), never asserted durations."""
import asyncio

from ackqueue.service.waker import Waker

BOUND = 30.0          # a wait that should end at once fails the test after this long


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, BOUND))


def test_a_set_before_the_wait_returns_at_once_until_cleared():
    async def main():
        w = Waker(asyncio.get_running_loop())
        w.set()
        await w.wait(3600)              # returns at once: the set is remembered
        assert w.is_set()
        w.clear()
        assert not w.is_set()
        await w.wait(0)                 # cleared: only the (zero) timeout ends it
        assert not w.is_set()
    run(main())


def test_a_set_from_another_task_ends_the_wait():
    async def main():
        loop = asyncio.get_running_loop()
        w = Waker(loop)
        loop.call_soon(w.set)
        await w.wait(3600)
        assert w.is_set()
    run(main())


def test_a_cancelled_wait_leaves_nothing_behind_and_the_waker_works_again():
    async def main():
        loop = asyncio.get_running_loop()
        w = Waker(loop)
        task = asyncio.ensure_future(w.wait(3600))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled()
        w.set()                          # no future left to resolve: no error
        await w.wait(3600)
    run(main())
