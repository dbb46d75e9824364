"""TLS for a queue server: who may reach a shared queue.

A queue server (``ackqueue server``, ZEO) holds pickles, and whoever can write to it can
make every consumer that unpickles run code of their choosing.  So a server reachable
beyond this machine should accept only clients that hold a certificate it trusts, over an
encrypted connection, as RabbitMQ, Kafka and SQS authenticate every client:

- the server: ``ackqueue server jobs.fs --listen 0.0.0.0:8100 --tls-cert server.pem
  --tls-key server.key --tls-client-ca clients-ca.pem``: TLS, and a client certificate
  signed by that CA is required (the handshake fails without one);
- a client: ``zeo://HOST:8100?tls_ca=server-ca.pem&tls_cert=client.pem&tls_key=client.key``:
  it checks the server's certificate against ``tls_ca`` and the host name, and presents
  its own.

ZEO's client and server take an ssl.SSLContext; this module makes them.
"""
import ipaddress
import ssl

__all__ = ["server_context", "client_context", "is_loopback"]


def server_context(cert, key, client_ca):
    """A server context: our certificate, and clients must present one client_ca signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca, cert=None, key=None):
    """A client context that trusts the server certificates ca signed (checking the host
    name), presenting our certificate when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def is_loopback(host):
    """Whether host names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
