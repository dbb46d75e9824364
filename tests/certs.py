"""Certificates for tests, made with the openssl command line (no mock TLS)."""
import shutil
import subprocess

import pytest


def self_signed_for_loopback(directory):
    """(certfile, keyfile): a self-signed EC certificate for 127.0.0.1, its own CA, valid
    for 2 days, written into directory.  Skips the calling test without openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a self-signed certificate")
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(keyfile), "-out", str(certfile)],
                   check=True, capture_output=True, timeout=60)
    return certfile, keyfile
