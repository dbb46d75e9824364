"""The exceptions ackqueue raises, beside the standard library's queue.Empty and queue.Full."""
import pickle
import queue as _stdlib_queue

__all__ = [
    "AckQueueError", "ShutDown", "StaleAck", "NotHeld", "UnpicklableItem",
    "StorageError", "QueueLocked", "NotAQueueFile", "QueueKindMismatch", "ServerUnavailable",
    "Refused", "DuplicateMessage", "ItemTooLarge", "UnsupportedFormat", "CodecMismatch",
    "ForbiddenClass", "UnreadableItem", "PickleRefused", "EncodingRefused", "QueueFileGone", "NotSupported",
]


class AckQueueError(Exception):
    """Base class of the errors that are ackqueue's own."""


# Python 3.13 has queue.ShutDown; older Pythons get ours, raised the same way.
ShutDown = getattr(_stdlib_queue, "ShutDown", None)
if ShutDown is None:  # pragma: no cover - depends on the running Python
    class ShutDown(Exception):
        """Raised by put() and get() on a queue that was shut down (Python 3.13's queue.ShutDown)."""


class Refused(AckQueueError):
    """A store operation found the store other than it expected (a message already claimed,
    acknowledged or given back by another process) and wrote nothing."""


class DuplicateMessage(Refused):
    """put() with a dedup_id already used in the same queue within its dedup window (even if
    that first message was acknowledged since).  Nothing was put.

    original_id: the id (int) of the message first put with that dedup id, or None when
    the store does not know it (a file written before ackqueue recorded it)."""

    original_id = None


class NotHeld(AckQueueError, ValueError):
    """ack()/nack() of something the caller does not hold: never got, already acked, or not an item."""


class StaleAck(NotHeld, Refused):
    """A late ack or nack: the delivery it refers to was given back (its visibility deadline passed,
    its thread ended, or its process died) and the message may be held by someone else now.
    The message is left untouched: a late ack must never remove it from its new holder."""

    reason = None   # set by a shared queue's store: "acked", "given_back" or "redelivered"
    queue = None        # the queue and id (int) of the message, when known
    message_id = None


class UnpicklableItem(TypeError, pickle.PicklingError):
    """put() of an item that pickle cannot serialize. The queue is left unchanged."""


class ForbiddenClass(AckQueueError, pickle.UnpicklingError):
    """A received item names a class or function that is not in the queue's
    allowed_classes: it was not unpickled, and nothing of it ran."""


class UnreadableItem(AckQueueError):
    """get() received a message whose body cannot be read here (it cannot be unpickled,
    names a class outside allowed_classes, or is a pickle in a queue that never unpickles).
    The message was given back and set aside for a while (UNREADABLE_DELAY), so that the
    messages behind it are still delivered; the receive counts, so that a dead-letter rule
    (max_receives) moves it in the end.

    queue and message_id (int) name the message; cause is the error reading it."""

    queue = None
    message_id = None


class PickleRefused(ForbiddenClass, UnreadableItem):
    """A received body is a pickle, and the queue's codec is not "pickle" (it is "json",
    "str" or "bytes": what a consumer picks so that nothing it reads can run code).  It was
    not unpickled; the message was given back, set aside as unreadable, so that the
    queue's dead-letter rule (max_receives) moves it once it was received that often.

    codec is the queue's codec; message_id the message's id (int) when known."""

    def __init__(self, message, codec=None, message_id=None, queue=None):
        super().__init__(message)
        self.codec = codec
        self.message_id = message_id
        self.queue = queue


def unreadable_error(message_id, queue, cause, delay):
    """The error get() raises for message message_id of queue, set aside for delay seconds
    because reading its body raised cause: PickleRefused for a pickle in a queue that
    never unpickles, UnreadableItem otherwise."""
    again = f"it was given back, to be visible again in {delay:g} s"
    if isinstance(cause, PickleRefused):
        return PickleRefused(
            f"message {message_id} of queue {queue!r} is a pickle, and the queue's codec "
            f"{cause.codec!r} never unpickles: nothing of it was read; {again} (a "
            "dead-letter rule, max_receives, moves it once it was received that often)",
            codec=cause.codec, message_id=message_id, queue=queue)
    error = UnreadableItem(f"message {message_id} of queue {queue!r} cannot be unpickled: "
                           f"{cause!r}; {again}")
    error.queue, error.message_id = queue, message_id
    return error


class EncodingRefused(AckQueueError, ValueError):
    """An already-encoded body (put_many(encoded=True), a body sent to the queue service)
    whose encoding the queue's codec does not admit: a queue with codec "json", "str" or
    "bytes" takes bodies of that encoding only, a queue with codec "pickle" takes any.
    Nothing was put.

    codec is the queue's codec, encoding the refused body's ("pickle", "json", "str" or
    "bytes"), index its position in the batch."""

    def __init__(self, message, codec=None, encoding=None, index=None):
        super().__init__(message)
        self.codec = codec
        self.encoding = encoding
        self.index = index


class ItemTooLarge(AckQueueError, ValueError):
    """put()/put_many() of an item whose pickled size is over the queue's max_item_size.
    Nothing was put (for put_many, none of the batch); the queue is left unchanged.

    size and limit are in bytes; index is the item's position in put_many()'s batch (0 for
    put())."""

    def __init__(self, message, size=None, limit=None, index=None):
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.index = index


class StorageError(AckQueueError):
    """The queue's storage cannot be opened or used."""


class QueueLocked(StorageError):
    """The queue file is held by another process: share a queue between processes through a server."""


class NotAQueueFile(StorageError):
    """The path names a file that is not a ZODB FileStorage."""


class UnsupportedFormat(StorageError):
    """The storage was written in a store format this ackqueue cannot read: a newer one
    (upgrade ackqueue), or an older one it has no migration for.  Nothing was written to it.

    found is the storage's format version, supported the one this ackqueue reads and
    writes (ackqueue.store.FORMAT), where names the storage (a file by its path)."""

    def __init__(self, message, found=None, supported=None, where=None):
        super().__init__(message)
        self.found = found
        self.supported = supported
        self.where = where


class QueueKindMismatch(StorageError, ValueError):
    """The named queue exists with another ordering (FIFO, LIFO or priority) than the one asked for."""


class CodecMismatch(QueueKindMismatch):
    """A queue opened with another codec than the one stored with it (ackqueue.codec)."""


class ServerUnavailable(StorageError):
    """The queue server could not be reached, or the connection to it was lost while an
    operation was being committed (its outcome may then be unknown: see the message)."""


class QueueFileGone(StorageError):
    """The queue file was deleted, or replaced by another file, while this process had it
    open: writing on would write to a file nobody will open again, so every further
    commit is refused (what was committed before is in the open file only)."""


class NotSupported(AckQueueError, NotImplementedError):
    """An operation a queue reached through the queue service (AckQueue(path="http://..."))
    cannot do: the message names the alternative (put_many/ack_many batches instead of a
    transaction block, priority= levels instead of a priority-by-value queue, ZEO for a
    queue inside an application's own ZODB)."""
