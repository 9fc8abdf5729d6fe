"""Sans-IO AMQP 0-9-1 server codec: client bytes in, events out; server frames in, bytes out.

No I/O and no asyncio here: the transport hands ``AmqpDecoder.feed`` whatever it read and writes
whatever the ``encode_*`` functions return.

Decoding. The decoder first takes the 8-octet protocol header, then frames (layout in
constants.py). Every complete frame in the buffer is parsed per ``feed`` call, walking an offset
over the received bytes; only an incomplete tail is copied aside, and it is not parsed again
until enough octets for the frame it starts have arrived, so the work per octet is bounded however
the stream is cut (no re-scanning, no quadratic slicing).

* Hot path, hand-written with ``struct``: Basic.Publish + its content header + its body frames
  become one ``Publish``; Basic.Ack, Basic.Nack and Basic.Reject become ``Ack``/``Nack``/
  ``Reject``.
* Every other method is decoded by pamqp into a ``Method`` event.

Content is assembled per channel as RabbitMQ's ``rabbit_command_assembler`` does, and bad input
gets RabbitMQ's reply codes (rabbit_reader.erl, rabbit_command_assembler.erl):

=================================================================  ====  =======================
input                                                              code  then
=================================================================  ====  =======================
frame payload > frame_max (RabbitMQ's 8-octet fudge: > frame_max)  501   decoder dead (no sync)
frame-end octet is not 0xCE                                        501   decoder dead (no sync)
unknown frame type; method payload < 4 octets; bad method fields   501   closing
heartbeat with a payload                                           501   closing
content header payload < 14 octets                                 501   closing
body frame longer than the rest of the declared body size          501   closing
declared body size > MAX_MSG_SIZE (512 MiB)                        501   closing
header/body frame where a method is expected (or on channel 0)     505   closing
method/body frame where a content header is expected               505   closing
method/header frame where a body frame is expected                 505   closing
content header of another class, or weight != 0                   505   closing
heartbeat on a channel other than 0                                505   closing
unknown class/method id                                            540   closing
server-only method from the client (e.g. Basic.Deliver)            503   closing
Connection.* method on a channel other than 0                      503   closing
other method on channel 0                                          504   closing
declared body size > max_message_size                              406   channel error; the
                                                                         body frames are skipped
=================================================================  ====  =======================

"closing": after a connection error (or ``start_closing()``, when the server sends
Connection.Close itself) the decoder keeps framing but yields only Connection.Close and
Connection.Close-Ok, as RabbitMQ's reader does while ?IS_STOPPING. "dead": framing is lost, the
decoder yields nothing more; send Connection.Close and drop the socket after a grace period.

Encoding. ``encode_method`` marshals any pamqp method. The hot server frames are hand-written:
``encode_deliver``, ``encode_get_ok``, ``encode_basic_return`` (method + content header + body
frames, body split at ``frame_max - 8``), ``encode_ack``/``encode_nack`` (publisher confirms).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, TypeAlias

from pamqp import base, commands
from pamqp import frame as pamqp_frame

from gateway.amqp.constants import (
    CHANNEL_ERROR,
    CLASS_BASIC,
    CLASS_CONNECTION,
    CLIENT_METHODS,
    COMMAND_INVALID,
    DEFAULT_FRAME_MAX,
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    FRAME_SIZE_FUDGE,
    HEARTBEAT_FRAME,
    INDEX_BASIC_ACK,
    INDEX_BASIC_NACK,
    INDEX_BASIC_PUBLISH,
    INDEX_BASIC_REJECT,
    MAX_MSG_SIZE,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
    PROTOCOL_HEADER_SIZE,
    REPLY_TEXTS,
    SHORTSTR_MAX,
    UNEXPECTED_FRAME,
)
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError
from gateway.amqp.events import (
    HEARTBEAT,
    Ack,
    AmqpEvent,
    BadProtocolHeader,
    Method,
    Nack,
    ProtocolHeader,
    Publish,
    Reject,
)
from gateway.amqp.fieldtable import Buffer

__all__ = [
    "AmqpDecoder",
    "encode_ack",
    "encode_basic_return",
    "encode_content",
    "encode_deliver",
    "encode_get_ok",
    "encode_heartbeat",
    "encode_method",
    "encode_nack",
]

# Frame header: type (octet), channel (short), payload size (long).
_FRAME_HEADER = struct.Struct(">BHI")
assert _FRAME_HEADER.size == FRAME_HEADER_SIZE
# First 4 payload octets of a method frame, read as one long: class id << 16 | method id.
_METHOD_INDEX = struct.Struct(">I")
# Content header payload: class id (short), weight (short, must be 0), body size (longlong),
# then the property flags and list (properties_raw).
_CONTENT_HEADER = struct.Struct(">HHQ")
_CONTENT_HEADER_SIZE: Final = _CONTENT_HEADER.size  # 12
_MIN_CONTENT_HEADER: Final = _CONTENT_HEADER_SIZE + 2  # at least one property-flags short
_MIN_HEADER_FRAME: Final = FRAME_HEADER_SIZE + _MIN_CONTENT_HEADER
# A content header frame up to its properties: the frame header then the content header.
_HEADER_FRAME = struct.Struct(">BHIHHQ")
# properties_raw starts after the frame header and class id, weight, body size.
_PROPERTIES_AT: Final = FRAME_HEADER_SIZE + _CONTENT_HEADER_SIZE
# Basic.Ack / Basic.Nack / Basic.Reject arguments: delivery tag (longlong), bits (octet).
_TAG_BITS = struct.Struct(">QB")
_TAG_BITS_PAYLOAD: Final = 4 + _TAG_BITS.size  # 13 = class/method + arguments
# Basic.Publish arguments start after class/method (4) and the deprecated ticket (short).
_PUBLISH_EXCHANGE_AT: Final = 6

_FRAME_END_OCTET: Final = bytes((FRAME_END,))

_Append: TypeAlias = Callable[[AmqpEvent], None]

# pamqp's method classes by (class id << 16 | method id), typed.
_METHOD_CLASSES: Final[dict[int, type[base.Frame]]] = {
    index: cls for index, cls in commands.INDEX_MAPPING.items() if issubclass(cls, base.Frame)
}


class _Content:
    """A Basic.Publish on one channel waiting for its content header and body frames."""

    __slots__ = (
        "discard",
        "exchange",
        "immediate",
        "mandatory",
        "parts",
        "properties_raw",
        "remaining",
        "routing_key",
    )

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.properties_raw = b""
        self.remaining = -1  # -1: the content header has not arrived yet
        self.parts: list[bytes] = []
        self.discard = False  # over max_message_size: skip the body, a channel error was sent


class AmqpDecoder:
    """Turns a client's bytes into ``AmqpEvent``s; one per connection.

    ``frame_max`` starts at the spec's frame-min-size (4096); the session sets it to the value
    negotiated in Connection.Tune-Ok (0 = no limit). ``max_message_size`` bounds a message body
    (406 PRECONDITION_FAILED above it, as RabbitMQ's ``max_message_size``).
    """

    def __init__(
        self,
        *,
        frame_max: int = FRAME_MIN_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        expect_protocol_header: bool = True,
    ) -> None:
        self.frame_max = frame_max
        self.max_message_size = max_message_size
        self._pending = bytearray()  # an incomplete tail of received bytes
        self._need = 0  # len(_pending) worth parsing again
        self._expect_header = expect_protocol_header
        self._content: dict[int, _Content] = {}  # channel -> publish being assembled
        self._closing = False
        self._dead = False

    # --- state ---------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Only Connection.Close / Close-Ok are yielded from now on."""
        return self._closing

    @property
    def dead(self) -> bool:
        """Framing is lost (or the protocol header was bad): nothing more will be yielded."""
        return self._dead

    @property
    def buffered(self) -> int:
        """Octets received but not yet parsed (a partial frame); for flow control."""
        return len(self._pending)

    def start_closing(self) -> None:
        """The server sent Connection.Close: from now on yield only Connection.Close(-Ok)."""
        self._closing = True
        self._content.clear()

    # --- decoding ------------------------------------------------------------------------------

    def feed(self, data: Buffer) -> list[AmqpEvent]:
        """Take received octets; return the events of every frame they complete, in order."""
        if self._dead:
            return []
        pending = self._pending
        if pending:
            pending += data
            if len(pending) < self._need:
                return []
            src = bytes(pending)
            pending.clear()
        elif type(data) is bytes:
            src = data
        else:
            src = bytes(data)
        events: list[AmqpEvent] = []
        pos = 0
        if self._expect_header:
            if len(src) < PROTOCOL_HEADER_SIZE:
                self._stash(src, 0, PROTOCOL_HEADER_SIZE)
                return events
            header = src[:PROTOCOL_HEADER_SIZE]
            if header != PROTOCOL_HEADER and header != PROTOCOL_HEADER_0_9:
                events.append(BadProtocolHeader(header))
                self._die()
                return events
            events.append(ProtocolHeader(header))
            self._expect_header = False
            pos = PROTOCOL_HEADER_SIZE
        pos = self._parse_frames(src, pos, events)
        if pos < len(src):
            self._stash(src, pos, self._need)
        return events

    def _stash(self, src: bytes, pos: int, need: int) -> None:
        self._pending += memoryview(src)[pos:]
        self._need = need

    def _die(self) -> None:
        self._dead = self._closing = True
        self._pending = bytearray()
        self._content.clear()

    def _parse_frames(self, src: bytes, pos: int, events: list[AmqpEvent]) -> int:
        """Parse frames from ``pos``; return where the first incomplete frame starts.

        Sets ``self._need`` to the length of that incomplete frame (or of a frame header).
        """
        n = len(src)
        append = events.append
        unpack_frame_header = _FRAME_HEADER.unpack_from
        unpack_index = _METHOD_INDEX.unpack_from
        unpack_tag_bits = _TAG_BITS.unpack_from
        unpack_header_frame = _HEADER_FRAME.unpack_from
        contents = self._content
        max_message_size = min(self.max_message_size, MAX_MSG_SIZE)
        frame_limit = self.frame_max
        if frame_limit:
            frame_limit += FRAME_SIZE_FUDGE - FRAME_OVERHEAD
        while True:
            if n - pos < FRAME_HEADER_SIZE:
                self._need = FRAME_HEADER_SIZE
                return pos
            ftype, channel, size = unpack_frame_header(src, pos)
            if frame_limit and size > frame_limit:
                append(
                    AmqpConnectionError(
                        FRAME_ERROR,
                        f"FRAME_ERROR - type {ftype}, frame payload of {size} octets is larger "
                        f"than frame_max {self.frame_max} allows",
                        channel=channel,
                    )
                )
                self._die()
                return n
            end = pos + FRAME_HEADER_SIZE + size  # offset of the frame-end octet
            if end >= n:
                self._need = size + FRAME_OVERHEAD
                return pos
            if src[end] != FRAME_END:
                append(
                    AmqpConnectionError(
                        FRAME_ERROR,
                        f"FRAME_ERROR - type {ftype}, invalid frame end marker {src[end]:#04x}",
                        channel=channel,
                    )
                )
                self._die()
                return n
            start = pos + FRAME_HEADER_SIZE  # payload offset
            pos = end + 1
            if self._closing:
                self._closing_frame(src, ftype, channel, start, end, append)
                continue

            if ftype == FRAME_METHOD:
                if size < 4:
                    self._fail(FRAME_ERROR, "method frame shorter than 4 octets", channel, append)
                    continue
                if contents and channel in contents:
                    self._unexpected_in_content(contents[channel], channel, append)
                    continue
                index = unpack_index(src, start)[0]
                if index == INDEX_BASIC_PUBLISH and channel:
                    # exchange (shortstr) routing-key (shortstr) bits (octet) = the last octet
                    q = start + _PUBLISH_EXCHANGE_AT
                    routing_at = q + 1 + src[q] if q < end else end
                    bits_at = routing_at + 1 + src[routing_at] if routing_at < end else end
                    if bits_at + 1 != end:
                        self._fail(
                            FRAME_ERROR, "cannot decode Basic.Publish", channel, append, index
                        )
                        continue
                    try:
                        exchange = src[q + 1 : routing_at].decode()
                        routing_key = src[routing_at + 1 : bits_at].decode()
                    except UnicodeDecodeError:
                        self._fail(
                            FRAME_ERROR, "Malformed UTF-8 in shortstr", channel, append, index
                        )
                        continue
                    bits = src[bits_at]
                    mandatory = bits & 1 != 0
                    immediate = bits & 2 != 0
                    # Fast path: the content header and a single body frame follow in the
                    # buffer, complete and well-formed; emit without per-channel state.
                    # Anything else (split, multi-frame, malformed) takes the general path.
                    if n - pos >= _MIN_HEADER_FRAME:
                        htype, hchannel, hsize, class_id, weight, body_size = unpack_header_frame(
                            src, pos
                        )
                        hend = pos + FRAME_HEADER_SIZE + hsize
                        if (
                            htype == FRAME_HEADER
                            and hchannel == channel
                            and hsize >= _MIN_CONTENT_HEADER
                            and hend < n
                            and src[hend] == FRAME_END
                            and (not frame_limit or hsize <= frame_limit)
                            and class_id == CLASS_BASIC
                            and not weight
                        ):
                            if not body_size:
                                append(
                                    Publish(
                                        channel,
                                        exchange,
                                        routing_key,
                                        mandatory,
                                        immediate,
                                        src[pos + _PROPERTIES_AT : hend],
                                        b"",
                                    )
                                )
                                pos = hend + 1
                                continue
                            b = hend + 1
                            if n - b >= FRAME_HEADER_SIZE:
                                btype, bchannel, bsize = unpack_frame_header(src, b)
                                bend = b + FRAME_HEADER_SIZE + bsize
                                if (
                                    btype == FRAME_BODY
                                    and bchannel == channel
                                    and bsize == body_size
                                    and bend < n
                                    and src[bend] == FRAME_END
                                    and (not frame_limit or bsize <= frame_limit)
                                    and bsize <= max_message_size
                                ):
                                    append(
                                        Publish(
                                            channel,
                                            exchange,
                                            routing_key,
                                            mandatory,
                                            immediate,
                                            src[pos + _PROPERTIES_AT : hend],
                                            src[b + FRAME_HEADER_SIZE : bend],
                                        )
                                    )
                                    pos = bend + 1
                                    continue
                    contents[channel] = _Content(exchange, routing_key, mandatory, immediate)
                elif index == INDEX_BASIC_ACK and channel:
                    if size != _TAG_BITS_PAYLOAD:
                        self._fail(FRAME_ERROR, "cannot decode Basic.Ack", channel, append, index)
                        continue
                    tag, bits = unpack_tag_bits(src, start + 4)
                    append(Ack(channel, tag, bool(bits & 1)))
                elif index == INDEX_BASIC_NACK and channel:
                    if size != _TAG_BITS_PAYLOAD:
                        self._fail(FRAME_ERROR, "cannot decode Basic.Nack", channel, append, index)
                        continue
                    tag, bits = unpack_tag_bits(src, start + 4)
                    append(Nack(channel, tag, bool(bits & 1), bool(bits & 2)))
                elif index == INDEX_BASIC_REJECT and channel:
                    if size != _TAG_BITS_PAYLOAD:
                        self._fail(
                            FRAME_ERROR, "cannot decode Basic.Reject", channel, append, index
                        )
                        continue
                    tag, bits = unpack_tag_bits(src, start + 4)
                    append(Reject(channel, tag, bool(bits & 1)))
                else:
                    self._control_method(src, index, channel, start, end, append)

            elif ftype == FRAME_BODY:
                content = contents.get(channel) if contents else None
                if content is None or content.remaining < 0:
                    self._unexpected_content_frame(content, channel, "content body", append)
                    continue
                remaining = content.remaining - size
                if remaining < 0:
                    self._fail(
                        FRAME_ERROR,
                        "content body frame exceeds remaining content size",
                        channel,
                        append,
                        INDEX_BASIC_PUBLISH,
                    )
                    continue
                content.remaining = remaining
                if content.discard:
                    if not remaining:
                        del contents[channel]
                    continue
                parts = content.parts
                if remaining:
                    parts.append(src[start:end])
                    continue
                if parts:
                    parts.append(src[start:end])
                    body = b"".join(parts)
                else:
                    body = src[start:end]
                del contents[channel]
                append(
                    Publish(
                        channel,
                        content.exchange,
                        content.routing_key,
                        content.mandatory,
                        content.immediate,
                        content.properties_raw,
                        body,
                    )
                )

            elif ftype == FRAME_HEADER:
                content = contents.get(channel) if contents else None
                if content is None or content.remaining >= 0:
                    self._unexpected_content_frame(content, channel, "content header", append)
                    continue
                if size < _MIN_CONTENT_HEADER:
                    self._fail(FRAME_ERROR, "content header too short", channel, append)
                    continue
                class_id, weight, body_size = _CONTENT_HEADER.unpack_from(src, start)
                if class_id != CLASS_BASIC or weight:
                    self._fail(
                        UNEXPECTED_FRAME,
                        f"expected content header for class {CLASS_BASIC}, got one for class "
                        f"{class_id} (weight {weight}) instead",
                        channel,
                        append,
                        INDEX_BASIC_PUBLISH,
                    )
                    continue
                if body_size > MAX_MSG_SIZE:
                    self._fail(
                        FRAME_ERROR,
                        f"content body size {body_size} exceeds maximum allowed size "
                        f"{MAX_MSG_SIZE}",
                        channel,
                        append,
                        INDEX_BASIC_PUBLISH,
                    )
                    continue
                properties_raw = src[start + _CONTENT_HEADER_SIZE : end]
                if not body_size:
                    del contents[channel]
                    append(
                        Publish(
                            channel,
                            content.exchange,
                            content.routing_key,
                            content.mandatory,
                            content.immediate,
                            properties_raw,
                            b"",
                        )
                    )
                    continue
                content.properties_raw = properties_raw
                content.remaining = body_size
                if body_size > self.max_message_size:
                    content.discard = True
                    append(
                        AmqpChannelError(
                            PRECONDITION_FAILED,
                            f"PRECONDITION_FAILED - message size {body_size} is larger than "
                            f"configured max size {self.max_message_size}",
                            CLASS_BASIC,
                            INDEX_BASIC_PUBLISH & 0xFFFF,
                            channel=channel,
                        )
                    )

            elif ftype == FRAME_HEARTBEAT:
                if size:
                    self._fail(FRAME_ERROR, "heartbeat frame with a payload", channel, append)
                elif channel:
                    self._fail(UNEXPECTED_FRAME, "heartbeat frame on a channel", channel, append)
                else:
                    append(HEARTBEAT)

            else:
                self._fail(FRAME_ERROR, f"unknown frame type {ftype}", channel, append)

    def _control_method(
        self,
        src: bytes,
        index: int,
        channel: int,
        start: int,
        end: int,
        append: _Append,
    ) -> None:
        """A method other than the hot four (or one of them on channel 0): pamqp decodes it."""
        method_class = _METHOD_CLASSES.get(index)
        if method_class is None:
            self._fail(
                NOT_IMPLEMENTED,
                f"unknown method {index >> 16}.{index & 0xFFFF}",
                channel,
                append,
                index,
            )
            return
        if index not in CLIENT_METHODS:
            self._fail(
                COMMAND_INVALID, f"unimplemented method {method_class.name}", channel, append, index
            )
            return
        if (index >> 16 == CLASS_CONNECTION) != (channel == 0):
            if channel:
                self._fail(
                    COMMAND_INVALID,
                    f"{method_class.name} on channel {channel}",
                    channel,
                    append,
                    index,
                )
            else:
                self._fail(
                    CHANNEL_ERROR,
                    f"unexpected method {method_class.name} on channel 0",
                    0,
                    append,
                    index,
                )
            return
        method = _unmarshal(method_class, src[start + 4 : end])
        if method is None:
            self._fail(FRAME_ERROR, f"cannot decode {method_class.name}", channel, append, index)
            return
        append(Method(channel, method))

    def _closing_frame(
        self, src: bytes, ftype: int, channel: int, start: int, end: int, append: _Append
    ) -> None:
        """While closing only Connection.Close and Close-Ok matter; drop everything else."""
        if ftype != FRAME_METHOD or channel or end - start < 4:
            return
        index = _METHOD_INDEX.unpack_from(src, start)[0]
        method_class = _METHOD_CLASSES.get(index)
        if method_class not in (commands.Connection.Close, commands.Connection.CloseOk):
            return
        assert method_class is not None
        method = _unmarshal(method_class, src[start + 4 : end])
        if method is not None:
            append(Method(0, method))

    def _fail(
        self,
        reply_code: int,
        text: str,
        channel: int,
        append: _Append,
        index: int = 0,
    ) -> None:
        """Report a connection error and start closing (framing is still in sync)."""
        name = REPLY_TEXTS.get(reply_code, "")
        append(
            AmqpConnectionError(
                reply_code, f"{name} - {text}", index >> 16, index & 0xFFFF, channel=channel
            )
        )
        self.start_closing()

    def _unexpected_in_content(self, content: _Content, channel: int, append: _Append) -> None:
        if content.remaining < 0:
            text = (
                f"expected content header for class {CLASS_BASIC}, "
                "got non content header frame instead"
            )
        else:
            text = "expected content body, got non content body frame instead"
        self._fail(UNEXPECTED_FRAME, text, channel, append, INDEX_BASIC_PUBLISH)

    def _unexpected_content_frame(
        self, content: _Content | None, channel: int, kind: str, append: _Append
    ) -> None:
        if content is None:
            self._fail(
                UNEXPECTED_FRAME,
                f"expected method frame, got non method frame ({kind}) instead",
                channel,
                append,
            )
        else:
            self._unexpected_in_content(content, channel, append)


def _unmarshal(method_class: type[base.Frame], payload: bytes) -> base.Frame | None:
    """pamqp-decode a method's arguments; None if they don't decode."""
    method = method_class()
    try:
        method.unmarshal(payload)
    except Exception:  # pamqp raises struct.error, ValueError, UnicodeDecodeError, KeyError...
        return None
    return method


# --- encoding ----------------------------------------------------------------------------------


def encode_method(channel: int, method: base.Frame) -> bytes:
    """A method frame for any pamqp method (pamqp validates and marshals it)."""
    return pamqp_frame.marshal(method, channel)


def encode_heartbeat() -> bytes:
    """A heartbeat frame."""
    return HEARTBEAT_FRAME


# Basic.Ack / Basic.Nack as a whole method frame: type, channel, size = 13, class 60,
# method 80 / 120, delivery tag, bits, frame end.
_TAG_BITS_FRAME = struct.Struct(">BHIHHQBB")


def encode_ack(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """Basic.Ack (a publisher confirm): the message(s) up to ``delivery_tag`` are safe."""
    return _TAG_BITS_FRAME.pack(
        FRAME_METHOD, channel, _TAG_BITS_PAYLOAD, CLASS_BASIC, 80, delivery_tag, multiple, FRAME_END
    )


def encode_nack(
    channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = False
) -> bytes:
    """Basic.Nack (a negative publisher confirm; RabbitMQ sends requeue = false)."""
    return _TAG_BITS_FRAME.pack(
        FRAME_METHOD,
        channel,
        _TAG_BITS_PAYLOAD,
        CLASS_BASIC,
        120,
        delivery_tag,
        multiple | (requeue << 1),
        FRAME_END,
    )


# The frame end of a method frame, then a content header frame up to its properties:
# frame end, type 2, channel, size, class 60, weight 0, body size.
_METHOD_END_CONTENT_HEADER = struct.Struct(">BBHIHHQ")
# The frame end of the content header frame, then the header of the first body frame.
_HEADER_END_BODY_FRAME = struct.Struct(">BBHI")
# Frame end of a method frame + content header frame prefix, to append to a method's format.
_CONTENT_HEADER_FORMAT: Final = _METHOD_END_CONTENT_HEADER.format[1:]

# Struct of a method frame whose arguments hold shortstrs, by (method, shortstr lengths):
# a few distinct lengths per consumer, so the cache stays small; bounded all the same.
_STRUCT_CACHE: dict[tuple[int, int, int, int], struct.Struct] = {}
_STRUCT_CACHE_MAX: Final = 4096


def _method_struct(key: tuple[int, int, int, int], fmt: str) -> struct.Struct:
    compiled = _STRUCT_CACHE.get(key)
    if compiled is None:
        if len(_STRUCT_CACHE) >= _STRUCT_CACHE_MAX:
            _STRUCT_CACHE.clear()
        compiled = _STRUCT_CACHE[key] = struct.Struct(fmt)
    return compiled


def _shortstr(value: str | bytes, name: str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > SHORTSTR_MAX:
        raise ValueError(f"{name} longer than {SHORTSTR_MAX} octets")
    return raw


def _body_frames(channel: int, body: Buffer, frame_max: int) -> list[Buffer]:
    """Body frames after the first one's header: [body part, end + next header, ...]."""
    chunk = frame_max - FRAME_OVERHEAD if frame_max else len(body)
    if chunk <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    view = memoryview(body)
    parts: list[Buffer] = [view[:chunk]]
    for offset in range(chunk, len(body), chunk):
        piece = view[offset : offset + chunk]
        parts.append(_HEADER_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, len(piece)))
        parts.append(piece)
    return parts


def _content_tail(
    head: bytes,
    channel: int,
    properties_raw: Buffer,
    body: Buffer,
    frame_max: int,
) -> bytes:
    """Join a packed method frame + content header prefix with the properties and body."""
    size = len(body)
    if not size:
        return b"".join((head, properties_raw, _FRAME_END_OCTET))
    first = frame_max - FRAME_OVERHEAD if frame_max else size
    if size <= first:
        return b"".join(
            (
                head,
                properties_raw,
                _HEADER_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, size),
                body,
                _FRAME_END_OCTET,
            )
        )
    return b"".join(
        (
            head,
            properties_raw,
            _HEADER_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, first),
            *_body_frames(channel, body, frame_max),
            _FRAME_END_OCTET,
        )
    )


def encode_deliver(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_raw: Buffer,
    body: Buffer,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """Basic.Deliver + content header + body frames (each at most ``frame_max`` octets).

    ``properties_raw`` is sent as is (flags + property list, e.g. ``Publish.properties_raw``).
    """
    # (inline rather than _shortstr(): this is the hottest encoder)
    ctag = consumer_tag.encode() if isinstance(consumer_tag, str) else consumer_tag
    exch = exchange.encode() if isinstance(exchange, str) else exchange
    rkey = routing_key.encode() if isinstance(routing_key, str) else routing_key
    lc, le, lr = len(ctag), len(exch), len(rkey)
    if lc > SHORTSTR_MAX or le > SHORTSTR_MAX or lr > SHORTSTR_MAX:
        raise ValueError(
            f"consumer_tag, exchange and routing_key are at most {SHORTSTR_MAX} octets"
        )
    # method frame: type 1, channel, size, class 60, method 60,
    #   consumer-tag (shortstr), delivery-tag (longlong), redelivered (octet),
    #   exchange (shortstr), routing-key (shortstr)
    # then frame end + the content header frame up to the properties.
    size = len(body)
    packer = _STRUCT_CACHE.get((60, lc, le, lr))
    if packer is None:
        packer = _method_struct(
            (60, lc, le, lr), f">BHIHHB{lc}sQBB{le}sB{lr}s" + _CONTENT_HEADER_FORMAT
        )
    head = packer.pack(
        FRAME_METHOD,
        channel,
        16 + lc + le + lr,
        CLASS_BASIC,
        60,
        lc,
        ctag,
        delivery_tag,
        redelivered,
        le,
        exch,
        lr,
        rkey,
        FRAME_END,
        FRAME_HEADER,
        channel,
        _CONTENT_HEADER_SIZE + len(properties_raw),
        CLASS_BASIC,
        0,
        size,
    )
    if 0 < size <= frame_max - FRAME_OVERHEAD or (size and not frame_max):
        return b"".join(
            (
                head,
                properties_raw,
                _HEADER_END_BODY_FRAME.pack(FRAME_END, FRAME_BODY, channel, size),
                body,
                _FRAME_END_OCTET,
            )
        )
    return _content_tail(head, channel, properties_raw, body, frame_max)


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    message_count: int,
    properties_raw: Buffer,
    body: Buffer,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """Basic.Get-Ok + content header + body frames."""
    exch = _shortstr(exchange, "exchange")
    rkey = _shortstr(routing_key, "routing_key")
    le, lr = len(exch), len(rkey)
    # method frame: type 1, channel, size, class 60, method 71, delivery-tag (longlong),
    #   redelivered (octet), exchange (shortstr), routing-key (shortstr), message-count (long)
    packer = _STRUCT_CACHE.get((71, 0, le, lr))
    if packer is None:
        packer = _method_struct((71, 0, le, lr), f">BHIHHQBB{le}sB{lr}sI" + _CONTENT_HEADER_FORMAT)
    head = packer.pack(
        FRAME_METHOD,
        channel,
        19 + le + lr,
        CLASS_BASIC,
        71,
        delivery_tag,
        redelivered,
        le,
        exch,
        lr,
        rkey,
        message_count,
        FRAME_END,
        FRAME_HEADER,
        channel,
        _CONTENT_HEADER_SIZE + len(properties_raw),
        CLASS_BASIC,
        0,
        len(body),
    )
    return _content_tail(head, channel, properties_raw, body, frame_max)


def encode_basic_return(
    channel: int,
    reply_code: int,
    reply_text: str | bytes,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_raw: Buffer,
    body: Buffer,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """Basic.Return (an unroutable mandatory message, e.g. 312 NO_ROUTE) + content frames."""
    text = _shortstr(reply_text, "reply_text")
    exch = _shortstr(exchange, "exchange")
    rkey = _shortstr(routing_key, "routing_key")
    lt, le, lr = len(text), len(exch), len(rkey)
    # method frame: type 1, channel, size, class 60, method 50, reply-code (short),
    #   reply-text (shortstr), exchange (shortstr), routing-key (shortstr)
    packer = _STRUCT_CACHE.get((50, lt, le, lr))
    if packer is None:
        packer = _method_struct(
            (50, lt, le, lr), f">BHIHHHB{lt}sB{le}sB{lr}s" + _CONTENT_HEADER_FORMAT
        )
    head = packer.pack(
        FRAME_METHOD,
        channel,
        9 + lt + le + lr,
        CLASS_BASIC,
        50,
        reply_code,
        lt,
        text,
        le,
        exch,
        lr,
        rkey,
        FRAME_END,
        FRAME_HEADER,
        channel,
        _CONTENT_HEADER_SIZE + len(properties_raw),
        CLASS_BASIC,
        0,
        len(body),
    )
    return _content_tail(head, channel, properties_raw, body, frame_max)


def encode_content(
    channel: int,
    method: base.Frame,
    properties_raw: Buffer,
    body: Buffer,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """Any content-carrying pamqp method + content header + body frames (the slow, general way)."""
    head = (
        encode_method(channel, method)
        + _METHOD_END_CONTENT_HEADER.pack(
            FRAME_END,
            FRAME_HEADER,
            channel,
            _CONTENT_HEADER_SIZE + len(properties_raw),
            CLASS_BASIC,
            0,
            len(body),
        )[1:]
    )
    return _content_tail(head, channel, properties_raw, body, frame_max)
