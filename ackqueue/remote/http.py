"""One keep-alive HTTP/1.1 client connection, as lean as the remote drop-in needs.

The remote drop-in (ackqueue.remote) makes one small request per put, get and ack, one after
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

Above it, what every remote module needs of the service's HTTP: ``Target`` (where the
service is and how to reach it, parsed from the queue's URL), ``ServiceHttp`` (one thread's
persistent connection, retrying refused or cut-off requests until wait_timeout, then
ServerUnavailable), and ``raise_for`` (an error answer as the ackqueue error it means).
"""
import json
import socket
import ssl
import time
import urllib.parse

from . import access
from ..errors import (AckQueueError, CodecMismatch, DuplicateMessage, EncodingRefused,
                      ItemTooLarge, NotSupported, ServerUnavailable, StaleAck)

__all__ = ["Connection", "WireError", "Target", "ServiceHttp", "Interrupted", "raise_for",
           "error_of", "unsupported", "DEFAULT_WAIT_TIMEOUT"]

DEFAULT_WAIT_TIMEOUT = 30.0   # seconds an operation waits for an unreachable service

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


# -- the service, as every remote module reaches it ------------------------------

class Interrupted(Exception):
    """A long poll cut short by shutdown() in another thread."""


class ServiceHttp:
    """One thread's persistent connection to the service."""

    def __init__(self, target):
        self.target = target
        self.conn = None
        self.interrupted = False

    def close(self):
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def interrupt(self):
        self.interrupted = True
        conn = self.conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _connect(self, timeout):
        t = self.target
        self.conn = Connection(t.host, t.port, timeout,
                               t.access.ssl_context() if t.https else None)

    def request(self, method, path, body=None, headers=None, *, read_timeout=None,
                retry=True):
        """(status, content type, data, attempts before the answered one).  Retries a
        refused, cut-off or 502/503/504 request until wait_timeout, then ServerUnavailable."""
        t = self.target
        deadline = time.monotonic() + t.wait_timeout
        read_timeout = read_timeout or t.wait_timeout
        attempt, pause, why = 0, 0.02, None
        while True:
            try:
                if self.conn is None:
                    self._connect(min(read_timeout, t.wait_timeout))
                self.conn.sock.settimeout(read_timeout)
                status, answer, data = self.conn.request(method, t.prefix + path, body,
                                                         headers)
                if self.conn.will_close:
                    self.close()
                if status in (502, 503, 504):
                    why = f"HTTP {status}"
                    code, message, _ = error_of(status, data)
                    if code == "StorageFull":   # retried too (space may be freed); said
                        why += f": {message}"
                else:
                    return status, answer.get("content-type", ""), data, attempt
            except ssl.SSLCertVerificationError as exc:
                self.close()                # retrying cannot help: say so at once
                raise AckQueueError(access.verify_failed(t, exc)) from None
            except OSError as exc:              # wire.WireError and timeouts too
                self.close()
                if self.interrupted:
                    self.interrupted = False
                    raise Interrupted() from exc
                why = repr(exc)
            except BaseException:
                # KeyboardInterrupt or the like mid-request: drop the connection now, so
                # the service sees its client gone (a long poll that finds a message then
                # gives it back) and no late answer is read as the next request's.
                self.close()
                raise
            if not retry or time.monotonic() + pause > deadline:
                raise ServerUnavailable(
                    f"the queue service at {t.url} could not be reached within "
                    f"{t.wait_timeout:g} s ({why}); {method} {path.split('?')[0]} "
                    "may not have been done")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            attempt += 1


class Target:
    """Where the service is, and how to reach it: parsed from the queue's URL,
    ``http[s]://[NAME@]HOST:PORT[?wait_timeout=S&tls_ca=FILE&token_file=FILE]``
    (ackqueue.remote.access: TLS and the bearer token)."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a queue service URL is http://HOST:PORT, not {url!r}")
        self.https = parts.scheme.lower() == "https"
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if self.https else 80)
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        self.prefix = parts.path.rstrip("/")
        options = access.parse_options(parts, url)
        self.wait_timeout = options.pop("wait_timeout", DEFAULT_WAIT_TIMEOUT)
        self.access = access.Access(parts, options, url)
        netloc = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port:
            netloc += f":{parts.port}"
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        self.netloc = (parts.username + "@" if parts.username else "") + netloc


def error_of(status, data):
    """(code, message, error document) of an error answer's JSON body."""
    try:
        doc = json.loads(data)["error"]
        return doc.get("code", ""), doc.get("message", ""), doc
    except Exception:
        return "", data[:200].decode("utf-8", "replace"), {}


def unsupported(what, instead):
    """The NotSupported error for what, on a queue reached through the service."""
    return NotSupported(f"{what} cannot work on a queue reached through the queue service "
                        f"(ackqueue serve): {instead}")



def raise_for(status, doc, stale_ok=False):
    """Raise the ackqueue error an answer other than 200 means (nothing for a 200)."""
    if status == 200:
        return
    code, message, error = error_of(status, doc if isinstance(doc, bytes) else
                                  json.dumps(doc).encode())
    if status in (409, 410) and code in ("StaleReceipt", "UnknownReceipt"):
        raise StaleAck(f"the delivery was given back before this ack or nack (its "
                       f"visibility deadline passed, its client's lease ended, or the "
                       f"service restarted): {message}")
    if status == 409 and code in ("NotOwned", "LeaseExpired"):     # a batch's lease check
        raise StaleAck(f"a delivery this batch needed held is no longer held by this "
                       f"client: {message}")
    if status == 413:
        raise ItemTooLarge(f"the queue service refused the item: {message}")
    if code == "DuplicateMessage":
        raise DuplicateMessage(message)
    if code == "CodecMismatch":
        raise CodecMismatch(message)
    if code == "UnsupportedEncoding":
        raise EncodingRefused(message, codec=error.get("codec"),
                              encoding=error.get("encoding"))
    raise AckQueueError(f"the queue service answered HTTP {status} {code}: {message}")

