"""The hand-written Produce and Fetch response encoders write exactly kio's bytes."""

from __future__ import annotations

import pytest

from gateway.kafka.apis import SUPPORTED_APIS, ApiKey
from gateway.kafka.codec import Request, encode_response
from gateway.kafka.entities import build_response
from gateway.kafka.records import build_batch
from gateway.kafka.wire import (
    FetchPartition,
    ProducePartition,
    encode_fetch_response,
    encode_produce_response,
    uvarint,
)

BATCH = build_batch([(1_700_000_000_000, b"k", b"v" * 200, [("h", b"x")])] * 3)
PRODUCE_VERSIONS = range(SUPPORTED_APIS[ApiKey.PRODUCE][0], SUPPORTED_APIS[ApiKey.PRODUCE][1] + 1)
FETCH_VERSIONS = range(SUPPORTED_APIS[ApiKey.FETCH][0], SUPPORTED_APIS[ApiKey.FETCH][1] + 1)


def kio_frame(api_key: int, version: int, values: dict[str, object]) -> bytes:
    request = Request(api_key, version, 77, None, None, 0)  # type: ignore[arg-type]
    return encode_response(request, build_response(api_key, version, values))


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_is_kios(version: int) -> None:
    topics = [
        ("orders", [ProducePartition(0, 0, 42, 0), ProducePartition(3, 2, -1, 7, "bad crc")]),
        ("é", [ProducePartition(1, 3, -1, -1)]),
    ]
    values = {
        "responses": [
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": p.partition,
                        "error_code": p.error_code,
                        "base_offset": p.base_offset,
                        "log_append_time": None,
                        "log_start_offset": p.log_start_offset,
                        "record_errors": [],
                        "error_message": p.error_message,
                    }
                    for p in partitions
                ],
            }
            for name, partitions in topics
        ],
        "throttle_time": 100,
    }
    assert encode_produce_response(version, 77, topics, 100) == kio_frame(
        ApiKey.PRODUCE, version, values
    )


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("aborted", [None, (), ((5, 10), (6, 20))])
def test_fetch_response_is_kios(version: int, aborted: tuple[tuple[int, int], ...] | None) -> None:
    half = len(BATCH) // 2
    parts = [BATCH[:half], memoryview(BATCH)[half:]]
    topics = [
        (
            "t",
            [
                FetchPartition(0, 0, 10, 9, 0, aborted, parts, len(BATCH)),
                FetchPartition(1, 1, -1, -1, -1, aborted, [], 0),
            ],
        )
    ]
    values = {
        "throttle_time": 5,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": p.error_code,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                        "log_start_offset": p.log_start_offset,
                        "aborted_transactions": (
                            None
                            if p.aborted_transactions is None
                            else [
                                {"producer_id": a, "first_offset": b}
                                for a, b in p.aborted_transactions
                            ]
                        ),
                        "preferred_read_replica": -1,
                        "records": b"".join(bytes(x) for x in p.records),
                    }
                    for p in topics[0][1]
                ],
            }
        ],
    }
    assert encode_fetch_response(version, 77, topics, throttle_time_ms=5) == kio_frame(
        ApiKey.FETCH, version, values
    )


def test_uvarint() -> None:
    assert [uvarint(v) for v in (0, 1, 127, 128, 300)] == [
        b"\x00",
        b"\x01",
        b"\x7f",
        b"\x80\x01",
        b"\xac\x02",
    ]
