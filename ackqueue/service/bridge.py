"""From the committer's thread back to the event loop: the library's non-blocking seam
(``put_many(then=...)``, ``ack_many(then=...)``) as awaitables.

A put or an ack submitted from the loop returns at once; its ``then(error)`` runs in the
committer's thread when the commit is durable (or failed).  ``Bridge`` turns each into an
asyncio future, and wakes the loop once per group commit, not once per outcome: what the
committer's thread posts while it settles a group (``ackqueue.commit.settling()``) is held
until the committer says the group is settled (``group_settled``, its group listener), and
then one ``call_soon_threadsafe`` (one write to the loop's self-pipe) drains it all.  That
matters beyond the syscall: writing to the self-pipe releases the GIL, and the woken loop
takes it, so each wake-up in the middle of a group costs the committer a wait for the GIL
before it can settle the next ticket or start the next commit.  Posts from any other thread
(a pool thread, the reaper's give-backs) wake the loop at once, coalesced with whatever is
already waiting.  No thread waits for a commit on the
service's behalf: the committer thread alone commits, and a request that changes a queue
is answered once its future resolves, that is once its commit is durable.
"""
import threading

from ackqueue.commit import settling

__all__ = ["Bridge"]


class Bridge:
    """Outcomes from the committer's thread, delivered to futures of one event loop."""

    def __init__(self, loop):
        self._loop = loop
        self._lock = threading.Lock()
        self._outcomes = []           # (future, error) waiting for the next drain
        self._scheduled = False       # a drain is on its way to the loop
        self._attached = False        # group_settled is a listener of the committer

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

    def attach(self, committer):
        """Become a group listener of the committer whose outcomes come here."""
        committer.add_group_listener(self.group_settled)
        self._attached = True

    def group_settled(self):
        """The committer's group listener: wake the loop for what the group posted."""
        self._schedule()

    def _post(self, future, value):
        with self._lock:
            self._outcomes.append((future, value))
        if self._attached and settling():
            return                    # group_settled wakes the loop for the whole group
        self._schedule()

    def _schedule(self):
        with self._lock:
            if self._scheduled or not self._outcomes:
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
