"""Throughput of the Kafka codec: request decoding, response encoding, batch handling.

Run: ``python -m bench codec kafka [--seconds 1.0]``. Prints one line per case with
operations per second (and MB/s where bytes matter). Single core, no I/O. Requests are written
with kio's own writers (the bytes a client sends; the tests check that kafka-python's bytes
are identical), many frames per buffer as a busy connection delivers them.
"""

from __future__ import annotations

import argparse
import datetime
import io
import struct
import time
from collections.abc import Callable
from functools import partial

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch_request
from kio.schema.fetch.v12 import response as fetch_response
from kio.schema.heartbeat.v4 import request as heartbeat_request
from kio.schema.produce.v9 import request as produce_request
from kio.schema.produce.v9 import response as produce_response
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64
from kio.static.protocol import RequestPayload

from gateway.kafka.codec import KafkaDecoder, Request, encode_response, preload_schemas
from gateway.kafka.records import (
    Compression,
    RecordInput,
    build_batch,
    iter_records,
    patch_base_offset,
    patch_base_offset_into,
    validate_batch,
)

_ZERO = i32Timedelta.parse(datetime.timedelta(0))


def encode_request(body: RequestPayload, correlation_id: int, client_id: str | None) -> bytes:
    """A request frame as a client writes it (header v1 or v2 from the body's schema)."""
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(struct.pack(">hhi", body.__api_key__, body.__version__, correlation_id))
    if client_id is None:
        out.write(struct.pack(">h", -1))
    else:
        raw = client_id.encode()
        out.write(struct.pack(">h", len(raw)) + raw)
    if body.__header_schema__.__flexible__:
        out.write(b"\x00")  # no header tagged fields
    entity_writer(type(body))(out, body)
    with out.getbuffer() as frame:
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    return out.getvalue()


def _records(count: int, value_size: int) -> list[RecordInput]:
    value = (b"braid-" * (value_size // 6 + 1))[:value_size]
    return [(1_700_000_000_000 + i, b"key-%d" % i, value, []) for i in range(count)]


def _produce(batch: bytes) -> produce_request.ProduceRequest:
    return produce_request.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            produce_request.TopicProduceData(
                name=TopicName("orders"),
                partition_data=(
                    produce_request.PartitionProduceData(index=i32(0), records=Records(batch)),
                ),
            ),
        ),
    )


def _fetch() -> fetch_request.FetchRequest:
    return fetch_request.FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        topics=(
            fetch_request.FetchTopic(
                topic=TopicName("orders"),
                partitions=tuple(
                    fetch_request.FetchPartition(
                        partition=i32(p),
                        fetch_offset=i64(1000 + p),
                        partition_max_bytes=i32(1 << 20),
                    )
                    for p in range(4)
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def _heartbeat() -> heartbeat_request.HeartbeatRequest:
    return heartbeat_request.HeartbeatRequest(
        group_id=GroupId("group"), generation_id=i32(3), member_id="member-1"
    )


def _rate(seconds: float, operation: Callable[[], int]) -> float:
    """Units per second of ``operation`` (which returns how many units it did), after warm-up."""
    operation()
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while (now := time.perf_counter()) < deadline:
        done += operation()
    return done / (now - started)


def _times(
    units: int, operation: Callable[[], object], calls: int | None = None
) -> Callable[[], int]:
    """Run ``operation`` ``calls`` times (default ``units``) and report ``units`` done."""
    repeat = range(units if calls is None else calls)

    def run() -> int:
        for _ in repeat:
            operation()
        return units

    return run


def _count_records(batch: bytes) -> int:
    return sum(1 for _ in iter_records(batch))


def _decode_all(stream: bytes, frames: int) -> Callable[[], int]:
    def run() -> int:
        count = len(KafkaDecoder().feed(stream))
        assert count == frames
        return count

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per case")
    seconds = parser.parse_args(argv).seconds
    preload_schemas()
    lines: list[str] = []

    def report(name: str, rate: float, unit: str, size: int = 0) -> None:
        megabytes = f"  {rate * size / 1e6:9.1f} MB/s" if size else ""
        lines.append(f"{name:<48} {rate:>13,.0f} {unit}/s{megabytes}")
        print(lines[-1], flush=True)

    # --- request decoding: 1000 frames per buffer ---
    batch_16k = build_batch(_records(16, 1000))
    for name, body in (
        ("decode Heartbeat v4", _heartbeat()),
        ("decode Fetch v12 (4 partitions)", _fetch()),
        (f"decode Produce v9 ({len(batch_16k)} B batch)", _produce(batch_16k)),
    ):
        frame = encode_request(body, 7, "bench-client")
        stream = frame * 1000
        report(name, _rate(seconds, _decode_all(stream, 1000)), "req", len(frame))

    # --- response encoding ---
    produce_answer = produce_response.ProduceResponse(
        responses=(
            produce_response.TopicProduceResponse(
                name=TopicName("orders"),
                partition_responses=(
                    produce_response.PartitionProduceResponse(
                        index=i32(0),
                        error_code=ErrorCode.none,
                        base_offset=i64(42),
                        record_errors=(),
                    ),
                ),
            ),
        ),
        throttle_time=_ZERO,
    )
    produce_info = Request(0, 9, 7, None, _produce(batch_16k), 0)
    report(
        "encode Produce v9 response",
        _rate(seconds, _times(100, partial(encode_response, produce_info, produce_answer))),
        "resp",
    )
    fetch_answer = fetch_response.FetchResponse(
        throttle_time=_ZERO,
        error_code=ErrorCode.none,
        responses=(
            fetch_response.FetchableTopicResponse(
                topic=TopicName("orders"),
                partitions=(
                    fetch_response.PartitionData(
                        partition_index=i32(0),
                        error_code=ErrorCode.none,
                        high_watermark=i64(1000),
                        aborted_transactions=None,
                        preferred_read_replica=BrokerId(-1),
                        records=Records(batch_16k * 4),
                    ),
                ),
            ),
        ),
    )
    fetch_info = Request(1, 12, 7, None, _fetch(), 0)
    report(
        f"encode Fetch v12 response ({4 * len(batch_16k)} B records)",
        _rate(seconds, _times(100, partial(encode_response, fetch_info, fetch_answer))),
        "resp",
        4 * len(batch_16k),
    )

    # --- batches ---
    for label, batch in (
        ("1 KiB", build_batch(_records(1, 900))),
        ("16 KiB", batch_16k),
        ("1 MiB", build_batch(_records(1024, 1000))),
    ):
        report(
            f"patch_base_offset {label} (copy)",
            _rate(seconds, _times(1000, partial(patch_base_offset, memoryview(batch), 1 << 33))),
            "batch",
            len(batch),
        )
        report(
            f"patch_base_offset_into {label} (in place)",
            _rate(seconds, _times(1000, partial(patch_base_offset_into, bytearray(batch), 7))),
            "batch",
        )
        report(
            f"validate_batch {label} (CRC-32C + header)",
            _rate(seconds, _times(100, partial(validate_batch, batch))),
            "batch",
            len(batch),
        )

    records = _records(1000, 100)
    for codec in Compression:
        batch = build_batch(records, compression=codec)
        report(
            f"iter_records 1000 x 100 B, {codec.name.lower()}",
            _rate(seconds, partial(_count_records, batch)),
            "rec",
        )
        report(
            f"build_batch 1000 x 100 B, {codec.name.lower()}",
            _rate(seconds, _times(1000, partial(build_batch, records, compression=codec), 1)),
            "rec",
        )


if __name__ == "__main__":
    main()
