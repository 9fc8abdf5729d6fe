"""Cluster and topic APIs: ApiVersions, Metadata, FindCoordinator, DescribeCluster,
CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs (SASL: ``access.py``; ACLs and SCRAM credentials: ``acls.py``).

Configs (``admin_configs.py``): topics and the broker describe theirs, each with its real
source; a topic's retention and cleanup settings are altered there. A consumer
group has one config, ``braid.tag.filter`` (its tag filter, ``tagfilters.py``), that
DescribeConfigs reads and AlterConfigs/IncrementalAlterConfigs set, durably, on resource type
GROUP (32; 3 from librdkafka < 2.10). Every resource gets its own answer, as Kafka gives it:
altering the broker is refused with INVALID_REQUEST, other resource types too. The other admin
APIs are in ``admin_records.py`` and ``admin_cluster.py``, their handlers listed here.

The brokers, the partition leaders and the coordinators come from the Broker API's cluster
view (``leaders.py``): a node alone is node 0 at the advertised address, controller, and
leader (epoch 0) of every partition, with itself as the only replica and ISR; a cluster node
lists the live nodes, each partition led by the owner of its shard at the shard's epoch
(``replicas = isr = [leader]``; no live owner: leader -1 and LEADER_NOT_AVAILABLE), and names
itself controller (any node serves the controller's requests). A
Kafka topic is a core topic; its partitions are the topic's queues. Topics whose names Kafka
would refuse (AMQP exchange names with ``/`` or ``:``, say) are not shown to Kafka clients.
Internal topics, as Kafka flags ``__consumer_offsets`` (``is_internal``, so that consumers'
``exclude.internal.topics`` leaves them out of pattern subscriptions): the broker's ``__``
system topics that exist, a ``__consumer_offsets`` entry, and the half-message convention's
``braid.txn`` and ``braid.txn.check``. A Kafka client never creates a ``__`` topic.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import (
    COORDINATOR_GROUP,
    COORDINATOR_TXN,
    ClientContext,
    LeaderTable,
    TopicError,
    TopicInfo,
    is_system_topic,
)
from gateway.kafka import admin_cluster, admin_configs, admin_records, tagfilters
from gateway.kafka.access import allowed, config_refusal
from gateway.kafka.admin_configs import (
    KAFKA_CONFIGS_KEY,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    SOURCE_DEFAULT,
    SOURCE_DYNAMIC_TOPIC,
    SOURCE_STATIC_BROKER,
    TYPE_STRING,
    ConfigRow,
)
from gateway.kafka.apis import ApiKey, api_versions_response
from gateway.kafka.codec import Request
from gateway.kafka.context import (
    CONSUMER_OFFSETS_TOPIC,
    NODE_ID,
    Connection,
    Handler,
    KafkaContext,
    ResponseBody,
    is_internal_topic,
    is_legal_topic_name,
)
from gateway.kafka.entities import build_response
from gateway.kafka.leaders import NO_LEADER, NO_LEADER_EPOCH, broker_list, coordinator_address

log = logging.getLogger(__name__)

# DescribeConfigs resource types (ConfigResource.Type); the other config constants are
# admin_configs.py's.
RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
RESOURCE_GROUP: Final = tagfilters.CONFIG_RESOURCE_GROUP
SOURCE_DYNAMIC_GROUP: Final = 8  # ConfigSource.GROUP_CONFIG (KIP-848)
# Kafka's KRaft controller refuses a CreateTopics or CreatePartitions that adds more partitions
# than this in all, every topic of it with POLICY_VIOLATION and this message
# (ReplicationControlManager.MAX_PARTITIONS_PER_BATCH, validateTotalNumberOfPartitions).
MAX_PARTITIONS_PER_REQUEST: Final = 10_000
TOO_MANY_PARTITIONS_MESSAGE: Final = "Excessively large number of partitions per request."
# The Kafka error of each TopicError code the topic caps raise (core/broker/topics.py).
_CAP_ERRORS: Final = {
    "invalid_partitions": ErrorCode.invalid_partitions,
    "policy_violation": ErrorCode.policy_violation,
}
# FindCoordinator key types (FindCoordinatorRequest.CoordinatorType) and the cluster view's
# coordinator kind of each.
KEY_TYPE_GROUP: Final = 0
KEY_TYPE_TRANSACTION: Final = 1
_COORDINATOR_KINDS: Final = {
    KEY_TYPE_GROUP: COORDINATOR_GROUP,
    KEY_TYPE_TRANSACTION: COORDINATOR_TXN,
}
# FindCoordinator v4 (KIP-699) batches keys: one answer per key in ``coordinators``.
FIRST_BATCHED_FIND_COORDINATOR: Final = 4
# Kafka's "authorized operations not requested" marker (Integer.MIN_VALUE).
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)


def kafka_topics(context: KafkaContext, client: ClientContext) -> list[TopicInfo]:
    """The topics Kafka clients see (legal names, no system topics)."""
    return [info for info in context.api.list_topics(client) if is_legal_topic_name(info.name)]


def internal_topics(context: KafkaContext, connection: Connection) -> list[TopicInfo]:
    """The internal topics Metadata lists besides the topics (``braid.txn`` and
    ``braid.txn.check`` are topics, flagged there): the broker's ``__`` system topics that
    exist, and ``__consumer_offsets``."""
    listed = context.api.system_topics(connection.client)
    if not any(info.name == CONSUMER_OFFSETS_TOPIC for info in listed):
        listed.append(TopicInfo(CONSUMER_OFFSETS_TOPIC, 1))
    return listed


def _topic_metadata(
    context: KafkaContext,
    connection: Connection,
    name: str,
    error: ErrorCode,
    info: TopicInfo | None,
) -> dict[str, Any]:
    return {
        "error_code": error,
        "name": name,
        "is_internal": is_internal_topic(name),
        "partitions": partition_metadata(context, connection, name, info.queues)
        if info is not None
        else [],
    }


# A partition whose shard has no live owner (Kafka's answer for a partition without a leader).
_NO_LEADER_PARTITION: Final = {
    "error_code": ErrorCode.leader_not_available,
    "leader_id": NO_LEADER,
    "leader_epoch": NO_LEADER_EPOCH,
    "replica_nodes": (),
    "isr_nodes": (),
    "offline_replicas": (),
}


def partition_metadata(
    context: KafkaContext, connection: Connection, topic: str, count: int
) -> list[dict[str, Any]]:
    """Each partition's leader (the owner of its shard), its only replica and ISR."""
    api = context.api
    table: LeaderTable | None = api.leader_table(connection.client)
    partitions = []
    for index in range(count):
        leader = (
            table[topic, index]
            if table is not None
            else api.partition_leader(connection.client, topic, index)
        )
        if leader is None:
            partitions.append({**_NO_LEADER_PARTITION, "partition_index": index})
            continue
        partitions.append(
            {
                "error_code": ErrorCode.none,
                "partition_index": index,
                "leader_id": leader.node_id,
                "leader_epoch": leader.epoch,
                "replica_nodes": (leader.node_id,),
                "isr_nodes": (leader.node_id,),
                "offline_replicas": (),
            }
        )
    return partitions


def check_queue_limit(
    context: KafkaContext, client: ClientContext, name: str, added: int, *, new_topic: bool
) -> None:
    """Raise a ``policy_violation`` :class:`TopicError` (POLICY_VIOLATION, 44) when ``added``
    partitions of topic ``name`` would pass the queue limits of the client's vhost (``/``):
    each Kafka partition is a queue (docs/limits.md), so ``max-queues`` and ``[limits]
    max_queues`` count them as RabbitMQ counts queues."""
    action = (
        f"create topic '{name}' with {added} partitions"
        if new_topic
        else f"add {added} partitions to topic '{name}'"
    )
    refusal = context.api.queue_limit_refusal(client, name, added, action)
    if refusal is not None:
        log.info("kafka: %s: %s", client.peer or client.connection_id, refusal.text)
        raise TopicError("policy_violation", refusal.text)


async def declare_kafka_topic(
    context: KafkaContext,
    client: ClientContext,
    name: str,
    partitions: int,
    configs: dict[str, str] | None = None,
) -> TopicInfo:
    check_queue_limit(context, client, name, partitions, new_topic=True)
    config: dict[str, Any] = {KAFKA_CONFIGS_KEY: configs} if configs else {}
    info = await context.api.create_topic(client, name, partitions, config)
    if configs:
        await admin_configs.apply_created_configs(context, client, name, configs)
    context.metrics["topics_created"] = context.metrics.get("topics_created", 0) + 1
    return info


async def handle_api_versions(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    return api_versions_response(request.api_version, throttle_time_ms=context.throttle_ms())


async def handle_metadata(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    version = request.api_version
    requested = body.topics
    topics: list[dict[str, Any]] = []
    if requested is None or (version == 0 and not requested):
        # null (v1+) or empty (v0): every topic, the internal ones flagged
        listed = kafka_topics(context, connection.client) + internal_topics(context, connection)
        for each in sorted(listed, key=lambda listed_topic: listed_topic.name):
            # As Kafka: only the topics the principal may describe are listed.
            if allowed(context, connection, "kafka Metadata", each.name):
                topics.append(_topic_metadata(context, connection, each.name, ErrorCode.none, each))
    else:
        allow_create = context.settings.auto_create_topics and getattr(
            body, "allow_auto_topic_creation", True
        )
        internal: dict[str, TopicInfo] | None = None
        seen: set[str] = set()
        for item in requested:
            name = item.name
            if name in seen:
                continue
            seen.add(name)
            info: TopicInfo | None = None
            error = ErrorCode.none
            if not allowed(context, connection, "kafka Metadata", name):
                # Kafka: TOPIC_AUTHORIZATION_FAILED without DESCRIBE, whether it exists or not.
                topics.append(
                    _topic_metadata(
                        context, connection, name, ErrorCode.topic_authorization_failed, None
                    )
                )
                continue
            if is_system_topic(name):
                if internal is None:
                    internal = {
                        system.name: system for system in internal_topics(context, connection)
                    }
                info = internal.get(name)
                if info is None:
                    # "__" names are the broker's: none is created for a client.
                    error = ErrorCode.invalid_topic_exception
            else:
                info = context.api.topic_info(connection.client, name)
            if info is None and error == ErrorCode.none:
                if not is_legal_topic_name(name):
                    error = ErrorCode.invalid_topic_exception
                elif allow_create and allowed(context, connection, "kafka CreateTopics", name):
                    try:
                        info = await declare_kafka_topic(
                            context,
                            connection.client,
                            name,
                            context.settings.num_partitions,
                        )
                    except TopicError as refused:
                        error = _CAP_ERRORS.get(refused.code, ErrorCode.invalid_topic_exception)
                else:
                    error = ErrorCode.unknown_topic_or_partition
            topics.append(_topic_metadata(context, connection, name, error, info))
    return build_response(
        ApiKey.METADATA,
        version,
        {
            "throttle_time": context.throttle_ms(),
            "brokers": broker_list(context, connection),
            "cluster_id": context.settings.cluster_id,
            "controller_id": context.api.this_node(),
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        },
    )


def _coordinator(
    context: KafkaContext, connection: Connection, key_type: int, key: str
) -> tuple[ErrorCode, int, str, int]:
    """One key's coordinator: (error, node id, host, port); node -1, "" and -1 on an error."""
    if key_type not in _COORDINATOR_KINDS:
        return ErrorCode.invalid_request, -1, "", -1
    if key_type == KEY_TYPE_GROUP and not allowed(
        context, connection, "kafka FindCoordinator group", key
    ):
        return ErrorCode.group_authorization_failed, -1, "", -1
    if key_type == KEY_TYPE_TRANSACTION and not allowed(
        context, connection, "kafka FindCoordinator transaction", key
    ):
        return ErrorCode.transactional_id_authorization_failed, -1, "", -1
    return coordinator_address(context, connection, _COORDINATOR_KINDS[key_type], key)


async def handle_find_coordinator(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    """The owner of the key's shard (group: ``h(group)``, transaction: ``h(id)``), or
    COORDINATOR_NOT_AVAILABLE when it has none; v4+ answers each of its keys."""
    body: Any = request.body
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
    if request.api_version >= FIRST_BATCHED_FIND_COORDINATOR:
        coordinators = []
        for key in body.coordinator_keys:
            error, node_id, host, port = _coordinator(context, connection, key_type, key)
            coordinators.append(
                {
                    "key": key,
                    "node_id": node_id,
                    "host": host,
                    "port": port,
                    "error_code": error,
                    "error_message": None,
                }
            )
        return build_response(
            ApiKey.FIND_COORDINATOR,
            request.api_version,
            {"throttle_time": context.throttle_ms(), "coordinators": coordinators},
        )
    error, node_id, host, port = _coordinator(context, connection, key_type, body.key)
    return build_response(
        ApiKey.FIND_COORDINATOR,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": error,
            "error_message": None,
            "node_id": node_id,
            "host": host,
            "port": port,
        },
    )


async def handle_describe_cluster(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    return build_response(
        ApiKey.DESCRIBE_CLUSTER,
        request.api_version,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "endpoint_type": getattr(request.body, "endpoint_type", 1),
            "cluster_id": context.settings.cluster_id,
            "controller_id": context.api.this_node(),
            "brokers": broker_list(context, connection),
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        },
    )


async def handle_create_topics(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    results = []
    names = [topic.name for topic in body.topics]
    requested = [
        len(topic.assignments)
        if topic.assignments
        else context.settings.num_partitions
        if topic.num_partitions == -1
        else topic.num_partitions
        for topic in body.topics
    ]
    too_many = sum(count for count in requested if count > 0) > MAX_PARTITIONS_PER_REQUEST
    if too_many:
        log.info(
            "kafka: %s CreateTopics asks for %d partitions: refused (at most %d per request)",
            connection.peer,
            sum(count for count in requested if count > 0),
            MAX_PARTITIONS_PER_REQUEST,
        )
    for topic, partitions in zip(body.topics, requested, strict=True):
        name = topic.name
        error = ErrorCode.none
        message: str | None = None
        configs = {config.name: config.value for config in topic.configs}
        if too_many:
            # Kafka checks the request's total before anything else, names included.
            error, message = ErrorCode.policy_violation, TOO_MANY_PARTITIONS_MESSAGE
        elif names.count(name) > 1:
            error, message = ErrorCode.invalid_request, "topic named more than once"
        elif not is_legal_topic_name(name) or is_system_topic(name):
            error, message = ErrorCode.invalid_topic_exception, f"illegal topic name {name!r}"
        elif not allowed(context, connection, "kafka CreateTopics", name):
            error = ErrorCode.topic_authorization_failed
            message = "Authorization failed."
        elif context.api.has_topic(connection.client, name):
            error, message = ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        elif topic.replication_factor not in (-1, 1):
            error = ErrorCode.invalid_replication_factor
            message = "this cluster has one broker: replication factor 1"
        elif any(tuple(a.broker_ids) != (NODE_ID,) for a in topic.assignments):
            error, message = ErrorCode.invalid_replica_assignment, "the only broker is node 0"
        elif partitions < 1:
            error, message = ErrorCode.invalid_partitions, "at least one partition"
        else:
            try:
                if body.validate_only:
                    context.api.check_topic_partitions(connection.client, name, partitions, 0)
                    check_queue_limit(context, connection.client, name, partitions, new_topic=True)
                else:
                    await declare_kafka_topic(context, connection.client, name, partitions, configs)
            except TopicError as refused:
                error, message = _cap_error(refused), str(refused)
                log.info("kafka: %s CreateTopics %r refused: %s", connection.peer, name, message)
        ok = error == ErrorCode.none
        results.append(
            {
                "name": name,
                "error_code": error,
                "error_message": message,
                "num_partitions": partitions if ok else -1,
                "replication_factor": 1 if ok else -1,
                "configs": [] if ok else None,
            }
        )
    return build_response(
        ApiKey.CREATE_TOPICS, request.api_version, {"throttle_time": 0, "topics": results}
    )


def _cap_error(refused: TopicError) -> ErrorCode:
    """The Kafka error of a topic declaration the core refused."""
    return _CAP_ERRORS.get(refused.code, ErrorCode.invalid_request)


async def handle_delete_topics(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    responses = []
    body: Any = request.body
    for name in body.topic_names:
        error = ErrorCode.none
        if not is_system_topic(name) and not allowed(
            context, connection, "kafka DeleteTopics", name
        ):
            error = ErrorCode.topic_authorization_failed
        elif is_system_topic(name) or not context.api.has_topic(connection.client, name):
            error = ErrorCode.unknown_topic_or_partition
        else:
            await context.api.delete_topic(connection.client, name)
            context.producer_states.forget_topic(name)
        responses.append({"name": name, "error_code": error, "error_message": None})
    return build_response(
        ApiKey.DELETE_TOPICS, request.api_version, {"throttle_time": 0, "responses": responses}
    )


async def handle_create_partitions(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    results = []
    added = 0
    for topic in body.topics:
        info = context.api.topic_info(connection.client, topic.name)
        if info is not None and topic.count > info.queues:
            added += topic.count - info.queues
    for topic in body.topics:
        info = context.api.topic_info(connection.client, topic.name)
        error = ErrorCode.none
        message: str | None = None
        if added > MAX_PARTITIONS_PER_REQUEST:
            error, message = ErrorCode.policy_violation, TOO_MANY_PARTITIONS_MESSAGE
        elif not allowed(context, connection, "kafka CreatePartitions", topic.name):
            error, message = ErrorCode.topic_authorization_failed, "Authorization failed."
        elif info is None or is_system_topic(topic.name):
            error = ErrorCode.unknown_topic_or_partition
        elif topic.count <= info.queues:
            error = ErrorCode.invalid_partitions
            message = f"topic {topic.name!r} has {info.queues} partitions already"
        elif topic.assignments and any(
            tuple(a.broker_ids) != (NODE_ID,) for a in topic.assignments
        ):
            error, message = ErrorCode.invalid_replica_assignment, "the only broker is node 0"
        else:
            try:
                added_here = topic.count - info.queues
                if body.validate_only:
                    context.api.check_topic_partitions(
                        connection.client, topic.name, topic.count, added_here
                    )
                check_queue_limit(
                    context, connection.client, topic.name, added_here, new_topic=False
                )
                if not body.validate_only:
                    await context.api.add_partitions(connection.client, topic.name, topic.count)
            except TopicError as refused:
                error, message = _cap_error(refused), str(refused)
        if error == ErrorCode.policy_violation or error == ErrorCode.invalid_partitions:
            log.info(
                "kafka: %s CreatePartitions %r refused: %s", connection.peer, topic.name, message
            )
        results.append({"name": topic.name, "error_code": error, "error_message": message})
    return build_response(
        ApiKey.CREATE_PARTITIONS, request.api_version, {"throttle_time": 0, "results": results}
    )


def _topic_configs(
    context: KafkaContext, client: ClientContext, info: TopicInfo
) -> list[ConfigRow]:
    return admin_configs.topic_configs(context, client, info)


def _group_configs(context: KafkaContext, group_id: str) -> list[ConfigRow]:
    """A group's one config: its tag filter, set by an admin client (GROUP_CONFIG), by the
    config file (STATIC_BROKER_CONFIG) or not at all (DEFAULT_CONFIG, null: no filter)."""
    value, origin = tagfilters.group_tag_filters(context.api).setting(group_id)
    source = {"runtime": SOURCE_DYNAMIC_GROUP, "file": SOURCE_STATIC_BROKER}.get(
        origin, SOURCE_DEFAULT
    )
    return [(tagfilters.TAG_FILTER_CONFIG, value, source, TYPE_STRING)]


# What a resource's alteration comes to: (error, message) or, for a group, the filter to store
# (``None``: back to the config file's) when the request is not validate-only.
_AlterResult = tuple[ErrorCode, str | None]


def _alter_other(
    context: KafkaContext, client: ClientContext, resource_type: int, resource_name: str
) -> _AlterResult:
    """The answer to altering a resource that is neither a group nor a topic."""
    if resource_type == RESOURCE_BROKER:
        return (
            ErrorCode.invalid_request,
            "broker configs cannot be altered at runtime (the broker's config file sets them)",
        )
    return ErrorCode.invalid_request, f"resource type {resource_type} is not supported"


def _check_filter(value: str | None, *, null_deletes: bool) -> tuple[_AlterResult, str | None]:
    """The expression to store for ``braid.tag.filter = value`` (``None``: delete)."""
    if value is None:
        if null_deletes:
            return (ErrorCode.none, None), None
        return (
            ErrorCode.invalid_request,
            f"Null value not supported for : {tagfilters.TAG_FILTER_CONFIG}",
        ), None
    problem = tagfilters.expression_error(value)
    if problem is not None:
        return (
            ErrorCode.invalid_config,
            f"Invalid value {value!r} for configuration {tagfilters.TAG_FILTER_CONFIG}: {problem}",
        ), None
    text = value.strip()
    return (ErrorCode.none, None), text or "*"


def _unknown_group_config(name: str) -> _AlterResult:
    return (
        ErrorCode.invalid_config,
        f"Unknown group config name: {name} (a group has {tagfilters.TAG_FILTER_CONFIG})",
    )


async def _alter_configs(
    context: KafkaContext, connection: Connection, request: Request, *, incremental: bool
) -> ResponseBody:
    """AlterConfigs and IncrementalAlterConfigs: one answer per resource, in request order."""
    client = connection.client
    body: Any = request.body
    registry = tagfilters.group_tag_filters(context.api)
    seen: dict[tuple[bool, int, str], int] = {}
    for resource in body.resources:
        is_group = resource.resource_type in tagfilters.GROUP_RESOURCE_TYPES
        key = (is_group, -1 if is_group else resource.resource_type, resource.resource_name)
        seen[key] = seen.get(key, 0) + 1
    responses = []
    for resource in body.resources:
        name = resource.resource_name
        is_group = resource.resource_type in tagfilters.GROUP_RESOURCE_TYPES
        key = (is_group, -1 if is_group else resource.resource_type, name)
        result: _AlterResult = (ErrorCode.none, None)
        refused = config_refusal(context, connection, resource.resource_type, name, alter=True)
        if refused is not None:
            result = refused
        elif seen[key] > 1:
            result = ErrorCode.invalid_request, f"resource {name!r} is named more than once"
        elif resource.resource_type == RESOURCE_TOPIC:
            result = await admin_configs.alter_topic(
                context,
                client,
                name,
                resource.configs,
                incremental=incremental,
                validate_only=body.validate_only,
            )
        elif not is_group:
            result = _alter_other(context, client, resource.resource_type, name)
        elif not name:
            result = ErrorCode.invalid_request, "the group name must not be empty"
        else:
            names = [config.name for config in resource.configs]
            change: str | None = None
            changed = not incremental  # AlterConfigs replaces the whole set: absent = reset
            for config in resource.configs:
                if names.count(config.name) > 1:
                    result = (
                        ErrorCode.invalid_request,
                        f"Error due to duplicate config keys: {config.name}",
                    )
                    break
                if config.name != tagfilters.TAG_FILTER_CONFIG:
                    result = _unknown_group_config(config.name)
                    break
                operation = config.config_operation if incremental else OP_SET
                if operation == OP_DELETE:
                    change, changed = None, True
                elif operation == OP_SET:
                    result, change = _check_filter(config.value, null_deletes=not incremental)
                    changed = True
                elif operation in (OP_APPEND, OP_SUBTRACT):
                    verb = "append" if operation == OP_APPEND else "subtract"
                    result = (
                        ErrorCode.invalid_config,
                        f"Config value {verb} is not allowed for config key: {config.name} "
                        "(SET the whole expression, TagA || TagB)",
                    )
                else:
                    result = ErrorCode.invalid_request, f"Unknown operation type {operation}"
                if result[0] != ErrorCode.none:
                    break
            if result[0] == ErrorCode.none and changed and not body.validate_only:
                await registry.store_filter(client, name, change)
        responses.append(
            {
                "error_code": result[0],
                "error_message": result[1],
                # As sent: librdkafka matches answers to its resources by (type, name).
                "resource_type": resource.resource_type,
                "resource_name": name,
            }
        )
    api_key = ApiKey.INCREMENTAL_ALTER_CONFIGS if incremental else ApiKey.ALTER_CONFIGS
    return build_response(
        api_key,
        request.api_version,
        {"throttle_time": context.throttle_ms(), "responses": responses},
    )


async def handle_alter_configs(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    return await _alter_configs(context, connection, request, incremental=False)


async def handle_incremental_alter_configs(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    return await _alter_configs(context, connection, request, incremental=True)


async def handle_describe_configs(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    results = []
    body: Any = request.body
    for resource in body.resources:
        error = ErrorCode.none
        message: str | None = None
        entries: list[ConfigRow] = []
        refused = config_refusal(
            context, connection, resource.resource_type, resource.resource_name, alter=False
        )
        if refused is not None:
            error, message = refused
        elif resource.resource_type == RESOURCE_TOPIC:
            info = context.api.topic_info(connection.client, resource.resource_name)
            if info is None or is_system_topic(resource.resource_name):
                error = ErrorCode.unknown_topic_or_partition
            else:
                entries = _topic_configs(context, connection.client, info)
        elif resource.resource_type == RESOURCE_BROKER:
            this_node = str(context.api.this_node())
            if resource.resource_name not in ("", this_node):
                error, message = ErrorCode.invalid_request, f"this broker is node {this_node}"
            else:
                entries = admin_configs.broker_configs(context, connection, connection.client)
        elif resource.resource_type in tagfilters.GROUP_RESOURCE_TYPES:
            if not resource.resource_name:
                error, message = ErrorCode.invalid_request, "the group name must not be empty"
            else:
                entries = _group_configs(context, resource.resource_name)
        else:
            error = ErrorCode.invalid_request
            message = f"resource type {resource.resource_type} is not supported"
        wanted = resource.configuration_keys
        if wanted is not None:
            entries = [entry for entry in entries if entry[0] in wanted]
        # Kafka: every topic config may be altered (read_only false), so may a group's.
        writable = resource.resource_type in tagfilters.GROUP_RESOURCE_TYPES or (
            resource.resource_type == RESOURCE_TOPIC
        )
        results.append(
            {
                "error_code": error,
                "error_message": message,
                "resource_type": resource.resource_type,
                "resource_name": resource.resource_name,
                "configs": [
                    {
                        "name": name,
                        "value": value,
                        "read_only": not writable and source != SOURCE_DYNAMIC_TOPIC,
                        "config_source": source,
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": config_type,
                        "documentation": None,
                    }
                    for name, value, source, config_type in entries
                ],
            }
        )
    return build_response(
        ApiKey.DESCRIBE_CONFIGS, request.api_version, {"throttle_time": 0, "results": results}
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.API_VERSIONS: handle_api_versions,
    ApiKey.METADATA: handle_metadata,
    ApiKey.FIND_COORDINATOR: handle_find_coordinator,
    ApiKey.DESCRIBE_CLUSTER: handle_describe_cluster,
    ApiKey.CREATE_TOPICS: handle_create_topics,
    ApiKey.DELETE_TOPICS: handle_delete_topics,
    ApiKey.CREATE_PARTITIONS: handle_create_partitions,
    ApiKey.DESCRIBE_CONFIGS: handle_describe_configs,
    ApiKey.ALTER_CONFIGS: handle_alter_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
    **admin_records.HANDLERS,
    **admin_cluster.HANDLERS,
}
