"""A consumer group's tag filter set and read by Kafka admin clients against ``braid serve``:
IncrementalAlterConfigs / AlterConfigs / DescribeConfigs on resource type GROUP, config
``braid.tag.filter`` (docs/kafka.md, "Tag filters").

confluent-kafka (librdkafka 2.16 sends ``ResourceType.GROUP`` as 32), kafka-python (32, and
AlterConfigs when asked), and a raw request with type 3 (what librdkafka before 2.10 sent)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

# The defining modules: confluent_kafka.admin re-exports these without declaring them.
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._resource import ResourceType
from kafka.admin import AlterConfigOp, KafkaAdminClient
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType as KPConfigResourceType
from kio.schema.describe_configs.v1 import request as describe_v1
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v0 import request as incremental_v0
from kio.static.primitive import i8

from tests.braid_process import BraidProcess
from tests.kafka.raw import RawClient

FILTER = "braid.tag.filter"
TIMEOUT_S = 30.0
QUIET_S = 1.0
# value -> x-braid-tags of the record (None: no header)
TAGGED: dict[bytes, str | None] = {
    b"a": "TagA",
    b"bc": "TagC,TagB",
    b"c": "TagC",
    b"none": None,
}
MATCHING = {b"a", b"bc"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid-group-configs"), listeners=("kafka",)) as b:
        yield b


def admin(braid: BraidProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": braid.kafka_bootstrap})


def produce_tagged(braid: BraidProcess, topic: str) -> None:
    """The records of TAGGED, in one batch (one flush), then one more batch each."""
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "linger.ms": 50})
    for value, tags in TAGGED.items():
        headers: list[tuple[str, str | bytes | None]] = (
            [("x-braid-tags", tags.encode())] if tags is not None else []
        )
        producer.produce(topic, value, key=b"k", headers=headers)
    assert producer.flush(TIMEOUT_S) == 0


def consume(braid: BraidProcess, topic: str, group: str, count: int) -> list[bytes]:
    """``count`` records read by a new member of ``group`` (its own client id), then none for
    QUIET_S. Commits nothing."""
    consumer = Consumer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": group,
            "client.id": f"{group}-client",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                raise KafkaException(message.error())
            value = message.value()
            assert value is not None
            got.append(value)
        assert len(got) == count, got
        extra = consumer.poll(QUIET_S)
        assert extra is None, extra.value()
    finally:
        consumer.close()
    return got


def incremental(client: AdminClient, group: str, value: str | None, op: AlterConfigOpType) -> None:
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[ConfigEntry(FILTER, value, incremental_operation=op)],
    )
    client.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)


def described(client: AdminClient, group: str) -> ConfigEntry:
    resource = ConfigResource(ResourceType.GROUP, group)
    entries: dict[str, ConfigEntry] = client.describe_configs([resource])[resource].result(
        TIMEOUT_S
    )
    assert set(entries) == {FILTER}
    return entries[FILTER]


def test_confluent_admin_sets_a_group_filter_that_survives_a_restart(tmp_path: Path) -> None:
    """SET on a GROUP resource filters that group's fetches (another group gets everything),
    DescribeConfigs reads it back, it is still in force after a restart, DELETE removes it."""
    topic, filtered, later, plain = (unique(p) for p in ("cfg", "cfg-g1", "cfg-g2", "plain"))
    with BraidProcess(tmp_path, listeners=("kafka",)) as braid:
        client = admin(braid)
        entry = described(client, filtered)
        assert entry.value is None
        assert ConfigSource(entry.source) is ConfigSource.DEFAULT_CONFIG
        incremental(client, filtered, "TagA || TagB", AlterConfigOpType.SET)
        incremental(client, later, "TagB||TagA ", AlterConfigOpType.SET)
        entry = described(client, filtered)
        assert entry.value == "TagA || TagB"
        assert ConfigSource(entry.source) is ConfigSource.GROUP_CONFIG
        assert not entry.is_read_only
        assert described(client, later).value == "TagB||TagA"

        produce_tagged(braid, topic)
        assert sorted(consume(braid, topic, filtered, len(MATCHING))) == sorted(MATCHING)
        assert sorted(consume(braid, topic, plain, len(TAGGED))) == sorted(TAGGED)

        braid.restart()
        client = admin(braid)
        assert described(client, filtered).value == "TagA || TagB"
        assert ConfigSource(described(client, later).source) is ConfigSource.GROUP_CONFIG
        # The filter set before the restart applies to the group's first fetches after it.
        assert sorted(consume(braid, topic, later, len(MATCHING))) == sorted(MATCHING)

        incremental(client, later, None, AlterConfigOpType.DELETE)
        entry = described(client, later)
        assert entry.value is None
        assert ConfigSource(entry.source) is ConfigSource.DEFAULT_CONFIG
        # Nothing committed: the group reads the topic again, all of it now.
        assert sorted(consume(braid, topic, later, len(TAGGED))) == sorted(TAGGED)
        braid.restart()
        client = admin(braid)
        assert described(client, later).value is None
        assert described(client, filtered).value == "TagA || TagB"


def alter_error(client: AdminClient, resource: ConfigResource) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        client.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    error: KafkaError = raised.value.args[0]
    return error


def test_confluent_admin_errors_per_resource(braid: BraidProcess) -> None:
    """Kafka's errors, each resource its own, on one connection that stays up."""
    client = admin(braid)
    group, topic = unique("errors"), unique("errors-topic")
    produce_tagged(braid, topic)

    def group_set(name: str, value: str | None) -> ConfigResource:
        return ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            ],
        )

    error = alter_error(client, group_set("braid.tag.filters", "TagA"))
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "Unknown group config name: braid.tag.filters" in error.str()
    for bad in ("TagA | TagB", "TagA ||", "TagA,TagB", "* || TagA"):
        error = alter_error(client, group_set(FILTER, bad))
        assert error.code() == KafkaError.INVALID_CONFIG, bad
        assert FILTER in error.str()
    append = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(FILTER, "TagC", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    assert alter_error(client, append).code() == KafkaError.INVALID_CONFIG
    assert described(client, group).value is None  # nothing was set by the refused requests

    # A topic's retention may be altered (test_e2e_admin.py), its cleanup policy not to compact.
    topic_alter = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    broker_alter = ConfigResource(
        ResourceType.BROKER,
        "0",
        incremental_configs=[
            ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    good = group_set(FILTER, "TagC")
    futures = client.incremental_alter_configs([topic_alter, broker_alter, good])
    for refused, code in (
        (topic_alter, KafkaError.INVALID_CONFIG),
        (broker_alter, KafkaError.INVALID_REQUEST),
    ):
        with pytest.raises(KafkaException) as raised:
            futures[refused].result(TIMEOUT_S)
        assert raised.value.args[0].code() == code
    futures[good].result(TIMEOUT_S)
    missing = ConfigResource(
        ResourceType.TOPIC,
        unique("missing"),
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    assert alter_error(client, missing).code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # DescribeConfigs of the three kinds in one call: topics and the broker as before.
    resources = [
        ConfigResource(ResourceType.TOPIC, topic),
        ConfigResource(ResourceType.BROKER, "0"),
        ConfigResource(ResourceType.GROUP, group),
    ]
    results = {
        r.restype: f.result(TIMEOUT_S) for r, f in client.describe_configs(resources).items()
    }
    assert results[ResourceType.TOPIC]["cleanup.policy"].value == "delete"
    assert results[ResourceType.BROKER]["broker.id"].value == "0"
    assert results[ResourceType.GROUP][FILTER].value == "TagC"
    # The filter is in force: this group reads only the TagC records.
    assert sorted(consume(braid, topic, group, 2)) == [b"bc", b"c"]


def test_kafka_python_admin_sets_reads_and_resets(braid: BraidProcess) -> None:
    """kafka-python 3: IncrementalAlterConfigs (after checking the name with a DescribeConfigs
    of the dynamic configs), AlterConfigs when told to, reset_configs (DELETE)."""
    group = unique("kp")
    client = KafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    try:
        resource = KPConfigResource(KPConfigResourceType.GROUP, group, {FILTER: "TagA || TagB"})
        result = client.alter_configs([resource])
        assert result == {"group": {group: "OK"}}
        shown = client.describe_configs([KPConfigResource(KPConfigResourceType.GROUP, group)])
        entry = shown["group"][group][FILTER]
        assert entry["value"] == "TagA || TagB"
        assert entry["config_source"] == "DYNAMIC_GROUP_CONFIG"

        legacy = KPConfigResource(KPConfigResourceType.GROUP, group, {FILTER: "TagC"})
        assert client.alter_configs([legacy], incremental=False) == {"group": {group: "OK"}}
        shown = client.describe_configs([KPConfigResource(KPConfigResourceType.GROUP, group)])
        assert shown["group"][group][FILTER]["value"] == "TagC"

        with pytest.raises(ValueError, match="Unrecognized configs"):
            client.alter_configs([KPConfigResource(KPConfigResourceType.GROUP, group, {"x": "1"})])
        bad = KPConfigResource(KPConfigResourceType.GROUP, group, {FILTER: "TagA | TagB"})
        result = client.alter_configs([bad], raise_on_unknown=False)
        assert "InvalidConfigurationError" in result["group"][group]

        reset = KPConfigResource(
            KPConfigResourceType.GROUP, group, {FILTER: (AlterConfigOp.DELETE, None)}
        )
        assert client.alter_configs([reset]) == {"group": {group: "OK"}}
        everything = client.describe_configs(
            [KPConfigResource(KPConfigResourceType.GROUP, group)], config_filter="all"
        )
        assert everything["group"][group][FILTER]["value"] is None
        assert everything["group"][group][FILTER]["config_source"] == "DEFAULT_CONFIG"
    finally:
        client.close()


def test_resource_type_3_of_older_librdkafka(braid: BraidProcess) -> None:
    """librdkafka before 2.10 sent its ResourceType.GROUP (3) as the config resource type: it is
    taken as a group and answered with the type it was sent with."""
    group = unique("legacy")
    raw = RawClient(braid.host, braid.kafka_port)
    try:
        response: Any = raw.request(
            incremental_v0.IncrementalAlterConfigsRequest(
                resources=(
                    incremental_v0.AlterConfigsResource(
                        resource_type=i8(3),
                        resource_name=group,
                        configs=(
                            incremental_v0.AlterableConfig(
                                name=FILTER, config_operation=i8(0), value="TagA"
                            ),
                        ),
                    ),
                    incremental_v0.AlterConfigsResource(
                        resource_type=i8(16), resource_name="metrics", configs=()
                    ),
                ),
                validate_only=False,
            )
        )
        ok, unsupported = response.responses
        assert (ok.error_code, ok.resource_type, ok.resource_name) == (ErrorCode.none, 3, group)
        assert unsupported.error_code == ErrorCode.invalid_request
        assert unsupported.resource_type == 16
        described_response: Any = raw.request(
            describe_v1.DescribeConfigsRequest(
                resources=(
                    describe_v1.DescribeConfigsResource(
                        resource_type=i8(3), resource_name=group, configuration_keys=None
                    ),
                    describe_v1.DescribeConfigsResource(
                        resource_type=i8(8), resource_name="0", configuration_keys=None
                    ),
                ),
                include_synonyms=True,
            )
        )
        found, refused = described_response.results
        assert found.resource_type == 3
        assert [(c.name, c.value, c.config_source) for c in found.configs] == [(FILTER, "TagA", 8)]
        assert refused.error_code == ErrorCode.invalid_request
        assert refused.configs == ()
    finally:
        raw.close()
