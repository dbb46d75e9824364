"""The queue service (``ackqueue serve``): one process owns the store and serves its
queues over HTTP to any number of clients, so that their operations share the library's
group commit.  Needs aiohttp (``pip install 'ackqueue[service]'``).

Layers, each importing only those below it:
- main.py: ``serve()``, what the command runs; app.py: make_app, the one composition root
  that assembles every front;
- the fronts, each an add_routes(app, api): http.py (the native API, /v1), rpc.py
  (Sasquatch's RPC-style JSON API), sqs/ (the SQS protocol), atomic_batch.py,
  leased_batches.py, encodings.py, admin.py, stats.py; auth.py, gate.py and listener.py
  guard the connections and requests;
- runtime.py: the per-application runtime every front shares (loop, pool, long poll,
  wake-ups, put_many, ack_many, sessions, reaper); params.py: request parameters;
  errors.py: the error answers; openapi.py: the OpenAPI document (package data);
- backend.py: the one backend: queues opened lazily by name, client sessions with leases,
  receipt handles; streams.py: the stream leases' store record.
"""
__all__ = ["serve"]


def serve(*args, **kwargs):
    from .main import serve as _serve
    return _serve(*args, **kwargs)
