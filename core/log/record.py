"""The commit-log record frame: layout, encoding and decoding.

Who writes it: only :class:`core.log.commitlog.CommitLog` (one writer). Who reads it: the broker
and any other process through :mod:`core.log.reader`. Every frame is checksummed with CRC32C.
Pure functions over ``bytes``/``memoryview``; no I/O, thread-safe.

Frame layout, little-endian, fixed 72-byte header then the variable fields in this order::

    offset size  field
     0     4     total_size    whole frame in bytes, this field included
     4     4     magic         RECORD_MAGIC, or BLANK_MAGIC for the filler closing a segment
     8     4     crc32c        over bytes [12, total_size)
    12     2     flags         FLAG_* bits below
    14     1     protocol      PROTOCOL_* of the publisher
    15     1     reserved      0
    16     8     store_ms      broker time the record was appended (ms since the epoch)
    24     8     born_ms       producer's timestamp (ms), e.g. Kafka CreateTime
    32     8     deliver_at_ms when a delayed record becomes visible (0: not delayed)
    40     4     queue         queue number inside ``topic``
    44     4     record_count  1, or the number of records in a batch body
    48     2     topic_len
    50     2     subject_len   routing address inside the topic (routing key, MQTT levels)
    52     4     key_len       0xFFFFFFFF for a null key
    56     4     headers_len
    60     2     tags_len
    62     2     client_len    publishing client's id
    64     2     address_len   origin address as the publisher wrote it (exchange + key, MQTT topic)
    66     2     dests_len     encoded destination list (0: index into (topic, queue) only)
    68     4     body_len      0xFFFFFFFF for a null body (Kafka tombstone)
    72           topic, subject, key, headers, tags, client, address, dests, body

Headers: repeated ``u16 name_len, name, u32 value_len, value`` (order kept, duplicates allowed).
Tags: repeated ``u8 len, tag`` (UTF-8). Destinations: repeated ``u16 topic_len, topic, u32 queue``.

A LINK record's body is repeated ``u64 position, u32 size`` of earlier records: replaying it
indexes those records into the LINK's destinations, or each into its own destinations when the
LINK names none, all in one frame (so a multi-record transaction commits atomically). Moving a
record (commit of a half message, a timer firing, a dead-letter move) never copies its body. A
LINK with headers has one target and is itself what gets indexed: readers follow it to the target
and add the LINK's headers (e.g. AMQP's ``x-death``) to the target's.
A LINK with ``FLAG_LINK_INDEXED`` is indexed in its own (topic, queue) too, read there as
stored; its headers describe it and are never laid over its targets'.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Required, TypedDict

from crc32c import crc32c

if TYPE_CHECKING:
    from typing_extensions import Unpack

RECORD_MAGIC = 0xB4A1D001
# Closes a segment whose remaining space cannot hold the next record (RocketMQ's BLANK_MAGIC_CODE):
# nothing ever straddles two segment files.
BLANK_MAGIC = 0xB4A1D0FF

# Flag bits.
FLAG_BATCH = 0x0001  # body is one Kafka RecordBatch holding record_count records
FLAG_HALF = 0x0002  # transactional half message: stored, not visible until committed
FLAG_DELAYED = 0x0004  # visible at deliver_at_ms, not before
FLAG_LINK = 0x0008  # body points at an earlier record to index into this record's destinations
FLAG_NULL_KEY = 0x0010
FLAG_NULL_BODY = 0x0020
FLAG_TXN_CONTROL = 0x0040  # Kafka control batch (commit/abort marker)
# A LINK that is also a record of its own (topic, queue), indexed there besides linking its
# targets: a transaction's commit decision in ``__transactions/0`` (one frame decides and makes
# the halves visible). Its key, tags and headers are its own, never laid over the targets'.
FLAG_LINK_INDEXED = 0x0080
# A copy of a record whose home is another shard of a cluster (docs/cluster.md section 2): a
# record whose destinations sit in several shards is stored once in each, and every copy but
# the one in its home shard carries this flag, so readers that count records (Spark's
# ``dedupe``) skip it. Consumers of the shard's queues read it as any record.
FLAG_COPY = 0x0100

PROTOCOL_INTERNAL = 0
PROTOCOL_KAFKA = 1
PROTOCOL_AMQP = 2
PROTOCOL_MQTT = 3
PROTOCOL_NAMES = {
    PROTOCOL_INTERNAL: "internal",
    PROTOCOL_KAFKA: "kafka",
    PROTOCOL_AMQP: "amqp",
    PROTOCOL_MQTT: "mqtt",
}

HEADER = struct.Struct("<IIIHBxqqqIIHHIIHHHHI")
HEADER_SIZE = HEADER.size  # 72
# The prefix every frame starts with, including a BLANK filler: total_size, magic, crc32c.
PREFIX = struct.Struct("<III")
CRC_START = PREFIX.size  # the checksum covers everything after the prefix
# The header after the prefix: flags through body_len.
_HEADER_TAIL = struct.Struct("<" + HEADER.format[4:])
FLAGS = struct.Struct("<H")
FLAGS_OFFSET = 12
_NULL_LEN = 0xFFFFFFFF
_LINK_BODY = struct.Struct("<QI")
_HEADER_NAME = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<I")
_DEST = struct.Struct("<HI")
# Limits: field widths of the frame.
MAX_TOPIC_BYTES = 0xFFFF
MAX_TAG_BYTES = 0xFF

Headers = Sequence[tuple[str, bytes]]


class CorruptRecordError(Exception):
    """A stored frame fails its length, magic or CRC check; it is never served.

    Raised by a queue read (``LogReader.read``), ``offset`` and ``next_offset`` are the queue
    offsets the damaged entry held (the records a consumer must skip or be told of); -1 for a
    commit-log scan."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"corrupt record at commit-log position {position}: {reason}")
        self.position = position
        self.reason = reason
        self.offset = -1
        self.next_offset = -1


def encode_headers(headers: Headers) -> bytes:
    parts: list[bytes] = []
    for name, value in headers:
        name_bytes = name.encode()
        parts.append(_HEADER_NAME.pack(len(name_bytes)))
        parts.append(name_bytes)
        parts.append(_HEADER_VALUE.pack(len(value)))
        parts.append(bytes(value))
    return b"".join(parts)


def decode_headers(raw: bytes | memoryview) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = []
    view = memoryview(raw)
    pos = 0
    end = len(view)
    while pos < end:
        (name_len,) = _HEADER_NAME.unpack_from(view, pos)
        pos += 2
        name = bytes(view[pos : pos + name_len]).decode()
        pos += name_len
        (value_len,) = _HEADER_VALUE.unpack_from(view, pos)
        pos += 4
        headers.append((name, bytes(view[pos : pos + value_len])))
        pos += value_len
    return headers


def encode_tags(tags: Iterable[str]) -> bytes:
    parts: list[bytes] = []
    for tag in tags:
        raw = tag.encode()
        if len(raw) > MAX_TAG_BYTES:
            raise ValueError(f"tag longer than {MAX_TAG_BYTES} bytes: {tag[:40]!r}...")
        parts.append(bytes((len(raw),)))
        parts.append(raw)
    return b"".join(parts)


def decode_tags(raw: bytes | memoryview) -> list[str]:
    view = bytes(raw)
    tags: list[str] = []
    pos = 0
    while pos < len(view):
        size = view[pos]
        tags.append(view[pos + 1 : pos + 1 + size].decode())
        pos += 1 + size
    return tags


def encode_destinations(destinations: Iterable[tuple[str, int]]) -> bytes:
    parts: list[bytes] = []
    for topic, queue in destinations:
        raw = topic.encode()
        parts.append(_DEST.pack(len(raw), queue))
        parts.append(raw)
    return b"".join(parts)


def decode_destinations(raw: bytes | memoryview) -> list[tuple[str, int]]:
    view = memoryview(raw)
    out: list[tuple[str, int]] = []
    pos = 0
    while pos < len(view):
        topic_len, queue = _DEST.unpack_from(view, pos)
        pos += _DEST.size
        out.append((bytes(view[pos : pos + topic_len]).decode(), queue))
        pos += topic_len
    return out


def encode_link_body(targets: Iterable[tuple[int, int]]) -> bytes:
    return b"".join(_LINK_BODY.pack(position, size) for position, size in targets)


def decode_link_body(body: bytes | memoryview) -> list[tuple[int, int]]:
    return [(int(p), int(s)) for p, s in _LINK_BODY.iter_unpack(body)]


class FrameFields(TypedDict, total=False):
    """The keyword fields of :func:`encode_record_parts` (and :func:`encode_record`)."""

    store_ms: Required[int]
    key: bytes | None
    headers: bytes
    tags: bytes
    subject: bytes
    client: bytes
    address: bytes
    destinations: bytes
    flags: int
    protocol: int
    born_ms: int
    deliver_at_ms: int
    record_count: int


def encode_record(
    topic: bytes, queue: int, body: bytes | memoryview | None, **fields: Unpack[FrameFields]
) -> bytes:
    """Encode one frame. Variable fields arrive already encoded (see ``encode_*``) so callers
    that publish the same headers repeatedly encode them once."""
    head, body_bytes = encode_record_parts(topic, queue, body, **fields)
    return head + body_bytes if body_bytes else head


def encode_record_parts(
    topic: bytes,
    queue: int,
    body: bytes | memoryview | None,
    *,
    store_ms: int,
    key: bytes | None = b"",
    headers: bytes = b"",
    tags: bytes = b"",
    subject: bytes = b"",
    client: bytes = b"",
    address: bytes = b"",
    destinations: bytes = b"",
    flags: int = 0,
    protocol: int = PROTOCOL_INTERNAL,
    born_ms: int = 0,
    deliver_at_ms: int = 0,
    record_count: int = 1,
) -> tuple[bytes, bytes | memoryview]:
    """:func:`encode_record` as two parts, the frame without its body and the body (not
    copied): a large body (a Kafka batch) is then written to the log straight from the buffer
    it arrived in (``CommitLog.append_parts``)."""
    if key is None:
        flags |= FLAG_NULL_KEY
        key = b""
        key_len = _NULL_LEN
    else:
        key_len = len(key)
    if body is None:
        flags |= FLAG_NULL_BODY
        body = b""
        body_len = _NULL_LEN
    else:
        body_len = len(body)
    fields = b"".join((topic, subject, key, headers, tags, client, address, destinations))
    total = HEADER_SIZE + len(fields) + len(body)
    tail = _HEADER_TAIL.pack(
        flags,
        protocol,
        store_ms,
        born_ms or store_ms,
        deliver_at_ms,
        queue,
        record_count,
        len(topic),
        len(subject),
        key_len,
        len(headers),
        len(tags),
        len(client),
        len(address),
        len(destinations),
        body_len,
    )
    # The CRC covers everything after the prefix: the header tail, the fields, the body.
    crc = crc32c(body, crc32c(fields, crc32c(tail)))
    return b"".join((PREFIX.pack(total, RECORD_MAGIC, crc), tail, fields)), body


# A frame's prefix, flags, protocol, store_ms, born_ms, deliver_at_ms.
_STAMP = struct.Struct("<IIIHBxqqq")


def stamp_frame(frame: bytearray, store_ms: int) -> int:
    """Set the store time of the record frame ``frame`` (one whole frame, checked) to
    ``store_ms``, ``FLAG_DELAYED`` when its ``deliver_at_ms`` is later, and its checksum
    anew; returns its flags. What the log does to a frame encoded elsewhere
    (``LogStore.append_encoded``)."""
    total, magic, _, flags, protocol, _, born_ms, deliver_at_ms = _STAMP.unpack_from(frame, 0)
    if deliver_at_ms > store_ms:
        flags |= FLAG_DELAYED
    _STAMP.pack_into(frame, 0, total, magic, 0, flags, protocol, store_ms, born_ms, deliver_at_ms)
    PREFIX.pack_into(frame, 0, total, magic, crc32c(memoryview(frame)[CRC_START:]))
    return int(flags)


def frame_queue(frame: bytes | bytearray | memoryview) -> tuple[str, int]:
    """The ``(topic, queue)`` of the record frame ``frame``, decoding nothing else."""
    fields = HEADER.unpack_from(frame, 0)
    topic_len = fields[10]
    return bytes(frame[HEADER_SIZE : HEADER_SIZE + topic_len]).decode(), fields[8]


def blank_frame(size: int) -> bytes:
    """The filler that closes a segment: a prefix with no checksum and zeros after it."""
    return PREFIX.pack(size, BLANK_MAGIC, 0) + bytes(size - PREFIX.size)


def verify_frame(buf: memoryview, pos: int, limit: int) -> int:
    """Check the frame at ``buf[pos:]`` and return its total size.

    Raises :class:`CorruptRecordError` (with ``pos`` relative to ``buf``) if the length, magic or
    checksum is wrong. A BLANK filler verifies as its size.
    """
    if pos + PREFIX.size > limit:
        raise CorruptRecordError(pos, "truncated frame prefix")
    total, magic, crc = PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        if total < PREFIX.size or pos + total > limit:
            raise CorruptRecordError(pos, f"bad blank size {total}")
        return int(total)
    if magic != RECORD_MAGIC:
        raise CorruptRecordError(pos, f"bad magic 0x{magic:08x}")
    if total < HEADER_SIZE or pos + total > limit:
        raise CorruptRecordError(pos, f"bad size {total}")
    if crc32c(buf[pos + CRC_START : pos + total]) != crc:
        raise CorruptRecordError(pos, "crc32c mismatch")
    return int(total)


class Record(NamedTuple):
    """One decoded commit-log record. ``key``/``body`` are ``None`` when the producer sent null.

    A NamedTuple rather than a frozen dataclass: every delivery decodes one, and building a
    frozen dataclass of 18 fields measured several times slower."""

    position: int
    size: int
    flags: int
    protocol: int
    store_ms: int
    born_ms: int
    deliver_at_ms: int
    topic: str
    queue: int
    record_count: int
    subject: str
    key: bytes | None
    headers: list[tuple[str, bytes]]
    tags: list[str]
    client: str
    address: str
    destinations: list[tuple[str, int]]
    body: bytes | None

    @property
    def protocol_name(self) -> str:
        return PROTOCOL_NAMES.get(self.protocol, "unknown")

    @property
    def is_batch(self) -> bool:
        return bool(self.flags & FLAG_BATCH)

    def index_targets(self) -> list[tuple[str, int]]:
        """The queues a visible record is indexed into when it is appended."""
        return self.destinations or [(self.topic, self.queue)]


_topic_names: dict[bytes, str] = {}


def decode_record(buf: memoryview | bytes, pos: int, position: int | None = None) -> Record:
    """Decode the (already verified) frame at ``buf[pos:]``; ``position`` labels it."""
    (
        total,
        _magic,
        _crc,
        flags,
        protocol,
        store_ms,
        born_ms,
        deliver_at_ms,
        queue,
        record_count,
        topic_len,
        subject_len,
        key_len,
        headers_len,
        tags_len,
        client_len,
        address_len,
        dests_len,
        body_len,
    ) = HEADER.unpack_from(buf, pos)
    raw = bytes(buf[pos + HEADER_SIZE : pos + total])
    # Topic names repeat: decode each once.
    topic_raw = raw[:topic_len]
    topic = _topic_names.get(topic_raw)
    if topic is None:
        topic = topic_raw.decode()
        if len(_topic_names) < 65_536:
            _topic_names[topic_raw] = topic
    cursor = topic_len
    subject = raw[cursor : cursor + subject_len].decode() if subject_len else ""
    cursor += subject_len
    key: bytes | None
    if key_len == _NULL_LEN:
        key = None
    else:
        key = raw[cursor : cursor + key_len]
        cursor += key_len
    headers = decode_headers(raw[cursor : cursor + headers_len]) if headers_len else []
    cursor += headers_len
    tags = decode_tags(raw[cursor : cursor + tags_len]) if tags_len else []
    cursor += tags_len
    client = raw[cursor : cursor + client_len].decode() if client_len else ""
    cursor += client_len
    address = raw[cursor : cursor + address_len].decode() if address_len else ""
    cursor += address_len
    dests = decode_destinations(raw[cursor : cursor + dests_len]) if dests_len else []
    cursor += dests_len
    body: bytes | None = None if body_len == _NULL_LEN else raw[cursor:]
    return Record(
        pos if position is None else position,
        total,
        flags,
        protocol,
        store_ms,
        born_ms,
        deliver_at_ms,
        topic,
        queue,
        record_count,
        subject,
        key,
        headers,
        tags,
        client,
        address,
        dests,
        body,
    )


def index_fields(
    buf: memoryview | bytes, pos: int
) -> tuple[int, int, list[str], list[tuple[str, int]]]:
    """``(size, record_count, tags, index targets)`` of the frame at ``buf[pos:]``, decoding only
    what dispatching a LINK to it needs."""
    fields = HEADER.unpack_from(buf, pos)
    total, queue, record_count = fields[0], fields[8], fields[9]
    topic_len, subject_len, key_len, headers_len, tags_len = fields[10:15]
    client_len, address_len, dests_len = fields[15:18]
    if key_len == _NULL_LEN:
        key_len = 0
    start = pos + HEADER_SIZE
    tags_at = start + topic_len + subject_len + key_len + headers_len
    tags = decode_tags(buf[tags_at : tags_at + tags_len]) if tags_len else []
    if dests_len:
        dests_at = tags_at + tags_len + client_len + address_len
        targets = decode_destinations(buf[dests_at : dests_at + dests_len])
    else:
        targets = [(bytes(buf[start : start + topic_len]).decode(), queue)]
    return total, record_count, tags, targets


def body_slice(buf: memoryview, pos: int) -> memoryview:
    """The body of the verified frame at ``buf[pos:]`` without decoding the rest (zero-copy)."""
    fields = HEADER.unpack_from(buf, pos)
    total = fields[0]
    body_len = fields[18]
    if body_len == _NULL_LEN:
        return buf[pos + total : pos + total]
    return buf[pos + total - body_len : pos + total]


def tags_slice(buf: memoryview, pos: int) -> list[str]:
    """The tags of the frame at ``buf[pos:]``, for the exact check after a tag-hash hit."""
    fields = HEADER.unpack_from(buf, pos)
    key_len = 0 if fields[12] == _NULL_LEN else fields[12]
    start = pos + HEADER_SIZE + fields[10] + fields[11] + key_len + fields[13]
    return decode_tags(buf[start : start + fields[14]])
