"""The queue service (``ackqueue serve``) as a real child process, for the remote drop-in's
tests: started on a free loopback port (--port 0, read back from the line it prints), and
restarted on that same port, so a client's URL stays valid across a restart."""
import json
import pathlib
import re
import select
import signal
import subprocess

from zeo_server import console_script

START_TIMEOUT = 30      # failure bounds only
STOP_TIMEOUT = 30


class Service:
    def __init__(self, path, log_path, *extra):
        self.path = None if path is None else str(path)
        self.log_path = str(log_path)
        self.extra = list(extra)
        self.port = 0
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        args = [console_script(), "serve"] + (
            ["--memory"] if self.path is None else [self.path]) + [
            "--port", str(self.port)] + self.extra
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        line = self.proc.stdout.readline() if ready else ""
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not found:
            self.proc.kill()
            self.proc.wait()
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                raise RuntimeError(f"the service did not start: {line!r}\n{f.read()}")
        self.port = int(found.group(1))

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        finally:
            self.proc.stdout.close()

    def kill(self):
        return self.stop(signal.SIGKILL)


def serve_with_clients(directory, clients, *extra):
    """A started Service on directory/q.fs under ``--auth``, its auth file (directory/
    auth.json) naming clients: {name: {"secret": ..., "rights": {pattern: [rights]}}}."""
    directory = pathlib.Path(directory)
    auth = directory / "auth.json"
    auth.write_text(json.dumps({"clients": clients}))
    return Service(directory / "q.fs", directory / "service.log", "--auth", str(auth), *extra)
