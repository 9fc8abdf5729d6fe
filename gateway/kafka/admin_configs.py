"""Topic and broker configs as DescribeConfigs shows them, and the topic configs
AlterConfigs (33) and IncrementalAlterConfigs (44) change.

Each config is shown with its real source, as Kafka's ``ConfigSource``: DYNAMIC_TOPIC_CONFIG
for what a client set on the topic (CreateTopics configs, alterations), STATIC_BROKER_CONFIG
for what the broker's config file sets to other than Kafka's default, DEFAULT_CONFIG for the
rest.

What a topic's alteration changes, applied by the core (``BrokerAPI.set_topic_retention``,
``core/log/retention.py``): ``retention.ms`` and ``retention.bytes`` (-1: no limit), which
give the topic retention of its own, and ``cleanup.policy`` (``delete``, the only policy:
there is no log compaction here, ``compact`` is INVALID_CONFIG). The other configs Kafka topics
have are fixed here (one commit log for every topic: ``segment.bytes``; one replica:
``min.insync.replicas``; ...): setting one to the value in effect is accepted and changes
nothing, another value is INVALID_CONFIG, a name Kafka does not know is INVALID_CONFIG with
Kafka's text. AlterConfigs replaces the topic's whole set (what it leaves out goes back to its
default); IncrementalAlterConfigs SETs and DELETEs one config at a time (APPEND/SUBTRACT only
on the list-valued ``cleanup.policy``). The topic's settings are kept in its config (the
Kafka configs as strings under :data:`KAFKA_CONFIGS_KEY`), durable before the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import ClientContext, TopicError, TopicInfo, is_system_topic
from gateway.kafka.context import Connection, KafkaContext

log = logging.getLogger(__name__)

# The topic config key a Kafka client's configs are kept under (TopicInfo.config).
KAFKA_CONFIGS_KEY: Final = "kafka.configs"
# Kafka's message.max.bytes default (1 MiB + record batch overhead).
MAX_MESSAGE_BYTES: Final = 1_048_588
# DescribeConfigs config sources (ConfigSource).
SOURCE_DYNAMIC_TOPIC: Final = 1
SOURCE_STATIC_BROKER: Final = 4
SOURCE_DEFAULT: Final = 5
# DescribeConfigs config types (ConfigEntry.ConfigType): what kafka-configs and UIs display.
TYPE_BOOLEAN: Final = 1
TYPE_STRING: Final = 2
TYPE_INT: Final = 3
TYPE_LONG: Final = 5
TYPE_LIST: Final = 7
# IncrementalAlterConfigs operations (AlterConfigOp.OpType).
OP_SET: Final = 0
OP_DELETE: Final = 1
OP_APPEND: Final = 2
OP_SUBTRACT: Final = 3
# A DescribeConfigs entry: (name, value or None, config source, config type).
ConfigRow = tuple[str, str | None, int, int]
# Kafka's defaults of the settings the config file may change (LogConfig, ServerConfigs).
KAFKA_RETENTION_MS: Final = 7 * 24 * 3600 * 1000  # log.retention.hours=168
KAFKA_SEGMENT_BYTES: Final = 1 << 30
KAFKA_NUM_PARTITIONS: Final = 1
NO_LIMIT: Final = -1
# What this broker speaks, as Kafka tools read it (the ApiVersions table is Kafka 3.9's and
# 4.x's baseline; KRaft brokers still report the setting).
INTER_BROKER_PROTOCOL_VERSION: Final = "3.9-IV0"
# The topic configs that change something here, and cleanup.policy's one value.
RETENTION_MS: Final = "retention.ms"
RETENTION_BYTES: Final = "retention.bytes"
CLEANUP_POLICY: Final = "cleanup.policy"
CLEANUP_DELETE: Final = "delete"
_LONG_CONFIGS: Final = (RETENTION_MS, RETENTION_BYTES)
_MAX_LONG: Final = 2**63 - 1
# Every topic config name Kafka knows (TopicConfig), for "Unknown topic config name".
KAFKA_TOPIC_CONFIG_NAMES: Final = frozenset(
    (
        "cleanup.policy",
        "compression.type",
        "compression.gzip.level",
        "compression.lz4.level",
        "compression.zstd.level",
        "delete.retention.ms",
        "file.delete.delay.ms",
        "flush.messages",
        "flush.ms",
        "follower.replication.throttled.replicas",
        "index.interval.bytes",
        "leader.replication.throttled.replicas",
        "local.retention.bytes",
        "local.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "message.downconversion.enable",
        "message.format.version",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "remote.log.copy.disable",
        "remote.log.delete.on.disable",
        "remote.storage.enable",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.index.bytes",
        "segment.jitter.ms",
        "segment.ms",
        "unclean.leader.election.enable",
    )
)


def _source(value: Any, kafka_default: Any) -> int:
    return SOURCE_DEFAULT if value == kafka_default else SOURCE_STATIC_BROKER


def _limit(value: int | None) -> int:
    return NO_LIMIT if value is None else value


def given_configs(info: TopicInfo) -> dict[str, str]:
    """The Kafka configs a client set on the topic (CreateTopics, alterations)."""
    given = info.config.get(KAFKA_CONFIGS_KEY) or {}
    return {str(name): str(value) for name, value in given.items() if value is not None}


def topic_configs(context: KafkaContext, client: ClientContext, info: TopicInfo) -> list[ConfigRow]:
    """(name, value, source, type) of a topic's configs, the ones Kafka tools ask for."""
    storage = context.api.storage_settings(client, info.name)
    retention_ms = _limit(storage.retention_ms)
    retention_bytes = _limit(storage.retention_bytes)
    durability = storage.durability
    configs = [
        (CLEANUP_POLICY, CLEANUP_DELETE, SOURCE_DEFAULT, TYPE_LIST),
        ("compression.type", "producer", SOURCE_DEFAULT, TYPE_STRING),
        (
            RETENTION_MS,
            str(retention_ms),
            _source(retention_ms, KAFKA_RETENTION_MS),
            TYPE_LONG,
        ),
        (RETENTION_BYTES, str(retention_bytes), _source(retention_bytes, NO_LIMIT), TYPE_LONG),
        (
            "segment.bytes",
            str(storage.segment_bytes),
            _source(storage.segment_bytes, KAFKA_SEGMENT_BYTES),
            TYPE_INT,
        ),
        ("max.message.bytes", str(MAX_MESSAGE_BYTES), SOURCE_DEFAULT, TYPE_INT),
        ("message.timestamp.type", "CreateTime", SOURCE_DEFAULT, TYPE_STRING),
        ("min.insync.replicas", "1", SOURCE_DEFAULT, TYPE_INT),
        ("unclean.leader.election.enable", "false", SOURCE_DEFAULT, TYPE_BOOLEAN),
        # What acks=all waits for here: the fsync (sync) or nothing more (async).
        (
            "flush.messages",
            "1" if durability == "sync" else str(_MAX_LONG),
            SOURCE_STATIC_BROKER,
            TYPE_LONG,
        ),
    ]
    given = given_configs(info)
    types = {row[0]: row[3] for row in configs}
    out: list[ConfigRow] = [row for row in configs if row[0] not in given]
    out += [
        (name, value, SOURCE_DYNAMIC_TOPIC, types.get(name, TYPE_STRING))
        for name, value in given.items()
    ]
    return out


def broker_configs(
    context: KafkaContext, connection: Connection, client: ClientContext
) -> list[ConfigRow]:
    """The broker configs Kafka tools and UIs read."""
    storage = context.api.storage_settings(client)
    settings = context.settings
    retention_ms = _limit(storage.retention_ms)
    retention_bytes = _limit(storage.retention_bytes)
    host, port = connection.advertised(settings)
    listener = f"{'SSL' if connection.tls else 'PLAINTEXT'}://{host}:{port}"
    log_dir, _, _ = context.api.log_directory(client)
    return [
        ("broker.id", str(context.api.this_node()), SOURCE_STATIC_BROKER, TYPE_INT),
        ("node.id", str(context.api.this_node()), SOURCE_STATIC_BROKER, TYPE_INT),
        ("process.roles", "broker,controller", SOURCE_STATIC_BROKER, TYPE_LIST),
        ("advertised.listeners", listener, SOURCE_STATIC_BROKER, TYPE_LIST),
        ("listeners", listener, SOURCE_STATIC_BROKER, TYPE_LIST),
        ("log.dirs", log_dir, SOURCE_STATIC_BROKER, TYPE_LIST),
        (
            "inter.broker.protocol.version",
            INTER_BROKER_PROTOCOL_VERSION,
            SOURCE_DEFAULT,
            TYPE_STRING,
        ),
        (
            "num.partitions",
            str(settings.num_partitions),
            _source(settings.num_partitions, KAFKA_NUM_PARTITIONS),
            TYPE_INT,
        ),
        (
            "auto.create.topics.enable",
            "true" if settings.auto_create_topics else "false",
            _source(settings.auto_create_topics, True),
            TYPE_BOOLEAN,
        ),
        (
            "log.retention.ms",
            str(retention_ms),
            _source(retention_ms, KAFKA_RETENTION_MS),
            TYPE_LONG,
        ),
        ("log.retention.hours", "168", SOURCE_DEFAULT, TYPE_INT),
        (
            "log.retention.bytes",
            str(retention_bytes),
            _source(retention_bytes, NO_LIMIT),
            TYPE_LONG,
        ),
        (
            "log.segment.bytes",
            str(storage.segment_bytes),
            _source(storage.segment_bytes, KAFKA_SEGMENT_BYTES),
            TYPE_INT,
        ),
        ("log.cleanup.policy", CLEANUP_DELETE, SOURCE_DEFAULT, TYPE_LIST),
        ("compression.type", "producer", SOURCE_DEFAULT, TYPE_STRING),
        ("message.max.bytes", str(MAX_MESSAGE_BYTES), SOURCE_DEFAULT, TYPE_INT),
        ("default.replication.factor", "1", SOURCE_DEFAULT, TYPE_INT),
        ("offsets.topic.replication.factor", "1", SOURCE_DEFAULT, TYPE_INT),
        ("transaction.state.log.replication.factor", "1", SOURCE_DEFAULT, TYPE_INT),
        ("min.insync.replicas", "1", SOURCE_DEFAULT, TYPE_INT),
        ("unclean.leader.election.enable", "false", SOURCE_DEFAULT, TYPE_BOOLEAN),
        ("delete.topic.enable", "true", SOURCE_DEFAULT, TYPE_BOOLEAN),
    ]


# -- altering a topic ------------------------------------------------------------------------

# (error, message) of one resource's alteration.
AlterResult = tuple[ErrorCode, str | None]
_OK: Final[AlterResult] = (ErrorCode.none, None)


def _invalid(message: str) -> AlterResult:
    return ErrorCode.invalid_config, message


def _check_value(name: str, value: str, in_effect: Mapping[str, str]) -> AlterResult:
    """Whether ``name = value`` may be set on a topic here."""
    if name not in KAFKA_TOPIC_CONFIG_NAMES:
        return _invalid(f"Unknown topic config name: {name}")
    if name in _LONG_CONFIGS:
        try:
            number = int(value.strip())
        except ValueError:
            return _invalid(
                f"Invalid value {value} for configuration {name}: Not a number of type LONG"
            )
        if number < NO_LIMIT:
            return _invalid(
                f"Invalid value {value} for configuration {name}: Value must be at least -1"
            )
        return _OK
    if name == CLEANUP_POLICY:
        policies = {policy.strip() for policy in value.split(",") if policy.strip()}
        if policies != {CLEANUP_DELETE}:
            return _invalid(
                f"Invalid value {value} for configuration {name}: only 'delete' is supported "
                "(this broker has no log compaction)"
            )
        return _OK
    if in_effect.get(name) == value:
        return _OK  # what is in effect already: nothing to change
    return _invalid(
        f"{name} cannot be altered on this broker (in effect: {in_effect.get(name)}); "
        f"alterable: {RETENTION_MS}, {RETENTION_BYTES}, {CLEANUP_POLICY}"
    )


def _list_operation(current: str, value: str, operation: int) -> str:
    items = [item.strip() for item in current.split(",") if item.strip()]
    changes = [item.strip() for item in value.split(",") if item.strip()]
    if operation == OP_APPEND:
        items += [item for item in changes if item not in items]
    else:
        items = [item for item in items if item not in changes]
    return ",".join(items)


def new_topic_configs(
    current: Mapping[str, str],
    in_effect: Mapping[str, str],
    configs: Any,
    *,
    incremental: bool,
) -> tuple[AlterResult, dict[str, str]]:
    """The topic's configs after the request's ``configs`` (kio entries with ``name``,
    ``value`` and, incremental, ``config_operation``), or the refusal."""
    names = [config.name for config in configs]
    result: dict[str, str] = dict(current) if incremental else {}
    for config in configs:
        name = config.name
        if names.count(name) > 1:
            return (ErrorCode.invalid_request, f"Error due to duplicate config keys: {name}"), {}
        operation = config.config_operation if incremental else OP_SET
        value = config.value
        if operation == OP_DELETE:
            if name not in KAFKA_TOPIC_CONFIG_NAMES:
                return _invalid(f"Unknown topic config name: {name}"), {}
            result.pop(name, None)
            continue
        if operation in (OP_APPEND, OP_SUBTRACT):
            if name != CLEANUP_POLICY:
                verb = "append" if operation == OP_APPEND else "subtract"
                return _invalid(f"Config value {verb} is not allowed for config key: {name}"), {}
            value = _list_operation(
                result.get(name, in_effect.get(name, "")), value or "", operation
            )
        elif operation != OP_SET:
            return (ErrorCode.invalid_request, f"Unknown operation type {operation}"), {}
        if value is None:
            if incremental:
                return (ErrorCode.invalid_request, f"Null value not supported for : {name}"), {}
            continue  # AlterConfigs: a null value is the default
        refusal = _check_value(name, value, in_effect)
        if refusal[0] != ErrorCode.none:
            return refusal, {}
        if name in _LONG_CONFIGS:
            value = str(int(value.strip()))
        result[name] = value
    return _OK, result


def retention_of(
    configs: Mapping[str, str], log_retention: tuple[int | None, int | None]
) -> tuple[int | None, int | None] | None:
    """The topic's own ``(ms, bytes)`` limits (None: no limit of that kind) from its configs,
    the log's filling the one not set; None when it sets neither."""
    if RETENTION_MS not in configs and RETENTION_BYTES not in configs:
        return None

    def limit(name: str, log_value: int | None) -> int | None:
        if name not in configs:
            return log_value
        number = int(configs[name])
        return None if number < 0 else number

    return limit(RETENTION_MS, log_retention[0]), limit(RETENTION_BYTES, log_retention[1])


async def alter_topic(
    context: KafkaContext,
    client: ClientContext,
    name: str,
    configs: Any,
    *,
    incremental: bool,
    validate_only: bool,
) -> AlterResult:
    """Alter one topic's configs (see the module docstring); the answer for its resource."""
    api = context.api
    info = None if is_system_topic(name) else api.topic_info(client, name)
    if info is None:
        return ErrorCode.unknown_topic_or_partition, f"topic {name!r} not found"
    in_effect = {row[0]: row[1] or "" for row in topic_configs(context, client, info)}
    current = given_configs(info)
    result, updated = new_topic_configs(current, in_effect, configs, incremental=incremental)
    if result[0] != ErrorCode.none or validate_only or updated == current:
        return result
    storage = api.storage_settings(client)
    limits = retention_of(updated, (storage.retention_ms, storage.retention_bytes))
    try:
        await api.set_topic_retention(client, name, limits)
    except TopicError as refused:
        return _invalid(str(refused))
    await api.when_durable(
        await api.set_topic_config(client, name, KAFKA_CONFIGS_KEY, updated or None)
    )
    log.info("kafka: topic %r configs now %s", name, updated)
    return _OK


async def apply_created_configs(
    context: KafkaContext, client: ClientContext, name: str, configs: Mapping[str, str | None]
) -> None:
    """Apply the retention a CreateTopics gave a new topic (its configs are kept already);
    values that are not numbers are left to the log's limits."""
    given = {key: value for key, value in configs.items() if value is not None}
    try:
        storage = context.api.storage_settings(client)
        limits = retention_of(given, (storage.retention_ms, storage.retention_bytes))
    except ValueError:
        log.info("kafka: topic %r created with a retention that is not a number: ignored", name)
        return
    if limits is not None:
        await context.api.set_topic_retention(client, name, limits)
