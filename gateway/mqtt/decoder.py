"""``MqttDecoder``: bytes in, packets out, for 3.1.1 and 5.0 (sans-IO, in the manner of h11).

    decoder = MqttDecoder()            # a server: the first packet must be CONNECT
    for packet in decoder.feed(data):  # whatever the socket read -> every packet it completes
        ...

One call per read, as ``AmqpDecoder.feed`` (docs/architecture.md, "One event convention for
the three codecs"): an empty list means more bytes are needed.

Buffering. The receive buffer is an immutable ``bytes`` plus a read offset; decoding a packet
only moves the offset, so a read holding 500 packets costs no slicing of the buffer. ``feed``
builds the next buffer from the unparsed tail (less than one packet) and the new data, then
decodes. A packet
larger than one read (its length is known from its fixed header) is collected as a list of
chunks and joined once, when complete: linear, never quadratic. Because the buffer is never
mutated, large PUBLISH payloads (``ZERO_COPY_PAYLOAD_MIN`` and up) are zero-copy ``memoryview``
slices of it that stay valid for as long as the caller keeps them (a ``bytearray`` compacted in
place could not export views: resizing one with live views raises ``BufferError``, so every
payload would have to be copied). Small payloads are copied to ``bytes``: as cheap as a view,
and they do not keep a whole receive buffer alive.

Version. 3.1.1 and 5.0 share the fixed header but differ in bodies (reason codes, properties).
A server-side decoder starts with ``version=None``, accepts only CONNECT [MQTT-3.1.0-1] and takes
the version from its protocol level; a client-side decoder is told the version it connected with.

Limits. ``max_packet_size`` (whole packet, fixed header included, as 5.0's Maximum Packet Size
counts it) is checked as soon as the fixed header is complete, before any of the body is
buffered beyond that read; a larger packet raises 0x95 Packet Too Large.

Errors. Malformed input raises ``MqttProtocolError`` carrying the 5.0 reason code to send. The
packets before the bad one in the same read are returned first, and the error is kept in
``error`` (the caller handles those packets, then the error); every later ``feed`` raises it
(the connection is finished).

Not thread-safe: one decoder per connection, used by one thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.mqtt._frozen import frozen_builder, twin_class
from gateway.mqtt._wire import Reader, decode_utf8, decode_varint
from gateway.mqtt.errors import MqttProtocolError, malformed, protocol_error
from gateway.mqtt.packet_types import (
    CONNACK_SESSION_PRESENT,
    CONNECT_CLEAN_START,
    CONNECT_PASSWORD,
    CONNECT_RESERVED,
    CONNECT_USERNAME,
    CONNECT_WILL,
    CONNECT_WILL_QOS_MASK,
    CONNECT_WILL_QOS_SHIFT,
    CONNECT_WILL_RETAIN,
    MAX_PACKET_SIZE,
    MQTT_5,
    PROTOCOL_NAME,
    PUBLISH_DUP,
    PUBLISH_QOS_MASK,
    PUBLISH_QOS_SHIFT,
    PUBLISH_RETAIN,
    REQUIRED_FLAGS,
    SUBSCRIBE_NO_LOCAL,
    SUBSCRIBE_QOS_MASK,
    SUBSCRIBE_RESERVED_V3,
    SUBSCRIBE_RESERVED_V5,
    SUBSCRIBE_RETAIN_AS_PUBLISHED,
    SUBSCRIBE_RETAIN_HANDLING_MASK,
    SUBSCRIBE_RETAIN_HANDLING_SHIFT,
    SUPPORTED_PROTOCOL_LEVELS,
    PacketType,
)
from gateway.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from gateway.mqtt.properties import NO_PROPERTIES, WILL_PROPERTIES, Properties, decode_properties
from gateway.mqtt.reason_codes import (
    ALLOWED_REASON_CODES,
    V3_CONNACK_MAX_RETURN_CODE,
    V3_SUBACK_RETURN_CODES,
    ReasonCode,
)

# Default largest packet accepted, fixed header included: 1 MiB, EMQX's default
# `mqtt.max_packet_size`. The encoding allows 256 MiB (MAX_PACKET_SIZE); a broker that keeps
# whole packets in memory should not accept that from every client by default.
DEFAULT_MAX_PACKET_SIZE = 1 << 20

# Topic names already validated, per decoder: bytes -> str. A device publishes to a handful of
# topics, so most PUBLISH packets skip UTF-8 decoding and the wildcard checks. Bounded, since the
# topics are chosen by the peer; cleared when full.
TOPIC_CACHE_SIZE = 1024

# Payloads of this size and more are handed out as zero-copy memoryviews of the receive buffer;
# smaller ones are copied to bytes. Measured: below a few KiB, slicing bytes costs no more than
# making a memoryview (and spares the garbage collector an object to track); and a small
# payload kept for long (a retained message, a queued QoS 1 delivery) would otherwise keep its
# whole receive buffer (64 KiB or more) alive.
ZERO_COPY_PAYLOAD_MIN = 4096

# [MQTT-4.8.2-1] shared subscriptions: "$share/{ShareName}/{filter}".
SHARED_SUBSCRIPTION_PREFIX = "$share/"

_PublishTwin = twin_class(Publish)
_PubackTwin = twin_class(Puback)
_build_connect = frozen_builder(Connect)
_build_connack = frozen_builder(Connack)
_build_subscribe = frozen_builder(Subscribe)
_build_subscription = frozen_builder(Subscription)
_build_suback = frozen_builder(Suback)
_build_unsubscribe = frozen_builder(Unsubscribe)
_build_unsuback = frozen_builder(Unsuback)
_build_disconnect = frozen_builder(Disconnect)
_build_auth = frozen_builder(Auth)
_build_will = frozen_builder(Will)
_PINGREQ = Pingreq()

# First byte -> (QoS, RETAIN, DUP) for the PUBLISH packets decoded inline, None for the rest,
# including the PUBLISH flags that are errors (QoS 3 [MQTT-3.3.1-4], DUP with QoS 0
# [MQTT-3.3.1-2]), which the slow path reports.
_PUBLISH_FLAGS: list[tuple[int, bool, bool] | None] = [None] * 256
for _flags in range(16):
    _qos = (_flags & PUBLISH_QOS_MASK) >> PUBLISH_QOS_SHIFT
    _dup = bool(_flags & PUBLISH_DUP)
    if _qos != 3 and (_qos or not _dup):
        _PUBLISH_FLAGS[(PacketType.PUBLISH << 4) | _flags] = (
            _qos,
            bool(_flags & PUBLISH_RETAIN),
            _dup,
        )
_NOTHING_INLINE: list[tuple[int, bool, bool] | None] = [None] * 256
# PUBACK's first byte (type 4, flags 0), decoded inline when its body is only a packet id.
_PUBACK_FIRST_BYTE = PacketType.PUBACK << 4
_PINGRESP = Pingresp()


class MqttDecoder:
    """Decodes the packets one peer sends. See the module docstring."""

    __slots__ = (
        "_buf",
        "_chunks",
        "_chunks_size",
        "_error",
        "_need",
        "_pos",
        "_seen_connect",
        "_topics",
        "_version",
        "max_packet_size",
    )

    def __init__(
        self, version: int | None = None, *, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE
    ) -> None:
        if version is not None and version not in SUPPORTED_PROTOCOL_LEVELS:
            raise ValueError(f"unsupported MQTT protocol level {version}")
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size {max_packet_size} not in 2..{MAX_PACKET_SIZE}")
        self._version = version
        # Largest packet accepted, fixed header included. A server may lower it after CONNECT;
        # 5.0 clients learn it from the CONNACK's Maximum Packet Size.
        self.max_packet_size = max_packet_size
        self._buf = b""
        self._pos = 0  # first byte of _buf not yet decoded
        self._need = 0  # bytes from _pos that the next packet needs (0: its header is incomplete)
        self._chunks: list[bytes] | None = None  # pieces of one large packet, joined when complete
        self._chunks_size = 0
        self._topics: dict[bytes, str] = {}
        self._error: MqttProtocolError | None = None
        self._seen_connect = False

    @property
    def version(self) -> int | None:
        """4 (3.1.1) or 5 (5.0); None until a server-side decoder has seen CONNECT."""
        return self._version

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded (the start of an incomplete packet)."""
        return len(self._buf) - self._pos + self._chunks_size

    @property
    def error(self) -> MqttProtocolError | None:
        """The protocol error found after the packets ``feed`` returned (None: none yet)."""
        return self._error

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Take received bytes; return every packet they complete, in order (possibly none).
        Raises ``MqttProtocolError`` when the peer broke the protocol, unless packets came
        before the bad one: those are returned, and the error is kept in ``error``."""
        if self._error is not None:
            raise self._error
        if not data:
            return []
        size = len(data)
        chunks = self._chunks
        if chunks is not None:
            chunks.append(bytes(data))
            self._chunks_size += size
            if self._chunks_size < self._need:
                return []
            self._buf = b"".join(chunks)
            self._pos = 0
            self._chunks = None
            self._chunks_size = 0
            return self._decode()
        buf = self._buf
        pos = self._pos
        tail = len(buf) - pos
        if tail == 0:
            self._buf = bytes(data)  # no copy when ``data`` is bytes already
        elif self._need > tail + size:
            # A packet larger than this read: collect the pieces, join them once when complete.
            self._chunks = [buf[pos:], bytes(data)]
            self._chunks_size = tail + size
            self._buf = b""
            return []
        else:
            self._buf = buf[pos:] + data
        self._pos = 0
        return self._decode()

    def _decode(self) -> list[Packet]:
        """The decoding loop. PUBLISH and the plain PUBACK are decoded inline (no calls but the
        unavoidable ones): a broker receives them at rates where each call shows."""
        buf = self._buf
        pos = self._pos
        size = len(buf)
        out: list[Packet] = []
        self._need = 0  # unknown until a fixed header is found incomplete
        if size - pos < 2:
            return out
        append = out.append
        view: memoryview | None = None  # of ``buf``, made when a large payload needs it
        version = self._version
        v5 = version == MQTT_5
        # First bytes taking the inline paths; none before the version is known, so that
        # everything before CONNECT goes the slow way, which enforces [MQTT-3.1.0-1].
        publish_flags = _PUBLISH_FLAGS if version is not None else _NOTHING_INLINE
        plain_puback = _PUBACK_FIRST_BYTE if version is not None else -1
        max_size = self.max_packet_size
        topics = self._topics
        last = size - 1  # a fixed header needs at least 2 bytes: pos < last
        try:
            while pos < last:
                first = buf[pos]
                # Remaining length: one byte below 128, two below 16384, inline; else the
                # general decoder, which also rejects a fifth byte and non-minimal forms.
                length = buf[pos + 1]
                if length < 0x80:
                    body = pos + 2
                elif pos + 2 < size and 0 < (second := buf[pos + 2]) < 0x80:
                    length = (length & 0x7F) | (second << 7)
                    body = pos + 3
                else:
                    header = decode_varint(buf, pos + 1, size)
                    if header is None:  # the fixed header itself is incomplete
                        break
                    length, body = header
                end = body + length
                if end - pos > max_size:
                    raise MqttProtocolError(
                        ReasonCode.PACKET_TOO_LARGE,
                        f"packet of {end - pos} bytes > maximum packet size {max_size}",
                    )
                if end > size:
                    self._need = end - pos
                    break

                flags = publish_flags[first]
                if flags is not None:
                    # PUBLISH (§3.3): topic name, [packet id], [5.0 properties], payload.
                    qos, retain, dup = flags
                    start = body + 2
                    # Read past ``end`` when the body is shorter than 2 bytes: then ``at`` is
                    # still > ``end`` (or the read raises IndexError); both mean malformed.
                    at = start + ((buf[body] << 8) | buf[body + 1])
                    if at > end:
                        raise malformed("PUBLISH ends inside its topic name")
                    raw_topic = buf[start:at]
                    topic = topics.get(raw_topic)
                    if topic is None:
                        topic = self._learn_topic(raw_topic)
                    if qos:
                        if at + 2 > end:
                            raise malformed("PUBLISH ends inside its packet identifier")
                        packet_id: int | None = (buf[at] << 8) | buf[at + 1]
                        if not packet_id:
                            raise protocol_error("PUBLISH with packet identifier 0 [MQTT-2.2.1-3]")
                        at += 2
                    else:
                        packet_id = None
                    if v5:
                        if at < end and buf[at] == 0:
                            at += 1
                            properties = NO_PROPERTIES
                        else:
                            reader = Reader(buf, at, end)
                            properties = decode_properties(reader, PacketType.PUBLISH)
                            at = reader.pos
                        if not topic and properties.topic_alias is None:
                            raise protocol_error("PUBLISH without topic name or topic alias")
                    else:
                        properties = NO_PROPERTIES
                    publish = _PublishTwin()
                    publish.topic = topic
                    if end - at < ZERO_COPY_PAYLOAD_MIN:
                        publish.payload = buf[at:end]
                    else:
                        if view is None:
                            view = memoryview(buf)
                        publish.payload = view[at:end]
                    publish.qos = qos
                    publish.retain = retain
                    publish.dup = dup
                    publish.packet_id = packet_id
                    publish.properties = properties
                    publish.__class__ = Publish
                    append(publish)
                elif first == plain_puback and length == 2:
                    # PUBACK with only a packet identifier (all of 3.1.1's, and 5.0's successes).
                    packet_id = (buf[body] << 8) | buf[body + 1]
                    if not packet_id:
                        raise protocol_error("PUBACK with packet identifier 0 [MQTT-2.2.1-3]")
                    puback = _PubackTwin()
                    puback.packet_id = packet_id
                    puback.reason_code = 0
                    puback.properties = NO_PROPERTIES
                    puback.__class__ = Puback
                    append(puback)
                else:
                    append(self._decode_other(first, buf, body, end))
                    if version != self._version:  # a CONNECT fixed the version
                        version = self._version
                        v5 = version == MQTT_5
                        publish_flags = _PUBLISH_FLAGS
                        plain_puback = _PUBACK_FIRST_BYTE
                pos = end
        except (MqttProtocolError, IndexError) as caught:
            # IndexError: see the topic length of PUBLISH.
            error = (
                caught if isinstance(caught, MqttProtocolError) else malformed("packet too short")
            )
            self._error = error
            self._pos = pos
            if out:
                return out  # the packets before the bad one; then ``error``
            raise error from None
        self._pos = pos
        return out

    def _learn_topic(self, raw: bytes) -> str:
        """Validate a topic name not yet in the cache and remember it."""
        topic = decode_utf8(raw)
        if not topic and self._version != MQTT_5:
            # [MQTT-4.7.3-1] topic names are at least one character; 5.0 allows an empty one
            # when a Topic Alias stands for it (checked by the caller).
            raise protocol_error("PUBLISH with an empty topic name [MQTT-4.7.3-1]")
        if "+" in topic or "#" in topic:
            raise MqttProtocolError(
                ReasonCode.TOPIC_NAME_INVALID,
                f"wildcard in PUBLISH topic name {topic!r} [MQTT-3.3.2-2]",
            )
        topics = self._topics
        if len(topics) >= TOPIC_CACHE_SIZE:
            topics.clear()
        topics[raw] = topic
        return topic

    def _decode_other(self, first: int, buf: bytes, body: int, end: int) -> Packet:
        """Every packet but the inlined ones: check the fixed header, then decode the body."""
        packet_type = first >> 4
        if self._version is None and packet_type != PacketType.CONNECT:
            raise protocol_error("the first packet must be CONNECT [MQTT-3.1.0-1]")
        if packet_type == 0 or (packet_type == PacketType.AUTH and self._version != MQTT_5):
            raise malformed(f"reserved packet type {packet_type}")
        if packet_type == PacketType.CONNECT and self._seen_connect:
            raise protocol_error("a second CONNECT [MQTT-3.1.0-2]")
        if packet_type == PacketType.PUBLISH:  # only the flags the inline path refuses get here
            if first & PUBLISH_QOS_MASK == PUBLISH_QOS_MASK:
                raise malformed("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
            raise malformed("PUBLISH with DUP set and QoS 0 [MQTT-3.3.1-2]")
        if first & 0x0F != REQUIRED_FLAGS[packet_type]:
            raise malformed(
                f"{PacketType(packet_type).name} with fixed header flags 0x{first & 0x0F:X} "
                "[MQTT-2.1.3-1]"
            )
        reader = Reader(buf, body, end)
        decode = _BODY_DECODERS[packet_type]
        packet = decode(reader, self._version == MQTT_5, packet_type)
        reader.expect_end(PacketType(packet_type).name)
        if isinstance(packet, Connect):
            self._seen_connect = True
            self._version = packet.protocol_level
        return packet


def _packet_id(reader: Reader, what: str) -> int:
    packet_id = reader.u16()
    if not packet_id:
        raise protocol_error(f"{what} with packet identifier 0 [MQTT-2.2.1-3]")
    return packet_id


def _reason_code(reader: Reader, packet_type: int) -> int:
    code = reader.u8()
    if code not in ALLOWED_REASON_CODES[PacketType(packet_type)]:
        raise protocol_error(
            f"reason code 0x{code:02X} not allowed in {PacketType(packet_type).name}"
        )
    return code


def _decode_connect(reader: Reader, _v5: bool, _packet_type: int) -> Connect:
    """CONNECT (§3.1): variable header then client id, [will], [username], [password]."""
    name = reader.raw(reader.u16())
    level = reader.u8()
    if name != PROTOCOL_NAME or level not in SUPPORTED_PROTOCOL_LEVELS:
        # [MQTT-3.1.2-1], [MQTT-3.1.2-2]; 3.1 ("MQIsdp", level 3) is not supported either.
        raise MqttProtocolError(
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol {name!r} level {level}",
        )
    v5 = level == MQTT_5
    flags = reader.u8()
    if flags & CONNECT_RESERVED:
        raise malformed("CONNECT reserved flag set [MQTT-3.1.2-3]")
    will_qos = (flags & CONNECT_WILL_QOS_MASK) >> CONNECT_WILL_QOS_SHIFT
    has_will = bool(flags & CONNECT_WILL)
    if not has_will and flags & (CONNECT_WILL_QOS_MASK | CONNECT_WILL_RETAIN):
        raise malformed("CONNECT will QoS or will retain without will flag [MQTT-3.1.2-11/13]")
    if will_qos == 3:
        raise malformed("CONNECT will QoS 3 [MQTT-3.1.2-12]")
    if not v5 and flags & CONNECT_PASSWORD and not flags & CONNECT_USERNAME:
        raise malformed("CONNECT password without user name [MQTT-3.1.2-22]")
    clean_start = bool(flags & CONNECT_CLEAN_START)
    keep_alive = reader.u16()
    properties = decode_properties(reader, PacketType.CONNECT) if v5 else NO_PROPERTIES
    client_id = reader.utf8()
    if not client_id and not clean_start and not v5:
        raise MqttProtocolError(
            ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            "empty client identifier with clean session 0 [MQTT-3.1.3-8]",
        )
    will = None
    if has_will:
        will_properties = decode_properties(reader, WILL_PROPERTIES) if v5 else NO_PROPERTIES
        will_topic = reader.utf8()
        if not will_topic or "+" in will_topic or "#" in will_topic:
            raise MqttProtocolError(
                ReasonCode.TOPIC_NAME_INVALID, f"invalid will topic {will_topic!r} [MQTT-3.1.3-11]"
            )
        will = _build_will(
            will_topic,
            reader.binary(),
            will_qos,
            bool(flags & CONNECT_WILL_RETAIN),
            will_properties,
        )
    username = reader.utf8() if flags & CONNECT_USERNAME else None
    password = reader.binary() if flags & CONNECT_PASSWORD else None
    return _build_connect(  # type: ignore[no-any-return]
        client_id, level, clean_start, keep_alive, username, password, will, properties
    )


def _decode_connack(reader: Reader, v5: bool, packet_type: int) -> Connack:
    """CONNACK (§3.2): acknowledge flags, reason code, [properties]."""
    flags = reader.u8()
    if flags & ~CONNACK_SESSION_PRESENT:
        raise malformed("CONNACK reserved flags set [MQTT-3.2.2-1]")
    if v5:
        code = _reason_code(reader, packet_type)
        properties = decode_properties(reader, packet_type)
    else:
        code = reader.u8()
        if code > V3_CONNACK_MAX_RETURN_CODE:
            raise protocol_error(f"reserved CONNACK return code {code}")
        properties = NO_PROPERTIES
    session_present = bool(flags & CONNACK_SESSION_PRESENT)
    if session_present and code:
        raise protocol_error("CONNACK refusing the connection with session present [MQTT-3.2.2-6]")
    return _build_connack(session_present, code, properties)  # type: ignore[no-any-return]


def _make_ack_decoder(cls: type[Any]) -> Callable[[Reader, bool, int], Packet]:
    """PUBACK, PUBREC, PUBREL, PUBCOMP (§3.4-3.7): packet id, then in 5.0 an optional reason code
    (absent: 0) and optional properties (absent: none)."""
    build = frozen_builder(cls)
    name = cls.__name__.upper()

    def decode(reader: Reader, v5: bool, packet_type: int) -> Packet:
        packet_id = _packet_id(reader, name)
        code = 0
        properties = NO_PROPERTIES
        if v5 and reader.remaining():
            code = _reason_code(reader, packet_type)
            if reader.remaining():
                properties = decode_properties(reader, packet_type)
        return build(packet_id, code, properties)  # type: ignore[no-any-return]

    return decode


def _decode_subscribe(reader: Reader, v5: bool, packet_type: int) -> Subscribe:
    """SUBSCRIBE (§3.8): packet id, [properties], then (topic filter, options) pairs."""
    packet_id = _packet_id(reader, "SUBSCRIBE")
    properties = decode_properties(reader, packet_type) if v5 else NO_PROPERTIES
    subscriptions: list[Subscription] = []
    while reader.remaining():
        topic_filter = reader.utf8()
        options = reader.u8()
        qos = options & SUBSCRIBE_QOS_MASK
        if options & (SUBSCRIBE_RESERVED_V5 if v5 else SUBSCRIBE_RESERVED_V3):
            raise malformed("SUBSCRIBE options reserved bits set [MQTT-3.8.3-5]")
        if qos == 3:
            raise malformed("SUBSCRIBE with QoS 3 [MQTT-3-8.3-4]")
        retain_handling = (
            options & SUBSCRIBE_RETAIN_HANDLING_MASK
        ) >> SUBSCRIBE_RETAIN_HANDLING_SHIFT
        if retain_handling == 3:
            raise protocol_error("SUBSCRIBE with retain handling 3")
        no_local = bool(options & SUBSCRIBE_NO_LOCAL)
        if no_local and topic_filter.startswith(SHARED_SUBSCRIPTION_PREFIX):
            raise protocol_error("No Local on a shared subscription [MQTT-3.8.3-4]")
        subscriptions.append(
            _build_subscription(
                topic_filter,
                qos,
                no_local,
                bool(options & SUBSCRIBE_RETAIN_AS_PUBLISHED),
                retain_handling,
            )
        )
    if not subscriptions:
        raise protocol_error("SUBSCRIBE without subscriptions [MQTT-3.8.3-2]")
    return _build_subscribe(packet_id, tuple(subscriptions), properties)  # type: ignore[no-any-return]


def _decode_suback(reader: Reader, v5: bool, packet_type: int) -> Suback:
    """SUBACK (§3.9): packet id, [properties], one reason code per subscription."""
    packet_id = _packet_id(reader, "SUBACK")
    properties = decode_properties(reader, packet_type) if v5 else NO_PROPERTIES
    codes = tuple(reader.rest())
    allowed = ALLOWED_REASON_CODES[PacketType.SUBACK] if v5 else V3_SUBACK_RETURN_CODES
    if not codes:
        raise protocol_error("SUBACK without reason codes")
    for code in codes:
        if code not in allowed:
            raise protocol_error(f"reason code 0x{code:02X} not allowed in SUBACK")
    return _build_suback(packet_id, codes, properties)  # type: ignore[no-any-return]


def _decode_unsubscribe(reader: Reader, v5: bool, packet_type: int) -> Unsubscribe:
    """UNSUBSCRIBE (§3.10): packet id, [properties], topic filters."""
    packet_id = _packet_id(reader, "UNSUBSCRIBE")
    properties = decode_properties(reader, packet_type) if v5 else NO_PROPERTIES
    filters: list[str] = []
    while reader.remaining():
        filters.append(reader.utf8())
    if not filters:
        raise protocol_error("UNSUBSCRIBE without topic filters [MQTT-3.10.3-2]")
    return _build_unsubscribe(packet_id, tuple(filters), properties)  # type: ignore[no-any-return]


def _decode_unsuback(reader: Reader, v5: bool, packet_type: int) -> Unsuback:
    """UNSUBACK (§3.11): packet id; in 5.0 properties and one reason code per filter."""
    packet_id = _packet_id(reader, "UNSUBACK")
    if not v5:
        return _build_unsuback(packet_id)  # type: ignore[no-any-return]
    properties = decode_properties(reader, packet_type)
    codes = tuple(reader.rest())
    if not codes:
        raise protocol_error("UNSUBACK without reason codes")
    allowed = ALLOWED_REASON_CODES[PacketType.UNSUBACK]
    for code in codes:
        if code not in allowed:
            raise protocol_error(f"reason code 0x{code:02X} not allowed in UNSUBACK")
    return _build_unsuback(packet_id, codes, properties)  # type: ignore[no-any-return]


def _decode_pingreq(_reader: Reader, _v5: bool, _packet_type: int) -> Pingreq:
    return _PINGREQ


def _decode_pingresp(_reader: Reader, _v5: bool, _packet_type: int) -> Pingresp:
    return _PINGRESP


def _reason_and_properties(reader: Reader, v5: bool, packet_type: int) -> tuple[int, Properties]:
    """DISCONNECT and AUTH bodies (5.0 §3.14.2, §3.15.2): both parts optional; none in 3.1.1."""
    code = 0
    properties = NO_PROPERTIES
    if v5 and reader.remaining():
        code = _reason_code(reader, packet_type)
        if reader.remaining():
            properties = decode_properties(reader, packet_type)
    return code, properties


def _decode_disconnect(reader: Reader, v5: bool, packet_type: int) -> Disconnect:
    return _build_disconnect(*_reason_and_properties(reader, v5, packet_type))  # type: ignore[no-any-return]


def _decode_auth(reader: Reader, v5: bool, packet_type: int) -> Auth:
    return _build_auth(*_reason_and_properties(reader, v5, packet_type))  # type: ignore[no-any-return]


_BODY_DECODERS: dict[int, Callable[[Reader, bool, int], Packet]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBACK: _make_ack_decoder(Puback),
    PacketType.PUBREC: _make_ack_decoder(Pubrec),
    PacketType.PUBREL: _make_ack_decoder(Pubrel),
    PacketType.PUBCOMP: _make_ack_decoder(Pubcomp),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: _decode_pingreq,
    PacketType.PINGRESP: _decode_pingresp,
    PacketType.DISCONNECT: _decode_disconnect,
    PacketType.AUTH: _decode_auth,
}
