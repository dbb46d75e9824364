"""Verification of AWS Signature Version 4 (what boto3, the AWS CLI and every AWS SDK send:
``Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request,
SignedHeaders=..., Signature=...``), as AWS documents it: the canonical request, the string
to sign and the signing key derived from the secret by HMAC-SHA256 over the date, region
and service.  The signature is recomputed here and compared in constant time.

``verify`` returns the access key id (and the region of the credential scope) or raises
SqsError with SQS's own codes: MissingAuthenticationToken (no signature),
IncompleteSignature (malformed), InvalidClientTokenId (unknown key), SignatureDoesNotMatch
(wrong signature, a request more than 5 minutes away from the server's clock, or an
``x-amz-content-sha256`` header that is not the SHA-256 of the body received).

The payload hash signed is always that of the body received (``payload_hash``), so a
signature covers the body: a captured request cannot carry another one."""
import datetime
import hashlib
import hmac
import re
import time
from urllib.parse import quote, unquote

from .errors import SqsError

__all__ = ["verify", "payload_hash", "MAX_SKEW"]

MAX_SKEW = 300.0                    # seconds a signed request may be from the server's time
_AUTH = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),"
                   r"\s*Signature=([0-9a-f]{64})\s*\Z")


def _hmac(key, msg):
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret, date, region, service):
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _canonical_query(raw_query):
    pairs = []
    for part in raw_query.split("&") if raw_query else ():
        k, _, v = part.partition("=")
        pairs.append((quote(unquote(k), safe="-_.~"), quote(unquote(v), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def payload_hash(headers, body):
    """The payload hash of the canonical request: the SHA-256 (lower-case hex) of the body
    received, always.  A client may send it as ``x-amz-content-sha256`` (the AWS JS SDK
    does); such a header must then be exactly that hash, signed or not: taking its value
    instead would let a captured request carry another body.  UNSIGNED-PAYLOAD and the
    STREAMING-* values of S3 bind no body and are refused (SignatureDoesNotMatch, as AWS
    answers for a body that is not the one signed)."""
    digest = hashlib.sha256(body).hexdigest()
    claimed = headers.get("x-amz-content-sha256")
    if claimed is None or claimed == digest:
        return digest
    if claimed == "UNSIGNED-PAYLOAD" or claimed.startswith("STREAMING-"):
        raise SqsError("SignatureDoesNotMatch",
                       f"x-amz-content-sha256: {claimed} is not accepted for SQS: sign the "
                       "payload (its SHA-256), as the AWS SDKs do for SQS.")
    raise SqsError("SignatureDoesNotMatch",
                   "The x-amz-content-sha256 header does not match the SHA-256 of the request "
                   "body received: the body is not the one signed.")


def canonical_request(method, path, raw_query, headers, signed, body):
    """The canonical request of AWS's documentation (headers: name -> value as sent)."""
    lines = []
    for name in signed:
        value = headers.get(name)
        if value is None:
            raise SqsError("SignatureDoesNotMatch",
                           f"The signed header {name} is missing from the request.")
        lines.append(f"{name}:{' '.join(value.strip().split())}\n")
    payload = payload_hash(headers, body)
    uri = quote(path or "/", safe="/-_.~%")
    return "\n".join([method, uri, _canonical_query(raw_query), "".join(lines),
                      ";".join(signed), payload])


def verify(method, path, raw_query, headers, body, secret_of, now=None):
    """(access key id, region) of a correctly signed request.  headers: a mapping of
    lower-cased names to values; secret_of(key id) -> the secret or None."""
    now = time.time() if now is None else now
    header = headers.get("authorization")
    if not header:
        raise SqsError("MissingAuthenticationToken",
                       "Request is missing Authentication Token")
    found = _AUTH.match(header.strip())
    if not found:
        raise SqsError("IncompleteSignature",
                       "Authorization header requires Credential, SignedHeaders and "
                       "Signature parameters (AWS4-HMAC-SHA256).")
    credential, signed, signature = found.groups()
    scope = credential.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise SqsError("IncompleteSignature", f"Invalid credential scope {credential!r}.")
    key_id, date, region, service, _ = scope
    secret = secret_of(key_id)
    if secret is None:
        raise SqsError("InvalidClientTokenId",
                       "The security token included in the request is invalid.")
    amz_date = headers.get("x-amz-date", "")
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        raise SqsError("IncompleteSignature", "the request has no valid X-Amz-Date") from None
    if abs(now - when) > MAX_SKEW:
        stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        raise SqsError("SignatureDoesNotMatch",
                       f"Signature expired: {amz_date} is now earlier than "
                       f"{(stamp - datetime.timedelta(seconds=MAX_SKEW)):%Y%m%dT%H%M%SZ} "
                       f"({stamp:%Y%m%dT%H%M%SZ} - 5 min.)")
    names = signed.split(";")
    creq = canonical_request(method, path, raw_query, headers, names, body)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, "/".join(scope[1:]),
                         hashlib.sha256(creq.encode("utf-8")).hexdigest()])
    expected = hmac.new(signing_key(secret, date, region, service), to_sign.encode("utf-8"),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SqsError("SignatureDoesNotMatch",
                       "The request signature we calculated does not match the signature "
                       "you provided. Check your AWS Secret Access Key and signing method.")
    return key_id, region
