"""What the command line and a held or uncleanly closed queue file tell a user, with real
parts: ``ackqueue pack`` through the queue service, the error for a queue file a service
or server holds (naming its URL), the top-level help, the ids get and peek print, and the
one line explaining a stale .index after a SIGKILL."""
import json
import logging
import os
import re
import signal
import subprocess

import pytest

from ackqueue import AckQueue, QueueLocked
from zeo_server import console_script, kill, read_line, spawn

TIMEOUT = 60            # a failure bound only

HOLDER = """
    import sys
    from ackqueue import AckQueue
    q = AckQueue(path=sys.argv[1], name="jobs")
    q.put_many(["a", "b", "c"])
    print("open", flush=True)
    sys.stdin.readline()
    """


def run(*args):
    return subprocess.run([console_script(), *map(str, args)], capture_output=True,
                          text=True, timeout=TIMEOUT)


def ok(*args):
    proc = run(*args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc


def one_line_error(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def sigkilled(script, *args):
    """A child running script (HOLDER: it prints "open" once it holds the file), SIGKILLed
    as soon as it said so."""
    holder = spawn(script, *args)
    try:
        assert read_line(holder) == "open"
    finally:
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(TIMEOUT) == -signal.SIGKILL
        for f in (holder.stdin, holder.stdout, holder.stderr):
            f.close()


# -- pack through the queue service -------------------------------------------------------

def test_pack_through_the_service_packs_its_file_while_it_serves(own_service, tmp_path):
    service = own_service()
    with AckQueue(path=service.url, name="jobs") as q:
        for i in range(20):
            q.put_many([f"m{i}.{k}" for k in range(50)])
        for _ in range(1000):
            q.ack(q.get(timeout=10))
        q.put("kept")
    before = os.path.getsize(tmp_path / "q.fs")
    line = ok("pack", service.url).stdout.strip()
    found = re.fullmatch(rf"packed {re.escape(service.url)}: ([\d,]+) -> ([\d,]+) bytes "
                         r"in [\d.]+ s", line)
    assert found, line
    size_before, size_after = (int(g.replace(",", "")) for g in found.groups())
    assert size_after < size_before and size_after == os.path.getsize(tmp_path / "q.fs")
    assert os.path.getsize(tmp_path / "q.fs") < before
    # The service goes on serving what is left.
    assert json.loads(ok("get", service.url, "jobs", "--ack", "--json").stdout)["body"] == "kept"
    assert service.stop() == 0


# -- a held queue file names what holds it --------------------------------------------------

def test_a_file_the_service_holds_is_refused_naming_ackqueue_serve_and_its_url(
        own_service, tmp_path):
    path = tmp_path / "q.fs"
    service = own_service()
    with pytest.raises(QueueLocked) as info:
        AckQueue(path=str(path))
    text = str(info.value)
    assert "ackqueue serve" in text and service.url in text, text
    assert f"pid {service.proc.pid}" in text and "zeo://" not in text, text
    line = one_line_error(run("ls", path), 1)
    assert "ackqueue serve" in line and f"ackqueue ls {service.url}" in line, line

    # Once the service is gone, the next holder's lock says nothing of that URL.
    service.kill()
    holder = spawn(HOLDER, path)
    try:
        assert read_line(holder) == "open"
        with pytest.raises(QueueLocked) as info:
            AckQueue(path=str(path), repair=True)     # the file itself: refused
        assert f"pid {holder.pid}" in str(info.value)
        assert service.url not in str(info.value), str(info.value)
    finally:
        kill(holder)


def test_a_file_a_plain_process_holds_is_reached_through_it_by_queues_and_tools(tmp_path):
    """A file held by a program (not a server) is shared by that program with the processes
    that open the same path: AckQueue(path=FILE), ackqueue ls FILE and peek reach its
    queues through it; what needs the file itself (repair=True) is refused, told that."""
    path = tmp_path / "q.fs"
    holder = spawn(HOLDER, path)
    try:
        assert read_line(holder) == "open"
        with AckQueue(path=str(path), name="jobs") as q:
            assert q.qsize() == 3
        listing = run("ls", path)
        assert listing.returncode == 0 and "jobs" in listing.stdout, listing
        peek = run("peek", path, "jobs")
        assert peek.returncode == 0 and "a" in peek.stdout, peek
        with pytest.raises(QueueLocked) as info:
            AckQueue(path=str(path), name="jobs", repair=True)
        text = str(info.value)
        assert f"pid {holder.pid}" in text and "shares it" in text, text
        assert "ackqueue server" not in text and "zeo://" not in text, text
    finally:
        kill(holder)


def test_a_file_a_zeo_server_holds_is_refused_naming_its_url(server):
    with pytest.raises(QueueLocked) as info:
        AckQueue(path=server.path)
    text = str(info.value)
    assert "queue server (ZEO)" in text and server.url in text, text


# -- help and ids ---------------------------------------------------------------------------

def test_top_level_help_lists_the_services_http_urls_as_targets():
    text = ok("--help").stdout
    assert "http://HOST:PORT" in text and "ackqueue serve" in text, text
    assert "zeo://HOST:PORT" in text


def test_get_and_peek_print_a_message_id_the_same_way(tmp_path, own_service):
    path = tmp_path / "ids.fs"
    ok("put", path, "jobs", "hello")
    service = own_service()
    ok("put", service.url, "jobs", "hello")
    for target in (path, service.url):
        peeked = ok("peek", target, "jobs").stdout.splitlines()[0]
        got = ok("get", target, "jobs").stdout.splitlines()[0]
        assert peeked.startswith("#1  ") and got.startswith("#1  "), (peeked, got)


# -- a stale .index after a SIGKILL: one line of ackqueue's --------------------------------

def test_a_stale_index_after_a_sigkill_is_explained_in_one_line(own_service, tmp_path,
                                                                caplog):
    # The service, SIGKILLed and started again: its log has ackqueue's line, not ZODB's.
    service = own_service()
    ok("put", service.url, "jobs", "kept")
    service.kill()
    service.start()
    assert json.loads(ok("get", service.url, "jobs", "--json").stdout)["body"] == "kept"
    assert service.stop() == 0
    log = (tmp_path / "service.log").read_text()
    assert "Ignoring index" not in log and "ZODB" not in log, log
    [line] = [x for x in log.splitlines() if ".index" in x]
    assert "INFO ackqueue.filestorage: ackqueue: queue file" in line, line
    assert "was not closed cleanly" in line and "nothing is lost" in line, line

    # The command line, after a SIGKILLed holder: nothing on stderr.
    path = tmp_path / "jobs.fs"
    sigkilled(HOLDER, path)                 # it made the file and never closed it
    proc = run("ls", path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.split()[-5:] == ["jobs", "fifo", "3", "0", "0"], proc.stdout

    # In a program, through logging: ackqueue's INFO record, not ZODB's WARNING; and once
    # the file was closed (its .index written), the next open has nothing to explain.
    other = tmp_path / "other.fs"
    sigkilled(HOLDER, other)
    caplog.set_level(logging.INFO)
    with AckQueue(path=str(other), name="jobs") as q:
        assert q.qsize() == 3
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert not [r for r in records if r[0].startswith("ZODB")], records
    assert [r[:2] for r in records if "was not closed cleanly" in r[2]] == [
        ("ackqueue.filestorage", "INFO")]
    caplog.clear()
    with AckQueue(path=str(other), name="jobs") as q:
        assert q.qsize() == 3
    assert not [r for r in caplog.records if ".index" in r.getMessage()], caplog.records
