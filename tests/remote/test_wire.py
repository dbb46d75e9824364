"""ackqueue.remote.http, the remote drop-in's HTTP/1.1 client, against a real socket server that
answers with the bytes each test gives (the answers the service's aiohttp sends, and the
ones HTTP allows that it does not: chunks, 100 Continue, HTTP/1.0, a cut-off body)."""
import socket
import threading

import pytest

from ackqueue.remote import http as wire


class Peer:
    """A loopback server: for each request read (head and Content-Length body), send the
    next canned answer; records the requests it read."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.srv.accept()
        buf = b""
        with conn:
            for answer in self.answers:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append((head, buf[:length]))
                buf = buf[length:]
                if answer is None:
                    return                    # hang up without answering
                conn.sendall(answer)
                if b"Content-Length" not in answer and b"chunked" not in answer \
                        and answer.startswith(b"HTTP/1.1 200"):
                    return                    # a body without a length ends at the close

    def close(self):
        self.srv.close()


def connect(peer):
    return wire.Connection("127.0.0.1", peer.port, 5)


def test_a_request_is_one_write_and_the_answer_is_read_by_its_length():
    peer = Peer([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 8\r\n\r\n{\"id\":7}",
                 b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"])
    c = connect(peer)
    status, headers, body = c.request("POST", "/v1/queues/q/messages", b"\x80\x05K\x01.",
                                      {"Content-Type": "application/x-python-pickle"})
    assert (status, body, headers["content-type"]) == (200, b'{"id":7}', "application/json")
    assert not c.will_close
    status, _, body = c.request("GET", "/nothing")          # the same connection
    assert (status, body) == (404, b"{}")
    head, sent = peer.requests[0]
    assert head.startswith(b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 5" in head and sent == b"\x80\x05K\x01."
    assert b"Content-Length" not in peer.requests[1][0], "a GET carries no body"
    c.close()
    peer.close()


def test_a_chunked_answer_after_a_100_continue():
    peer = Peer([b"HTTP/1.1 100 Continue\r\n\r\n"
                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-Trailer: 1\r\n\r\n"])
    c = connect(peer)
    assert c.request("POST", "/x", b"")[::2] == (200, b"abcdefg")
    c.close()
    peer.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\n\r\nok",                       # no length: up to the close
])
def test_an_answer_that_ends_the_connection_says_so(answer):
    peer = Peer([answer, None])
    c = connect(peer)
    status, _, body = c.request("GET", "/")
    assert (status, body, c.will_close) == (200, b"ok", True)
    c.close()
    peer.close()


@pytest.mark.parametrize("answer", [
    None,                                                  # hung up, nothing sent
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # the body cut off
    b"SSH-2.0-OpenSSH\r\n\r\n",                             # not HTTP
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_what_cannot_be_read_raises_an_oserror(answer):
    peer = Peer([answer, None] if answer else [None])
    c = connect(peer)
    with pytest.raises(OSError):
        c.request("GET", "/")
    c.close()
    peer.close()


def test_a_silent_server_times_out():
    srv = socket.create_server(("127.0.0.1", 0))          # accepts, never answers
    c = wire.Connection("127.0.0.1", srv.getsockname()[1], 0.2)
    with pytest.raises(socket.timeout):
        c.request("GET", "/")
    c.close()
    srv.close()
