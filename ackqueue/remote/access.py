"""How the remote drop-in reaches a queue service that asks for TLS and a bearer token
(``ackqueue serve --tls-cert/--tls-key --auth FILE``, ackqueue.service.auth).

Everything is in the queue's URL, as a ``zeo://`` address carries its TLS files
(ackqueue.zeo.client.parse_zeo_url), so that one string opens the queue::

    https://alice@jobs.example:8080?tls_ca=service-ca.pem&token_file=alice.token

- ``tls_ca=FILE``: the CA (PEM) that signed the service's certificate; the host name is
  checked against it.  Without it, https:// trusts the system's CAs.
- ``token_file=FILE``: the client's secret, sent as ``Authorization: Bearer <secret>``
  on every request.  A file, never the URL itself, so the secret stays out of the queue's
  repr, logs and process listings; a password in the URL is refused for that reason.
- ``NAME@``: the client's name in the service's auth file.  Under ``--auth`` a client id
  must be that name or start with ``NAME:``, so this process's client id becomes
  ``NAME:host:pid:random`` (without a name, the service refuses the lease: the error
  says to add it).

A token is sent over https://, or over http:// to this machine only (127.0.0.0/8, ::1,
localhost: what ``ackqueue serve`` itself allows without TLS).
"""
import ssl

from ..zeo.tls import client_context, is_loopback

__all__ = ["Access", "parse_options", "verify_failed", "refused"]

_NUMBER_OPTIONS = ("wait_timeout",)
_FILE_OPTIONS = ("tls_ca", "token_file")


def parse_options(parts, url):
    """{option: value} of a service URL's query (urllib.parse.urlsplit parts): seconds
    for wait_timeout, file paths for tls_ca and token_file; ValueError for anything else."""
    import urllib.parse
    options = {}
    for key, values in urllib.parse.parse_qs(parts.query).items():
        value = values[-1]
        if key in _FILE_OPTIONS:
            options[key] = value
            continue
        if key not in _NUMBER_OPTIONS:
            raise ValueError(f"unknown option {key!r} in the queue service URL (known: "
                             f"{', '.join(_NUMBER_OPTIONS + _FILE_OPTIONS)})")
        try:
            options[key] = float(value)
        except ValueError:
            raise ValueError(f"{key} must be seconds, not {value!r}") from None
        if not options[key] > 0:
            raise ValueError(f"{key} must be positive")
    return options


class Access:
    """The TLS context, headers and client id prefix of one service URL."""

    def __init__(self, parts, options, url):
        https = parts.scheme.lower() == "https"
        if parts.password is not None:
            raise ValueError("a queue service URL carries no password (it would show in "
                             "reprs and logs): put the token in a file and give "
                             "token_file=FILE")
        self.name = parts.username or None
        self.tls_ca = options.get("tls_ca")
        if self.tls_ca is not None and not https:
            raise ValueError("tls_ca= applies to an https:// queue service URL")
        self._context = None
        self.headers = {}
        token_file = options.get("token_file")
        if token_file is not None:
            if not https and not is_loopback(parts.hostname):
                raise ValueError(f"token_file= over http:// to {parts.hostname} would send "
                                 "the token in clear text: use https:// (ackqueue serve "
                                 "--tls-cert/--tls-key)")
            self.headers["Authorization"] = f"Bearer {_read_token(token_file)}"
        if https:
            self._context = (client_context(self.tls_ca) if self.tls_ca is not None
                             else ssl.create_default_context())

    def ssl_context(self):
        return self._context

    def client_id(self, base):
        """This process's client id (base: host:pid:random) under the URL's client name."""
        return base if self.name is None else f"{self.name}:{base}"


def _read_token(path):
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read token_file {path}: {exc.strerror}") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"token_file {path} must hold one token (no spaces)")
    return token


def verify_failed(target, exc):
    """The error of a service whose certificate this client does not trust."""
    hint = ("give the CA that signed it: ?tls_ca=CA.pem" if target.access.tls_ca is None
            else f"it is not signed by {target.access.tls_ca} for host {target.host}")
    return (f"the queue service at {target.url} presented a certificate this client does "
            f"not trust ({exc.verify_message}): {hint}")


def refused(target, status, doc):
    """The error of a lease the service refused for want of credentials or rights."""
    message = doc.get("error", {}).get("message", "") if isinstance(doc, dict) else str(doc)
    if status == 401:
        hint = ("give the client's token: ?token_file=FILE" if "Authorization"
                not in target.access.headers else "the token in token_file is not known")
    else:
        hint = ("name the client in the URL (https://NAME@HOST:PORT): under --auth a client "
                "id starts with the client's name" if target.access.name is None else
                f"is {target.access.name!r} the name the token belongs to?")
    return f"the queue service at {target.url} refused this client (HTTP {status}: " \
           f"{message}); {hint}"
