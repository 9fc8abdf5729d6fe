"""Sans-IO Kafka wire codec, server side: request frames in, response frames out.

Frame layout (both directions, https://kafka.apache.org/protocol#protocol_common)::

    Size          int32   bytes that follow (header + body)
    Header        request header v1 or v2 / response header v0 or v1
    Body          the API message of the version named in the header

Request header (``RequestHeader.json``; v0, without client_id, was only ever used by
ControlledShutdown v0, which Kafka 4 and kio no longer have)::

    api_key         int16
    api_version     int16
    correlation_id  int32
    client_id       nullable string, always int16-length even in v2 (special-cased by Kafka)
    tagged_fields   v2 only: uvarint count, then (uvarint tag, uvarint size, bytes) each

The header version follows from the body: v2 when the request version is flexible, else v1.
kio's request schema records it (``__header_schema__``). Response header v1 (correlation_id +
tagged fields) follows a flexible response, v0 (correlation_id) a non-flexible one, except
that ApiVersions responses always use v0 (KIP-511: a client that does not know the broker's
versions must be able to read the header).

Usage, as the AMQP codec (docs/architecture.md, "One event convention"): ``events =
decoder.feed(data)``, the events of every complete frame, in wire order; each complete frame
gives a ``Request`` or, for an API or version outside ``SUPPORTED_APIS``, an
``UnsupportedRequest``. The list may end early, the rest staying buffered for the next call
(``feed(b"")`` included): at a frame over ``max_request_size`` after other events, since those
(ApiVersions, a SASL login) may raise the limit; at a bad frame after other events, whose
error the next call raises. Responses are built with
``encode_response(request, body)`` and, for ``UnsupportedRequest``,
``encode_unsupported_response`` (``None`` means: close the connection, as Kafka does).

Notes for the handlers that build responses (seen against the real clients):

- Produce with acks=0 gets no response at all (``Request.expects_response``).
- Fetch: send empty records as ``b""``, never ``None``: librdkafka 2.16 reads a null records
  field as "invalid MessageSetSize -1" and drops the partition's response.
- Fetch v7+: answering ``session_id=0`` means "no fetch session"; clients then send full
  requests every time, which is valid (KIP-227).

Not thread-safe; one decoder per connection.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol, TypeAlias

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError
from kio.static.protocol import RequestPayload, ResponsePayload

from gateway.kafka.apis import (
    API_VERSIONS_FIRST_FLEXIBLE,
    SUPPORTED_APIS,
    ApiKey,
    api_versions_response,
)
from gateway.kafka.errors import KafkaFrameError, LocalProtocolError, MalformedRequestError
from gateway.kafka.lenient import null_in_non_nullable_array, read_entity

# Kafka's ``socket.request.max.bytes`` default (104857600 = 100 MiB): the largest request frame
# the broker reads; a bigger size prefix closes the connection (``InvalidReceiveException``).
MAX_REQUEST_SIZE: Final = 100 * 1024 * 1024

# Size prefix of every frame: int32, big-endian, not counting itself.
_SIZE = struct.Struct(">i")
SIZE_PREFIX_LEN: Final = _SIZE.size  # 4
# Fixed start of every request header: api_key int16, api_version int16, correlation_id int32.
_HEADER_PREFIX = struct.Struct(">hhi")
_API_KEY = struct.Struct(">h")
# The same followed by the client_id length (int16, -1 for null): one unpack per request.
_HEADER_PREFIX_WITH_ID_LENGTH = struct.Struct(">hhih")
# A frame too short for the fixed header prefix cannot even be answered.
MIN_REQUEST_SIZE: Final = _HEADER_PREFIX.size  # 8
# Response header: correlation_id int32 (v0); v1 appends the tagged-field count.
_RESPONSE_HEADER = struct.Struct(">ii")  # size prefix + correlation_id
_NO_TAGGED_FIELDS: Final = b"\x00"  # uvarint 0


Body: TypeAlias = RequestPayload
_BodyReader: TypeAlias = Callable[[bytes, int], tuple[RequestPayload, int]]


# Events are named tuples rather than the frozen dataclasses used elsewhere: measured here, a
# frozen slotted dataclass of six fields takes ~4 us to build (object.__setattr__ per field),
# more than kio takes to parse a small request body; a named tuple ~1 us. Both are immutable.


class Request(NamedTuple):
    """One parsed request frame.

    ``size`` is the frame length without the size prefix (for quotas and metrics). ``body`` is
    the kio entity of ``(api_key, api_version)``; byte fields in it (Produce records) are
    copies, so the event outlives the decoder's buffer.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Body
    size: int

    @property
    def expects_response(self) -> bool:
        """False only for Produce with acks=0: the broker sends nothing back (Kafka docs)."""
        if self.api_key == ApiKey.PRODUCE:
            return getattr(self.body, "acks", -1) != 0
        return True


class UnsupportedRequest(NamedTuple):
    """A complete frame whose API key or version is not in ``SUPPORTED_APIS``; body not parsed.

    Kafka's answer: for ApiVersions, a v0 response with error 35 UNSUPPORTED_VERSION and the
    supported ApiVersions range, after which the client retries at that version (KIP-511;
    ``RequestContext.isUnsupportedApiVersionsRequest``); for anything else, close the
    connection (``InvalidRequestException`` in ``RequestContext.parseRequest``).
    ``encode_unsupported_response`` returns those bytes or ``None``.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int

    @property
    def close_connection(self) -> bool:
        return self.api_key != ApiKey.API_VERSIONS


Event: TypeAlias = Request | UnsupportedRequest


class RequestInfo(Protocol):
    """What ``encode_response`` needs of the request it answers (``Request`` has it)."""

    @property
    def api_key(self) -> int: ...
    @property
    def api_version(self) -> int: ...
    @property
    def correlation_id(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Schema:
    read_body: _BodyReader
    flexible_header: bool
    payload: type[RequestPayload]


# (api_key, api_version) -> body reader and header flexibility, filled on first use: resolving
# all ~130 supported schemas up front takes seconds (kio imports one module per version).
_SCHEMAS: dict[tuple[int, int], _Schema] = {}


def _schema(api_key: int, api_version: int) -> _Schema:
    schema = _SCHEMAS.get((api_key, api_version))
    if schema is None:
        payload = load_request_schema(api_key, api_version)
        schema = _SCHEMAS[(api_key, api_version)] = _Schema(
            read_body=entity_reader(payload),
            flexible_header=payload.__header_schema__.__flexible__,
            payload=payload,
        )
    return schema


def _check_supported(supported: Mapping[int, tuple[int, int]]) -> None:
    """Every version of the table must have a kio schema (checked without importing them)."""
    for api_key, (low, high) in supported.items():
        name = api_key_map.get(api_key)
        versions = schema_name_map.get(name, {}) if name is not None else {}
        missing = [v for v in range(low, high + 1) if v not in versions]
        if low > high or missing:
            raise ValueError(f"no kio request schema for api {api_key} versions {low}..{high}")


def preload_schemas(
    supported: Mapping[int, tuple[int, int]] = SUPPORTED_APIS,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Resolve every request schema of ``supported`` now (at server start, off the hot path).
    ``stop`` is asked between schemas: True ends the preload early (the server is closing)."""
    for api_key, (low, high) in supported.items():
        for version in range(low, high + 1):
            if stop is not None and stop():
                return
            _schema(api_key, version)


def _read_uvarint(frame: bytes, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 varint at ``pos`` -> (value, next position). IndexError if truncated."""
    value = 0
    shift = 0
    while True:
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:  # uvarint32: at most 5 bytes
            raise ValueError("unsigned varint longer than 5 bytes")


class KafkaDecoder:
    """Splits a byte stream into request frames and parses each (see module docstring).

    ``max_request_size`` caps a frame (default ``MAX_REQUEST_SIZE``); the check runs on the size
    prefix, so an oversize frame fails before its body is buffered. ``supported`` is the table
    of accepted versions (default ``SUPPORTED_APIS``). ``oversize``, when set, is called with
    the api key of a frame over ``max_request_size`` (read once the two bytes after the size
    prefix are in) before it is refused, and may raise ``max_request_size`` to let it in (the
    server lifts its before-login cap this way, gateway/kafka/server.py).

    ``feed`` raises ``KafkaFrameError`` (bad size prefix) or ``MalformedRequestError`` (header
    or body does not parse), at once when no event comes before the bad frame, else at the next
    call; after either the stream is unusable and every later call raises the same error. The
    server closes the connection.

    Buffering: received chunks are kept as a list of ``bytes`` and joined only once a whole
    frame is there, so a large frame arriving in many reads is copied once, and a read that
    holds whole frames is parsed in place without any copy. Frames are parsed straight from
    the immutable ``bytes`` (kio readers need a read-only buffer).
    """

    def __init__(
        self,
        *,
        max_request_size: int = MAX_REQUEST_SIZE,
        supported: Mapping[int, tuple[int, int]] = SUPPORTED_APIS,
    ) -> None:
        if max_request_size < MIN_REQUEST_SIZE:
            raise ValueError(f"max_request_size must be >= {MIN_REQUEST_SIZE}")
        self.max_request_size = max_request_size
        _check_supported(supported)
        self.supported: Mapping[int, tuple[int, int]] = dict(supported)
        self._buffer = b""  # holds the next frame's first byte at _pos
        self._pos = 0
        self._chunks: list[bytes] = []  # received after _buffer, not yet joined
        self._chunks_len = 0
        self._error: KafkaFrameError | MalformedRequestError | None = None
        self.oversize: Callable[[int], None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as events (for a read high-water mark)."""
        return len(self._buffer) - self._pos + self._chunks_len

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Take received bytes (copied unless ``bytes``); return the events of every complete
        frame buffered, in order (see the class docstring for where the list ends early)."""
        if self._error is not None:
            raise self._error
        if data:
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self._chunks_len += len(data)
        events: list[Event] = []
        try:
            while (event := self._next_event(bool(events))) is not None:
                events.append(event)
        except (KafkaFrameError, MalformedRequestError):
            if not events:
                raise
            # The events before the bad frame are the client's requests: they are handled
            # (as Kafka handles the requests read before one that does not parse), then the
            # next call raises the stored error.
        return events

    def _next_event(self, after_events: bool) -> Event | None:
        """The next complete frame as an event, or ``None`` when more bytes are needed (or, with
        ``after_events``, at a frame over ``max_request_size``: decided at the next call)."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        pos = self._pos
        if len(buffer) - pos < SIZE_PREFIX_LEN:
            if not self._have(SIZE_PREFIX_LEN):
                return None
            buffer = self._buffer
            pos = 0
        (size,) = _SIZE.unpack_from(buffer, pos)
        if size > self.max_request_size and after_events:
            return None
        if size > self.max_request_size and self.oversize is not None:
            if not self._have(SIZE_PREFIX_LEN + _API_KEY.size):
                return None
            buffer = self._buffer
            pos = self._pos
            (api_key,) = _API_KEY.unpack_from(buffer, pos + SIZE_PREFIX_LEN)
            self.oversize(api_key)
        if size < MIN_REQUEST_SIZE or size > self.max_request_size:
            self._error = KafkaFrameError(
                f"invalid request size {size} (allowed {MIN_REQUEST_SIZE}"
                f"..{self.max_request_size})",
                size,
            )
            raise self._error
        start = pos + SIZE_PREFIX_LEN
        end = start + size
        if end > len(buffer):
            if not self._have(SIZE_PREFIX_LEN + size):
                return None
            buffer = self._buffer
            start = SIZE_PREFIX_LEN
            end = start + size
        if end == len(buffer):
            self._buffer = b""  # do not keep a large read alive past its last frame
            self._pos = 0
        else:
            self._pos = end
        try:
            return self._parse(buffer, start, end)
        except MalformedRequestError as exc:
            self._error = exc
            raise

    def _have(self, needed: int) -> bool:
        """Make ``needed`` bytes contiguous at ``_pos``; False while they are not all received."""
        available = len(self._buffer) - self._pos
        if available >= needed:
            return True
        if available + self._chunks_len < needed:
            return False
        if available:
            self._buffer = b"".join([memoryview(self._buffer)[self._pos :], *self._chunks])
        elif len(self._chunks) == 1:
            self._buffer = self._chunks[0]  # the common case: no copy at all
        else:
            self._buffer = b"".join(self._chunks)
        self._pos = 0
        self._chunks = []
        self._chunks_len = 0
        return True

    def _parse(self, buffer: bytes, start: int, end: int) -> Event:
        size = end - start
        if size >= _HEADER_PREFIX_WITH_ID_LENGTH.size:
            api_key, api_version, correlation_id, id_length = (
                _HEADER_PREFIX_WITH_ID_LENGTH.unpack_from(buffer, start)
            )
        else:  # 8 or 9 bytes: the fixed prefix, no room for a client_id length
            api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(buffer, start)
            id_length = None
        limits = self.supported.get(api_key)
        if limits is None or not limits[0] <= api_version <= limits[1]:
            flexible_header = (
                api_key == ApiKey.API_VERSIONS and api_version >= API_VERSIONS_FIRST_FLEXIBLE
            )
            try:
                client_id, _ = _read_header_rest(buffer, start, end, id_length, flexible_header)
            except (IndexError, ValueError):
                # The body of an unknown version is never read (KIP-511), and the answer needs
                # only the correlation id: a header we cannot finish reading costs the client
                # nothing but its client id.
                client_id = None
            return UnsupportedRequest(api_key, api_version, correlation_id, client_id, size)
        schema = _SCHEMAS.get((api_key, api_version)) or _schema(api_key, api_version)
        try:
            client_id, offset = _read_header_rest(
                buffer, start, end, id_length, schema.flexible_header
            )
            try:
                body, consumed = schema.read_body(buffer, offset)
            except KeyError:
                # kio refuses tags its schema does not declare; Kafka skips them (KIP-482).
                body, next_offset = read_entity(schema.payload, buffer[:end], offset)
                consumed = next_offset - offset
            if offset + consumed > end:
                # kio saw the whole read, which may hold the next frame: bound it here.
                raise ValueError("request body runs past the end of its frame")
            # kio reads length -1 as None even where the schema says the array is not
            # nullable (a handler then fails with TypeError); Kafka's generated readers throw
            # "non-nullable field ... was serialized as null", parseRequest turns it into an
            # InvalidRequestException and the SocketServer closes the connection: so do we.
            null_field = null_in_non_nullable_array(body)
            if null_field is not None:
                raise ValueError(f"non-nullable field {null_field} was serialized as null")
        except (DecodeError, IndexError, KeyError, ValueError, TypeError, struct.error) as exc:
            raise MalformedRequestError(
                f"cannot parse {_api_name(api_key)} v{api_version} request: {exc!r}",
                api_key=api_key,
                api_version=api_version,
                correlation_id=correlation_id,
            ) from exc
        # Bytes after the body are ignored, as the Kafka broker ignores them (it reads what the
        # schema names and drops the rest of the frame).
        return Request(api_key, api_version, correlation_id, client_id, body, size)


def _read_header_rest(
    buffer: bytes, start: int, end: int, id_length: int | None, flexible: bool
) -> tuple[str | None, int]:
    """client_id and (v2) tagged fields after the fixed prefix -> (client_id, body offset)."""
    if id_length is None:
        raise ValueError("frame too short for a client_id")
    pos = start + _HEADER_PREFIX_WITH_ID_LENGTH.size
    if id_length < 0:  # -1: null (Kafka reads any negative length as null)
        client_id = None
    else:
        id_end = pos + id_length
        if id_end > end:
            raise ValueError("client_id runs past the end of the frame")
        client_id = buffer[pos:id_end].decode()
        pos = id_end
    if flexible:
        # RequestHeader v2 defines no tagged fields: skip whatever a client sends.
        if pos < end and buffer[pos] == 0:
            pos += 1
        else:
            count, pos = _read_uvarint(buffer, pos)
            for _ in range(count):
                _tag, pos = _read_uvarint(buffer, pos)
                field_size, pos = _read_uvarint(buffer, pos)
                pos += field_size
            if pos > end:
                raise ValueError("header tagged fields run past the end of the frame")
    return client_id, pos


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


def response_header_flexible(api_key: int, api_version: int) -> bool:
    """True when the response uses header v1 (tagged fields), False for header v0.

    Flexible response versions use v1, except ApiVersions which always uses v0 (KIP-511).
    """
    if api_key == ApiKey.API_VERSIONS:
        return False
    return load_response_schema(api_key, api_version).__flexible__


def encode_response(request: RequestInfo, body: ResponsePayload) -> bytes:
    """A complete response frame (size prefix, header, body) answering ``request``.

    ``body`` must be the kio response entity of the request's API and version; an ApiVersions
    v0 body also answers an ApiVersions request of an unsupported version (KIP-511).
    Raises ``LocalProtocolError`` when the body does not fit the request.
    """
    body_type = type(body)
    api_key: int = body_type.__api_key__
    version: int = body_type.__version__
    if api_key != request.api_key or (
        version != request.api_version and not (api_key == ApiKey.API_VERSIONS and version == 0)
    ):
        raise LocalProtocolError(
            f"{body_type.__name__} v{version} cannot answer a request for api "
            f"{request.api_key} v{request.api_version}"
        )
    out = io.BytesIO()
    out.write(_RESPONSE_HEADER.pack(0, request.correlation_id))
    if api_key != ApiKey.API_VERSIONS and body_type.__flexible__:
        out.write(_NO_TAGGED_FIELDS)
    entity_writer(body_type)(out, body)
    with out.getbuffer() as frame:
        _SIZE.pack_into(frame, 0, len(frame) - SIZE_PREFIX_LEN)
    return out.getvalue()


def encode_unsupported_response(
    event: UnsupportedRequest,
    supported: Mapping[int, tuple[int, int]] = SUPPORTED_APIS,
) -> bytes | None:
    """Kafka's answer to an ``UnsupportedRequest``; ``None``: close the connection instead.

    For ApiVersions: a v0 response, header v0, error 35 UNSUPPORTED_VERSION, listing the
    ApiVersions range of ``supported`` (KIP-511).
    """
    if event.close_connection:
        return None
    body = api_versions_response(0, error_code=ErrorCode.unsupported_version, supported=supported)
    return encode_response(event, body)
