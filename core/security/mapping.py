"""One permission model for three protocols: which resource of which vhost each protocol
operation touches, and which permission it needs. The table is data (:data:`OPERATIONS`);
``docs/security.md`` prints it and the tests iterate over it.

Names (the issue's rule, RabbitMQ's vhost layout as ``docs/mapping.md`` gives it):

- a log topic ``amq.vhost.V.R`` is resource ``R`` of vhost ``V``; every other name belongs to
  vhost ``/``;
- within a vhost, ``amq.queue.Q`` is queue ``Q`` and any other name is exchange of that name;
  so Kafka topic ``T`` is exchange ``T``, MQTT ``T/a/b`` is exchange ``T`` with routing key
  ``a.b``, and an AMQP queue is reached from Kafka as topic ``amq.queue.Q``;
- Kafka group ids and transactional ids follow the same vhost rule, and are checked against the
  read (groups) and write (transactional ids) expressions.

Permissions are RabbitMQ's three (configure, write, read), plus ``describe`` (any of the three
matches: what Kafka's DESCRIBE shows, such as a topic in Metadata) and ``administrator`` (the
user's tag: the cluster-wide Kafka admin operations). Each row also names the Kafka ACL
operation it is (the resource type follows from the resource: exchanges and queues are TOPIC
resources named by their log topic, groups GROUP, transactional ids TRANSACTIONAL_ID, the rest
CLUSTER ``kafka-cluster``), so that Kafka ACLs add to the vhost permissions: an ALLOW from
either source grants, a DENY ACL always wins.

Pure data and functions; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Resources
EXCHANGE: Final = "exchange"
QUEUE: Final = "queue"
TOPIC: Final = "topic"  # a log topic: an exchange or a queue, by its name
GROUP: Final = "group"
TRANSACTIONAL_ID: Final = "transactional_id"
CLUSTER: Final = "cluster"

# Permissions
CONFIGURE: Final = "configure"
WRITE: Final = "write"
READ: Final = "read"
DESCRIBE: Final = "describe"
ADMINISTRATOR: Final = "administrator"
PERMISSIONS: Final = (CONFIGURE, WRITE, READ, DESCRIBE, ADMINISTRATOR)

AMQP: Final = "amqp"
MQTT: Final = "mqtt"
KAFKA: Final = "kafka"

DEFAULT_VHOST: Final = "/"
VHOST_TOPIC_PREFIX: Final = "amq.vhost."
QUEUE_TOPIC_PREFIX: Final = "amq.queue."
# RabbitMQ names the default exchange "" as the resource "amq.default" in permission checks.
DEFAULT_EXCHANGE_RESOURCE: Final = "amq.default"


@dataclass(frozen=True, slots=True)
class OperationRule:
    """One protocol operation: what it touches and needs.

    ``name`` is the key gateways pass (:data:`OPERATIONS`); ``resource`` one of the resource
    kinds above (``topic``: the name passed is a log topic, an exchange or a queue by its name);
    ``permission`` one of :data:`PERMISSIONS`; ``routing_key``: topic permissions apply to the
    routing key (or pattern) passed with the check (``write`` or ``read`` expression, as the
    permission); ``kafka_operation``: the Kafka ACL operation it counts as.
    """

    name: str
    protocol: str
    operation: str
    resource: str
    permission: str
    kafka_operation: str
    routing_key: bool = False


def _rule(
    protocol: str,
    operation: str,
    resource: str,
    permission: str,
    kafka_operation: str,
    *,
    routing_key: bool = False,
) -> OperationRule:
    return OperationRule(
        f"{protocol} {operation}",
        protocol,
        operation,
        resource,
        permission,
        kafka_operation,
        routing_key,
    )


OPERATION_LIST: Final = (
    # AMQP 0-9-1, as RabbitMQ's rabbit_channel checks them (names passed: log topics).
    _rule(AMQP, "exchange.declare", EXCHANGE, CONFIGURE, "CREATE"),
    # A new exchange with an alternate exchange: read on it, write on the alternate (what it
    # routes there), as rabbit_channel checks them.
    _rule(AMQP, "exchange.declare with alternate-exchange", EXCHANGE, READ, "READ"),
    _rule(AMQP, "exchange.declare alternate-exchange", EXCHANGE, WRITE, "WRITE"),
    _rule(AMQP, "exchange.delete", EXCHANGE, CONFIGURE, "DELETE"),
    _rule(AMQP, "exchange.bind destination", EXCHANGE, WRITE, "WRITE"),
    _rule(AMQP, "exchange.bind source", EXCHANGE, READ, "READ", routing_key=True),
    _rule(AMQP, "exchange.unbind destination", EXCHANGE, WRITE, "WRITE"),
    _rule(AMQP, "exchange.unbind source", EXCHANGE, READ, "READ", routing_key=True),
    _rule(AMQP, "queue.declare", QUEUE, CONFIGURE, "CREATE"),
    # A new queue with a dead-letter exchange: read on the queue (its messages leave through
    # the dead-letter exchange), write on the dead-letter exchange.
    _rule(AMQP, "queue.declare with x-dead-letter-exchange", QUEUE, READ, "READ"),
    _rule(AMQP, "queue.declare x-dead-letter-exchange", EXCHANGE, WRITE, "WRITE"),
    _rule(AMQP, "queue.delete", QUEUE, CONFIGURE, "DELETE"),
    _rule(AMQP, "queue.purge", QUEUE, READ, "DELETE"),
    _rule(AMQP, "queue.bind queue", QUEUE, WRITE, "WRITE"),
    _rule(AMQP, "queue.bind exchange", EXCHANGE, READ, "READ", routing_key=True),
    _rule(AMQP, "queue.unbind queue", QUEUE, WRITE, "WRITE"),
    _rule(AMQP, "queue.unbind exchange", EXCHANGE, READ, "READ", routing_key=True),
    _rule(AMQP, "basic.publish", TOPIC, WRITE, "WRITE", routing_key=True),
    _rule(AMQP, "basic.consume", QUEUE, READ, "READ"),
    _rule(AMQP, "basic.get", QUEUE, READ, "READ"),
    # MQTT 3.1.1 / 5.0: T/a/b is exchange T (a log topic), routing key a.b.
    _rule(MQTT, "PUBLISH", TOPIC, WRITE, "WRITE", routing_key=True),
    _rule(MQTT, "will", TOPIC, WRITE, "WRITE", routing_key=True),
    _rule(MQTT, "SUBSCRIBE", TOPIC, READ, "READ", routing_key=True),
    # A filter whose first level is a wildcard: checked for each record it would deliver.
    _rule(MQTT, "deliver", TOPIC, READ, "READ", routing_key=True),
    # Kafka: topics (log topics), groups, transactional ids, the cluster.
    _rule(KAFKA, "Produce", TOPIC, WRITE, "WRITE"),
    _rule(KAFKA, "Fetch", TOPIC, READ, "READ"),
    _rule(KAFKA, "ListOffsets", TOPIC, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "Metadata", TOPIC, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "OffsetCommit topic", TOPIC, READ, "READ"),
    _rule(KAFKA, "OffsetFetch topic", TOPIC, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "CreateTopics", TOPIC, CONFIGURE, "CREATE"),
    _rule(KAFKA, "DeleteTopics", TOPIC, CONFIGURE, "DELETE"),
    _rule(KAFKA, "DeleteRecords", TOPIC, CONFIGURE, "DELETE"),
    _rule(KAFKA, "CreatePartitions", TOPIC, CONFIGURE, "ALTER"),
    _rule(KAFKA, "AlterConfigs topic", TOPIC, CONFIGURE, "ALTER_CONFIGS"),
    _rule(KAFKA, "DescribeConfigs topic", TOPIC, DESCRIBE, "DESCRIBE_CONFIGS"),
    _rule(KAFKA, "AddPartitionsToTxn topic", TOPIC, WRITE, "WRITE"),
    _rule(KAFKA, "TxnOffsetCommit topic", TOPIC, READ, "READ"),
    _rule(KAFKA, "DescribeProducers", TOPIC, READ, "READ"),
    _rule(KAFKA, "JoinGroup", GROUP, READ, "READ"),
    _rule(KAFKA, "SyncGroup", GROUP, READ, "READ"),
    _rule(KAFKA, "Heartbeat", GROUP, READ, "READ"),
    _rule(KAFKA, "LeaveGroup", GROUP, READ, "READ"),
    _rule(KAFKA, "OffsetCommit", GROUP, READ, "READ"),
    _rule(KAFKA, "TxnOffsetCommit", GROUP, READ, "READ"),
    _rule(KAFKA, "AddOffsetsToTxn group", GROUP, READ, "READ"),
    _rule(KAFKA, "OffsetFetch", GROUP, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "FindCoordinator group", GROUP, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "DescribeGroups", GROUP, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "ListGroups", GROUP, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "DeleteGroups", GROUP, CONFIGURE, "DELETE"),
    _rule(KAFKA, "OffsetDelete", GROUP, CONFIGURE, "DELETE"),
    _rule(KAFKA, "AlterConfigs group", GROUP, CONFIGURE, "ALTER_CONFIGS"),
    _rule(KAFKA, "DescribeConfigs group", GROUP, DESCRIBE, "DESCRIBE_CONFIGS"),
    _rule(KAFKA, "InitProducerId", TRANSACTIONAL_ID, WRITE, "WRITE"),
    _rule(KAFKA, "AddPartitionsToTxn", TRANSACTIONAL_ID, WRITE, "WRITE"),
    _rule(KAFKA, "AddOffsetsToTxn", TRANSACTIONAL_ID, WRITE, "WRITE"),
    _rule(KAFKA, "EndTxn", TRANSACTIONAL_ID, WRITE, "WRITE"),
    _rule(KAFKA, "TxnOffsetCommit transaction", TRANSACTIONAL_ID, WRITE, "WRITE"),
    _rule(KAFKA, "FindCoordinator transaction", TRANSACTIONAL_ID, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "DescribeTransactions", TRANSACTIONAL_ID, DESCRIBE, "DESCRIBE"),
    _rule(KAFKA, "CreateAcls", CLUSTER, ADMINISTRATOR, "ALTER"),
    _rule(KAFKA, "DeleteAcls", CLUSTER, ADMINISTRATOR, "ALTER"),
    _rule(KAFKA, "DescribeAcls", CLUSTER, ADMINISTRATOR, "DESCRIBE"),
    _rule(KAFKA, "AlterUserScramCredentials", CLUSTER, ADMINISTRATOR, "ALTER"),
    _rule(KAFKA, "DescribeUserScramCredentials", CLUSTER, ADMINISTRATOR, "DESCRIBE"),
    _rule(KAFKA, "AlterConfigs broker", CLUSTER, ADMINISTRATOR, "ALTER_CONFIGS"),
    _rule(KAFKA, "DescribeConfigs broker", CLUSTER, ADMINISTRATOR, "DESCRIBE_CONFIGS"),
    _rule(KAFKA, "DescribeLogDirs", CLUSTER, ADMINISTRATOR, "DESCRIBE"),
    _rule(KAFKA, "ElectLeaders", CLUSTER, ADMINISTRATOR, "ALTER"),
    _rule(KAFKA, "AlterPartitionReassignments", CLUSTER, ADMINISTRATOR, "ALTER"),
    _rule(KAFKA, "ListPartitionReassignments", CLUSTER, ADMINISTRATOR, "DESCRIBE"),
)
OPERATIONS: Final = {rule.name: rule for rule in OPERATION_LIST}
assert len(OPERATIONS) == len(OPERATION_LIST), "operation names must be unique"

# Kafka ACL resource type of each resource kind.
KAFKA_RESOURCE_TYPES: Final = {
    EXCHANGE: "TOPIC",
    QUEUE: "TOPIC",
    TOPIC: "TOPIC",
    GROUP: "GROUP",
    TRANSACTIONAL_ID: "TRANSACTIONAL_ID",
    CLUSTER: "CLUSTER",
}
# A Kafka ACL for one of these operations also allows DESCRIBE (DESCRIBE_CONFIGS for
# ALTER_CONFIGS), as Kafka's AclAuthorizer has it; DENY ACLs imply nothing.
IMPLIED_BY_ALLOW: Final = {
    "DESCRIBE": ("DESCRIBE", "READ", "WRITE", "DELETE", "ALTER"),
    "DESCRIBE_CONFIGS": ("DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
}


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a name points in the permission model: ``kind`` of the resource (exchange, queue,
    group, transactional_id, cluster), its ``name`` within ``vhost``, and the Kafka ACL
    resource (``acl_type``, ``acl_name``: a log topic's full name)."""

    vhost: str
    kind: str
    name: str
    acl_type: str
    acl_name: str


def split_vhost(name: str) -> tuple[str, str]:
    """``(vhost, name within it)``: ``amq.vhost.V.R`` is ``(V, R)``; any other is ``("/", name)``.
    A vhost name has no ``.`` (gateway/amqp/vhost.py), so the first ``.`` after the prefix ends
    it."""
    if name.startswith(VHOST_TOPIC_PREFIX):
        vhost, dot, rest = name[len(VHOST_TOPIC_PREFIX) :].partition(".")
        if dot and vhost:
            return vhost, rest
    return DEFAULT_VHOST, name


def resource_of(kind: str, name: str) -> Resource:
    """The resource that ``name`` (a log topic for exchanges, queues and topics) is."""
    acl_type = KAFKA_RESOURCE_TYPES[kind]
    if kind == CLUSTER:
        return Resource(DEFAULT_VHOST, CLUSTER, "kafka-cluster", acl_type, "kafka-cluster")
    vhost, local = split_vhost(name)
    if kind in (TOPIC, QUEUE, EXCHANGE):
        if local.startswith(QUEUE_TOPIC_PREFIX):
            return Resource(vhost, QUEUE, local[len(QUEUE_TOPIC_PREFIX) :], acl_type, name)
        if kind == QUEUE:  # a queue named by itself, not by its topic
            return Resource(vhost, QUEUE, local, acl_type, name)
        return Resource(vhost, EXCHANGE, local or DEFAULT_EXCHANGE_RESOURCE, acl_type, name)
    return Resource(vhost, kind, local, acl_type, name)


def mqtt_filter_as_routing_pattern(levels_after_first: str) -> str:
    """An MQTT filter's levels after the first as the AMQP topic pattern RabbitMQ's MQTT plugin
    checks topic permissions against: ``a/+/b.c`` -> ``a.*.b/c`` (``#`` stays)."""
    return ".".join(
        "*" if level == "+" else level.replace(".", "/") for level in levels_after_first.split("/")
    )
