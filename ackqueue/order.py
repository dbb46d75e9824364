"""The order of a queue's ready messages: the three kinds (FIFO, LIFO, ordered by value)
and the integer key a ready message is filed under in the store (ackqueue.store), higher
priority first, then FIFO or LIFO within a priority.  Below the store and the expiry index,
which both file messages by it; ackqueue.store re-exports these names."""

__all__ = ["FIFO", "LIFO", "VALUE", "KINDS", "PRIORITY_MAX", "SEQ_BITS", "SEQ_MASK",
           "store_key", "seq_of_key"]

FIFO, LIFO, VALUE = "fifo", "lifo", "value"
KINDS = (FIFO, LIFO, VALUE)

PRIORITY_MAX = 1000
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1


def store_key(kind, priority, seq):
    """The integer that orders a ready message: higher priority first, then FIFO or LIFO."""
    if kind == VALUE:
        return seq
    rank = (PRIORITY_MAX - priority) << SEQ_BITS
    return rank | ((SEQ_MASK - seq) if kind == LIFO else seq)


def seq_of_key(kind, key):
    """Inverse of store_key for the sequence number."""
    if kind == VALUE:
        return key
    low = key & SEQ_MASK
    return (SEQ_MASK - low) if kind == LIFO else low
