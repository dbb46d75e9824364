"""The queue service (``ackqueue serve``): one process owns the store and serves the
native HTTP API (/v1) to any number of clients, so that their operations share the
library's group commit.  Needs aiohttp (``pip install 'ackqueue[service]'``).

- core.py: queues opened lazily by name, client sessions with leases, receipt handles;
- http.py: the aiohttp application (handlers, errors, long polls without threads);
- openapi.py: the OpenAPI document served at /openapi.json;
- server.py: ``serve()``, what the command runs.
"""
__all__ = ["serve"]


def serve(*args, **kwargs):
    from .server import serve as _serve
    return _serve(*args, **kwargs)
