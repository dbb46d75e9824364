"""From the committer's thread back to the event loop: the library's non-blocking seam
(``put_many(then=...)``, ``ack_many(then=...)``) as awaitables.

A put or an ack submitted from the loop returns at once; its ``then(error)`` runs in the
committer's thread when the commit is durable (or failed).  ``Bridge`` turns each into an
asyncio future, and wakes the loop once per burst of outcomes, not once per outcome: the
tickets of one group commit settle one after the other in the committer's thread, so the
first schedules a drain (one ``call_soon_threadsafe``, one write to the loop's self-pipe)
and the rest only append to the list it will drain.  No thread waits for a commit on the
service's behalf: the committer thread alone commits, and a request that changes a queue
is answered once its future resolves, that is once its commit is durable.
"""
import threading

__all__ = ["Bridge"]


class Bridge:
    """Outcomes from the committer's thread, delivered to futures of one event loop."""

    def __init__(self, loop):
        self._loop = loop
        self._lock = threading.Lock()
        self._outcomes = []           # (future, error) waiting for the next drain
        self._scheduled = False       # a drain is on its way to the loop

    def pending(self):
        """(future, then): pass then as the seam's callback; the future's result is the
        error then was called with (None: durable)."""
        future = self._loop.create_future()

        def then(error):
            self._post(future, error)
        return future, then

    def call_soon(self, fn, *args):
        """Run fn(*args) on the loop soon, from any thread, in the same wake-up as the
        outcomes around it (a ready listener's call after a put's commit, say)."""
        self._post(None, (fn, args))

    def _post(self, future, value):
        with self._lock:
            self._outcomes.append((future, value))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:          # the loop is closed: the service is stopping
            pass

    def _drain(self):
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
            self._scheduled = False
        for future, value in outcomes:
            if future is None:
                fn, args = value
                fn(*args)
            elif not future.done():   # its request may have been cancelled meanwhile
                future.set_result(value)

    async def durable(self, submit):
        """submit(then) on the loop's thread (it must not block: the seam's calls never
        wait for a commit), then wait until then is called; return what submit returned,
        or raise the error the commit failed with."""
        future, then = self.pending()
        result = submit(then)
        error = await future
        if error is not None:
            raise error
        return result
