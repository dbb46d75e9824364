"""The service's aiohttp application as make_app builds it: its state under typed app
keys (no aiohttp NotAppKeyWarning), the runtime's service the one it was given.
"""
import json
import warnings

import pytest

pytest.importorskip("aiohttp")

from aiohttp import web                                          # noqa: E402


def test_make_app_uses_app_keys_no_not_app_key_warning(tmp_path):
    from ackqueue.service import auth as auth_mod
    from ackqueue.service.backend import Service
    from ackqueue.service.app import API, make_app
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"clients": {"root": {
        "secret": "admin-secret-012345678", "rights": {"*": ["admin"]}}}}))
    service = Service(None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            app = make_app(service, pool_size=1, auth=auth_mod.load_auth(str(path)))
        assert not [w for w in caught if issubclass(w.category, web.NotAppKeyWarning)], \
            [str(w.message) for w in caught]
        assert app[API].service is service
    finally:
        app[API].pool.shutdown()
        service.close()
