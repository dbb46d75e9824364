"""A thread that dies of an exception while holding an item gives it back at the
head of the queue, whatever threading.excepthook is: none, an application's own hook
installed before or after the queue, in this process and in a fresh one (the hook set
before ackqueue is imported).  The application's hook still runs.
"""
import json
import threading

import pytest

from ackqueue import AckQueue
from helpers_reliability import BOUND, FakeClock, drain_items as drain, run_child


def _silent_hook(args):
    """An application's own hook that reports elsewhere and never chains."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("when", ["none", "before", "after"])
def test_thread_dying_gives_back_at_head_whatever_the_excepthook(tmp_path, monkeypatch,
                                                                  when):
    if when == "before":
        monkeypatch.setattr(threading, "excepthook", _silent_hook)
    q = AckQueue(path=tmp_path / "q.fs", clock=FakeClock())   # plain queue.Queue code
    if when == "after":
        monkeypatch.setattr(threading, "excepthook", _silent_hook)
    try:
        for item in ("job", "next"):
            q.put(item)
        seen = []

        def worker():
            seen.append(q.get())
            raise RuntimeError("worker failed while holding an item")

        t = threading.Thread(target=worker)
        t.start()
        t.join(BOUND)
        assert not t.is_alive() and seen == ["job"]
        # A get looks at ended threads first: no waiting, and the clock never moved.
        m = q.get_message(block=False)
        assert (m.body, m.receive_count) == ("job", 2)
        assert drain(q) == ["next"]
    finally:
        q.close()


@pytest.mark.parametrize("when", ["before-import", "after-creation"])
def test_thread_dying_gives_back_with_an_app_hook_in_a_fresh_process(tmp_path, when):
    # A fresh interpreter: the hook really is installed before ackqueue is imported.
    proc = run_child("""
        import json, sys, threading
        reported = []
        def app_hook(args):
            reported.append(type(args.exc_value).__name__)
        if sys.argv[2] == "before-import":
            threading.excepthook = app_hook
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1])
        if sys.argv[2] == "after-creation":
            threading.excepthook = app_hook
        q.put("job")
        q.put("later")
        def worker():
            q.get()
            raise RuntimeError("worker failed")
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        m = q.get_message(block=False)
        print(json.dumps({"body": m.body, "count": m.receive_count, "hook": reported}))
    """, tmp_path / "q.fs", when)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"body": "job", "count": 2, "hook": ["RuntimeError"]}
