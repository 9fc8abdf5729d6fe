"""Authorization on the Kafka APIs beyond produce, fetch and groups, as Kafka's KafkaApis asks
its AclAuthorizer: the transaction requests (the transactional id, then the topics or the group)
and the config requests (each resource on its own: topic, group, the cluster for the broker),
against a real ``braid serve``.

The transaction requests are written with kio over a socket logged in with SASL PLAIN
(``tests.kafka.raw``), to see each partition's code; confluent-kafka shows how a client reports
a refused commit and refused configs.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.add_offsets_to_txn.v3.request import AddOffsetsToTxnRequest
from kio.schema.add_partitions_to_txn.v3.request import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
)
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)

from tests.braid_process import BraidProcess
from tests.kafka.raw import RawClient
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
PASSWORD = uuid.uuid4().hex
# tina may write and configure tina.*, read tina.* and shared.*, and configure cfg.* (so she
# sees cfg.* in Metadata and FindCoordinator: describe is any of the three, but not read it).
TINA = {"configure": r"^(tina|cfg)\.", "write": r"^tina\.", "read": r"^(tina|shared)\."}


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("authz")
    with BraidProcess(path, listeners=("kafka", "http")) as process:
        admin = Admin(process.http_port)
        admin.user("tina", PASSWORD)
        admin.permit("tina", **TINA)
        yield process


def logged_in(braid: BraidProcess, user: str, password: str) -> RawClient:
    raw = RawClient(braid.host, braid.kafka_port, timeout=DEADLINE_S)
    assert raw.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    token = b"\0" + user.encode() + b"\0" + password.encode()
    assert raw.request(SaslAuthenticateRequest(auth_bytes=token)).error_code == ErrorCode.none
    return raw


@pytest.fixture
def tina(braid: BraidProcess) -> Iterator[RawClient]:
    raw = logged_in(braid, "tina", PASSWORD)
    yield raw
    raw.close()


def create_topics(braid: BraidProcess, *names: str) -> None:
    """Made by guest (an administrator with every permission)."""
    raw = logged_in(braid, "guest", "guest")
    try:
        response = raw.request(
            MetadataRequest(
                topics=tuple(MetadataRequestTopic(name=name) for name in names),
                allow_auto_topic_creation=True,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )
        assert [topic.error_code for topic in response.topics] == [ErrorCode.none] * len(names)
    finally:
        raw.close()


def init_producer_id(raw: RawClient, transactional_id: str) -> tuple[int, int]:
    response = raw.request(
        InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(milliseconds=60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert response.error_code == ErrorCode.none
    return response.producer_id, response.producer_epoch


def add_partitions(
    raw: RawClient, transactional_id: str, producer: tuple[int, int], *topics: str
) -> dict[str, ErrorCode]:
    response = raw.request(
        AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer[0],
            v3_and_below_producer_epoch=producer[1],
            v3_and_below_topics=tuple(
                AddPartitionsToTxnTopic(name=topic, partitions=(0,)) for topic in topics
            ),
        )
    )
    return {
        result.name: result.results_by_partition[0].partition_error_code
        for result in response.results_by_topic_v3_and_below
    }


def add_offsets(
    raw: RawClient, transactional_id: str, producer: tuple[int, int], group: str
) -> ErrorCode:
    response = raw.request(
        AddOffsetsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer[0],
            producer_epoch=producer[1],
            group_id=group,
        )
    )
    code: ErrorCode = response.error_code
    return code


def txn_offset_commit(
    raw: RawClient, transactional_id: str, producer: tuple[int, int], group: str, *topics: str
) -> dict[str, ErrorCode]:
    response = raw.request(
        TxnOffsetCommitRequest(
            transactional_id=transactional_id,
            group_id=group,
            producer_id=producer[0],
            producer_epoch=producer[1],
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=tuple(
                TxnOffsetCommitRequestTopic(
                    name=topic,
                    partitions=(
                        TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=0,
                            committed_leader_epoch=-1,
                            committed_metadata=None,
                        ),
                    ),
                )
                for topic in topics
            ),
        )
    )
    return {topic.name: topic.partitions[0].error_code for topic in response.topics}


def end_txn(
    raw: RawClient, transactional_id: str, producer: tuple[int, int], commit: bool
) -> ErrorCode:
    response = raw.request(
        EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer[0],
            producer_epoch=producer[1],
            committed=commit,
        )
    )
    code: ErrorCode = response.error_code
    return code


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def test_a_transactional_id_without_write_is_refused_on_every_transaction_request(
    braid: BraidProcess, tina: RawClient
) -> None:
    mine, theirs = f"tina.{suffix()}", f"shared.tx{suffix()}"  # theirs: describe, not write
    create_topics(braid, mine)
    refused = ErrorCode.transactional_id_authorization_failed
    any_producer = (1, 0)  # the id is checked before the producer id is looked at
    assert add_partitions(tina, theirs, any_producer, mine) == {mine: refused}
    assert add_offsets(tina, theirs, any_producer, "tina.g") == refused
    assert txn_offset_commit(tina, theirs, any_producer, "tina.g", mine) == {mine: refused}
    assert end_txn(tina, theirs, any_producer, commit=True) == refused
    stderr = braid.stderr()
    for operation in ("AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn"):
        assert f"user='tina' operation='kafka {operation}'" in stderr
    assert "operation='kafka TxnOffsetCommit transaction'" in stderr


def test_add_partitions_refuses_a_topic_without_write_and_attempts_none(
    braid: BraidProcess, tina: RawClient
) -> None:
    mine, shared = f"tina.{suffix()}", f"shared.{suffix()}"
    create_topics(braid, mine, shared)
    transactional_id = f"tina.tx{suffix()}"
    producer = init_producer_id(tina, transactional_id)
    assert add_partitions(tina, transactional_id, producer, mine, shared) == {
        mine: ErrorCode.operation_not_attempted,
        shared: ErrorCode.topic_authorization_failed,
    }
    # An internal topic is never written by a client: refused as Kafka refuses it.
    assert add_partitions(tina, transactional_id, producer, "__offsets") == {
        "__offsets": ErrorCode.topic_authorization_failed
    }
    assert add_partitions(tina, transactional_id, producer, mine) == {mine: ErrorCode.none}
    assert end_txn(tina, transactional_id, producer, commit=False) == ErrorCode.none
    assert f"operation='kafka AddPartitionsToTxn topic' vhost='/' resource='exchange {shared}'" in (
        braid.stderr()
    )


def test_transaction_offsets_need_read_on_the_group_and_each_topic(
    braid: BraidProcess, tina: RawClient
) -> None:
    mine, configurable = f"tina.{suffix()}", f"cfg.{suffix()}"  # cfg.*: describe, not read
    create_topics(braid, mine, configurable)
    transactional_id = f"tina.tx{suffix()}"
    producer = init_producer_id(tina, transactional_id)
    group, other_group = f"tina.g{suffix()}", f"cfg.g{suffix()}"
    assert add_offsets(tina, transactional_id, producer, other_group) == (
        ErrorCode.group_authorization_failed
    )
    assert add_offsets(tina, transactional_id, producer, group) == ErrorCode.none
    assert txn_offset_commit(tina, transactional_id, producer, other_group, mine) == {
        mine: ErrorCode.group_authorization_failed
    }
    assert txn_offset_commit(tina, transactional_id, producer, group, mine, configurable) == {
        mine: ErrorCode.none,
        configurable: ErrorCode.topic_authorization_failed,
    }
    assert end_txn(tina, transactional_id, producer, commit=False) == ErrorCode.none
    stderr = braid.stderr()
    assert f"operation='kafka AddOffsetsToTxn group' vhost='/' resource='group {other_group}'" in (
        stderr
    )
    assert (
        f"operation='kafka TxnOffsetCommit topic' vhost='/' resource='exchange {configurable}'"
        in (stderr)
    )


def sasl(braid: BraidProcess, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": braid.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_confluent_commit_is_refused_once_a_deny_acl_covers_the_transactional_id(
    braid: BraidProcess,
) -> None:
    topic, transactional_id = f"tina.{suffix()}", f"tina.tx{suffix()}"
    producer = Producer({**sasl(braid, "tina", PASSWORD), "transactional.id": transactional_id})
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    producer.produce(topic, b"in the transaction")
    assert producer.flush(DEADLINE_S) == 0
    guest = AdminClient(sasl(braid, "guest", "guest"))
    deny = AclBinding(
        ResourceType.TRANSACTIONAL_ID,
        transactional_id,
        ResourcePatternType.LITERAL,
        "User:tina",
        "*",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    for future in guest.create_acls([deny]).values():
        future.result(DEADLINE_S)
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction(DEADLINE_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert f"operation='kafka EndTxn' vhost='/' resource='transactional_id {transactional_id}'" in (
        braid.stderr()
    )


def config_errors(futures: dict[ConfigResource, Any]) -> dict[str, int]:
    """``"type name"`` -> the Kafka error code its future failed with (0: answered)."""
    codes: dict[str, int] = {}
    for resource, future in futures.items():
        key = f"{resource.restype.name.lower()} {resource.name}"
        try:
            future.result(DEADLINE_S)
            codes[key] = 0
        except KafkaException as error:
            codes[key] = error.args[0].code()
    return codes


def test_configs_are_refused_per_resource_as_kafka_refuses_them(braid: BraidProcess) -> None:
    mine, theirs = f"tina.{suffix()}", f"bob.{suffix()}"
    create_topics(braid, mine, theirs)
    tina = AdminClient(sasl(braid, "tina", PASSWORD))
    described = tina.describe_configs(
        [
            ConfigResource(ResourceType.TOPIC, mine),
            ConfigResource(ResourceType.TOPIC, theirs),
            ConfigResource(ResourceType.GROUP, "bob.g"),
            ConfigResource(ResourceType.BROKER, "0"),
        ]
    )
    assert config_errors(described) == {
        f"topic {mine}": 0,
        f"topic {theirs}": KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "group bob.g": KafkaError.GROUP_AUTHORIZATION_FAILED,
        "broker 0": KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
    tag_filter = ConfigEntry("braid.tag.filter", "red", incremental_operation=AlterConfigOpType.SET)
    altered = tina.incremental_alter_configs(
        [
            ConfigResource(ResourceType.GROUP, "tina.g", incremental_configs=[tag_filter]),
            ConfigResource(ResourceType.GROUP, "bob.g", incremental_configs=[tag_filter]),
            ConfigResource(ResourceType.TOPIC, theirs, incremental_configs=[tag_filter]),
        ]
    )
    assert config_errors(altered) == {
        "group tina.g": 0,
        "group bob.g": KafkaError.GROUP_AUTHORIZATION_FAILED,
        f"topic {theirs}": KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
    stderr = braid.stderr()
    assert (
        "operation='kafka DescribeConfigs broker' vhost='/' resource='cluster kafka-cluster'"
        in (stderr)
    )
    assert "operation='kafka AlterConfigs group' vhost='/' resource='group bob.g'" in stderr
    # guest, an administrator, reads the broker's configs.
    guest = AdminClient(sasl(braid, "guest", "guest"))
    broker = guest.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
    assert config_errors(broker) == {"broker 0": 0}
