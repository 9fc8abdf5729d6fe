"""Unknown tagged fields are skipped (KIP-482), where kio's reader refuses them."""

from __future__ import annotations

import io

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from gateway.kafka.apis import SUPPORTED_APIS
from gateway.kafka.codec import KafkaDecoder, Request
from gateway.kafka.entities import build
from gateway.kafka.lenient import read_entity

# librdkafka 2.16's AdminClient listing all topics: Metadata v9 whose body carries tag 0
# (empty), which MetadataRequest v9 does not declare.
LIBRDKAFKA_METADATA_V9 = bytes.fromhex(
    "0000001a00030009000000030007" + b"rdkafka".hex() + "000000000001000000"
)


def test_librdkafka_metadata_with_an_unknown_tag_is_read() -> None:
    decoder = KafkaDecoder()
    (event,) = decoder.feed(LIBRDKAFKA_METADATA_V9)
    assert isinstance(event, Request)
    assert event.body.topics is None  # type: ignore[union-attr]
    assert event.body.allow_auto_topic_creation is False  # type: ignore[union-attr]


def _flexible_versions() -> list[tuple[int, int]]:
    cases = []
    for key, (low, high) in SUPPORTED_APIS.items():
        for version in range(low, high + 1):
            if load_request_schema(key, version).__flexible__:
                cases.append((key, version))
    return cases


@pytest.mark.parametrize(("api_key", "version"), _flexible_versions())
def test_lenient_reader_agrees_with_kio_and_skips_unknown_tags(api_key: int, version: int) -> None:
    schema = load_request_schema(api_key, version)
    # An instance with every field at its default or zero value, written by kio.
    empty = build(schema, {})
    out = io.BytesIO()
    entity_writer(schema)(out, empty)
    raw = out.getvalue()
    assert entity_reader(schema)(raw, 0) == (empty, len(raw))
    assert read_entity(schema, raw, 0) == (empty, len(raw))
    # The same with an unknown tag (99, three bytes) in the top-level tagged fields.
    assert raw.endswith(b"\x00")
    tagged = raw[:-1] + b"\x01\x63\x03abc"
    assert read_entity(schema, tagged, 0) == (empty, len(tagged))


def test_nested_entities_known_and_unknown_tags() -> None:
    schema = load_request_schema(1, 12)  # Fetch v12: cluster_id is tagged field 0
    fetch = build(
        schema,
        {
            "cluster_id": "braid",
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 1000,
            "topics": [
                {
                    "topic": "t",
                    "partitions": [{"partition": 3, "fetch_offset": 42, "partition_max_bytes": 7}],
                }
            ],
            "rack_id": "r",
        },
    )
    out = io.BytesIO()
    entity_writer(schema)(out, fetch)
    raw = out.getvalue()
    assert read_entity(schema, raw, 0) == (fetch, len(raw))
    # An unknown tag (5, two bytes) in the partition entity, before its empty tag buffer.
    marker = (42).to_bytes(8, "big")
    at = raw.index(marker) + 8 + 4 + 4 + 4  # fetch_offset, last_fetched_epoch, log start, max
    assert raw[at + 4] == 0  # the partition's (empty) tag buffer
    tagged = raw[: at + 4] + b"\x01\x05\x02zz" + raw[at + 5 :]
    assert read_entity(schema, tagged, 0) == (fetch, len(tagged))
