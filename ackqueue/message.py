"""Message: one delivery of a queued item, as get_message() returns it."""
from dataclasses import dataclass, field

__all__ = ["Message", "MessageId"]


class MessageId(int):
    """A message's id: its sequence number in its queue (never reused).

    A distinct type so that ack(MessageId(7)) is never mistaken for ack(7) of an item 7."""

    def __repr__(self):
        return f"MessageId({int(self)})"


@dataclass(frozen=True)
class Message:
    """One delivery of a message.

    ``body`` is the item; ``receive_count`` counts deliveries including this one (a
    delivery's count is written to the store without making get() wait, so a delivery cut
    short by a process crash may be missing from the count after the next open); ``sent_at``
    is when it was put and ``deadline`` when this delivery is given back unless acknowledged
    (both clock seconds, time.time() by default; deadline is None without a visibility
    timeout).  Pass the Message itself to ack(), nack() or change_visibility(): it names this
    very delivery, so a late ack after a redelivery is refused."""

    id: MessageId
    body: object
    receive_count: int
    sent_at: float
    deadline: object
    priority: int
    queue: str
    _holding: object = field(default=None, repr=False, compare=False)
