"""A real TCP proxy on loopback that cuts a connection instead of passing on an answer: how
the tests make a request whose answer never arrives (an uncertain commit), for real."""
import socket
import threading


class CuttingProxy:
    """Forward 127.0.0.1:port to 127.0.0.1:target_port.  Once ``armed`` is set, the proxy
    closes a connection instead of passing on an answer, once: the next answer at all
    (marker None), or the first answer after a request containing marker has reached the
    server (so the server got the request and acted on it).  ``cuts`` counts the cuts."""

    def __init__(self, target_port, marker=None):
        self.target = ("127.0.0.1", target_port)
        self.marker = marker
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.cuts = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            conn = {"cut": False}       # this connection's answer is to be cut
            threading.Thread(target=self._pump, args=(client, server, conn, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conn, False),
                             daemon=True).start()

    def _pump(self, src, dst, conn, upstream):
        tail = b""                      # a marker may straddle two reads
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    if (self.marker is not None and self.armed.is_set()
                            and self.marker in tail + data):
                        self.armed.clear()
                        conn["cut"] = True
                elif conn["cut"] or (self.marker is None and self.armed.is_set()):
                    self.armed.clear()
                    self.cuts += 1      # this answer never reaches the client
                    break
                dst.sendall(data)
                tail = data[-32:]
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self):
        self.closed = True
        self.listener.close()
