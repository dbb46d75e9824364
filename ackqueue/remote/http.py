"""One keep-alive HTTP/1.1 client connection, as lean as the remote drop-in needs.

The remote drop-in (remote.py) makes one small request per put, get and ack, one after
the other on one connection per thread, so what a request costs the client is part of
every operation's latency and of the CPU the machine has left for the service.
``http.client`` spends about 300 Python calls on one such request (an email-package
header parser, a file object per response) and sends a request with a body in two
writes.  This client writes a request in one ``sendall`` and reads the answer from one
buffer: a status line, headers, then a body of ``Content-Length`` bytes or in chunks.

Its contract, narrower than http.client's: HTTP/1.1 only; the caller gives the header
values (ASCII) and the body (bytes); ``request`` returns ``(status, headers, body)`` with
header names in lower case, and ``will_close`` says whether the server ends the
connection after this answer (``Connection: close``, or an HTTP/1.0 answer).  Any
protocol error raises ``WireError`` (an OSError, so callers that retry on a broken
connection retry on it too); a timeout raises ``socket.timeout``.
"""
import socket

__all__ = ["Connection", "WireError"]

MAX_HEAD = 65536            # bytes of status line and headers we accept


class WireError(OSError):
    """The server's answer is not HTTP/1.1 we can read, or the connection ended early."""


class Connection:
    """A keep-alive connection to host:port (TLS when ssl_context is given)."""

    def __init__(self, host, port, timeout, ssl_context=None):
        self.host, self.port = host, port
        sock = socket.create_connection((host, port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._buf = bytearray()
        netloc = host if ":" not in host else f"[{host}]"
        self._host_line = f"Host: {netloc}:{port}\r\n".encode("ascii")
        self.will_close = False

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def request(self, method, path, body=None, headers=None):
        """Send one request and read its answer: (status, {name: value}, body bytes)."""
        head = [f"{method} {path} HTTP/1.1\r\n".encode("ascii"), self._host_line]
        if headers:
            head.append("".join(f"{k}: {v}\r\n" for k, v in headers.items())
                        .encode("latin-1"))
        if body is not None or method in ("POST", "PUT"):
            head.append(b"Content-Length: %d\r\n" % (len(body) if body else 0))
        head.append(b"\r\n")
        if body:
            head.append(body)
        self.sock.sendall(b"".join(head))
        return self._answer(method)

    # -- reading the answer ----------------------------------------------------------------

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise WireError("the service closed the connection before answering")
        self._buf += data

    def _line(self):
        while True:
            end = self._buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[:end + 2]
                return line
            if len(self._buf) > MAX_HEAD:
                raise WireError("an HTTP header line is too long")
            self._fill()

    def _exactly(self, n):
        while len(self._buf) < n:
            self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _answer(self, method):
        while True:
            version, status, headers = self._head()
            if status >= 200 or status == 101:
                break                         # 1xx (100 Continue): read the next answer
        self.will_close = (version != b"HTTP/1.1"
                           or headers.get("connection", "").lower() == "close")
        if method == "HEAD" or status in (204, 304):
            return status, headers, b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return status, headers, self._chunks()
        length = headers.get("content-length")
        if length is None:                    # the body runs to the connection's end
            self.will_close = True
            return status, headers, self._rest()
        try:
            n = int(length)
        except ValueError:
            raise WireError(f"a bad Content-Length: {length!r}") from None
        return status, headers, self._exactly(n)

    def _head(self):
        line = self._line()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise WireError(f"not an HTTP answer: {line[:80]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise WireError(f"not an HTTP status: {line[:80]!r}") from None
        headers, size = {}, len(line)
        while True:
            line = self._line()
            if not line:
                return parts[0], status, headers
            size += len(line)
            if size > MAX_HEAD:
                raise WireError("the HTTP headers are too long")
            name, sep, value = line.partition(b":")
            if not sep:
                raise WireError(f"a bad HTTP header line: {line[:80]!r}")
            headers[name.strip().lower().decode("latin-1")] = \
                value.strip().decode("latin-1")

    def _chunks(self):
        out = bytearray()
        while True:
            size_line = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise WireError(f"a bad chunk size: {size_line[:20]!r}") from None
            if size == 0:
                while self._line():           # trailers, up to the empty line
                    pass
                return bytes(out)
            out += self._exactly(size)
            if self._exactly(2) != b"\r\n":
                raise WireError("a chunk does not end with CRLF")

    def _rest(self):
        while True:
            data = self.sock.recv(65536)
            if not data:
                rest = bytes(self._buf)
                self._buf.clear()
                return rest
            self._buf += data
