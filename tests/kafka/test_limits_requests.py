"""Issue 21 item 8 (Kafka): a request that holds null where its schema has a non-nullable
array. kio's reader took length -1 as None and the handler failed with TypeError; Kafka's
generated readers refuse it ("non-nullable field ... was serialized as null"), parseRequest
turns that into an InvalidRequestException and the SocketServer closes the connection without
an answer. BraidMQ does the same, logs one line, and every other connection goes on."""

from __future__ import annotations

import struct
import time

import pytest
from kio.schema.metadata.v1.request import MetadataRequest

from gateway.kafka.codec import KafkaDecoder
from gateway.kafka.errors import MalformedRequestError
from tests.braid_process import BraidProcess
from tests.kafka.raw import RawClient


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw"
    return struct.pack(">i", len(header) + len(body)) + header + body


# Produce v3 (not flexible): transactional_id null, acks 1, timeout 1000 ms, topic_data null.
PRODUCE_NULL_TOPICS = _frame(0, 3, 1, struct.pack(">hhii", -1, 1, 1000, -1))
# The same with one topic "t" whose partition_data is null (a nested non-nullable array).
PRODUCE_NULL_PARTITIONS = _frame(
    0, 3, 2, struct.pack(">hhii", -1, 1, 1000, 1) + struct.pack(">h", 1) + b"t" + b"\xff" * 4
)


def _flexible_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw" + b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


# CreateTopics v5 (flexible): topics is a compact array, uvarint 0 = null.
CREATE_TOPICS_NULL = _flexible_frame(19, 5, 3, b"\x00" + struct.pack(">i", 1000) + b"\x00\x00")


def test_null_for_a_non_nullable_array_closes_only_that_connection(
    braid: BraidProcess,
) -> None:
    bystander = RawClient(braid.host, braid.kafka_port)
    try:
        for frame, field in (
            (PRODUCE_NULL_TOPICS, "topic_data"),
            (PRODUCE_NULL_PARTITIONS, "topic_data[0].partition_data"),
            (CREATE_TOPICS_NULL, "topics"),
        ):
            client = RawClient(braid.host, braid.kafka_port)
            try:
                client.send_bytes(frame)
                assert client.closed_by_peer(timeout=30), f"{field}: connection kept open"
            finally:
                client.close()
            line = f"non-nullable field {field} was serialized as null"
            deadline = time.monotonic() + 30
            while line not in braid.stderr() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert line in braid.stderr()
            # The bystander's connection and the broker are unaffected.
            metadata = bystander.request(MetadataRequest(topics=None))
            assert metadata.brokers
        assert "TypeError" not in braid.stderr()
        assert "Traceback" not in braid.stderr()
    finally:
        bystander.close()


def test_the_decoder_refuses_null_for_a_non_nullable_array() -> None:
    for frame in (PRODUCE_NULL_TOPICS, PRODUCE_NULL_PARTITIONS, CREATE_TOPICS_NULL):
        decoder = KafkaDecoder()
        with pytest.raises(MalformedRequestError, match="was serialized as null"):
            decoder.feed(frame)
