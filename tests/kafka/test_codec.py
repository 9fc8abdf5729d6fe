"""KafkaDecoder / encode_response against the bytes real clients send and expect.

Requests are encoded by kafka-python 3.x (through its sans-IO ``KafkaProtocol``) and by
aiokafka 0.14 (as ``AIOKafkaConnection.send`` frames them); each frame is fed whole, one byte
at a time, followed by the start of another frame, and all frames back to back in one buffer.
Responses are parsed back by kafka-python's ``KafkaProtocol.receive_bytes``.
"""

from __future__ import annotations

import datetime
import io
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import kio.schema.fetch.v12.response as fetch_v12
import kio.schema.find_coordinator.v3.response as find_coordinator_v3
import kio.schema.metadata.v5.response as metadata_v5
import kio.schema.metadata.v9.response as metadata_v9
import kio.schema.produce.v9.response as produce_v9
import pytest
from aiokafka.protocol.admin import ApiVersionRequest as AioApiVersionRequest
from aiokafka.protocol.commit import OffsetCommitRequest as AioOffsetCommitRequest
from aiokafka.protocol.fetch import FetchRequest as AioFetchRequest
from aiokafka.protocol.group import JoinGroupRequest as AioJoinGroupRequest
from aiokafka.protocol.metadata import MetadataRequest as AioMetadataRequest
from aiokafka.protocol.produce import ProduceRequest as AioProduceRequest
from kafka.protocol.parser import KafkaProtocol
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

from gateway.kafka.apis import SUPPORTED_APIS, ApiKey, api_versions_response
from gateway.kafka.codec import (
    MAX_REQUEST_SIZE,
    KafkaDecoder,
    Request,
    UnsupportedRequest,
    encode_response,
    encode_unsupported_response,
    preload_schemas,
    response_header_flexible,
)
from gateway.kafka.errors import KafkaFrameError, LocalProtocolError, MalformedRequestError
from gateway.kafka.records import Compression, build_batch, validate_produce_records
from tests.kafka.clients import aiokafka_frame, kafka_python_frame, kafka_python_request_classes

KP = kafka_python_request_classes()
BATCH = build_batch(
    [(1_700_000_000_000 + i, b"key", b"value-%d" % i * 10, [("h", b"v")]) for i in range(5)],
    compression=Compression.GZIP,
)
T = 1_700_000_000_000
# aiokafka's connection knows a broker's versions from its ApiVersions answer.
AIO_VERSIONS = dict(SUPPORTED_APIS)


@dataclass
class Case:
    name: str
    frame: bytes
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    check: Callable[[Any], None]


def _no_check(body: Any) -> None:
    pass


def _check_produce(version: int, acks: int, topic: str, partition: int) -> Callable[[Any], None]:
    def check(body: Any) -> None:
        assert body.acks == acks
        (topic_data,) = body.topic_data
        assert topic_data.name == topic
        (partition_data,) = topic_data.partition_data
        assert partition_data.index == partition
        assert partition_data.records == BATCH
        batch, header = validate_produce_records(partition_data.records, version)
        assert bytes(batch) == BATCH
        assert header.record_count == 5

    return check


def _check_api_versions_v4(body: Any) -> None:
    assert body.client_software_name == "kafka-python"
    assert body.client_software_version == "3.0"


def _check_metadata_orders_pay(body: Any) -> None:
    assert [t.name for t in body.topics] == ["orders", "pay"]
    assert body.allow_auto_topic_creation


def _check_topic_names(*names: str) -> Callable[[Any], None]:
    def check(body: Any) -> None:
        assert tuple(t.name for t in body.topics) == names

    return check


def _check_fetch_v12(body: Any) -> None:
    (topic,) = body.topics
    (partition,) = topic.partitions
    assert (topic.topic, partition.partition, partition.fetch_offset) == ("orders", 2, 42)
    assert partition.partition_max_bytes == 65536
    assert (body.isolation_level, body.rack_id, body.session_epoch) == (1, "r1", -1)


def _check_join_group_v7(body: Any) -> None:
    assert (body.group_id, body.member_id, body.protocol_type) == ("g", "", "consumer")
    (protocol,) = body.protocols
    assert (protocol.name, protocol.metadata) == ("range", b"\x00\x01meta")


def _check_sasl_handshake(body: Any) -> None:
    assert body.mechanism == "PLAIN"


def _check_aiokafka_fetch(body: Any) -> None:
    partition = body.topics[0].partitions[0]
    assert (partition.partition, partition.fetch_offset, partition.partition_max_bytes) == (
        0,
        7,
        4096,
    )


def _check_aiokafka_join_group(body: Any) -> None:
    assert body.group_instance_id is None
    assert [(p.name, p.metadata) for p in body.protocols] == [("rr", b"m")]


def _check_aiokafka_offset_commit(body: Any) -> None:
    partition = body.topics[0].partitions[0]
    assert (partition.committed_offset, partition.committed_metadata) == (99, "meta")


def _cases() -> list[Case]:
    kp_topic = KP[ApiKey.PRODUCE].TopicProduceData
    kp_partition = kp_topic.PartitionProduceData
    kp_fetch_topic = KP[ApiKey.FETCH].FetchTopic
    kp_fetch_partition = kp_fetch_topic.FetchPartition
    kp_metadata_topic = KP[ApiKey.METADATA].MetadataRequestTopic
    kp_join_protocol = KP[ApiKey.JOIN_GROUP].JoinGroupRequestProtocol

    def kp(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
        return kafka_python_frame(KP[api_key](version=version, **fields), correlation_id)

    cases = [
        Case(
            "kafka-python ApiVersions v4",
            kp(18, 4, 1, client_software_name="kafka-python", client_software_version="3.0"),
            18,
            4,
            1,
            "kafka-python",
            _check_api_versions_v4,
        ),
        Case(
            "kafka-python ApiVersions v0",
            kp(18, 0, 2),
            18,
            0,
            2,
            "kafka-python",
            _no_check,
        ),
        Case(
            "kafka-python Metadata v9 (flexible)",
            kp(
                3,
                9,
                3,
                topics=[kp_metadata_topic(name="orders"), kp_metadata_topic(name="pay")],
                allow_auto_topic_creation=True,
            ),
            3,
            9,
            3,
            "kafka-python",
            _check_metadata_orders_pay,
        ),
        Case(
            "kafka-python Metadata v0 (all topics)",
            kp(3, 0, 4, topics=[kp_metadata_topic(name="a")]),
            3,
            0,
            4,
            "kafka-python",
            _check_topic_names("a"),
        ),
        Case(
            "kafka-python Produce v9 (flexible)",
            kp(
                0,
                9,
                5,
                acks=-1,
                timeout_ms=1500,
                topic_data=[
                    kp_topic(name="orders", partition_data=[kp_partition(index=3, records=BATCH)])
                ],
            ),
            0,
            9,
            5,
            "kafka-python",
            _check_produce(9, -1, "orders", 3),
        ),
        Case(
            "kafka-python Produce v3 transactional",
            kp(
                0,
                3,
                6,
                transactional_id="tx-1",
                acks=1,
                timeout_ms=100,
                topic_data=[
                    kp_topic(name="t", partition_data=[kp_partition(index=0, records=BATCH)])
                ],
            ),
            0,
            3,
            6,
            "kafka-python",
            _check_produce(3, 1, "t", 0),
        ),
        Case(
            "kafka-python Fetch v12",
            kp(
                1,
                12,
                7,
                max_wait_ms=500,
                min_bytes=1,
                max_bytes=1 << 20,
                isolation_level=1,
                session_id=0,
                session_epoch=-1,
                topics=[
                    kp_fetch_topic(
                        topic="orders",
                        partitions=[
                            kp_fetch_partition(
                                partition=2, fetch_offset=42, partition_max_bytes=65536
                            )
                        ],
                    )
                ],
                rack_id="r1",
            ),
            1,
            12,
            7,
            "kafka-python",
            _check_fetch_v12,
        ),
        Case(
            "kafka-python JoinGroup v7",
            kp(
                11,
                7,
                8,
                group_id="g",
                session_timeout_ms=10000,
                rebalance_timeout_ms=30000,
                member_id="",
                protocol_type="consumer",
                protocols=[kp_join_protocol(name="range", metadata=b"\x00\x01meta")],
            ),
            11,
            7,
            8,
            "kafka-python",
            _check_join_group_v7,
        ),
        Case(
            "kafka-python SaslHandshake v1",
            kp(17, 1, 9, mechanism="PLAIN"),
            17,
            1,
            9,
            "kafka-python",
            _check_sasl_handshake,
        ),
        Case(
            "aiokafka ApiVersions v0 (sent before versions are known)",
            aiokafka_frame(AioApiVersionRequest(), {}, 10),
            18,
            0,
            10,
            "aiokafka",
            _no_check,
        ),
        Case(
            "aiokafka Metadata v5",
            aiokafka_frame(AioMetadataRequest(["x", "y"], True), AIO_VERSIONS, 11),
            3,
            5,
            11,
            "aiokafka",
            _check_topic_names("x", "y"),
        ),
        Case(
            "aiokafka Produce v7",
            aiokafka_frame(
                AioProduceRequest(None, -1, 30000, [("orders", [(1, BATCH)])]), AIO_VERSIONS, 12
            ),
            0,
            7,
            12,
            "aiokafka",
            _check_produce(7, -1, "orders", 1),
        ),
        Case(
            "aiokafka Fetch v11",
            aiokafka_frame(
                AioFetchRequest(100, 1, 1 << 20, 0, [("orders", [(0, 7, 4096)])]),
                AIO_VERSIONS,
                13,
            ),
            1,
            11,
            13,
            "aiokafka",
            _check_aiokafka_fetch,
        ),
        Case(
            "aiokafka JoinGroup v5",
            aiokafka_frame(
                AioJoinGroupRequest("g", 10000, 30000, "", None, "consumer", [("rr", b"m")]),
                AIO_VERSIONS,
                14,
            ),
            11,
            5,
            14,
            "aiokafka",
            _check_aiokafka_join_group,
        ),
        Case(
            "aiokafka OffsetCommit v3, null client id",
            aiokafka_frame(
                AioOffsetCommitRequest("g", 1, "m", -1, [("orders", [(0, 99, "meta")])]),
                AIO_VERSIONS,
                15,
                client_id=None,
            ),
            8,
            3,
            15,
            None,
            _check_aiokafka_offset_commit,
        ),
    ]
    return cases


CASES = _cases()
# Start of another frame: the decoder must hold it back until it is complete.
TRAILING = CASES[0].frame[:7]


def _assert_case(event: object, case: Case) -> None:
    assert isinstance(event, Request), event
    assert event.api_key == case.api_key
    assert event.api_version == case.api_version
    assert event.correlation_id == case.correlation_id
    assert event.client_id == case.client_id
    assert event.size == len(case.frame) - 4
    assert type(event.body) is load_request_schema(case.api_key, case.api_version)
    case.check(event.body)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_whole_frame(case: Case) -> None:
    decoder = KafkaDecoder()
    (event,) = decoder.feed(case.frame)
    _assert_case(event, case)
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_byte_by_byte(case: Case) -> None:
    decoder = KafkaDecoder()
    for byte in case.frame[:-1]:
        assert decoder.feed(bytes([byte])) == []
    (event,) = decoder.feed(case.frame[-1:])
    _assert_case(event, case)
    assert decoder.feed(b"") == []


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_trailing_bytes_are_kept_for_the_next_frame(case: Case) -> None:
    decoder = KafkaDecoder()
    (event,) = decoder.feed(memoryview(case.frame + TRAILING))
    _assert_case(event, case)
    assert decoder.feed(b"") == []
    assert decoder.buffered == len(TRAILING)
    (event,) = decoder.feed(CASES[0].frame[len(TRAILING) :])
    _assert_case(event, CASES[0])


def test_all_frames_in_one_buffer_and_in_odd_chunks() -> None:
    stream = b"".join(c.frame for c in CASES) * 3
    expected = CASES * 3
    decoder = KafkaDecoder()
    events = decoder.feed(stream)
    assert len(events) == len(expected)
    for event, case in zip(events, expected, strict=True):
        _assert_case(event, case)
    # Chunks that cut frames anywhere; bytearray input is copied, so reusing it is safe.
    decoder = KafkaDecoder()
    events = []
    chunk = bytearray()
    for start in range(0, len(stream), 37):
        chunk[:] = stream[start : start + 37]
        events.extend(decoder.feed(chunk))
    assert [(e.api_key, e.correlation_id) for e in events] == [
        (c.api_key, c.correlation_id) for c in expected
    ]
    assert decoder.buffered == 0


def test_many_small_frames_split_across_reads() -> None:
    frame = CASES[1].frame  # ApiVersions v0: a small frame
    decoder = KafkaDecoder()
    count = 0
    for _ in range(200):
        count += len(decoder.feed(frame * 499 + frame[:5]))
        count += len(decoder.feed(frame[5:]))
    assert count == 200 * 500
    assert decoder.buffered == 0


def test_large_frame_in_many_reads_is_joined_once_complete() -> None:
    kp_topic = KP[ApiKey.PRODUCE].TopicProduceData
    kp_partition = kp_topic.PartitionProduceData
    big = build_batch([(T, None, bytes([i % 251]) * 10_000, []) for i in range(100)])
    frame = kafka_python_frame(
        KP[ApiKey.PRODUCE](
            version=9,
            acks=1,
            timeout_ms=1,
            topic_data=[kp_topic(name="t", partition_data=[kp_partition(index=0, records=big)])],
        ),
        correlation_id=9,
    )
    decoder = KafkaDecoder()
    received = 0
    for start in range(0, len(frame) - 1000, 1000):
        assert decoder.feed(memoryview(frame)[start : start + 1000]) == []
        received += 1000
        assert decoder.buffered == received
    event, after = decoder.feed(frame[received:] + CASES[1].frame)
    assert isinstance(event, Request)
    body: Any = event.body
    assert body.topic_data[0].partition_data[0].records == big
    _assert_case(after, CASES[1])
    assert decoder.buffered == 0


def test_every_supported_version_parses_byte_exact() -> None:
    """kafka-python's default request of every supported version, re-encoded by kio, is equal."""
    preload_schemas()
    for api_key, (low, high) in SUPPORTED_APIS.items():
        for version in range(low, high + 1):
            request = KP[api_key](version=version)
            frame = kafka_python_frame(request, correlation_id=version + 100)
            decoder = KafkaDecoder()
            (event,) = decoder.feed(frame)
            assert isinstance(event, Request), (api_key, version, event)
            assert (event.api_key, event.api_version) == (api_key, version)
            out = io.BytesIO()
            entity_writer(type(event.body))(out, event.body)
            assert out.getvalue() == bytes(request.encode(version=version)), (api_key, version)


def test_expects_response_is_false_only_for_produce_acks_0() -> None:
    kp_topic = KP[ApiKey.PRODUCE].TopicProduceData
    frame = kafka_python_frame(
        KP[ApiKey.PRODUCE](version=9, acks=0, timeout_ms=1, topic_data=[kp_topic(name="t")]),
        correlation_id=1,
    )
    decoder = KafkaDecoder()
    produce, api_versions = decoder.feed(frame + CASES[0].frame)
    assert isinstance(produce, Request)
    assert not produce.expects_response
    assert isinstance(api_versions, Request)
    assert api_versions.expects_response


# --- KIP-511: ApiVersions newer than ours ---------------------------------------------------


def _raw_frame(api_key: int, version: int, correlation_id: int, rest: bytes) -> bytes:
    payload = struct.pack(">hhi", api_key, version, correlation_id) + rest
    return struct.pack(">i", len(payload)) + payload


def test_future_api_versions_request_gets_v0_error_35_response() -> None:
    # ApiVersions v9 from a future client: header v2 (client id, no tags) and a body we cannot
    # know. The body is not read; the answer lists our ApiVersions range.
    frame = _raw_frame(18, 9, 77, b"\x00\x03cli\x00" + b"\xde\xad\xbe\xef")
    decoder = KafkaDecoder()
    (event,) = decoder.feed(frame)
    assert event == UnsupportedRequest(18, 9, 77, "cli", len(frame) - 4)
    assert not event.close_connection
    response = encode_unsupported_response(event)
    low, high = SUPPORTED_APIS[ApiKey.API_VERSIONS]
    assert response == (
        struct.pack(">i", 4 + 2 + 4 + 6)  # size: correlation id, error, array length, 1 entry
        + struct.pack(">i", 77)  # response header v0: correlation id only
        + struct.pack(">h", 35)  # error_code UNSUPPORTED_VERSION
        + struct.pack(">i", 1)  # api_keys: int32 length (v0 is not flexible)
        + struct.pack(">hhh", 18, low, high)
    )
    assert decoder.feed(b"") == []


def test_future_api_versions_request_with_unreadable_header_is_still_answered() -> None:
    frame = _raw_frame(18, 9, 78, b"\x7f\xff")  # client id length beyond the frame
    decoder = KafkaDecoder()
    (event,) = decoder.feed(frame)
    assert isinstance(event, UnsupportedRequest)
    assert (event.correlation_id, event.client_id) == (78, None)
    assert encode_unsupported_response(event) is not None


def test_kafka_python_accepts_the_fallback_and_retries_with_our_max() -> None:
    """kafka-python opens with ApiVersions v4; a broker capped at v3 answers per KIP-511."""
    capped = {**SUPPORTED_APIS, ApiKey.API_VERSIONS: (0, 3)}
    client = KafkaProtocol(client_id="kp")
    client.send_request(
        KP[ApiKey.API_VERSIONS](
            version=4, client_software_name="kafka-python", client_software_version="3"
        ),
        correlation_id=5,
    )
    decoder = KafkaDecoder(supported=capped)
    (event,) = decoder.feed(client.send_bytes())
    assert isinstance(event, UnsupportedRequest)
    assert (event.api_key, event.api_version, event.correlation_id) == (18, 4, 5)
    response = encode_unsupported_response(event, capped)
    assert response is not None
    [(correlation_id, parsed)] = client.receive_bytes(response)
    assert correlation_id == 5
    assert parsed.error_code == ErrorCode.unsupported_version
    [entry] = parsed.api_keys
    assert (entry.api_key, entry.min_version, entry.max_version) == (18, 0, 3)
    # kafka-python's retry (net/connection.py: min(4, advertised max)) is now accepted.
    client.send_request(
        KP[ApiKey.API_VERSIONS](
            version=min(4, entry.max_version),
            client_software_name="kafka-python",
            client_software_version="3",
        ),
        correlation_id=6,
    )
    (retry,) = decoder.feed(client.send_bytes())
    assert isinstance(retry, Request)
    assert retry.api_version == 3
    [(_, full)] = client.receive_bytes(
        encode_response(retry, api_versions_response(3, supported=capped))
    )
    assert full.error_code == 0
    assert {a.api_key: (a.min_version, a.max_version) for a in full.api_keys} == capped


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (ApiKey.PRODUCE, 2),  # below our minimum: legacy message format
        (ApiKey.FETCH, 13),  # topic ids
        (ApiKey.METADATA, 10),
        (34, 0),  # AlterReplicaLogDirs: a Kafka API we do not serve (one log dir per node)
        (999, 0),  # no such API
    ],
)
def test_other_unsupported_requests_close_the_connection(api_key: int, version: int) -> None:
    decoder = KafkaDecoder()
    (event,) = decoder.feed(_raw_frame(api_key, version, 3, b"\x00\x01c" + b"\x00" * 16))
    assert isinstance(event, UnsupportedRequest)
    assert event.close_connection
    assert event.client_id == "c"
    assert encode_unsupported_response(event) is None


# --- Framing and parse errors ---------------------------------------------------------------


def test_max_request_size_is_kafkas_socket_request_max_bytes() -> None:
    assert MAX_REQUEST_SIZE == 104_857_600
    assert KafkaDecoder().max_request_size == MAX_REQUEST_SIZE


def test_oversize_frame_fails_on_its_size_prefix() -> None:
    decoder = KafkaDecoder(max_request_size=1000)
    assert decoder.feed(struct.pack(">i", 1000) + b"\x00" * 10) == []  # exactly the limit
    decoder = KafkaDecoder(max_request_size=1000)
    with pytest.raises(KafkaFrameError) as caught:
        decoder.feed(struct.pack(">i", 1001) + b"\x00" * 10)
    assert caught.value.size == 1001
    assert caught.value.error_code == ErrorCode.invalid_request
    # The decoder is dead: it never buffers the rest of the frame.
    with pytest.raises(KafkaFrameError):
        decoder.feed(b"\x00" * 1000)
    assert decoder.buffered == 14
    with pytest.raises(KafkaFrameError):
        decoder.feed(b"")


def test_default_limit_rejects_a_frame_above_100_mib_after_4_bytes() -> None:
    decoder = KafkaDecoder()
    with pytest.raises(KafkaFrameError):
        decoder.feed(struct.pack(">i", MAX_REQUEST_SIZE + 1))


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 7])
def test_negative_or_too_small_size_is_a_frame_error(size: int) -> None:
    decoder = KafkaDecoder()
    with pytest.raises(KafkaFrameError):
        decoder.feed(struct.pack(">i", size) + b"\x00" * 8)


def test_truncated_body_is_malformed_and_kills_the_decoder() -> None:
    frame = CASES[4].frame  # Produce v9
    payload = frame[4:-3]
    decoder = KafkaDecoder()
    with pytest.raises(MalformedRequestError) as caught:
        decoder.feed(struct.pack(">i", len(payload)) + payload + CASES[0].frame)
    assert (caught.value.api_key, caught.value.api_version) == (0, 9)
    assert caught.value.correlation_id == CASES[4].correlation_id
    with pytest.raises(MalformedRequestError):
        decoder.feed(b"")


def test_the_requests_before_a_bad_frame_come_out_and_the_next_call_raises() -> None:
    # As Kafka handles the requests read before one that does not parse, then closes.
    frame = CASES[4].frame  # Produce v9
    payload = frame[4:-3]
    decoder = KafkaDecoder()
    events = decoder.feed(CASES[0].frame + struct.pack(">i", len(payload)) + payload)
    assert [(e.api_key, e.correlation_id) for e in events] == [
        (CASES[0].api_key, CASES[0].correlation_id)
    ]
    with pytest.raises(MalformedRequestError):
        decoder.feed(b"")


def test_a_frame_over_the_cap_after_other_requests_waits_for_the_next_call() -> None:
    # The requests before it (ApiVersions, a SASL login) may lift the cap: the server raises
    # max_request_size (or its oversize hook does) before the frame is judged.
    big = CASES[4].frame  # Produce v9
    decoder = KafkaDecoder(max_request_size=64)
    asked: list[int] = []
    decoder.oversize = asked.append
    (first,) = decoder.feed(CASES[1].frame + big)
    _assert_case(first, CASES[1])
    assert asked == []  # not judged yet
    assert decoder.buffered == len(big)
    decoder.max_request_size = len(big)
    (produce,) = decoder.feed(b"")
    _assert_case(produce, CASES[4])
    decoder = KafkaDecoder(max_request_size=64)
    decoder.oversize = asked.append
    decoder.feed(CASES[1].frame + big)
    with pytest.raises(KafkaFrameError):
        decoder.feed(b"")  # still over it: refused now, after the hook was asked
    assert asked == [ApiKey.PRODUCE]


def test_bad_client_id_is_malformed() -> None:
    decoder = KafkaDecoder()
    with pytest.raises(MalformedRequestError):
        decoder.feed(_raw_frame(3, 5, 1, b"\x00\x10ab"))  # 16-byte client id, 2 present


def test_header_tagged_fields_are_skipped() -> None:
    body = CASES[2].frame[4 + 8 + 2 + len("kafka-python") + 1 :]  # Metadata v9 body
    header_rest = b"\x00\x01c" + b"\x02" + b"\x05\x02hi" + b"\x07\x00"  # two unknown tags
    decoder = KafkaDecoder()
    (event,) = decoder.feed(_raw_frame(3, 9, 42, header_rest + body))
    assert isinstance(event, Request)
    assert event.client_id == "c"
    _check_metadata_orders_pay(event.body)


def test_trailing_bytes_inside_a_frame_are_ignored_as_kafka_does() -> None:
    frame = CASES[1].frame
    payload = frame[4:] + b"junk"
    decoder = KafkaDecoder()
    (event,) = decoder.feed(struct.pack(">i", len(payload)) + payload)
    assert isinstance(event, Request)
    assert event.api_key == ApiKey.API_VERSIONS


def test_supported_table_must_exist_in_kio() -> None:
    with pytest.raises(ValueError, match="no kio request schema"):
        KafkaDecoder(supported={ApiKey.PRODUCE: (0, 9)})


# --- Responses ------------------------------------------------------------------------------


class _Info(NamedTuple):
    """The three fields ``encode_response`` reads (``codec.RequestInfo``)."""

    api_key: int
    api_version: int
    correlation_id: int


def _zero() -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(0))


def _roundtrip_through_kafka_python(request: Any, body: Any) -> Any:
    """Send ``request`` from kafka-python, answer it with ``body``, return what it parses."""
    client = KafkaProtocol(client_id="kp")
    client.send_request(request, correlation_id=321)
    decoder = KafkaDecoder()
    (event,) = decoder.feed(client.send_bytes())
    assert isinstance(event, Request)
    [(correlation_id, parsed)] = client.receive_bytes(encode_response(event, body))
    assert correlation_id == 321
    return parsed


@pytest.mark.parametrize("version", range(5))
def test_api_versions_response_every_version(version: int) -> None:
    parsed = _roundtrip_through_kafka_python(
        KP[ApiKey.API_VERSIONS](version=version), api_versions_response(version)
    )
    assert parsed.error_code == 0
    assert {a.api_key: (a.min_version, a.max_version) for a in parsed.api_keys} == SUPPORTED_APIS


def test_api_versions_response_header_is_v0_even_when_flexible() -> None:
    request = _Info(api_key=18, api_version=3, correlation_id=9)
    frame = encode_response(request, api_versions_response(3))
    # size, correlation id, then straight into the body's error code: no tagged-field byte.
    assert frame[4:8] == struct.pack(">i", 9)
    assert frame[8:10] == b"\x00\x00"


def test_metadata_v9_response() -> None:
    body = metadata_v9.MetadataResponse(
        throttle_time=_zero(),
        brokers=(
            metadata_v9.MetadataResponseBroker(node_id=BrokerId(1), host="h", port=i32(9092)),
        ),
        cluster_id="braid",
        controller_id=BrokerId(1),
        topics=(
            metadata_v9.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=TopicName("orders"),
                partitions=(
                    metadata_v9.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=i32(0),
                        leader_id=BrokerId(1),
                        replica_nodes=(BrokerId(1),),
                        isr_nodes=(BrokerId(1),),
                    ),
                ),
            ),
        ),
    )
    parsed = _roundtrip_through_kafka_python(KP[ApiKey.METADATA](version=9), body)
    assert parsed.cluster_id == "braid"
    assert parsed.brokers[0].host == "h"
    assert parsed.topics[0].name == "orders"
    assert parsed.topics[0].partitions[0].leader_id == 1


def test_metadata_v5_response_non_flexible() -> None:
    body = metadata_v5.MetadataResponse(
        throttle_time=_zero(),
        brokers=(metadata_v5.MetadataResponseBroker(node_id=BrokerId(0), host="x", port=i32(1)),),
        controller_id=BrokerId(0),
        topics=(),
    )
    parsed = _roundtrip_through_kafka_python(KP[ApiKey.METADATA](version=5), body)
    assert parsed.brokers[0].port == 1


def test_produce_v9_response() -> None:
    body = produce_v9.ProduceResponse(
        responses=(
            produce_v9.TopicProduceResponse(
                name=TopicName("orders"),
                partition_responses=(
                    produce_v9.PartitionProduceResponse(
                        index=i32(3),
                        error_code=ErrorCode.corrupt_message,
                        base_offset=i64(-1),
                        record_errors=(),
                    ),
                ),
            ),
        ),
        throttle_time=_zero(),
    )
    parsed = _roundtrip_through_kafka_python(KP[ApiKey.PRODUCE](version=9, acks=-1), body)
    partition = parsed.responses[0].partition_responses[0]
    assert (partition.index, partition.error_code) == (3, 2)


def test_fetch_v12_response_carries_the_batch() -> None:
    body = fetch_v12.FetchResponse(
        throttle_time=_zero(),
        error_code=ErrorCode.none,
        responses=(
            fetch_v12.FetchableTopicResponse(
                topic=TopicName("orders"),
                partitions=(
                    fetch_v12.PartitionData(
                        partition_index=i32(0),
                        error_code=ErrorCode.none,
                        high_watermark=i64(5),
                        aborted_transactions=None,
                        records=Records(BATCH),
                    ),
                ),
            ),
        ),
    )
    parsed = _roundtrip_through_kafka_python(KP[ApiKey.FETCH](version=12), body)
    partition = parsed.responses[0].partitions[0]
    assert partition.high_watermark == 5
    assert partition.records == BATCH


def test_find_coordinator_v3_response_uses_header_v1() -> None:
    body = find_coordinator_v3.FindCoordinatorResponse(
        throttle_time=_zero(),
        error_code=ErrorCode.none,
        error_message=None,
        node_id=BrokerId(0),
        host="127.0.0.1",
        port=i32(9092),
    )
    request = _Info(api_key=10, api_version=3, correlation_id=8)
    frame = encode_response(request, body)
    assert frame[4:9] == struct.pack(">i", 8) + b"\x00"  # correlation id + empty tag section
    parsed = _roundtrip_through_kafka_python(KP[ApiKey.FIND_COORDINATOR](version=3, key="g"), body)
    assert (parsed.host, parsed.port) == ("127.0.0.1", 9092)


def test_response_header_version_agrees_with_kio() -> None:
    for api_key, (low, high) in SUPPORTED_APIS.items():
        for version in range(low, high + 1):
            header = load_response_schema(api_key, version).__header_schema__
            assert response_header_flexible(api_key, version) == (header is not ResponseHeaderV0), (
                api_key,
                version,
            )


def test_mismatched_response_is_our_fault() -> None:
    request = UnsupportedRequest(3, 9, 1, None, 0)
    with pytest.raises(LocalProtocolError):
        encode_response(request, api_versions_response(0))
    request = UnsupportedRequest(18, 3, 1, None, 0)
    with pytest.raises(LocalProtocolError):
        encode_response(request, api_versions_response(2))


def test_api_versions_response_rejects_unknown_version() -> None:
    with pytest.raises(ValueError, match="no ApiVersions response schema"):
        api_versions_response(5)


def test_supported_versions_have_request_and_response_schemas() -> None:
    for api_key, (low, high) in SUPPORTED_APIS.items():
        assert ApiKey(api_key).name.lower() == api_key_map[api_key]
        for version in range(low, high + 1):
            assert load_request_schema(api_key, version).__api_key__ == i16(api_key)
            assert load_response_schema(api_key, version).__version__ == i16(version)
