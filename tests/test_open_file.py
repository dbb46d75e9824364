"""Opening a queue at a path that holds no queue file yet: what is not a regular file
(/dev/null, a FIFO) is refused with its path and nothing is created beside it; an empty
file (what a crash while creating a queue file leaves) is adopted, with a warning.
"""
import pytest

from ackqueue import AckQueue
from helpers_reliability import drain_items as drain


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_what_is_not_a_regular_file_is_refused_with_its_path(tmp_path, target):
    import os
    from ackqueue import NotAQueueFile
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    before = set(os.listdir(tmp_path))
    with pytest.raises(NotAQueueFile, match=f"{target!r} is not a regular file"):
        AckQueue(path=target)
    assert set(os.listdir(tmp_path)) == before


def test_an_empty_file_is_adopted_with_a_warning(tmp_path, caplog):
    # What a crash while creating a queue file (or a power cut before its first bytes
    # reached the disk) leaves: adopted, never refused, but not silently.
    import logging
    path = tmp_path / "empty.fs"
    path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="ackqueue.filestorage"):
        with AckQueue(path=path) as q:
            q.put("x")
    assert any(str(path) in r.getMessage() and "empty file" in r.getMessage()
               for r in caplog.records)
    with AckQueue(path=path) as q:
        assert drain(q) == ["x"]
