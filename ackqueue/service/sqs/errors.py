"""SQS's errors as the JSON protocol carries them: HTTP status, a JSON body
``{"__type": "com.amazonaws.sqs#Code", "message": ...}`` and the ``x-amzn-query-error``
header (``LegacyCode;Sender``) from which the SDKs (botocore, the AWS SDKs of other
languages) take the error code a program matches on (e.g.
``AWS.SimpleQueueService.NonExistentQueue``, what ``QueueDoesNotExist`` is called in SQS's
query API)."""
import json
import uuid

from aiohttp import web

__all__ = ["SqsError", "error_response", "CONTENT_TYPE"]

CONTENT_TYPE = "application/x-amz-json-1.0"

# code -> (the legacy (query) code SDKs match, HTTP status, fault)
_CODES = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400, "Sender"),
    "QueueNameExists": ("QueueAlreadyExists", 400, "Sender"),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400, "Sender"),
    "InvalidParameterValue": ("InvalidParameterValue", 400, "Sender"),
    "InvalidParameterCombination": ("InvalidParameterCombination", 400, "Sender"),
    "MissingParameter": ("MissingParameter", 400, "Sender"),
    "InvalidAttributeName": ("InvalidAttributeName", 400, "Sender"),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400, "Sender"),
    "InvalidAddress": ("InvalidAddress", 404, "Sender"),
    "InvalidMessageContents": ("InvalidMessageContents", 400, "Sender"),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400, "Sender"),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400, "Sender"),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400,
                                 "Sender"),
    "TooManyEntriesInBatchRequest": (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400, "Sender"),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400, "Sender"),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400, "Sender"),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400, "Sender"),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400, "Sender"),
    "OverLimit": ("OverLimit", 403, "Sender"),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404, "Sender"),
    "InvalidAction": ("InvalidAction", 400, "Sender"),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403, "Sender"),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403, "Sender"),
    "IncompleteSignature": ("IncompleteSignature", 400, "Sender"),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403, "Sender"),
    "AccessDenied": ("AccessDenied", 403, "Sender"),
    "RequestTooLarge": ("RequestTooLarge", 413, "Sender"),
    "InternalError": ("InternalError", 500, "Receiver"),
    "ServiceUnavailable": ("ServiceUnavailable", 503, "Receiver"),
}


class SqsError(Exception):
    """An SQS error: code is one of _CODES' keys (the JSON protocol's error name)."""

    def __init__(self, code, message, *, headers=None):
        if code not in _CODES:
            raise ValueError(f"not an SQS error code: {code}")
        super().__init__(message)
        self.code, self.message = code, message
        self.headers = headers          # more response headers (Retry-After, say)

    @property
    def legacy_code(self):
        return _CODES[self.code][0]

    @property
    def status(self):
        return _CODES[self.code][1]


def error_response(exc):
    legacy, status, fault = _CODES[exc.code]
    body = json.dumps({"__type": f"com.amazonaws.sqs#{exc.code}", "message": exc.message})
    return web.Response(body=body.encode(), status=status, content_type=CONTENT_TYPE,
                        headers={"x-amzn-query-error": f"{legacy};{fault}",
                                 "x-amzn-RequestId": str(uuid.uuid4()),
                                 **(exc.headers or {})})
