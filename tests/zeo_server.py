"""A real queue server for tests: the ``ackqueue server`` console script on a free loopback
port (port 0, read back from the line the server prints), stopped with SIGTERM."""
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

START_TIMEOUT = 30      # failure bounds only
STOP_TIMEOUT = 30


def console_script():
    """The ackqueue console script installed beside the running Python."""
    path = os.path.join(os.path.dirname(sys.executable), "ackqueue")
    if not os.path.exists(path):
        raise RuntimeError(f"the ackqueue console script is not installed at {path}; "
                           "install the project (pip install -e .) first")
    return path


class Server:
    """``ackqueue server PATH --listen 127.0.0.1:PORT`` in a child process."""

    def __init__(self, path, log_path, port=0, extra=()):
        self.path = str(path)
        self.log_path = str(log_path)
        self.extra = tuple(extra)      # more options for the command (TLS)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [console_script(), "server", self.path, "--listen", f"127.0.0.1:{port}",
             *self.extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"zeo://[^\s:]+:(\d+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the server did not start: {line!r}; log:\n{self.read_log()}")
        self.banner = line
        self.port = int(found.group(1))
        self.url = f"zeo://127.0.0.1:{self.port}"

    def read_log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        """Stop the server with sig and return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        finally:
            self.proc.stdout.close()
            self.log.close()
        return code

    def restart(self):
        """Stop cleanly and start again on the same port (clients reconnect by themselves)."""
        self.stop()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.__init__(self.path, self.log_path, self.port, self.extra)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise


def spawn(script, *args, **kwargs):
    """A child ``python -c script args...`` with pipes for stdin and stdout (text)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=kwargs.pop("stderr", subprocess.PIPE), text=True, **kwargs)


def read_line(proc, timeout=60):
    """The child's next stdout line (a failure bound only: children answer at once)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"no output from child {proc.pid} within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child {proc.pid} exited ({proc.wait()}): {err}")
    return line.strip()


def kill(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(STOP_TIMEOUT)
