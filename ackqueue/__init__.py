"""ackqueue: a persistent, acknowledging drop-in replacement for queue.Queue on ZODB.

    from ackqueue import AckQueue
    q = AckQueue(path="jobs.fs")      # was: q = queue.Queue()
    q = AckQueue(path="http://127.0.0.1:8080", name="jobs")   # shared: ackqueue serve jobs.fs
    q = AckQueue(path="zeo://127.0.0.1:8100")   # inside ZODB: ackqueue server jobs.fs

Items survive crashes and restarts; get() hands an item out in flight and it leaves the
queue only when acknowledged (ack() or task_done()); otherwise it comes back.
"""
from queue import Empty, Full

from .browse import BrowsedMessage
from .connection import QueueConnection
from .errors import (AckQueueError, CodecMismatch, DuplicateMessage, EncodingRefused,
                     ForbiddenClass, ItemTooLarge, PickleRefused, UnreadableItem, NotAQueueFile, NotHeld, NotSupported, QueueFileGone,
                     QueueKindMismatch, QueueLocked, ServerUnavailable, ShutDown, StaleAck,
                     StorageError, UnpicklableItem, UnsupportedFormat)
from .message import Message, MessageId
from .queue import AckLifoQueue, AckPriorityQueue, AckQueue, queues
from .version import __version__  # noqa: F401 (ackqueue.__version__)


__all__ = [
    "AckQueue", "AckLifoQueue", "AckPriorityQueue", "QueueConnection", "Message",
    "MessageId", "Empty", "Full", "ShutDown", "AckQueueError", "StaleAck", "NotHeld",
    "UnpicklableItem", "StorageError", "QueueLocked", "NotAQueueFile", "QueueKindMismatch",
    "ServerUnavailable", "DuplicateMessage", "ItemTooLarge", "UnsupportedFormat", "queues",
    "BrowsedMessage", "CodecMismatch", "ForbiddenClass", "QueueFileGone", "NotSupported",
    "EncodingRefused", "PickleRefused", "UnreadableItem",
]
