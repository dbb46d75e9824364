"""The parts of the bare floor servers: a group committer and a keep-alive HTTP/1.1
protocol, with no queue behind them.

The durable request floor of (service) (scenarios/service_floor.py) and the wake-up floor
of (e) across processes (contenders/wake_floor.py) are built of these: Proto hands each
request to a callback, Writer makes the bodies that gathered meanwhile durable as one
group (an append + fsync, or one ZODB FileStorage commit) and then calls back on the
loop, answer writes a 200 with a JSON body.
"""
import asyncio
import os
import threading


class Writer:
    """The group committer of a floor server: take what gathered, make it durable, then
    call durable(group) on the loop, once per group (group: the (transport, body) pairs;
    by default each request is answered)."""

    def __init__(self, kind, path, loop, durable=None):
        self.kind, self.loop = kind, loop
        self.durable = durable or answer_all
        self.cond = threading.Condition()
        self.pending = []                      # (transport, body)
        if kind == "fsync":
            self.file = open(path, "ab")
        else:
            import transaction
            import ZODB
            from ZODB.FileStorage import FileStorage
            from persistent.mapping import PersistentMapping
            self.tm = transaction.TransactionManager()
            self.conn = ZODB.DB(FileStorage(path)).open(self.tm)
            self.log = self.conn.root()["log"] = PersistentMapping()
            self.tm.commit()
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, transport, body):
        with self.cond:
            self.pending.append((transport, body))
            self.cond.notify()

    def _run(self):
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                group, self.pending = self.pending, []
            bodies = [body for _, body in group]
            if self.kind == "fsync":
                self.file.write(b"".join(bodies))
                self.file.flush()
                os.fsync(self.file.fileno())
            else:
                self.log["group"] = bodies            # one record, written anew each time
                self.tm.commit()
            self.loop.call_soon_threadsafe(self.durable, group)


def answer(transport, body=b"{}"):
    if not transport.is_closing():
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body)


def answer_all(group):
    for transport, _ in group:
        answer(transport)


class Proto(asyncio.Protocol):
    """HTTP/1.1 keep-alive requests with a Content-Length body: each is handed to
    on_request(request line, transport, body), which answers it when it can."""

    def __init__(self, on_request):
        self.on_request = on_request

    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            request_line = self.buf[:self.buf.find(b"\r\n")]
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.on_request(request_line, self.transport, body)
