"""RecordBatch helpers: headers, base-offset patching, CRC checks, codecs, Produce validation."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from gateway.kafka.errors import RecordBatchError
from gateway.kafka.records import (
    ATTR_CONTROL,
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    Compression,
    Record,
    build_batch,
    compute_crc,
    iter_records,
    patch_base_offset,
    patch_base_offset_into,
    read_batch_header,
    read_magic,
    split_batches,
    validate_batch,
    validate_produce_records,
)

T0 = 1_700_000_000_000
Headers = list[tuple[str, bytes | None]]
HEADERS: list[Headers] = [
    [],
    [("trace", b"abc")],
    [("a", b"1"), ("b", None)],
    [],
    [("tomb", b"")],
    [],
]
# Compressible (so the builder keeps the codec) and covering null key/value/header value.
RECORDS: list[tuple[int | None, bytes | None, bytes | None, Headers]] = [
    (T0 + i, None if i == 3 else b"key-%d" % i, None if i == 4 else b"value " * 50, h)
    for i, h in enumerate(HEADERS)
]


def _expected(
    records: list[tuple[int | None, bytes | None, bytes | None, Headers]],
) -> list[Record]:
    return [
        Record(delta, timestamp or 0, key, value, headers)
        for delta, (timestamp, key, value, headers) in enumerate(records)
    ]


def _aiokafka_batch(codec: int, *, producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """A batch as aiokafka's producer builds it."""
    builder = DefaultRecordBatchBuilder(2, codec, 0, *producer, 1 << 20)
    for delta, (timestamp, key, value, headers) in enumerate(RECORDS):
        builder.append(delta, timestamp, key, value, headers)
    return bytes(builder.build())


def _corrupt(batch: bytes, at: int) -> bytes:
    mutable = bytearray(batch)
    mutable[at] ^= 0xFF
    return bytes(mutable)


@pytest.mark.parametrize("codec", list(Compression))
def test_build_and_iterate_every_codec(codec: Compression) -> None:
    batch = build_batch(RECORDS, compression=codec)
    header = validate_batch(batch)
    assert header.compression == codec
    assert header.record_count == len(RECORDS)
    assert header.last_offset_delta == len(RECORDS) - 1
    assert (header.base_timestamp, header.max_timestamp) == (T0, T0 + 5)
    assert list(iter_records(batch)) == _expected(RECORDS)


@pytest.mark.parametrize("codec", list(Compression))
def test_aiokafka_built_batches_read_back(codec: Compression) -> None:
    batch = _aiokafka_batch(codec, producer=(7, 2, 100))
    header = validate_batch(batch)
    assert header.compression == codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 100)
    assert list(iter_records(memoryview(batch))) == _expected(RECORDS)


def test_header_fields_match_aiokafka() -> None:
    batch = build_batch(
        RECORDS,
        base_offset=1000,
        compression=Compression.LZ4,
        producer_id=99,
        producer_epoch=3,
        base_sequence=17,
        transactional=True,
    )
    header = read_batch_header(batch)
    theirs = DefaultRecordBatch(batch)
    assert header.base_offset == theirs.base_offset == 1000
    assert header.magic == theirs.magic == 2
    assert header.crc == theirs.crc == compute_crc(batch)
    assert header.attributes == theirs.attributes
    assert header.compression == theirs.compression_type == Compression.LZ4
    assert header.is_transactional
    assert theirs.is_transactional
    assert not header.is_control
    assert not theirs.is_control_batch
    assert not header.is_log_append_time
    assert header.last_offset_delta == theirs.last_offset_delta
    assert header.base_timestamp == theirs.first_timestamp
    assert header.max_timestamp == theirs.max_timestamp
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 3, 17)
    assert header.size == len(batch)
    assert header.next_offset == theirs.next_offset == 1000 + len(RECORDS)
    assert header.last_offset == 1000 + len(RECORDS) - 1
    assert header.partition_leader_epoch == -1


@pytest.mark.parametrize("codec", list(Compression))
def test_patch_base_offset_keeps_crc_valid(codec: Compression) -> None:
    batch = build_batch(RECORDS, compression=codec)
    patched = patch_base_offset(memoryview(batch), 1 << 40)
    assert isinstance(patched, bytes)
    assert patched[8:] == batch[8:]  # nothing but the base offset changed
    header = validate_batch(patched)
    assert header.base_offset == 1 << 40
    assert header.crc == read_batch_header(batch).crc
    assert DefaultRecordBatch(patched).validate_crc()
    assert [r.offset for r in DefaultRecordBatch(patched)] == [
        (1 << 40) + i for i in range(len(RECORDS))
    ]
    assert list(iter_records(patched)) == _expected(RECORDS)  # deltas stay deltas


def test_patch_base_offset_into_a_fetch_buffer() -> None:
    first, second = build_batch(RECORDS[:2]), build_batch(RECORDS[2:])
    buffer = bytearray(first + second)
    patch_base_offset_into(buffer, 10)
    patch_base_offset_into(buffer, 12, at=len(first))
    one, two = split_batches(buffer)
    assert (validate_batch(one).base_offset, validate_batch(two).base_offset) == (10, 12)


def test_split_batches() -> None:
    batches = [build_batch(RECORDS[i : i + 2], compression=Compression.ZSTD) for i in (0, 2, 4)]
    views = split_batches(b"".join(batches))
    assert [bytes(v) for v in views] == batches
    assert split_batches(b"") == []


@pytest.mark.parametrize("cut", [1, 11, 12, 60, 100])
def test_split_batches_refuses_partial_batches(cut: int) -> None:
    batch = build_batch(RECORDS)
    with pytest.raises(RecordBatchError) as caught:
        split_batches(batch + batch[:cut])
    assert caught.value.error_code == ErrorCode.corrupt_message


def test_split_batches_refuses_a_tiny_length() -> None:
    with pytest.raises(RecordBatchError) as caught:
        split_batches(struct.pack(">qi", 0, 3) + b"\x00" * 3)
    assert caught.value.error_code == ErrorCode.corrupt_message


def test_every_crc_covered_byte_is_checked() -> None:
    batch = build_batch(RECORDS, compression=Compression.GZIP)
    for at in range(CRC_OFFSET, len(batch)):
        with pytest.raises(RecordBatchError) as caught:
            validate_batch(_corrupt(batch, at))
        # A flipped attributes byte can also land on an unknown codec; all others are CRC.
        assert caught.value.error_code in (
            ErrorCode.corrupt_message,
            ErrorCode.unsupported_compression_type,
        ), at


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_random_garbage_never_validates(data: st.DataObject) -> None:
    batch = build_batch(RECORDS, compression=Compression.SNAPPY)
    at = data.draw(st.integers(ATTRIBUTES_OFFSET, len(batch) - 1))
    garbage = data.draw(st.binary(min_size=1, max_size=16))
    mutated = bytearray(batch)
    mutated[at : at + len(garbage)] = garbage[: len(batch) - at]
    if bytes(mutated) == batch:
        return
    with pytest.raises(RecordBatchError):
        validate_batch(bytes(mutated))


def test_base_offset_and_leader_epoch_are_outside_the_crc() -> None:
    batch = build_batch(RECORDS)
    for at in range(8):  # base offset
        validate_batch(_corrupt(batch, at))
    for at in range(12, 16):  # partition leader epoch
        validate_batch(_corrupt(batch, at))


def test_length_that_disagrees_with_the_buffer_is_corrupt() -> None:
    batch = build_batch(RECORDS)
    with pytest.raises(RecordBatchError) as caught:
        validate_batch(batch + b"\x00")
    assert caught.value.error_code == ErrorCode.corrupt_message
    with pytest.raises(RecordBatchError) as caught:
        validate_batch(batch[: BATCH_HEADER_SIZE - 1])
    assert caught.value.error_code == ErrorCode.corrupt_message


def _with_header(batch: bytes, fmt: str, at: int, value: int) -> bytes:
    """Rewrite one header field and fix the CRC, as a misbehaving client would send it."""
    mutable = bytearray(batch)
    struct.pack_into(fmt, mutable, at, value)
    struct.pack_into(">I", mutable, CRC_OFFSET, compute_crc(mutable))
    return bytes(mutable)


def test_refused_batches_carry_kafkas_error_codes() -> None:
    batch = build_batch(RECORDS)
    attributes = read_batch_header(batch).attributes
    control = _with_header(batch, ">h", ATTRIBUTES_OFFSET, attributes | ATTR_CONTROL)
    bad_codec = _with_header(batch, ">h", ATTRIBUTES_OFFSET, attributes | 0x05)
    bad_count = _with_header(batch, ">i", 57, len(RECORDS) + 1)
    no_sequence = _with_header(batch, ">q", 43, 5)  # producer id 5, base sequence -1
    cases = {
        control: ErrorCode.invalid_record,
        bad_codec: ErrorCode.unsupported_compression_type,
        bad_count: ErrorCode.invalid_record,
        no_sequence: ErrorCode.invalid_record,
        build_batch(RECORDS, transactional=True): ErrorCode.invalid_record,  # no producer id
    }
    for refused, code in cases.items():
        with pytest.raises(RecordBatchError) as caught:
            validate_batch(refused)
        assert caught.value.error_code == code
    # Control batches are fine when the broker writes them itself.
    assert validate_batch(control, from_client=False).is_control


def test_legacy_message_set_is_refused_as_kafka_does_for_produce_v3_plus() -> None:
    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
        builder.append(0, T0 if magic else None, b"k", b"v")
        legacy = bytes(builder.build())
        assert read_magic(legacy) == magic
        [view] = split_batches(legacy)  # same 12-byte log overhead as magic 2
        with pytest.raises(RecordBatchError) as caught:
            validate_produce_records(legacy, 9)
        assert caught.value.error_code == ErrorCode.invalid_record
        with pytest.raises(RecordBatchError):
            list(iter_records(view))


def test_produce_records_rules() -> None:
    batch = build_batch(RECORDS, compression=Compression.ZSTD)
    view, header = validate_produce_records(batch, 7)
    assert bytes(view) == batch
    assert header.compression == Compression.ZSTD
    for records, version, code in [
        (batch, 6, ErrorCode.unsupported_compression_type),  # zstd needs Produce v7
        (None, 9, ErrorCode.invalid_record),
        (b"", 9, ErrorCode.invalid_record),
        (batch + batch, 9, ErrorCode.invalid_record),  # exactly one batch per partition
        (_corrupt(batch, 40), 9, ErrorCode.corrupt_message),
    ]:
        with pytest.raises(RecordBatchError) as caught:
            validate_produce_records(records, version)
        assert caught.value.error_code == code


def test_iter_records_reports_a_broken_compressed_payload() -> None:
    batch = build_batch(RECORDS, compression=Compression.LZ4)
    broken = bytearray(batch)
    broken[BATCH_HEADER_SIZE + 4 : BATCH_HEADER_SIZE + 12] = b"\xff" * 8
    with pytest.raises(RecordBatchError) as caught:
        list(iter_records(bytes(broken)))
    assert caught.value.error_code == ErrorCode.corrupt_message


def test_build_batch_needs_records_and_defaults_timestamp_to_now() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])
    [record] = iter_records(build_batch([(None, None, b"v", [])]))
    assert record.timestamp > T0
