"""The Spark source's and sink's way to the queue service: a few native-API requests
(ackqueue/service/http.py and service/leased_batches.py), in batches, over http.client.

It runs in Spark's driver and in its Python workers alike, so it holds nothing that cannot
be made again: a connection is opened on first use in each process and each object is
pickled without it.
"""
import http.client
import json
import socket
import time
import urllib.parse

from ackqueue.frames import FRAMES, decode_frames, encode_frames

__all__ = ["Client", "ServiceError", "encode_frames", "decode_frames"]



class ServiceError(RuntimeError):
    """The queue service refused a request or could not be reached."""




def _q(value):
    return urllib.parse.quote(str(value), safe="")


class Client:
    """Requests to the service at url (http or https), with an optional bearer token.
    A request that cannot reach the service is retried for retry_for seconds."""

    def __init__(self, url, token=None, timeout=60.0, retry_for=30.0):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url must be the queue service's http(s)://host:port, not {url!r}")
        self.url, self.https, self.host = url, u.scheme == "https", u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.token, self.timeout, self.retry_for = token, timeout, retry_for
        self._conn = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method, path, body=None, content_type=None):
        """(content type, data) of a 2xx answer; ServiceError otherwise."""
        headers = {}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        deadline, pause = time.monotonic() + self.retry_for, 0.05
        while True:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._conn.request(method, self.prefix + path, body=body, headers=headers)
                r = self._conn.getresponse()
                data = r.read()
                if r.will_close:
                    self.close()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if time.monotonic() + pause > deadline:
                    raise ServiceError(f"the queue service at {self.url} could not be "
                                       f"reached ({exc!r})") from exc
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
        if not 200 <= r.status < 300:
            try:
                err = json.loads(data)["error"]
                why = f"{err['code']}: {err['message']}"
            except (ValueError, KeyError, TypeError):
                why = data[:200].decode("utf-8", "replace")
            raise ServiceError(f"{method} {path.split('?')[0]} -> HTTP {r.status} ({why})")
        return r.getheader("Content-Type", ""), data

    def json(self, method, path, body=None, content_type=None):
        return json.loads(self.request(method, path, body, content_type)[1])

    # -- the calls the source, the sink and the snapshot make ---------------------------

    def counts(self, queue):
        return self.json("GET", f"/v1/queues/{_q(queue)}")["stats"]

    def _read(self, queue, stream, seq, part, n, visibility_timeout, max_receives,
              dead_letter, **extra):
        query = {"max": n, "visibility_timeout": visibility_timeout, **extra}
        if max_receives is not None:
            query["max_receives"] = max_receives
        if dead_letter is not None:
            query["dead_letter"] = dead_letter
        return decode_frames(self.request(
            "POST", f"/v1/queues/{_q(queue)}/streams/{_q(stream)}/batches/{seq}/{part}?"
            + urllib.parse.urlencode(query))[1])

    def read_batch(self, queue, stream, seq, part, n, visibility_timeout, max_receives=None,
                   dead_letter=None):
        """[(header dict, payload bytes)] of a leased batch part (service/leased_batches.py)."""
        parts = self._read(queue, stream, seq, part, n, visibility_timeout, max_receives,
                           dead_letter)
        heads = json.loads(parts[0])["messages"]
        return list(zip(heads, parts[1:]))

    def read_columns(self, queue, stream, seq, part, n, visibility_timeout,
                     max_receives=None, dead_letter=None):
        """(columns dict, payload offsets, payloads) of a leased batch part, in the
        service's columnar answer (format=columns; service/leased_batches.py)."""
        head, offsets, data = self._read(queue, stream, seq, part, n, visibility_timeout,
                                         max_receives, dead_letter, format="columns")
        return json.loads(head), offsets, data

    def commit(self, queue, stream, upto):
        return self.json("POST", f"/v1/queues/{_q(queue)}/streams/{_q(stream)}/commit?"
                         f"upto={int(upto)}")

    def streams(self, queue):
        """{stream: {"committed", "parts", "messages"}} leased from queue now."""
        return self.json("GET", f"/v1/queues/{_q(queue)}/streams")["streams"]

    def put_rows(self, queue, bodies, dedup_ids, priorities, attributes, encoding,
                 dedup_window):
        head = {"dedup_ids": dedup_ids, "priorities": priorities, "attributes": attributes}
        body = encode_frames([json.dumps(head, separators=(",", ":")).encode()] + bodies)
        return self.json("POST", f"/v1/queues/{_q(queue)}/rows?encoding={encoding}"
                         f"&dedup_window={dedup_window:g}", body, FRAMES)

    def browse(self, queue, after=-1, limit=1000):
        return self.json("GET", f"/v1/queues/{_q(queue)}/browse?after={after}&limit={limit}")
