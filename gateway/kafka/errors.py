"""Kafka wire errors: who is at fault and what goes back on the wire.

Two kinds of fault, as in h11 (``RemoteProtocolError`` / ``LocalProtocolError``):

- ``RemoteProtocolError``: the client sent something wrong. Framing and request-parsing errors
  (``KafkaFrameError``, ``MalformedRequestError``) end the connection without a response, as the
  Kafka broker does: its ``SocketServer`` closes the channel on an ``InvalidReceiveException``
  (bad size prefix) and on an ``InvalidRequestException`` (header or body that does not parse).
  ``RecordBatchError`` is scoped to one partition of a Produce request: its ``error_code`` goes
  into that partition's response and the connection lives on.
- ``LocalProtocolError``: we tried to send something wrong (a response that does not match its
  request). A bug on our side; never the client's fault.

Every error carries the Kafka error code (``kio.schema.errors.ErrorCode``) that describes it, so
logs and responses use the numbers clients know.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class KafkaProtocolError(Exception):
    """Base of the Kafka wire errors; never raised itself."""

    def __init__(self, message: str, error_code: ErrorCode) -> None:
        super().__init__(message)
        self.error_code = error_code

    def __str__(self) -> str:
        return f"{self.args[0]} [{self.error_code.name} ({int(self.error_code)})]"


class RemoteProtocolError(KafkaProtocolError):
    """The client broke the protocol."""


class KafkaFrameError(RemoteProtocolError):
    """The int32 size prefix of a request is negative, too small or above the size limit.

    The stream cannot be resynchronised: close the connection (Kafka: ``InvalidReceiveException``).
    """

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message, ErrorCode.invalid_request)
        self.size = size


class MalformedRequestError(RemoteProtocolError):
    """A complete frame whose header or body does not parse: close the connection.

    ``correlation_id`` is ``None`` when even the fixed header prefix was missing.
    """

    def __init__(
        self,
        message: str,
        *,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        super().__init__(message, ErrorCode.invalid_request)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class RecordBatchError(RemoteProtocolError):
    """A record batch is corrupt or not allowed; ``error_code`` goes into the partition response.

    Codes used, as the Kafka broker's ``LogValidator`` / ``ProduceRequest.validateRecords``:
    ``CORRUPT_MESSAGE`` (2) for a bad CRC or framing, ``INVALID_RECORD`` (87) for a well-formed
    batch the broker refuses, ``UNSUPPORTED_COMPRESSION_TYPE`` (76) for an unknown codec or zstd
    below Produce v7.
    """


class LocalProtocolError(KafkaProtocolError):
    """We tried to encode something the protocol does not allow (a bug on our side)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.unknown_server_error)
