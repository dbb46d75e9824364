"""The plumbing of the helper processes: starting them, their report lines, stopping them.

Every child is ``python -m benchmarks --child TASK ARGS...`` run from the repository root.
It reports JSON lines on stdout; the children of (e) across processes, (g) and (service)
also read a "go" line on stdin and write their stderr to a file in the run's directory.
The tasks live with their scenario or contender; child_tasks.py names them and is the
one module that imports them: this module imports no scenario and no contender, so that
every scenario and contender can import it.
"""
import json
import os
import select
import signal
import subprocess
import sys
import time

from benchmarks.common import REPO, Timeout


async def until_terminated():
    """Wait, on the running loop, until SIGTERM or SIGINT: a helper server stopped this
    way returns from asyncio.run and exits 0, so a run's report does not list its
    stop as a problem (signal 15)."""
    import asyncio
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_app(app):
    """Serve the aiohttp app on a free loopback port, report "ready" with the port, and
    stop cleanly at SIGTERM (until_terminated)."""
    from aiohttp import web
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    report(event="ready", port=site._server.sockets[0].getsockname()[1])
    await until_terminated()
    await runner.cleanup()


def child_command(*argv):
    return [sys.executable, "-m", "benchmarks", "--child", *map(str, argv)]


def report(**kw):
    """One JSON report line on stdout (a child's only way to talk to its parent)."""
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


# --- (f): children that report once and exit ------------------------------------------


def spawn_child(*argv):
    return subprocess.Popen(child_command(*argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def read_report(proc, timeout):
    """The next JSON report line of a child (raises with its stderr if it died)."""
    deadline = time.monotonic() + timeout
    while True:
        line = proc.stdout.readline()
        if line:
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
            continue
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"child exited ({proc.returncode}) without a report: {err}")


def run_child(*argv, timeout=1800):
    proc = spawn_child(*argv)
    try:
        rep = read_report(proc, timeout)
        proc.wait(timeout)
        return rep
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- (e) across processes and (g): children that talk in both directions --------------


class ChildError(RuntimeError):
    """A child process reported an error (its traceback is kept for results.json)."""

    def __init__(self, message, child_traceback=None):
        super().__init__(message)
        self.child_traceback = child_traceback


class Child:
    """python -m benchmarks --child TASK ...: JSON lines on its stdout, "go" on its stdin,
    stderr into a file in the run's directory (shown when the child fails)."""

    def __init__(self, directory, name, *argv):
        self.name = name
        self.err_path = os.path.join(directory, f"{name}.stderr")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            child_command(*argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, cwd=REPO, bufsize=0)
        self._buf = b""

    def stderr_tail(self, chars=1500):
        try:
            with open(self.err_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def _read_line(self, event, timeout, progress):
        """Read until self._buf holds a whole line (see expect)."""
        deadline = time.monotonic() + timeout
        last = progress() if progress else None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if progress is not None:
                now = progress()
                if now != last:
                    last, deadline = now, time.monotonic() + timeout
                    left = timeout
            if left <= 0:
                raise Timeout(f"{self.name}: no {event!r} report within {timeout:g}s"
                              + (" of its last progress" if progress else ""))
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                raise RuntimeError(f"{self.name} exited ({code}) before its {event!r} "
                                   f"report: {self.stderr_tail()}")
            self._buf += chunk

    def expect(self, event, timeout, progress=None):
        """The child's next report; it must be `event` (an "error" report raises).  With
        progress (a callable), timeout counts from the last change of progress()."""
        self._read_line(event, timeout, progress)
        line, self._buf = self._buf.split(b"\n", 1)
        rep = json.loads(line)
        if rep.get("event") == "error":
            raise ChildError(f"{self.name}: {rep.get('error')}", rep.get("traceback"))
        if rep.get("event") != event:
            raise RuntimeError(f"{self.name}: expected {event!r}, got {rep!r}")
        return rep

    def send(self, text):
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60):
        """Wait for the exit (SIGKILL after timeout); return the exit code."""
        try:
            self.proc.stdin.close()
        except Exception:   # noqa: BLE001
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            code = f"SIGKILLed: no exit {timeout}s after its last report"
        for f in (self.proc.stdout, self.err):
            try:
                f.close()
            except Exception:   # noqa: BLE001
                pass
        return code


def stop_server(proc, files, timeout):
    """SIGTERM a server child and wait for it (SIGKILL after timeout s), then close its
    files; returns its exit code, or a sentence saying it had to be killed."""
    code = proc.poll()
    if code is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = f"no exit {timeout}s after SIGTERM: SIGKILLed"
    for f in files:
        try:
            f.close()
        except Exception:   # noqa: BLE001
            pass
    return code
