"""The remote drop-in: ``AckQueue(path="http://HOST:PORT", name=...)`` through
``ackqueue serve``.  database.py (RemoteDatabase, RemoteState), connection.py
(RemoteConnection, the front's per-thread proxy), block.py (atomic blocks as one batch
request), http.py (the HTTP/1.1 client and the service's error answers), access.py (TLS
and the bearer token)."""
