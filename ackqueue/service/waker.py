"""A long poll's wake-up (ackqueue.service.runtime.Api.poll), lighter than asyncio.Event.

``asyncio.wait_for(event.wait(), t)`` resumes its waiter three loop iterations after
``event.set()`` on Python 3.11 (wait_for wraps event.wait() in a task; the task's step,
its done callback, then the waiting coroutine), and each iteration can be queued behind
other requests' work on a busy loop.  A Waker's ``wait(t)`` awaits a bare future that
``set()`` resolves: the poll resumes in the next iteration.  Same interface as the
Event the poll used (set, clear, and the set of waiters the stats count).
Loop thread only.
"""
__all__ = ["Waker"]


def _release(fut):
    if not fut.done():
        fut.set_result(None)


class Waker:
    __slots__ = ("loop", "_fut", "_set")

    def __init__(self, loop):
        self.loop = loop
        self._fut = None
        self._set = False

    def set(self):
        self._set = True
        if self._fut is not None:
            _release(self._fut)

    def clear(self):
        self._set = False

    def is_set(self):
        return self._set

    async def wait(self, timeout):
        """Until set() (returns at once if it was since the last clear()) or timeout
        seconds."""
        if self._set:
            return
        self._fut = fut = self.loop.create_future()
        handle = self.loop.call_later(timeout, _release, fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._fut = None
