"""Who may reach a shared queue: ``ackqueue server`` with TLS and client
certificates, and its refusal to listen beyond this machine without them.

Certificates are made in the test with the openssl command (a CA for the server, a CA for
clients, and certificates they sign); the server is the real console script.
"""
import shutil
import subprocess
from urllib.parse import quote

import pytest

from ackqueue import AckQueue, ServerUnavailable

from zeo_server import Server, console_script

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d, name):
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}", cwd=d)


def _signed(d, name, ca, server=False):
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else
                   "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", ext.name,
             cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for ca in ("server-ca", "client-ca", "rogue-ca"):
        _ca(d, ca)
    _signed(d, "server", "server-ca", server=True)
    _signed(d, "client", "client-ca")
    _signed(d, "rogue", "rogue-ca")
    return d


@pytest.fixture
def tls_server(pki, tmp_path):
    srv = Server(tmp_path / "tls.fs", tmp_path / "server.log", extra=(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "client-ca.pem")))
    yield srv
    srv.stop()


def url(srv, pki, who="client", **more):
    q = {"tls_ca": str(pki / "server-ca.pem")}
    if who:
        q.update(tls_cert=str(pki / f"{who}.pem"), tls_key=str(pki / f"{who}.key"))
    q.update(more)
    return srv.url + "?" + "&".join(f"{k}={quote(str(v))}" for k, v in q.items())


def test_a_client_with_a_certificate_the_server_trusts_uses_the_queue(tls_server, pki):
    with AckQueue(path=url(tls_server, pki), name="jobs") as q:
        q.put({"over": "tls"})
        assert q.get(timeout=30) == {"over": "tls"}
        q.task_done()
    assert "TLS with client certificates" in tls_server.banner


@pytest.mark.parametrize("who", [None, "rogue"])
def test_a_client_without_a_trusted_certificate_is_refused(tls_server, pki, who):
    with pytest.raises(ServerUnavailable):
        AckQueue(path=url(tls_server, pki, who, wait_timeout=3), name="jobs")


def test_a_plain_client_cannot_talk_to_a_tls_server(tls_server):
    with pytest.raises(ServerUnavailable):
        AckQueue(path=tls_server.url + "?wait_timeout=3", name="jobs")


def test_the_url_checks_its_tls_options():
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        AckQueue(path="zeo://127.0.0.1:1?tls_cert=a.pem")
    with pytest.raises(ValueError, match="unknown option"):
        AckQueue(path="zeo://127.0.0.1:1?tls=yes")


def test_the_server_refuses_to_listen_beyond_this_machine_without_tls(tmp_path):
    run = subprocess.run([console_script(), "server", str(tmp_path / "q.fs"),
                          "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert "refusing to serve 0.0.0.0" in run.stderr and "Traceback" not in run.stderr
    assert any("--insecure" in line for line in lines)
    assert not (tmp_path / "q.fs").exists(), "nothing is created when it cannot start"


def test_insecure_serves_beyond_this_machine_without_tls(tmp_path):
    srv = Server(tmp_path / "q.fs", tmp_path / "server.log",
                 extra=("--listen", "0.0.0.0:0", "--insecure"))   # the last --listen wins
    try:
        assert "zeo://0.0.0.0:" in srv.banner
        with AckQueue(path=srv.url) as q:          # reached through the loopback address
            q.put(1)
            assert q.get(timeout=30) == 1
            q.task_done()
    finally:
        srv.stop()
