"""The OpenAPI 3 document of the service's HTTP APIs (the native API, the atomic and
leased batches, admin, a queue's codec, the stats page and metrics, Sasquatch's API),
served at /openapi.json.  The SQS protocol (POST /) is described by AWS, not here.

The document is package data, ``ackqueue/service/openapi.json`` (setup.py's
package_data), read once; tests/test_service_openapi.py checks that every route of the
application but the SQS protocol's is in it and every operation in it is a route, and
that the limits it states are the code's.  Every operation that answers errors documents
503 StorageFull: any of them may open (make) a queue or commit, which a full disk refuses
(storagefull.py).
"""
import functools
import json
from importlib import resources

__all__ = ["document"]


@functools.lru_cache(maxsize=1)
def _text():
    return resources.files(__package__).joinpath("openapi.json").read_text("utf-8")


def document():
    """The OpenAPI document, a new dict at each call (the caller may change it)."""
    return json.loads(_text())
