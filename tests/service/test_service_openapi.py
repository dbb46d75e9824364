"""The OpenAPI document (package data: ackqueue/service/openapi.json) and the service's
application agree: every route of make_app but the SQS protocol's POST / is documented,
every documented operation is a route, and the limits the document states are the code's."""
import pytest

pytest.importorskip("aiohttp")

from ackqueue import codec, store                       # noqa: E402
from ackqueue.frames import FRAMES                      # noqa: E402
from ackqueue.service.openapi import document           # noqa: E402
from ackqueue.service.params import MAX_BATCH           # noqa: E402

METHODS = {"get", "put", "post", "delete", "patch"}
SQS = {("post", "/")}           # the SQS protocol: one route, its actions in the body


def app_routes():
    """(method, path) of every route of the real application (make_app)."""
    from ackqueue.service.app import API, make_app
    from ackqueue.service.backend import Service
    service = Service(None)
    app = None
    try:
        app = make_app(service, pool_size=1)
        return {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
                if r.method != "HEAD"}
    finally:
        if app is not None:
            app[API].pool.shutdown()
        service.close()


def operations(doc):
    return {(m, path) for path, item in doc["paths"].items() for m in item if m in METHODS}


def test_every_route_is_documented_and_every_operation_is_a_route():
    routes, documented = app_routes(), operations(document())
    assert SQS <= routes
    assert routes - SQS - documented == set(), "routes missing from openapi.json"
    assert documented - routes == set(), "operations in openapi.json that are no route"


def test_the_document_states_the_codes_limits():
    doc = document()
    schemas = doc["components"]["schemas"]
    assert set(schemas["Message"]["properties"]["encoding"]["enum"]) == set(codec.CODECS)
    put = doc["paths"]["/v1/queues/{name}/codec"]["put"]
    [param] = [p for p in put["parameters"] if p["name"] == "codec"]
    assert set(param["schema"]["enum"]) == set(codec.CODECS)
    pack = doc["paths"]["/v1/pack"]["post"]["parameters"][0]["schema"]
    assert pack["maximum"] == store.MAX_RETENTION
    assert FRAMES in doc["paths"]["/v1/batch"]["post"]["requestBody"]["content"]
    acks = doc["paths"]["/v1/queues/{name}/ack"]["post"]["requestBody"]
    assert acks["content"]["application/json"]["schema"]["properties"]["receipts"][
        "maxItems"] == MAX_BATCH


def test_every_operation_that_answers_errors_documents_storage_full():
    for path, item in document()["paths"].items():
        for method, op in item.items():
            responses = op.get("responses", {})
            if any(code[0] in "45" for code in responses):
                assert "503" in responses, (method, path)


def test_each_call_gets_its_own_document():
    doc = document()
    doc["paths"].clear()
    assert document()["paths"]
