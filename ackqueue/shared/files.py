"""Where a queue file's owner listens, and whether the process holding a file shares it.

The owner of ``jobs.fs`` listens on ``jobs.fs.sock`` (mode 0600: this user's processes
only) and records ``unix://jobs.fs.sock`` in the file's lock file after its pid
(filestorage.note_holder): a process refused the file's lock reads there whether, and
where, the holder serves it.
"""
import hashlib
import os
import socket
import stat
import tempfile
import time

from ..filestorage import lock_holder

__all__ = ["available", "reachable", "socket_path", "owner_url", "shared", "bind",
           "unlink_if"]

_MAX_SUN_PATH = 100         # sockaddr_un holds 104 to 108 bytes, the final NUL included


def reachable(path):
    """Whether the queue file path, which this process could not lock, is reached through
    the process that holds it (this platform has Unix sockets, and the holder shares it)."""
    return available() and shared(os.path.realpath(path))


def available():
    """Whether processes of this platform can share a file through its owner."""
    return hasattr(socket, "AF_UNIX")


def socket_path(path):
    """Where the owner of the queue file path (a real path) listens: ``path + '.sock'``,
    or, when that is too long for a Unix socket address, a name made from the path's hash
    in a directory of this user's under the temporary directory."""
    beside = path + ".sock"
    if len(os.fsencode(beside)) <= _MAX_SUN_PATH:
        return beside
    folder = os.path.join(tempfile.gettempdir(), f"ackqueue-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    return os.path.join(folder, digest + ".sock")


def owner_url(path):
    """What the owner of path records in the file's lock file."""
    return "unix://" + socket_path(path)


def shared(path, wait=1.0, clock=time.monotonic, sleep=time.sleep):
    """Whether the process holding the queue file path (which this one could not lock)
    shares it through its owner's socket, as its lock file says.  The holder records it
    just after taking the lock, so an answer is waited for up to wait seconds; a holder
    that records another url (a server) or none (an older ackqueue) does not share it."""
    mine = owner_url(path)
    deadline = clock() + wait
    while True:
        url = lock_holder(path)[1]
        if url == mine:
            return True
        if url is not None or clock() >= deadline:
            return False
        sleep(0.01)


def bind(path, backlog=512):
    """A listening socket at path, mode 0600, and the inode of its file (so that its
    owner removes only its own).  The caller holds the queue file's lock, so a socket file
    already there belongs to an owner that is gone: it is replaced."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)               # made 0600 as it is created: never readable by others
    try:
        sock.bind(path)
        sock.listen(backlog)
        inode = os.stat(path).st_ino
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    return sock, inode


def unlink_if(path, inode):
    """Remove the socket file at path if it is still the one with inode."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass
