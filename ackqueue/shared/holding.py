"""A client process taking a queue file over when its owner has gone, and letting it go.

A process whose queues are clients of a file's owner (shared.client) asks ``take_over``
whenever a request finds the owner's socket closed or refused: the owner closed the file,
exited, or was killed.  The first process to get the file's lock holds it from then on and
its owner serves every client (its own queues too, through the socket, as they opened);
the others' retries reach it.  ``joined``/``left`` count this process's clients of each
file, so that a file it took over is let go (its owner stops, the next client takes it
over) once none of them is open.
"""
import logging
import os
import threading

from ..database import open_database
from ..errors import QueueLocked

log = logging.getLogger(__name__)

__all__ = ["take_over", "joined", "left"]

_lock = threading.Lock()
_clients = {}               # path -> client databases of this process on that file
_taken = {}                 # path -> the handle of a file this process took over


def joined(path):
    """A client of this process opened a queue of the file path."""
    with _lock:
        _clients[path] = _clients.get(path, 0) + 1


def left(path):
    """A client of this process on path closed: with the last, a file this process took
    over is let go."""
    with _lock:
        count = _clients.get(path, 0) - 1
        if count > 0:
            _clients[path] = count
            return
        _clients.pop(path, None)
        handle = _taken.pop(path, None)
    if handle is not None:
        handle.release()


def take_over(path, serving):
    """Hold the queue file path and serve it from this process (serving: the front's
    opener, as open_database's share=), if no process holds it: True when this process
    serves it (it did already, or has just taken it), False when another process does."""
    with _lock:
        if path in _taken:
            return True
        try:
            handle = open_database(path, share=serving)
        except QueueLocked:
            return False
        except Exception as exc:          # unreadable just now: the next retry tries again
            log.debug("ackqueue: taking over %s failed: %r", path, exc)
            return False
        if handle.owner is None:          # it cannot be served from here: stay a client
            handle.release()
            return False
        _taken[path] = handle
    log.info("ackqueue: this process (pid %d) took over queue file %s and serves it on %s",
             os.getpid(), path, handle.owner.socket_path)
    return True


def _forked():
    """A forked child: the parent's counts and taken files are the parent's."""
    global _lock
    _lock = threading.Lock()
    _clients.clear()
    _taken.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
