"""Building kio responses of every version from one description (``gateway.kafka.entities``)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode

from gateway.kafka.apis import SUPPORTED_APIS, ApiKey
from gateway.kafka.codec import Request, encode_response
from gateway.kafka.entities import build_response, response_class

METADATA = {
    "throttle_time": 5,
    "brokers": [{"node_id": 0, "host": "h", "port": 9092, "rack": None}],
    "cluster_id": "c",
    "controller_id": 0,
    "topics": [
        {
            "error_code": 3,
            "name": "t",
            "partitions": [{"partition_index": 0, "leader_id": 0, "replica_nodes": [0]}],
        }
    ],
}


@pytest.mark.parametrize("version", range(0, 10))
def test_one_description_serves_every_metadata_version(version: int) -> None:
    body = build_response(ApiKey.METADATA, version, METADATA)
    assert type(body) is response_class(ApiKey.METADATA, version)
    assert body.topics[0].error_code == ErrorCode.unknown_topic_or_partition
    assert body.topics[0].partitions[0].replica_nodes == (0,)
    if version >= 3:
        assert body.throttle_time == datetime.timedelta(milliseconds=5)
    encode_response(Request(ApiKey.METADATA, version, 1, None, None, 0), body)  # type: ignore[arg-type]


def test_missing_fields_take_their_defaults_and_none_becomes_zero() -> None:
    body = build_response(ApiKey.JOIN_GROUP, 5, {"protocol_name": None, "error_code": 27})
    assert body.protocol_name == ""  # not nullable before v7
    assert body.generation_id == -1
    assert body.members == ()
    assert build_response(ApiKey.JOIN_GROUP, 7, {"protocol_name": None}).protocol_name is None


def test_datetime_fields_take_milliseconds() -> None:
    body = build_response(
        ApiKey.PRODUCE,
        9,
        {
            "responses": [
                {
                    "name": "t",
                    "partition_responses": [
                        {"index": 0, "base_offset": 1, "log_append_time": 1_700_000_000_000}
                    ],
                }
            ]
        },
    )
    stamp = body.responses[0].partition_responses[0].log_append_time
    assert stamp is not None
    assert stamp.timestamp() == 1_700_000_000


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(key, version) for key, (low, high) in SUPPORTED_APIS.items() for version in (low, high)],
)
def test_an_empty_description_encodes_for_every_supported_api(api_key: int, version: int) -> None:
    body = build_response(api_key, version, {})
    encode_response(Request(api_key, version, 1, None, None, 0), body)  # type: ignore[arg-type]
