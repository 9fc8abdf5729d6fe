"""AMQP messages <-> log records: what a publish stores, and the properties a delivery carries.

No I/O here: pure functions over properties and record headers (documented in docs/amqp.md).

A Basic.Publish becomes one record whose subject is the routing key, whose body is the message
body, and whose headers are, in order:

===========================  ===================================================================
record header                value
===========================  ===================================================================
``x-braid-amqp-properties``  the content header's property flags and list, byte for byte as
                             the publisher sent them (absent when it sent no properties)
``x-braid-content-type``     the ``content_type`` property (UTF-8)
``x-braid-content-encoding`` ``content_encoding``
``x-braid-correlation-id``   ``correlation_id``
``x-braid-reply-to``         ``reply_to``
``x-braid-message-id``       ``message_id``
``x-braid-timestamp``        ``timestamp``, seconds since the epoch as decimal digits
``x-braid-type``             ``type``
``x-braid-user-id``          ``user_id``
``x-braid-app-id``           ``app_id``
``x-braid-priority``         ``priority``, decimal digits
``x-braid-expires-at``       publish time + ``expiration`` (ms since the epoch; the core expires
                             the record when it reaches a queue's head after that)
<name>                       each entry of the ``headers`` table: text as UTF-8, bytes as they
                             are, numbers and booleans as text, tables and arrays as JSON
===========================  ===================================================================

A delivery of a record an AMQP publisher stored sends ``x-braid-amqp-properties`` back unchanged
(unless the record was dead-lettered: then the headers table gains ``x-death`` and the
``x-first-death-*`` entries and ``expiration`` is dropped, as RabbitMQ does). A record from MQTT
or Kafka gets properties built from its headers by the same table read backwards, persistent
delivery mode, and every other header in the headers table except the broker's and the other
gateways' own (``x-braid-*``, ``x-mqtt-*``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from core.api import (
    DEAD_LETTER_REASON_HEADER,
    DEAD_LETTER_SUBJECT_HEADER,
    DEAD_LETTER_TOPIC_HEADER,
    EXPIRES_AT_HEADER,
    X_DEATH_HEADER,
)
from gateway.amqp.constants import PRECONDITION_FAILED
from gateway.amqp.errors import AmqpChannelError
from gateway.amqp.fieldtable import FieldTable, FieldValue, Timestamp
from gateway.amqp.properties import (
    DELIVERY_MODE_PERSISTENT,
    EMPTY_PROPERTIES,
    BasicProperties,
    decode_properties,
    encode_properties,
)

__all__ = [
    "PROPERTIES_HEADER",
    "PublishInfo",
    "dead_letter_address",
    "delivery_properties",
    "expiration_ms",
    "jsonable",
    "publish_info",
]

# The raw property octets of an AMQP publish, kept for byte-exact delivery.
PROPERTIES_HEADER: Final = "x-braid-amqp-properties"
# The delayed-message exchange's delay header (rabbitmq-delayed-message-exchange).
X_DELAY_HEADER: Final = "x-delay"

# property name -> record header name (string-valued properties)
# (The MQTT gateway writes and reads x-braid-content-type, -reply-to and -correlation-id for
# MQTT 5's Content Type, Response Topic and Correlation Data: the same names, so a request from
# one protocol can be answered over the other.)
_TEXT_PROPERTIES: Final = (
    ("content_type", "x-braid-content-type"),
    ("content_encoding", "x-braid-content-encoding"),
    ("correlation_id", "x-braid-correlation-id"),
    ("reply_to", "x-braid-reply-to"),
    ("message_id", "x-braid-message-id"),
    ("type", "x-braid-type"),
    ("user_id", "x-braid-user-id"),
    ("app_id", "x-braid-app-id"),
)
_NUMBER_PROPERTIES: Final = (("timestamp", "x-braid-timestamp"), ("priority", "x-braid-priority"))
# Broker and other gateways' own headers: never AMQP header-table entries.
RESERVED_PREFIXES: Final = ("x-braid-", "x-mqtt-")
_PROPERTY_OF_HEADER: Final = {header: prop for prop, header in _TEXT_PROPERTIES} | {
    header: prop for prop, header in _NUMBER_PROPERTIES
}
# Header-table entries never copied into record headers (the broker's own, or dead-letter
# history that the core keeps in its own form).
_NOT_COPIED: Final = frozenset(
    {
        PROPERTIES_HEADER,
        EXPIRES_AT_HEADER,
        X_DEATH_HEADER,
        DEAD_LETTER_REASON_HEADER,
        "x-first-death-queue",
        "x-first-death-exchange",
    }
)
# Record headers that never become AMQP header-table entries on a delivery.
_RESERVED_HEADERS: Final = _NOT_COPIED | frozenset(_PROPERTY_OF_HEADER)
# Decoded properties per distinct raw octets: most publishers repeat the same few property sets.
_CACHE_MAX: Final = 4096


@dataclass(slots=True, frozen=True)
class PublishInfo:
    """What the broker needs from a publish's properties (computed once per distinct octets)."""

    headers: list[tuple[str, bytes]]  # record headers (read-only: shared between publishes)
    table: FieldTable | None  # the headers table, for headers exchanges
    persistent: bool  # delivery_mode 2
    expiration_ms: int | None  # per-message TTL
    delay_ms: int  # x-delay header (delayed-message exchange), 0 if absent
    reply_to: str | None
    user_id: str | None


_cache: dict[bytes, PublishInfo] = {}
_NO_PROPERTIES: Final = PublishInfo([], None, False, None, 0, None, None)


def publish_info(raw: bytes) -> PublishInfo:
    """The record headers and routing facts of ``raw`` properties (flags + property list).

    Raises ``AmqpConnectionError`` for undecodable properties (a frame error, as RabbitMQ) and
    ``AmqpChannelError`` 406 for an invalid ``expiration``.
    """
    info = _cache.get(raw)
    if info is not None:
        return info
    if raw == EMPTY_PROPERTIES:
        return _NO_PROPERTIES
    properties = decode_properties(raw)
    info = _publish_info(raw, properties)
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[raw] = info
    return info


def _publish_info(raw: bytes, properties: BasicProperties) -> PublishInfo:
    headers: list[tuple[str, bytes]] = [(PROPERTIES_HEADER, raw)]
    for prop, name in _TEXT_PROPERTIES:
        value = properties.get(prop)
        if value is not None:
            headers.append((name, _text_bytes(value)))
    for prop, name in _NUMBER_PROPERTIES:
        number = properties.get(prop)
        if isinstance(number, int):
            headers.append((name, str(int(number)).encode()))
    table = properties.get("headers")
    delay = 0
    if table:
        for key, value in table.items():
            if key not in _NOT_COPIED:
                headers.append((key, header_bytes(value)))
        raw_delay = table.get(X_DELAY_HEADER)
        if isinstance(raw_delay, int) and not isinstance(raw_delay, bool):
            delay = raw_delay
        elif isinstance(raw_delay, str | bytes):
            try:
                delay = int(raw_delay)
            except ValueError:
                delay = 0
    expiration = properties.get("expiration")
    reply_to = properties.get("reply_to")
    user_id = properties.get("user_id")
    return PublishInfo(
        headers,
        table,
        properties.get("delivery_mode") == DELIVERY_MODE_PERSISTENT,
        expiration_ms(expiration) if expiration is not None else None,
        delay,
        _text(reply_to) if reply_to is not None else None,
        _text(user_id) if user_id is not None else None,
    )


def expiration_ms(value: str | bytes) -> int:
    """The ``expiration`` property as milliseconds (RabbitMQ: decimal digits, >= 0)."""
    text = _text(value)
    try:
        ttl = int(text)
    except ValueError:
        raise AmqpChannelError(
            PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid expiration '{text}': no_integer"
        ) from None
    if ttl < 0:
        raise AmqpChannelError(
            PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - invalid expiration '{text}': {{value_negative,{ttl}}}",
        )
    return ttl


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _text_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")


def header_bytes(value: FieldValue) -> bytes:
    """A header-table value as a record header value (see the module docstring)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if value is None:
        return b""
    if isinstance(value, int | float | Decimal):
        return str(value).encode()
    return json.dumps(jsonable(value), separators=(",", ":")).encode()


def jsonable(value: Any) -> Any:
    """A field value in JSON's types (for arguments kept in the log and for comparisons)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


# --- delivery ----------------------------------------------------------------------------------

NameOf = Callable[[str], str]  # a topic -> the AMQP name of its exchange or queue


def delivery_properties(
    headers: list[tuple[str, bytes]],
    from_amqp: bool,
    exchange_name: NameOf,
    queue_name: NameOf,
) -> bytes:
    """The property octets to deliver a record with (see the module docstring)."""
    raw: bytes | None = None
    dead = False
    for name, value in headers:
        if name == PROPERTIES_HEADER:
            raw = value
        elif name == X_DEATH_HEADER:
            dead = True
    if raw is not None and from_amqp and not dead:
        return raw
    properties: dict[str, Any] = {}
    if from_amqp:
        if raw is None and not dead:
            return EMPTY_PROPERTIES  # published without properties
        if raw is not None:
            try:
                properties = dict(decode_properties(raw))
            except Exception:
                properties = {}
    else:
        properties = _properties_from_headers(headers)
    if dead:
        _add_death(properties, headers, exchange_name, queue_name)
    try:
        return encode_properties(properties)
    except (TypeError, ValueError):
        return EMPTY_PROPERTIES


def dead_letter_address(headers: list[tuple[str, bytes]]) -> tuple[str, str] | None:
    """(topic, routing key) the last dead-lettering published a record to, or None if it was
    never dead-lettered: RabbitMQ delivers a dead letter with its dead-letter exchange and the
    routing key it was dead-lettered with (``x-dead-letter-routing-key``, else its own)."""
    topic: str | None = None
    subject = ""
    for name, value in headers:
        if name == DEAD_LETTER_TOPIC_HEADER:
            topic = value.decode("utf-8", "replace")
        elif name == DEAD_LETTER_SUBJECT_HEADER:
            subject = value.decode("utf-8", "replace")
    return None if topic is None else (topic, subject)


def _properties_from_headers(headers: list[tuple[str, bytes]]) -> dict[str, Any]:
    properties: dict[str, Any] = {"delivery_mode": DELIVERY_MODE_PERSISTENT}
    table: dict[str, FieldValue] = {}
    for name, value in headers:
        prop = _PROPERTY_OF_HEADER.get(name)
        if prop is not None:
            if prop == "timestamp":
                try:
                    properties[prop] = Timestamp(int(value))
                except ValueError:
                    table[name] = _header_value(value)
            elif prop == "priority":
                try:
                    priority = int(value)
                except ValueError:
                    priority = -1
                if 0 <= priority <= 255:
                    properties[prop] = priority
            elif len(value) <= 255:
                properties[prop] = value
            else:
                table[name] = _header_value(value)
        elif name not in _RESERVED_HEADERS and not name.startswith(RESERVED_PREFIXES):
            table[name] = _header_value(value)
    if table:
        properties["headers"] = table
    return properties


def _header_value(value: bytes) -> FieldValue:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _add_death(
    properties: dict[str, Any],
    headers: list[tuple[str, bytes]],
    exchange_name: NameOf,
    queue_name: NameOf,
) -> None:
    """RabbitMQ's dead-letter headers from the core's JSON ``x-death``."""
    raw_death = b""
    reason: bytes | None = None
    for name, value in headers:
        if name == X_DEATH_HEADER:
            raw_death = value
        elif name == DEAD_LETTER_REASON_HEADER:
            reason = value
    try:
        entries = json.loads(raw_death)
    except ValueError:
        return
    deaths: list[FieldValue] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        death: dict[str, FieldValue] = {
            "count": int(entry.get("count", 1)),
            "reason": str(entry.get("reason", "")),
            "queue": queue_name(str(entry.get("queue", ""))),
            "time": Timestamp(int(entry.get("time", 0)) // 1000),
            "exchange": exchange_name(str(entry.get("exchange", ""))),
            "routing-keys": [str(key) for key in entry.get("routing-keys", [])],
        }
        deaths.append(death)
    table = dict(properties.get("headers") or {})
    table["x-death"] = deaths
    if deaths:
        first = deaths[-1]
        assert isinstance(first, dict)
        expiration = properties.get("expiration")
        if expiration is not None:
            # RabbitMQ removes a dead letter's expiration and keeps it in the entry of the
            # death that removed it (the first), so it is not expired again where it goes.
            first["original-expiration"] = expiration
        table.setdefault("x-first-death-reason", reason.decode() if reason else first["reason"])
        table.setdefault("x-first-death-queue", first["queue"])
        table.setdefault("x-first-death-exchange", first["exchange"])
    properties["headers"] = table
    properties.pop("expiration", None)
