"""``ackqueue server`` (the ZEO queue server) refusing to start: a port in use, a file
another process holds, a missing directory, a file that is not a queue.  Each is one
``Error:`` line on stderr, a non-zero exit and no traceback, and nothing is created.
The real console script; the holder is a real server.
"""
import os
import socket
import subprocess

from zeo_server import console_script


def _run_server(*args, timeout=60):
    return subprocess.run([console_script(), "server", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _one_clear_line(proc):
    assert proc.returncode not in (0, None), proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def test_server_port_in_use_is_one_line_and_creates_nothing(tmp_path):
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _run_server(tmp_path / "q.fs", "--listen", f"127.0.0.1:{port}")
    finally:
        taken.close()
    line = _one_clear_line(proc)
    assert f"127.0.0.1:{port}" in line and "in use" in line, line
    assert os.listdir(tmp_path) == []


def test_server_on_a_file_another_process_holds(tmp_path):
    from zeo_server import Server
    path = tmp_path / "q.fs"
    first = Server(path, tmp_path / "first.log")
    try:
        before = sorted(os.listdir(tmp_path))
        proc = _run_server(path, "--listen", "127.0.0.1:0")
        line = _one_clear_line(proc)
        assert str(path) in line and f"pid {first.proc.pid}" in line, line
        # Its advice is not to run the command that just failed.
        assert "(ackqueue server" not in line, line
        assert first.url.replace("zeo://", "") in line or "zeo://" in line, line
        assert sorted(os.listdir(tmp_path)) == before
    finally:
        assert first.stop() == 0


def test_server_in_a_missing_directory(tmp_path):
    path = tmp_path / "nowhere" / "q.fs"
    line = _one_clear_line(_run_server(path, "--listen", "127.0.0.1:0"))
    assert str(path.parent) in line and "does not exist" in line, line
    assert os.listdir(tmp_path) == []


def test_server_on_a_file_that_is_not_a_queue(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a queue\n")
    line = _one_clear_line(_run_server(path, "--listen", "127.0.0.1:0"))
    assert str(path) in line and "not a ZODB FileStorage file" in line, line
    assert os.listdir(tmp_path) == ["notes.txt"]
    assert path.read_text() == "not a queue\n"
