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
    delivery's count reaches the store with its ack or give-back, so a delivery cut short
    by a process crash is missing from the count after the next open, unless the queue has
    a dead-letter policy, max_receives, which makes each receive durable first); ``sent_at``
    is when it was put and ``deadline`` when this delivery is given back unless acknowledged
    (both clock seconds, time.time() by default; deadline is None without a visibility
    timeout).  ``attributes`` are the string pairs given to put (a dict); ``first_received``
    and ``last_received`` the times of its first and latest receive; ``sequence_number`` the
    id it got at its first put, kept when it moves to a dead-letter queue and back;
    ``dead_letter_source`` the queue it was dead-lettered from (else None).
    A Message from peek() has no delivery: its deadline is None and it cannot be acked.
    Pass the Message itself to ack(), nack() or change_visibility(): it names this
    very delivery, so a late ack after a redelivery is refused."""

    id: MessageId
    body: object
    receive_count: int
    sent_at: float
    deadline: object
    priority: int
    queue: str
    attributes: dict = field(default_factory=dict)
    first_received: object = None
    last_received: object = None
    sequence_number: int = None
    dead_letter_source: object = None
    _holding: object = field(default=None, repr=False, compare=False)

    @property
    def holding(self):
        """The delivery this Message names (what ack() acknowledges), None from peek()."""
        return self._holding
