"""The service's composition root: make_app builds the aiohttp application from the
backend (backend.Service), its runtime (runtime.Api) and every front's add_routes: the
native API (http.py), the atomic batch (atomic_batch.py), admin (admin.py), a queue's
codec (encodings.py), leased batches (leased_batches.py), the stats page and metrics
(stats.py), Sasquatch's RPC-style API (rpc.py) and the SQS protocol (sqs/).  It is the
only module that imports them all; only main.py (``ackqueue serve``) and tests import it.
"""
from aiohttp import web

from . import admin, atomic_batch, encodings, http, leased_batches, rpc, sqs, stats
from .runtime import API, Api

__all__ = ["make_app", "API"]


def make_app(service, *, pool_size=64, max_body=1 << 20, client_timeout=60.0,
             sasquatch=None, auth=None):
    """The aiohttp application serving service's native API, Sasquatch's API
    (sasquatch: its config.SasquatchSettings, or None: the defaults), the SQS protocol,
    the stats page and metrics (auth: an auth.Auth, or None: no access control)."""
    api = Api(service, pool_size=pool_size, max_body=max_body, client_timeout=client_timeout)
    app = web.Application(middlewares=[api.errors], client_max_size=api.client_max_size)
    app[API] = api
    app.on_startup.append(api.on_startup)
    app.on_shutdown.append(api.on_shutdown)
    app.on_cleanup.append(api.on_cleanup)
    http.add_routes(app, api)                   # the native API (/health, /v1/queues...)
    atomic_batch.add_routes(app, api)                 # POST /v1/batch
    admin.add_routes(app, api)                  # redrive, pack
    encodings.add_routes(app, api)                # /v1/queues/{name}/codec
    leased_batches.add_routes(app, api)               # leased batches, row puts (stream processors)
    stats.add_routes(app, api, json_first=rpc.sasquatch_stats)  # /stats, /metrics
    rpc.add_routes(app, api, sasquatch)         # Sasquatch's API on the same port
    sqs.add_routes(app, api, auth)              # the SQS JSON protocol on POST /
    if auth is not None:                        # before anything else runs but the body's
        app.middlewares.insert(0, auth.middleware)    # size and time checks, just below
        app.middlewares.insert(0, api.body_limits)
    return app
