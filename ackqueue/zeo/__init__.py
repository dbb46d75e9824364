"""Sharing a queue file through ZEO: the client (client.py), the queue server
(server.py, ``ackqueue server``) and their TLS contexts (tls.py)."""
