"""records.filter_batch and records.gap_batch, on byte strings: what a tag-filtered Fetch serves
(docs/kafka.md, "Tag filters"), checked with aiokafka's record codec as a consumer reads it."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.memory_records import MemoryRecords

from gateway.kafka.errors import RecordBatchError
from gateway.kafka.records import (
    BATCH_HEADER_SIZE,
    Compression,
    Headers,
    build_batch,
    compute_crc,
    filter_batch,
    gap_batch,
    read_batch_header,
)

T0 = 1_700_000_000_000
TAGS = ["TagA", None, "TagB,TagC", "TagC", "TagA", None]


def tagged_batch(
    compression: Compression = Compression.NONE,
    *,
    transactional: bool = False,
) -> bytes:
    """Six records, offsets 0-5, values b"v0".. b"v5", tagged as TAGS, as a producer sends them."""
    records = []
    for index, tags in enumerate(TAGS):
        headers: Headers = [("h", b"%d" % index)]
        if tags is not None:
            headers.append(("x-braid-tags", tags.encode()))
        records.append((T0 + index, b"k%d" % index, b"v%d" % index, headers))
    return build_batch(
        records,
        compression=compression,
        producer_id=7 if transactional else -1,
        producer_epoch=2 if transactional else -1,
        base_sequence=40 if transactional else -1,
        transactional=transactional,
    )


def keep_tag(tag: str) -> Callable[[Headers], bool]:
    def keep(headers: Headers) -> bool:
        for name, value in headers:
            if name == "x-braid-tags" and value is not None and tag in value.decode().split(","):
                return True
        return False

    return keep


def decoded(batch: bytes) -> DefaultRecordBatch:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    assert compute_crc(batch) == parsed.crc
    return parsed


@pytest.mark.parametrize("count", [1, 3, 1000])
def test_gap_batch_covers_its_offsets_with_no_records(count: int) -> None:
    gap = gap_batch(500, count, epoch=3, timestamp_ms=T0)
    assert len(gap) == BATCH_HEADER_SIZE
    header = read_batch_header(gap)
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (
        500,
        count - 1,
        0,
    )
    assert header.partition_leader_epoch == 3
    assert header.next_offset == 500 + count
    assert (header.base_timestamp, header.max_timestamp) == (T0, T0)
    assert header.producer_id == -1
    parsed = decoded(gap)
    assert list(parsed) == []
    assert parsed.next_offset == 500 + count


def test_gap_batch_needs_an_offset() -> None:
    with pytest.raises(ValueError, match="at least one offset"):
        gap_batch(0, 0)


def test_a_changed_byte_breaks_the_gap_crc() -> None:
    gap = bytearray(gap_batch(10, 2))
    gap[-1] ^= 1
    assert not DefaultRecordBatch(bytes(gap)).validate_crc()


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP, Compression.ZSTD])
def test_filter_batch_keeps_the_matching_records_at_their_offsets(
    compression: Compression,
) -> None:
    source = tagged_batch(compression)
    filtered = filter_batch(source, keep_tag("TagC"), base_offset=100, epoch=5)
    assert filtered is not None
    header = read_batch_header(filtered)
    assert header.base_offset == 100
    assert header.last_offset_delta == len(TAGS) - 1  # as the original: the consumer moves to 106
    assert header.next_offset == 100 + len(TAGS)
    assert header.partition_leader_epoch == 5
    assert header.record_count == 2
    assert header.compression == Compression.NONE
    parsed = decoded(filtered)
    records = list(parsed)
    assert [r.offset for r in records] == [102, 103]
    assert [r.value for r in records] == [b"v2", b"v3"]
    assert [r.key for r in records] == [b"k2", b"k3"]
    assert [r.timestamp for r in records] == [T0 + 2, T0 + 3]
    assert records[0].headers == [("h", b"2"), ("x-braid-tags", b"TagB,TagC")]
    assert parsed.max_timestamp == T0 + 3


def test_filter_batch_keeps_the_producer_fields() -> None:
    source = tagged_batch(transactional=True)
    filtered = filter_batch(source, keep_tag("TagA"), base_offset=0)
    assert filtered is not None
    header = read_batch_header(filtered)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert header.is_transactional
    assert [r.offset for r in decoded(filtered)] == [0, 4]


def test_filter_batch_of_every_record_is_none_and_of_none_a_gap() -> None:
    source = tagged_batch()
    assert filter_batch(source, lambda headers: True, base_offset=0) is None
    gap = filter_batch(source, keep_tag("TagZ"), base_offset=40, epoch=1)
    assert gap == gap_batch(40, len(TAGS), epoch=1, timestamp_ms=T0 + len(TAGS) - 1)


def test_a_fetch_of_filtered_batch_then_gap_reads_back_in_aiokafka() -> None:
    """What a filtered Fetch returns: a re-encoded batch, then a gap up to the partition's end;
    aiokafka's MemoryRecords walks both and lands on the gap's end."""
    first = filter_batch(tagged_batch(), keep_tag("TagA"), base_offset=0)
    assert first is not None
    response = first + gap_batch(len(TAGS), 4)
    records = MemoryRecords(response)
    offsets: list[int] = []
    next_offset = 0
    while records.has_next():
        batch = records.next_batch()
        assert batch is not None
        assert batch.validate_crc()
        offsets += [r.offset for r in batch]
        next_offset = batch.next_offset
    assert offsets == [0, 4]
    assert next_offset == len(TAGS) + 4


def test_filter_batch_refuses_a_batch_it_cannot_decode() -> None:
    source = bytearray(tagged_batch())
    struct.pack_into(">i", source, BATCH_HEADER_SIZE - 4, 50)  # more records than there are
    with pytest.raises(RecordBatchError):
        filter_batch(bytes(source), keep_tag("TagA"), base_offset=0)
