"""Kafka RecordBatch (message format v2, magic 2) helpers over bytes and memoryviews.

Pure functions, no I/O, thread-safe; usable by ``core`` or ``spark`` without an event loop.
A batch is handled as opaque bytes wherever possible: the broker reads its 61-byte header,
checks its CRC and patches its base offset, and decodes records only for consumers of other
protocols. Record (de)compression and the varint record layout are aiokafka's Cython codec
(``aiokafka.record.default_records``), with gzip from the standard library and snappy, lz4 and
zstd from ``cramjam``.

RecordBatch layout (``DefaultRecordBatch.java``; all integers big-endian)::

    offset  size  field
         0     8  base_offset             int64   first offset; set by the broker, not in CRC
         8     4  batch_length            int32   bytes after this field (size = length + 12)
        12     4  partition_leader_epoch  int32   set by the broker, not in CRC
        16     1  magic                   int8    2 (0/1: legacy MessageSet, same offset)
        17     4  crc                     uint32  CRC-32C of bytes 21..end
        21     2  attributes              int16   see ATTR_* below
        23     4  last_offset_delta       int32   record_count - 1 for a batch from a producer
        27     8  base_timestamp          int64   first record's timestamp (ms)
        35     8  max_timestamp           int64   (log append time when ATTR_LOG_APPEND_TIME)
        43     8  producer_id             int64   -1 without idempotence
        51     2  producer_epoch          int16
        53     4  base_sequence           int32   -1 without idempotence
        57     4  record_count            int32
        61     .  records                 compressed as a whole when attributes say so

Legacy MessageSet v0/v1 (magic 0/1) never reaches this broker from a conforming client:
``SUPPORTED_APIS`` starts Produce at v3, and Produce v3+ may carry only magic 2 (Kafka rejects
anything else with INVALID_RECORD, as ``validate_produce_records`` does); Fetch starts at v4,
whose clients all read magic 2. Records published through AMQP or MQTT are stored as magic 2
batches built by ``build_batch``. So magic 0/1 is detected (the magic byte sits at offset 16 in
all three formats) and refused, never decoded.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Final, NamedTuple, TypeAlias

import cramjam
from aiokafka.codec import lz4_decode, snappy_decode, zstd_decode
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from gateway.kafka.errors import RecordBatchError

Buffer: TypeAlias = bytes | bytearray | memoryview

# The layout above, one field per format character: q base_offset, i batch_length,
# i partition_leader_epoch, b magic, I crc, h attributes, i last_offset_delta,
# q base_timestamp, q max_timestamp, q producer_id, h producer_epoch, i base_sequence,
# i record_count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 61
# base_offset + batch_length: the "log overhead" every batch and legacy message starts with.
LOG_OVERHEAD: Final = struct.calcsize(">qi")  # 12
BASE_OFFSET_OFFSET: Final = 0
BATCH_LENGTH_OFFSET: Final = struct.calcsize(">q")  # 8
PARTITION_LEADER_EPOCH_OFFSET: Final = LOG_OVERHEAD  # 12
MAGIC_OFFSET: Final = struct.calcsize(">qii")  # 16
CRC_OFFSET: Final = struct.calcsize(">qiib")  # 17
ATTRIBUTES_OFFSET: Final = struct.calcsize(">qiibI")  # 21: the CRC covers from here to the end
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")

CURRENT_MAGIC: Final = 2
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1

# Attribute bits (int16). Bits 7-15 unused.
ATTR_COMPRESSION_MASK: Final = 0x07  # bits 0-2: Compression
ATTR_LOG_APPEND_TIME: Final = 0x08  # bit 3: timestamp type (0 create time, 1 log append time)
ATTR_TRANSACTIONAL: Final = 0x10  # bit 4
ATTR_CONTROL: Final = 0x20  # bit 5: control batch (transaction markers)
ATTR_DELETE_HORIZON: Final = 0x40  # bit 6: base_timestamp is the compaction delete horizon

# The oldest Produce version allowed to carry zstd batches (KIP-110); older: error 76.
ZSTD_MIN_PRODUCE_VERSION: Final = 7


class Compression(enum.IntEnum):
    """Codec ids of attributes bits 0-2 (``CompressionType.java``); 5-7 are undefined."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class BatchHeader(NamedTuple):
    """The 61-byte header of a RecordBatch, field for field (see the module layout).

    A named tuple rather than a frozen dataclass: built straight from ``struct.unpack_from``
    in well under a microsecond, where a 13-field frozen dataclass takes several.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, log overhead included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> int:
        """Codec id (a ``Compression`` value unless the batch is invalid)."""
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_LOG_APPEND_TIME)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


class Record(NamedTuple):
    """One record of a batch. ``timestamp`` is absolute (ms); headers keep their order."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def read_batch_header(batch: Buffer, offset: int = 0) -> BatchHeader:
    """The header of the batch starting at ``offset``. ``RecordBatchError`` if cut short."""
    if len(batch) - offset < BATCH_HEADER_SIZE:
        raise RecordBatchError(
            f"record batch header needs {BATCH_HEADER_SIZE} bytes, {len(batch) - offset} available",
            ErrorCode.corrupt_message,
        )
    return BatchHeader._make(BATCH_HEADER.unpack_from(batch, offset))


def read_magic(batch: Buffer, offset: int = 0) -> int:
    """The magic byte (format version) of the batch or legacy message at ``offset``."""
    if len(batch) - offset <= MAGIC_OFFSET:
        raise RecordBatchError(
            "record batch too short to hold its magic byte", ErrorCode.corrupt_message
        )
    magic: int = _INT8.unpack_from(batch, offset + MAGIC_OFFSET)[0]
    return magic


def patch_base_offset(batch: Buffer, base_offset: int) -> bytes:
    """A copy of ``batch`` with its base offset set: one copy, nothing else changes.

    The base offset is outside the CRC (which starts at the attributes), and offsets of the
    records are deltas from it, so the batch stays valid.
    """
    return b"".join((_INT64.pack(base_offset), memoryview(batch)[BATCH_LENGTH_OFFSET:]))


def patch_base_offset_into(buffer: bytearray | memoryview, base_offset: int, at: int = 0) -> None:
    """Set the base offset of the batch at ``buffer[at:]`` in place (e.g. in a Fetch response)."""
    _INT64.pack_into(buffer, at + BASE_OFFSET_OFFSET, base_offset)


def compute_crc(batch: Buffer) -> int:
    """CRC-32C over attributes..end, the value the ``crc`` field must hold."""
    with memoryview(batch) as view:
        return crc32c(view[ATTRIBUTES_OFFSET:])


def split_batches(records: Buffer) -> list[memoryview]:
    """Cut a record set (a Produce partition's ``records``) into one view per batch.

    Only the 12-byte log overhead of each batch is read, so this works for any magic.
    A batch running past the end, or a length below the minimum of its format, raises
    ``RecordBatchError(CORRUPT_MESSAGE)``: unlike Kafka, which silently trims a partial
    trailing batch, a Produce with one is refused (no conforming client sends one).
    """
    view = memoryview(records)
    total = len(view)
    batches: list[memoryview] = []
    pos = 0
    while pos < total:
        if total - pos < LOG_OVERHEAD:
            raise RecordBatchError(
                f"{total - pos} trailing bytes after the last record batch",
                ErrorCode.corrupt_message,
            )
        (length,) = _INT32.unpack_from(view, pos + BATCH_LENGTH_OFFSET)
        # The smallest legacy message (magic 0, null key and value) is 14 bytes after the
        # log overhead: crc 4, magic 1, attributes 1, key length 4, value length 4.
        if length < 14:
            raise RecordBatchError(
                f"record batch length {length} is below the minimum", ErrorCode.corrupt_message
            )
        end = pos + LOG_OVERHEAD + length
        if end > total:
            raise RecordBatchError(
                f"record batch of {LOG_OVERHEAD + length} bytes runs past the end of the "
                f"record set ({total - pos} bytes left)",
                ErrorCode.corrupt_message,
            )
        batches.append(view[pos:end])
        pos = end
    return batches


def validate_batch(batch: Buffer, *, from_client: bool = True) -> BatchHeader:
    """Check one complete magic-2 batch without decoding its records; return its header.

    Checks, with the Kafka broker's error codes (``DefaultRecordBatch.ensureValid``,
    ``LogValidator.validateBatch``):

    - CORRUPT_MESSAGE (2): header cut short, length that disagrees with the buffer, CRC-32C
      mismatch.
    - INVALID_RECORD (87): magic other than 2; record count < 1 or not matching
      last_offset_delta + 1; a control batch from a client; a transactional batch without a
      producer id; a producer id with a negative base sequence.
    - UNSUPPORTED_COMPRESSION_TYPE (76): codec id 5-7.
    """
    size = len(batch)
    magic = read_magic(batch)
    if magic != CURRENT_MAGIC:
        raise RecordBatchError(
            f"record batch magic {magic}: only magic {CURRENT_MAGIC} is accepted",
            ErrorCode.invalid_record,
        )
    header = read_batch_header(batch)
    if header.batch_length + LOG_OVERHEAD != size:
        raise RecordBatchError(
            f"record batch length field says {header.size} bytes, buffer holds {size}",
            ErrorCode.corrupt_message,
        )
    crc = crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:])
    if crc != header.crc:
        raise RecordBatchError(
            f"record batch CRC mismatch: stored {header.crc:#010x}, computed {crc:#010x}",
            ErrorCode.corrupt_message,
        )
    if header.compression > Compression.ZSTD:
        raise RecordBatchError(
            f"unknown compression codec id {header.compression}",
            ErrorCode.unsupported_compression_type,
        )
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        raise RecordBatchError(
            f"record count {header.record_count} does not match last offset delta "
            f"{header.last_offset_delta}",
            ErrorCode.invalid_record,
        )
    if from_client:
        if header.is_control:
            raise RecordBatchError(
                "clients are not allowed to write control records", ErrorCode.invalid_record
            )
        if header.producer_id >= 0 and header.base_sequence < 0:
            raise RecordBatchError(
                f"producer id {header.producer_id} with base sequence {header.base_sequence}",
                ErrorCode.invalid_record,
            )
    if header.is_transactional and header.producer_id < 0:
        raise RecordBatchError(
            "transactional record batch without a producer id", ErrorCode.invalid_record
        )
    return header


def validate_produce_records(
    records: Buffer | None, api_version: int
) -> tuple[memoryview, BatchHeader]:
    """Validate one partition's ``records`` of a Produce request; return the batch and header.

    Produce v3+ must carry exactly one magic-2 batch per partition, zstd only from v7
    (``ProduceRequest.validateRecords``): violations are INVALID_RECORD (87) and
    UNSUPPORTED_COMPRESSION_TYPE (76); then ``validate_batch``.
    """
    if records is None or len(records) == 0:
        raise RecordBatchError(
            "Produce requests must have exactly one record batch per partition",
            ErrorCode.invalid_record,
        )
    batches = split_batches(records)
    if len(batches) != 1:
        raise RecordBatchError(
            f"Produce requests must have exactly one record batch per partition, got "
            f"{len(batches)}",
            ErrorCode.invalid_record,
        )
    (batch,) = batches
    header = validate_batch(batch)
    if header.compression == Compression.ZSTD and api_version < ZSTD_MIN_PRODUCE_VERSION:
        raise RecordBatchError(
            f"zstd compression needs Produce v{ZSTD_MIN_PRODUCE_VERSION}+, got v{api_version}",
            ErrorCode.unsupported_compression_type,
        )
    return batch, header


def iter_records(batch: Buffer) -> Iterator[Record]:
    """Decode the records of one magic-2 batch (decompressing it if needed).

    Does not check the CRC (``validate_batch`` does). Control batches yield their control
    records as stored (key: version + type, value: the marker). A malformed batch raises
    ``RecordBatchError(CORRUPT_MESSAGE)``.
    """
    header = read_batch_header(batch)
    if header.magic != CURRENT_MAGIC:
        raise RecordBatchError(
            f"cannot decode record batch magic {header.magic}", ErrorCode.invalid_record
        )
    if header.compression > Compression.ZSTD:
        raise RecordBatchError(
            f"unknown compression codec id {header.compression}",
            ErrorCode.unsupported_compression_type,
        )
    base_offset = header.base_offset
    new_record = tuple.__new__  # Record(...) costs twice as much per record (measured)
    try:
        decoded = DefaultRecordBatch(batch)  # type: ignore[arg-type]  # any buffer works
        for record in decoded:
            yield new_record(
                Record,
                (
                    record.offset - base_offset,
                    record.timestamp,
                    record.key,
                    record.value,
                    record.headers,
                ),
            )
    except RecordBatchError:
        raise
    except Exception as exc:  # aiokafka: CorruptRecordException, codec and struct errors
        raise RecordBatchError(
            f"cannot decode record batch: {exc!r}", ErrorCode.corrupt_message
        ) from exc


# The builder refuses records past batch_size; a batch built here holds whatever it is given.
_UNLIMITED_BATCH_SIZE: Final = 2**31 - 1

Headers: TypeAlias = list[tuple[str, bytes | None]]
# (timestamp_ms or None for now, key, value, headers)
RecordInput: TypeAlias = tuple[int | None, bytes | None, bytes | None, Headers]


def build_batch(
    records: Iterable[RecordInput],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
) -> bytes:
    """A magic-2 batch of ``(timestamp_ms, key, value, headers)`` records, offsets 0, 1, ...

    For records published through AMQP or MQTT. A ``None`` timestamp means now. The builder
    keeps the batch uncompressed when compression would not make it smaller (aiokafka's
    choice, as the Java producer). Raises ``ValueError`` for an empty ``records``.
    """
    builder = DefaultRecordBatchBuilder(
        CURRENT_MAGIC,
        int(compression),
        int(transactional),
        producer_id,
        producer_epoch,
        base_sequence,
        _UNLIMITED_BATCH_SIZE,
    )
    count = 0
    for timestamp, key, value, headers in records:
        builder.append(count, timestamp, key, value, headers)
        count += 1
    if count == 0:
        raise ValueError("a record batch needs at least one record")
    built = builder.build()
    if base_offset:
        patch_base_offset_into(built, base_offset)
    return bytes(built)


# Control records (``ControlRecordType.java``, ``EndTransactionMarker.java``): the key is
# version int16 (0) + type int16; the value of a transaction marker is version int16 (0) +
# coordinator_epoch int32.
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER_VALUE = struct.Struct(">hi")
CONTROL_RECORD_VERSION: Final = 0


class ControlType(enum.IntEnum):
    """Control record types (``ControlRecordType.java``)."""

    ABORT = 0
    COMMIT = 1


def build_control_batch(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    timestamp_ms: int | None = None,
    base_offset: int = 0,
) -> bytes:
    """A transaction marker as the Kafka broker writes it: a transactional control batch of one
    control record, base sequence -1 (``MemoryRecords.withEndTransactionMarker``)."""
    built = bytearray(
        build_batch(
            [
                (
                    timestamp_ms,
                    _CONTROL_KEY.pack(CONTROL_RECORD_VERSION, control_type),
                    _END_TXN_MARKER_VALUE.pack(CONTROL_RECORD_VERSION, coordinator_epoch),
                    [],
                )
            ],
            base_offset=base_offset,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=True,
        )
    )
    (attributes,) = _INT16.unpack_from(built, ATTRIBUTES_OFFSET)
    _INT16.pack_into(built, ATTRIBUTES_OFFSET, attributes | ATTR_CONTROL)
    _UINT32.pack_into(built, CRC_OFFSET, compute_crc(built))
    return bytes(built)


def control_type_of(batch: Buffer) -> ControlType | None:
    """The marker type of a control batch (its first record's key), ``None`` otherwise."""
    if not read_batch_header(batch).is_control:
        return None
    for record in iter_records(batch):
        if record.key is not None and len(record.key) >= _CONTROL_KEY.size:
            return ControlType(_CONTROL_KEY.unpack_from(record.key)[1])
    return None


# Offsets of the fields ``filter_batch`` and ``gap_batch`` set (see the module layout).
_LAST_OFFSET_DELTA_OFFSET: Final = struct.calcsize(">qiibIh")  # 23
_EMPTY_BATCH_LENGTH: Final = BATCH_HEADER_SIZE - LOG_OVERHEAD


def _seal(batch: bytearray, base_offset: int, last_offset_delta: int, epoch: int) -> bytes:
    """Set the base offset, leader epoch and last offset delta, then the CRC."""
    _INT64.pack_into(batch, BASE_OFFSET_OFFSET, base_offset)
    _INT32.pack_into(batch, PARTITION_LEADER_EPOCH_OFFSET, epoch)
    _INT32.pack_into(batch, _LAST_OFFSET_DELTA_OFFSET, last_offset_delta)
    _UINT32.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def gap_batch(base_offset: int, count: int, *, epoch: int = 0, timestamp_ms: int = 0) -> bytes:
    """A batch of no records covering offsets ``base_offset .. base_offset + count - 1``:
    what a compacted log serves for a batch whose records were all removed (message format v2
    keeps the last offset delta), so a consumer moves on past offsets it is not sent."""
    if count < 1:
        raise ValueError("a gap covers at least one offset")
    batch = bytearray(
        BATCH_HEADER.pack(
            base_offset,
            _EMPTY_BATCH_LENGTH,
            epoch,
            CURRENT_MAGIC,
            0,
            0,
            count - 1,
            timestamp_ms,
            timestamp_ms,
            NO_PRODUCER_ID,
            NO_PRODUCER_EPOCH,
            NO_SEQUENCE,
            0,
        )
    )
    return _seal(batch, base_offset, count - 1, epoch)


def filter_batch(
    batch: Buffer,
    keep: Callable[[Headers], bool],
    *,
    base_offset: int,
    epoch: int = 0,
) -> bytes | None:
    """``batch`` with only the records whose headers ``keep`` takes, at their own offsets, with
    the same base offset (``base_offset``) and last offset delta, so a consumer moves past the
    records left out as it does past those compaction removed; ``None`` when it keeps them all.

    The result is uncompressed (a batch is decoded to be filtered), with the original's
    producer id, epoch, base sequence and transactional bit; a batch left with no record is a
    ``gap_batch``. Raises ``RecordBatchError`` for a batch that cannot be decoded."""
    header = read_batch_header(batch)
    records = list(iter_records(batch))
    kept = [record for record in records if keep(record.headers)]
    if len(kept) == len(records):
        return None
    if not kept:
        return gap_batch(
            base_offset,
            header.last_offset_delta + 1,
            epoch=epoch,
            timestamp_ms=header.max_timestamp,
        )
    builder = DefaultRecordBatchBuilder(
        CURRENT_MAGIC,
        int(Compression.NONE),
        int(header.is_transactional),
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        _UNLIMITED_BATCH_SIZE,
    )
    for record in kept:
        builder.append(
            record.offset_delta, record.timestamp, record.key, record.value, record.headers
        )
    return _seal(bytearray(builder.build()), base_offset, header.last_offset_delta, epoch)


# -- validating what a producer sends before it is stored (issue 21) ----------------------------
#
# Kafka's LogValidator decodes every record of a produced batch (decompressing it) before the
# batch is appended, so a batch whose CRC is right and whose records are garbage is refused
# (CORRUPT_MESSAGE) instead of stalling every consumer that reads it later. BraidMQ stores
# batches as sent and decodes them only for consumers of other protocols, so it checks the
# same before storing: the records are walked (aiokafka's Cython reader checks each record's
# length, varints and the bytes left over), their offset deltas must be 0, 1, 2, ..., and a
# compressed batch may inflate to ``max_inflated_batch_bytes`` at most (MESSAGE_TOO_LARGE),
# found from the compressed stream's own block headers before anything is inflated, so a
# compression bomb costs no memory.

_GZIP_WBITS: Final = 16 + 15  # zlib: a gzip member, 32 KiB window
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"  # snappy-java's SnappyOutputStream stream header
_XERIAL_HEADER_SIZE: Final = 16  # magic 8, version int32, compatible version int32
_LZ4_FRAME_MAGIC: Final = 0x184D2204
_LZ4_BLOCK_MAX: Final = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}  # BD bits 4-6
_LZ4_UNCOMPRESSED_BLOCK: Final = 0x80000000
_ZSTD_FRAME_MAGIC: Final = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK: Final = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC: Final = 0x184D2A50
_ZSTD_MAX_BLOCK: Final = 128 << 10  # RFC 8878 3.1.1.2.3: Block_Maximum_Size <= 128 KiB
_UINT32_LE = struct.Struct("<I")


def _too_large(size: int, limit: int) -> RecordBatchError:
    return RecordBatchError(
        f"record batch inflates to {size} bytes or more: at most {limit} "
        "(max_inflated_batch_bytes)",
        ErrorCode.message_too_large,
    )


def _corrupt(what: str) -> RecordBatchError:
    return RecordBatchError(f"compressed record batch: {what}", ErrorCode.corrupt_message)


def _gunzip(data: memoryview, limit: int) -> bytes:
    """Inflate a gzip stream, stopping one byte past ``limit`` (zlib's ``max_length``)."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise _corrupt(f"gzip: {exc}") from exc
    if len(out) > limit:
        raise _too_large(len(out), limit)
    if not inflater.eof:
        raise _corrupt("gzip stream ends early")
    return out


def _snappy_bound(data: memoryview) -> int:
    """The inflated size a snappy payload declares (each raw block starts with it)."""
    if bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        return int(cramjam.snappy.decompress_raw_len(bytes(data)))
    total = 0
    pos = _XERIAL_HEADER_SIZE
    while pos < len(data):
        if len(data) - pos < 4:
            raise _corrupt("snappy block size cut short")
        (size,) = _INT32.unpack_from(data, pos)
        pos += 4
        if size < 0 or pos + size > len(data):
            raise _corrupt("snappy block runs past the end")
        total += int(cramjam.snappy.decompress_raw_len(bytes(data[pos : pos + size])))
        pos += size
    return total


def _lz4_bound(data: memoryview) -> int:
    """An upper bound of what LZ4 frames inflate to: each compressed block at most the
    frame's block maximum, each stored block its size (the LZ4 frame format's headers)."""
    total = 0
    pos = 0
    while pos < len(data):
        if len(data) - pos < 7 or _UINT32_LE.unpack_from(data, pos)[0] != _LZ4_FRAME_MAGIC:
            raise _corrupt("not an LZ4 frame")
        flags, descriptor = data[pos + 4], data[pos + 5]
        block_max = _LZ4_BLOCK_MAX.get((descriptor >> 4) & 0x07)
        if block_max is None:
            raise _corrupt("LZ4 frame with an invalid block maximum size")
        pos += 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0) + 1
        while True:
            if len(data) - pos < 4:
                raise _corrupt("LZ4 block size cut short")
            (size,) = _UINT32_LE.unpack_from(data, pos)
            pos += 4
            if size == 0:  # end mark
                break
            stored = size & ~_LZ4_UNCOMPRESSED_BLOCK
            total += stored if size & _LZ4_UNCOMPRESSED_BLOCK else block_max
            pos += stored + (4 if flags & 0x10 else 0)
        pos += 4 if flags & 0x04 else 0  # content checksum
    return total


def _zstd_bound(data: memoryview) -> int:
    """An upper bound of what zstd frames inflate to, from their block headers (RFC 8878):
    a raw block is its size, an RLE block its declared size, a compressed one 128 KiB."""
    total = 0
    pos = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise _corrupt("zstd frame cut short")
        (magic,) = _UINT32_LE.unpack_from(data, pos)
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            if len(data) - pos < 8:
                raise _corrupt("zstd skippable frame cut short")
            pos += 8 + _UINT32_LE.unpack_from(data, pos + 4)[0]
            continue
        if magic != _ZSTD_FRAME_MAGIC or len(data) - pos < 5:
            raise _corrupt("not a zstd frame")
        descriptor = data[pos + 4]
        content_size_flag = descriptor >> 6
        single_segment = descriptor & 0x20
        pos += 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03]
        pos += (1 if single_segment else 0, 2, 4, 8)[content_size_flag]
        while True:
            if len(data) - pos < 3:
                raise _corrupt("zstd block header cut short")
            header = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
            block_type = (header >> 1) & 0x03
            size = header >> 3
            if block_type == 0:  # raw
                total += size
                pos += size
            elif block_type == 1:  # RLE: one byte repeated size times
                total += size
                pos += 1
            elif block_type == 2:  # compressed
                total += _ZSTD_MAX_BLOCK
                pos += size
            else:
                raise _corrupt("zstd block of the reserved type")
            if header & 0x01:  # last block
                break
        pos += 4 if descriptor & 0x04 else 0  # content checksum
    return total


def inflate_records(batch: Buffer, header: BatchHeader, limit: int) -> bytes | memoryview:
    """The records of ``batch`` (after its 61-byte header), inflated when compressed.
    ``RecordBatchError``: MESSAGE_TOO_LARGE (10) when they would inflate past ``limit`` bytes
    (decided before inflating, except for gzip, which stops one byte past it), CORRUPT_MESSAGE
    (2) for a stream that cannot be inflated."""
    data = memoryview(batch)[BATCH_HEADER_SIZE:]
    codec = header.compression
    if codec == Compression.NONE:
        if len(data) > limit:
            raise _too_large(len(data), limit)
        return data
    if codec == Compression.GZIP:
        return _gunzip(data, limit)
    # An upper bound from the headers; LZ4's and zstd's count every compressed block as full,
    # so a legitimate batch may be up to one block below it: refused past the limit plus one
    # block, then checked exactly once inflated (memory: the limit plus one block at most).
    if codec == Compression.SNAPPY:
        bound, slack = _snappy_bound(data), 0
    elif codec == Compression.LZ4:
        bound, slack = _lz4_bound(data), max(_LZ4_BLOCK_MAX.values())
    else:
        bound, slack = _zstd_bound(data), _ZSTD_MAX_BLOCK
    if bound > limit + slack:
        raise _too_large(bound, limit)
    try:
        inflated = bytes(
            {
                Compression.SNAPPY: snappy_decode,
                Compression.LZ4: lz4_decode,
                Compression.ZSTD: zstd_decode,
            }[Compression(codec)](data)
        )
    except Exception as exc:  # cramjam's errors have no common base
        raise _corrupt(f"{Compression(codec).name.lower()}: {exc!r}") from exc
    if len(inflated) > limit:
        raise _too_large(len(inflated), limit)
    return inflated


def validate_records(batch: Buffer, header: BatchHeader, max_inflated_bytes: int) -> None:
    """Check every record of a produced batch before it is stored (see above):
    MESSAGE_TOO_LARGE (10) for a batch inflating past ``max_inflated_bytes``, CORRUPT_MESSAGE
    (2) for records that do not decode, are fewer or more than the header counts, or whose
    offset deltas are not 0, 1, 2, ... ``validate_batch`` has checked the header and CRC."""
    records = inflate_records(batch, header, max_inflated_bytes)
    if header.compression == Compression.NONE:
        plain: Buffer = batch
    else:
        # The same batch uncompressed, for the record reader (a copy of the header only).
        rebuilt = bytearray(memoryview(batch)[:BATCH_HEADER_SIZE])
        _INT16.pack_into(
            rebuilt, ATTRIBUTES_OFFSET, header.attributes & ~ATTR_COMPRESSION_MASK & 0xFFFF
        )
        rebuilt += records
        plain = rebuilt
    expected = 0
    try:
        for record in DefaultRecordBatch(plain):  # type: ignore[arg-type]  # any buffer works
            if record.offset - header.base_offset != expected:
                raise RecordBatchError(
                    f"record {expected} of the batch has offset delta "
                    f"{record.offset - header.base_offset}",
                    ErrorCode.corrupt_message,
                )
            expected += 1
    except RecordBatchError:
        raise
    except Exception as exc:  # aiokafka's CorruptRecordException, struct and varint errors
        raise RecordBatchError(
            f"record batch holds records that do not decode: {exc}", ErrorCode.corrupt_message
        ) from exc
    if expected != header.record_count:
        raise RecordBatchError(
            f"record batch header counts {header.record_count} records, it holds {expected}",
            ErrorCode.corrupt_message,
        )
