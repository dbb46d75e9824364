"""The operator's command line through its real entry point: the ``ackqueue`` console
script as a subprocess, on queue files in tmp_path and through a real queue server."""
import json
import os
import shutil
import subprocess
import time

import pytest

from ackqueue import AckQueue
from zeo_server import Server, console_script, kill, read_line, spawn

TIMEOUT = 60            # a failure bound only


def run(*args, cwd=None, input=None):
    return subprocess.run([console_script(), *map(str, args)], cwd=cwd, input=input,
                          capture_output=True, text=True, timeout=TIMEOUT)


def ok(*args, **kwargs):
    proc = run(*args, **kwargs)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc


def as_json(*args, **kwargs):
    return json.loads(ok(*args, "--json", **kwargs).stdout)


def one_line_error(proc, code):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


COMMANDS = ["demo", "server", "ls", "stats", "peek", "put", "get", "purge", "redrive",
            "pack", "export", "import", "check"]


def test_help_on_every_command_has_an_example_and_the_exit_codes_are_documented():
    top = ok("--help").stdout
    assert "0 ok, 1 error, 2 usage, 3 queue not found" in top
    for command in COMMANDS:
        assert command in top
        text = ok(command, "--help").stdout
        assert "Example:" in text and f"ackqueue {command}" in text, command


def test_usage_mistakes_exit_2(tmp_path):
    assert run().returncode == 2
    for args in (["nosuchcommand"], ["ls"], ["peek", "x.fs"], ["peek", "x.fs", "q", "-n", "x"],
                 ["put", "x.fs", "q"], ["server", "x.fs", "--listen", "bad"]):
        proc = run(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "x.fs")


def test_put_ls_stats_peek(tmp_path):
    path = tmp_path / "jobs.fs"
    ok("put", path, "jobs", "hello", "-a", "customer=7", "--priority", "200")
    ok("put", path, "jobs", "-", input="one\ntwo\n")
    ok("put", path, "jobs", "later", "--delay", "300")
    ok("put", path, "other", "x")
    assert as_json("ls", path) == {
        "jobs": {"kind": "fifo", "ready": 3, "in_flight": 0, "delayed": 1},
        "other": {"kind": "fifo", "ready": 1, "in_flight": 0, "delayed": 0}}
    text = ok("ls", path).stdout.splitlines()
    assert text[0].split() == ["QUEUE", "KIND", "READY", "IN", "FLIGHT", "DELAYED"]
    assert text[1].split() == ["jobs", "fifo", "3", "0", "1"]

    peeked = as_json("peek", path, "jobs")
    assert [(m["body"], m["state"]) for m in peeked] == [
        ("hello", "ready"), ("one", "ready"), ("two", "ready"), ("later", "delayed")]
    assert peeked[0]["attributes"] == {"customer": "7"} and peeked[0]["priority"] == 200
    assert 250 < peeked[3]["delay"] <= 300
    assert all(m["receive_count"] == 0 and m["age"] >= 0 for m in peeked)
    assert [m["body"] for m in as_json("peek", path, "jobs", "-n", "2")] == ["hello", "one"]
    human = ok("peek", path, "jobs").stdout
    assert "body: hello" in human and "customer=7" in human and "ready in" in human

    stats = as_json("stats", path, "jobs")       # peeking changed nothing
    assert (stats["ready"], stats["delayed"], stats["put"], stats["redelivered"]) == (3, 1, 4, 0)
    assert as_json("peek", path, "jobs")[0]["receive_count"] == 0


def test_get_without_ack_gives_back_and_with_ack_removes(tmp_path):
    path = tmp_path / "jobs.fs"
    ok("put", path, "jobs", "first")
    ok("put", path, "jobs", "second")
    proc = ok("get", path, "jobs")
    assert "body: first" in proc.stdout and "given back" in proc.stderr
    assert [m["body"] for m in as_json("peek", path, "jobs")] == ["first", "second"]
    got = as_json("get", path, "jobs", "--ack")
    assert (got["body"], got["acked"]) == ("first", True)
    assert [m["body"] for m in as_json("peek", path, "jobs")] == ["second"]
    assert as_json("stats", path, "jobs")["acked"] == 1
    ok("get", path, "jobs", "--ack")
    assert as_json("get", path, "jobs", "--ack") is None       # nothing ready


def test_unknown_queue_exits_3_and_creates_nothing(tmp_path):
    path = tmp_path / "jobs.fs"
    ok("put", path, "jobs", "x")
    for args in (["stats", path, "nope"], ["peek", path, "nope"], ["get", path, "nope"],
                 ["export", path, "nope", tmp_path / "out.jsonl"], ["purge", path, "nope"],
                 ["redrive", path, "nope"]):
        line = one_line_error(run(*args), 3)
        assert "'nope' not found" in line
    assert list(as_json("ls", path)) == ["jobs"]
    assert not os.path.exists(tmp_path / "out.jsonl")


def test_user_mistakes_are_one_line_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("not a queue file\n")
    assert "no queue file" in one_line_error(run("ls", tmp_path / "missing.fs"), 1)
    assert not os.path.exists(tmp_path / "missing.fs")
    one_line_error(run("ls", tmp_path), 1)                         # a directory
    assert "not a ZODB FileStorage" in one_line_error(run("ls", tmp_path / "notes.txt"), 1)
    one_line_error(run("put", tmp_path / "no" / "dir.fs", "q", "x"), 1)
    one_line_error(run("ls", "zeo://127.0.0.1:1?wait_timeout=0.5"), 1)
    one_line_error(run("ls", "zeo://nonsense"), 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "fine"}\n{"body": oops}\n')
    line = one_line_error(run("import", tmp_path / "q.fs", "jobs", bad), 1)
    assert "line 2" in line
    bad.write_text('{"body": "x", "encoding": "base64"}\n')
    assert "line 1" in one_line_error(run("import", tmp_path / "q.fs", "jobs", bad), 1)


def test_a_file_another_process_holds_is_reached_through_that_process(tmp_path):
    """The holder of a file shares it (ackqueue.shared): ls, put and pack reach its queues
    through it; check reads the file as it stands."""
    path = tmp_path / "jobs.fs"
    ok("put", path, "jobs", "x")
    holder = spawn("""
        import sys
        from ackqueue import AckQueue
        q = AckQueue(path=sys.argv[1], name="jobs")
        print("open", flush=True)
        sys.stdin.readline()
        print(q.qsize(), flush=True)
        """, path)
    try:
        assert read_line(holder) == "open"
        assert "jobs" in ok("ls", path).stdout
        ok("put", path, "jobs", "y")
        ok("pack", path)
        assert ok("check", path).stdout.strip().endswith("ok: no damage found")
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert read_line(holder) == "2"                 # the holder sees the tool's put
    finally:
        kill(holder)


def make_dead_letters(path, n):
    with AckQueue(path=str(path), name="jobs", max_receives=1, dead_letter="dead") as q:
        for i in range(n):
            q.put(f"job {i}")
        for _ in range(n):
            q.nack(q.get())
        with pytest.raises(Exception):
            q.get_nowait()                  # each one moves to "dead" instead
    with AckQueue(path=str(path), name="dead") as d:
        assert d.qsize() == n


def test_redrive_and_purge(tmp_path):
    path = tmp_path / "jobs.fs"
    make_dead_letters(path, 3)
    assert "redrove 3" in ok("redrive", path, "dead").stdout
    assert as_json("ls", path)["jobs"]["ready"] == 3
    assert as_json("ls", path)["dead"]["ready"] == 0
    make_dead_letters(tmp_path / "b.fs", 2)
    ok("redrive", tmp_path / "b.fs", "dead", "--to", "retry")
    assert [m["body"] for m in as_json("peek", tmp_path / "b.fs", "retry")] == ["job 0", "job 1"]
    assert "purged 3" in ok("purge", path, "jobs").stdout
    assert as_json("stats", path, "jobs")["purged"] == 3
    assert as_json("peek", path, "jobs") == []


def test_pack_shrinks_the_file(tmp_path):
    path = tmp_path / "jobs.fs"
    with AckQueue(path=str(path), name="jobs") as q:
        for i in range(200):
            q.put("x" * 200)
        for _ in range(200):
            q.ack(q.get())
    before = os.path.getsize(path)
    assert "packed" in ok("pack", path).stdout
    assert os.path.getsize(path) < before / 2
    assert as_json("ls", path)["jobs"]["ready"] == 0


def test_export_import_round_trip_keeps_everything(tmp_path):
    src, dst = tmp_path / "src.fs", tmp_path / "dst.fs"
    items = ["text é", b"\x00\xffbytes", {"a": [1, 2.5, None]}, ("tuple", 3)]
    with AckQueue(path=str(src), name="jobs") as q:
        for n, item in enumerate(items):
            q.put(item, priority=100 + n * 10, attributes={"n": str(n)})
        q.put("delayed", delay=600, retention=3600, attributes={"k": "v"})
    proc = ok("export", src, "jobs", tmp_path / "out.jsonl")
    assert "exported 5" in proc.stdout
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    # Higher priority first: the tuple, the dict, the bytes, the text, then the delayed one.
    assert [line.get("encoding") for line in lines] == ["pickle", "pickle", "base64", None,
                                                         None]
    assert "imported 5" in ok("import", dst, "jobs", tmp_path / "out.jsonl").stdout
    assert as_json("ls", src) == as_json("ls", dst)
    with AckQueue(path=str(src), name="jobs") as a:
        before = list(a.browse())
    with AckQueue(path=str(dst), name="jobs") as b:
        after = list(b.browse())
    assert len(before) == len(after) == 5
    now = time.time()
    for x, y in zip(before, after):
        assert (x.item, type(x.item), x.attributes, x.priority, x.state) == \
               (y.item, type(y.item), y.attributes, y.priority, y.state)
        assert abs((x.expires_at - now) - (y.expires_at - now)) < 30
    assert after[-1].item == "delayed" and 540 < after[-1].visible_at - now <= 600
    assert abs(after[-1].expires_at - now - 3600) < 60


def test_check_reports_damage_with_its_offset_and_changes_nothing(tmp_path):
    from ZODB.FileStorage.FileStorage import FileIterator
    from ZODB.FileStorage.format import DATA_HDR_LEN
    path = tmp_path / "jobs.fs"
    with AckQueue(path=str(path), name="jobs") as q:
        for i in range(20):
            q.put(f"message {i}")
    good = ok("check", path)
    assert "ok: no damage found" in good.stdout
    report = as_json("check", path)
    assert report["ok"] and report["records"] > 20 and report["damage"] == []

    records = [r.pos for t in FileIterator(str(path)) for r in t if r.data]
    offset = records[len(records) // 2]
    damaged = tmp_path / "damaged.fs"
    shutil.copy(path, damaged)
    with open(damaged, "r+b") as f:                 # the record's pickle, not its header
        f.seek(offset + DATA_HDR_LEN)
        f.write(b"\xff\xff\xff\xff")
    original = damaged.read_bytes()
    proc = run("check", damaged)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"damage at offset {offset}:" in proc.stdout
    assert damaged.read_bytes() == original
    assert not os.path.exists(str(damaged) + ".lock")
    assert json.loads(run("check", damaged, "--json").stdout)["damage"][0]["offset"] == offset

    # A transaction length that does not add up stops the walk: reported at that offset.
    txns = [t._tpos for t in FileIterator(str(path))]
    cut = tmp_path / "cut.fs"
    shutil.copy(path, cut)
    with open(cut, "r+b") as f:
        f.seek(txns[3] + 8)                         # the transaction's length field
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x01")
    proc = run("check", cut)
    assert proc.returncode == 1 and f"damage at offset {txns[3]}:" in proc.stdout, proc.stdout


def test_output_has_no_control_codes_when_not_a_terminal(tmp_path):
    path = tmp_path / "jobs.fs"
    lines = "".join(json.dumps({"body": f"m{i}", "priority": i % 5}) + "\n"
                    for i in range(2000))
    (tmp_path / "in.jsonl").write_text(lines)
    runs = [ok("import", path, "jobs", tmp_path / "in.jsonl"),
            ok("export", path, "jobs", tmp_path / "out.jsonl"),
            ok("check", path), ok("pack", path), ok("ls", path), ok("peek", path, "jobs"),
            ok("purge", path, "jobs")]
    assert "imported 2000" in runs[0].stdout and "exported 2000" in runs[1].stdout
    for proc in runs:
        assert "\x1b" not in proc.stdout + proc.stderr and "\r" not in proc.stderr


def test_through_a_server(tmp_path):
    path = tmp_path / "served.fs"
    server = Server(path, tmp_path / "server.log")
    try:
        url = server.url
        ok("put", url, "jobs", "over the wire", "-a", "k=v")
        assert as_json("ls", url) == {
            "jobs": {"kind": "fifo", "ready": 1, "in_flight": 0, "delayed": 0}}
        assert as_json("peek", url, "jobs")[0]["attributes"] == {"k": "v"}
        assert one_line_error(run("stats", url, "nope"), 3)
        line = one_line_error(run("ls", path), 1)       # the server holds the file
        assert "already open in another process" in line
        assert as_json("get", url, "jobs", "--ack")["body"] == "over the wire"
        assert as_json("stats", url, "jobs")["acked"] == 1
        ok("pack", url)
    finally:
        assert server.stop() == 0


def tmux(socket, *args):
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                          timeout=TIMEOUT)


def wait_for_screen(socket, predicate, what):
    deadline = time.monotonic() + 30                  # a failure bound only
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux(socket, "capture-pane", "-p", "-t", "top").stdout
        if predicate(screen):
            return screen
        time.sleep(0.1)
    raise AssertionError(f"{what} never showed; the screen:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_top_in_a_real_terminal_shows_counts_and_rates_and_quits_on_q(tmp_path):
    server = Server(tmp_path / "served.fs", tmp_path / "server.log")
    socket = f"ackqueue-test-{os.getpid()}"
    rc_file = tmp_path / "rc"
    try:
        ok("put", server.url, "jobs", "-", input="a\nb\nc\n")
        command = f"{console_script()} top {server.url}; echo $? > {rc_file}"
        assert tmux(socket, "new-session", "-d", "-s", "top", "-x", "120", "-y", "20",
                    command).returncode == 0
        screen = wait_for_screen(socket, lambda s: "jobs" in s, "the jobs queue")
        assert "READY" in screen and "IN/S" in screen and "q to quit" in screen
        row = next(line for line in screen.splitlines() if "jobs" in line)
        assert row.replace("│", " ").split()[1:4] == ["3", "0", "0"], screen
        # Another process puts 40 messages: the live view shows them and an in-rate.
        ok("put", server.url, "jobs", "-", input="".join(f"m{i}\n" for i in range(40)))
        ok("put", server.url, "other", "x")

        def updated(s):
            cells = [line.replace("│", " ").split() for line in s.splitlines()]
            jobs = [c for c in cells if c and c[0] == "jobs"]
            return jobs and jobs[0][1] == "43" and any(c and c[0] == "other" for c in cells)
        screen = wait_for_screen(socket, updated, "43 ready messages")
        row = next(line for line in screen.splitlines() if "jobs" in line)
        assert float(row.replace("│", " ").split()[4]) > 0, screen     # IN/S
        tmux(socket, "send-keys", "-t", "top", "q")
        deadline = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0"
    finally:
        tmux(socket, "kill-server")
        assert server.stop() == 0


def test_top_off_a_terminal_prints_plain_tables(tmp_path):
    path = tmp_path / "jobs.fs"
    ok("put", path, "jobs", "x")
    proc = ok("top", path, "--iterations", "2", "--interval", "0.2")
    assert "\x1b" not in proc.stdout
    tables = [block for block in proc.stdout.split("\n\n") if block.strip()]
    assert len(tables) == 2
    assert tables[1].splitlines()[2].split() == ["jobs", "1", "0", "0", "0.0", "0.0", "1",
                                                 "0", "0"]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_progress_bars_in_a_real_terminal(tmp_path):
    lines = "".join(json.dumps({"body": f"m{i}"}) + "\n" for i in range(3000))
    (tmp_path / "in.jsonl").write_text(lines)
    socket = f"ackqueue-bars-{os.getpid()}"
    script = console_script()
    path = tmp_path / "jobs.fs"
    command = (f"{script} import {path} jobs {tmp_path / 'in.jsonl'} && "
               f"{script} export {path} jobs {tmp_path / 'out.jsonl'} && "
               f"{script} check {path} && echo ALL-DONE; sleep 30")
    try:
        assert tmux(socket, "new-session", "-d", "-s", "top", "-x", "150", "-y", "20",
                    command).returncode == 0
        screen = wait_for_screen(socket, lambda s: "ALL-DONE" in s, "the end of the commands")
    finally:
        tmux(socket, "kill-server")
    bars = [line for line in screen.splitlines() if "━" in line]
    assert any("importing" in b and "3000/3000" in b and "messages/s" in b for b in bars), screen
    assert any("exporting" in b and "3000/3000" in b for b in bars), screen
    assert any("checking" in b for b in bars), screen
    assert "imported 3000" in screen and "exported 3000" in screen and "ok: no damage" in screen


def test_export_import_of_100000_messages(tmp_path):
    lines = "".join(json.dumps({"body": f"message {i}", "attributes": {"n": str(i)},
                                "priority": i % 3}) + "\n" for i in range(100000))
    (tmp_path / "in.jsonl").write_text(lines)
    assert "imported 100000" in ok("import", tmp_path / "a.fs", "jobs",
                                   tmp_path / "in.jsonl").stdout
    assert "exported 100000" in ok("export", tmp_path / "a.fs", "jobs",
                                   tmp_path / "out.jsonl").stdout
    exported = [json.loads(line) for line in (tmp_path / "out.jsonl").open()]
    assert len(exported) == 100000
    # Priority 2 first, then 1, then 0, each in put order.
    expected = sorted(range(100000), key=lambda i: (-(i % 3), i))
    assert [m["body"] for m in exported] == [f"message {i}" for i in expected]
    assert all(m["attributes"] == {"n": m["body"].split()[1]} for m in exported)
    assert as_json("ls", tmp_path / "a.fs")["jobs"]["ready"] == 100000


def test_every_command_through_a_queue_service_url(tmp_path):
    """TARGET may be the queue service's URL: the commands go through
    its native API, pack too (the service packs its file); check, which reads the file
    itself, says so in one line."""
    import re
    import signal
    serve = subprocess.Popen([console_script(), "serve", str(tmp_path / "q.fs"), "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = re.search(r"http://[0-9.]+:\d+", serve.stdout.readline()).group(0)
        ok("put", url, "jobs", "hello", "-a", "k=v")
        ok("put", url, "jobs", "-", input="two\nthree\n")
        assert as_json("ls", url) == {"jobs": {"kind": "fifo", "ready": 3, "in_flight": 0,
                                               "delayed": 0}}
        assert as_json("stats", url, "jobs")["put"] == 3
        assert "body: hello" in ok("peek", url, "jobs", "-n", "1").stdout
        assert as_json("get", url, "jobs", "--ack")["body"] == "hello"
        ok("export", url, "jobs", tmp_path / "x.jsonl")
        ok("import", url, "copy", tmp_path / "x.jsonl")
        assert as_json("ls", url)["copy"]["ready"] == 2
        ok("purge", url, "copy")
        assert ok("pack", url).stdout.startswith(f"packed {url}: ")
        assert "check reads a file" in run("check", url).stderr
        one_line_error(run("stats", url, "nope"), 3)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(TIMEOUT)


def test_a_lifo_queue_round_trips_in_its_delivery_order(tmp_path):
    from ackqueue import AckLifoQueue
    src, dst = tmp_path / "src.fs", tmp_path / "dst.fs"
    with AckLifoQueue(path=str(src), name="stack") as q:
        q.put_many(["one", "two", "three"])       # delivered three, two, one
    ok("export", src, "stack", tmp_path / "x.jsonl")
    ok("import", dst, "stack", tmp_path / "x.jsonl")   # a new file: made LIFO, as exported
    assert as_json("ls", dst)["stack"]["kind"] == "lifo"
    with AckLifoQueue(path=str(dst), name="stack") as q:
        assert [q.get(block=False) for _ in range(3)] == ["three", "two", "one"]
        for _ in range(3):
            q.task_done()
