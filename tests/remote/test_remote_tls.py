"""The remote drop-in over https:// with a bearer token: the real ``ackqueue
serve --tls-cert/--tls-key --auth FILE``, a self-signed certificate made in the test with
the openssl command, and AckQueue(path="https://NAME@HOST:PORT?tls_ca=...&token_file=...")."""
import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("aiohttp")

from ackqueue import AckQueue, AckQueueError  # noqa: E402

from tests.certs import self_signed_for_loopback      # noqa: E402
from tests.service.test_service_stats_auth import Served       # noqa: E402

TOKEN = "alice-secret-0123456789abcdef"
READER = "reader-secret-0123456789abcdef"


@pytest.fixture
def pki(tmp_path):
    """A self-signed certificate for 127.0.0.1 (its own CA) made with openssl."""
    self_signed_for_loopback(tmp_path)
    (tmp_path / "alice.token").write_text(TOKEN + "\n")
    (tmp_path / "reader.token").write_text(READER + "\n")
    (tmp_path / "wrong.token").write_text("not-a-token-of-anyone-at-all\n")
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"clients": {
        "alice": {"secret": TOKEN, "rights": {"*": ["read", "write"]}},
        "reader": {"secret": READER, "rights": {"*": ["read"]}}}}))
    return tmp_path


@pytest.fixture
def service(pki):
    s = Served(pki, "--tls-cert", str(pki / "cert.pem"), "--tls-key", str(pki / "key.pem"),
               "--auth", str(pki / "auth.json"), path=None, cafile=str(pki / "cert.pem"))
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait(30)


def _url(s, pki, who="alice", token="alice.token", ca=True, wait=None):
    query = [f"tls_ca={pki / 'cert.pem'}"] if ca else []
    if token:
        query.append(f"token_file={pki / token}")
    if wait:
        query.append(f"wait_timeout={wait}")
    user = f"{who}@" if who else ""
    return f"https://{user}127.0.0.1:{s.port}?{'&'.join(query)}"


def test_put_get_ack_over_https_with_a_token_across_processes(service, pki):
    assert service.scheme == "https"
    url = _url(service, pki)
    q = AckQueue(path=url, name="jobs", visibility_timeout=60)
    q.put({"n": 1})
    code = f"""
        from ackqueue import AckQueue
        q = AckQueue(path={url!r}, name="jobs")
        m = q.get_message(timeout=20)
        q.ack(m)
        q.put(("seen", m.body))
        q.close()
        """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], timeout=120)
    assert done.returncode == 0
    assert q.get(timeout=20) == ("seen", {"n": 1})
    q.task_done()
    assert q.stats()["acked"] == 2
    assert TOKEN not in repr(q) and "token" not in repr(q)
    q.close()
    assert service.stop() == 0


def test_refusals_say_what_to_give(service, pki):
    with pytest.raises(AckQueueError, match="tls_ca"):          # untrusted: no retries
        AckQueue(path=_url(service, pki, ca=False), name="jobs")
    with pytest.raises(AckQueueError, match="token_file"):      # no token: 401
        AckQueue(path=_url(service, pki, token=None), name="jobs")
    with pytest.raises(AckQueueError, match="not known"):       # a wrong token: 401
        AckQueue(path=_url(service, pki, token="wrong.token"), name="jobs")
    with pytest.raises(AckQueueError, match="NAME@"):           # no client name: 403
        AckQueue(path=_url(service, pki, who=None), name="jobs")
    with pytest.raises(ValueError, match="password"):
        AckQueue(path=f"https://alice:{TOKEN}@127.0.0.1:{service.port}", name="jobs")
    reader = AckQueue(path=_url(service, pki, who="reader", token="reader.token"),
                      name="jobs")
    with pytest.raises(AckQueueError, match="403"):              # read right only
        reader.put("x")
    with pytest.raises(AckQueueError, match="403"):              # dead-lettering writes
        reader.get(timeout=0.1, max_receives=2, dead_letter="jobs-dead")
    reader.close()
    assert service.stop() == 0
