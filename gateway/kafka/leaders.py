"""Brokers, partition leaders and coordinators as this broker tells Kafka clients (docs/cluster.md
section 8), from the Broker API's cluster view (``core/api/cluster.py``).

- Brokers: every live node serving Kafka. This node's own address is the one the client came
  in on (or the advertised one, and the TLS port to a TLS client: ``Connection.advertised``);
  another node's is what it registered, its TLS port to a TLS client when it has one.
- A partition request (Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords) for a
  partition this node does not lead: NOT_LEADER_OR_FOLLOWER (6), the client refreshes its
  metadata and goes to the leader; on the leader, a ``current_leader_epoch`` below the
  partition's: FENCED_LEADER_EPOCH (74), above: UNKNOWN_LEADER_EPOCH (75), as Kafka's
  ``Partition.checkCurrentLeaderEpoch`` (-1: the client did not say, nothing checked). A node
  alone has no leader table: it leads everything, and nothing is checked.
- A group or transaction request on a node that does not coordinate its key: NOT_COORDINATOR
  (16); FindCoordinator with no live coordinator: COORDINATOR_NOT_AVAILABLE (15).
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import BrokerNode, LeaderTable, PartitionLeader
from gateway.kafka.context import Connection, KafkaContext

# RecordBatch.NO_PARTITION_LEADER_EPOCH: a request's current_leader_epoch not given.
NO_LEADER_EPOCH: Final = -1
NO_LEADER: Final = -1


def broker_address(
    context: KafkaContext, connection: Connection, broker: BrokerNode
) -> tuple[str, int]:
    """The address a client is told for ``broker``."""
    if broker.node_id == context.api.this_node():
        return connection.advertised(context.settings)
    if connection.tls and broker.tls_port is not None:
        return broker.host, broker.tls_port
    return broker.host, broker.port


def broker_list(context: KafkaContext, connection: Connection) -> list[dict[str, Any]]:
    """Metadata's and DescribeCluster's brokers."""
    listed = []
    for broker in context.api.brokers(connection.client):
        host, port = broker_address(context, connection, broker)
        listed.append(
            {
                "node_id": broker.node_id,
                "broker_id": broker.node_id,
                "host": host,
                "port": port,
                "rack": broker.rack,
            }
        )
    return listed


def find_broker(
    context: KafkaContext, connection: Connection, node_id: int
) -> tuple[str, int] | None:
    """The address of broker ``node_id``, or None when it is not a live broker."""
    for broker in context.api.brokers(connection.client):
        if broker.node_id == node_id:
            return broker_address(context, connection, broker)
    return None


def leader_error(
    leader: PartitionLeader | None, this_node: int, current_leader_epoch: int = NO_LEADER_EPOCH
) -> ErrorCode:
    """The error of a partition request on this node, given the partition's leader."""
    if leader is None or leader.node_id != this_node:
        return ErrorCode.not_leader_or_follower
    if current_leader_epoch != NO_LEADER_EPOCH:
        if current_leader_epoch < leader.epoch:
            return ErrorCode.fenced_leader_epoch
        if current_leader_epoch > leader.epoch:
            return ErrorCode.unknown_leader_epoch
    return ErrorCode.none


def partition_check(
    table: LeaderTable | None,
    this_node: int,
    topic: str,
    partition: int,
    current_leader_epoch: int = NO_LEADER_EPOCH,
) -> ErrorCode:
    """:func:`leader_error` of a partition by the leader table (None: a node alone, which
    leads every partition: no error)."""
    if table is None:
        return ErrorCode.none
    return leader_error(table[topic, partition], this_node, current_leader_epoch)


def coordinator_error(
    context: KafkaContext, connection: Connection, kind: str, key: str | None
) -> ErrorCode:
    """NOT_COORDINATOR when another node (or none) coordinates ``key`` of ``kind``."""
    api = context.api
    if key is None:
        return ErrorCode.none
    if api.coordinator(connection.client, kind, key) != api.this_node():
        return ErrorCode.not_coordinator
    return ErrorCode.none


def coordinator_address(
    context: KafkaContext, connection: Connection, kind: str, key: str
) -> tuple[ErrorCode, int, str, int]:
    """FindCoordinator's answer for one key: (error, node id, host, port); no live
    coordinator, or one that serves no Kafka listener: COORDINATOR_NOT_AVAILABLE."""
    node_id = context.api.coordinator(connection.client, kind, key)
    address = find_broker(context, connection, node_id) if node_id is not None else None
    if node_id is None or address is None:
        return ErrorCode.coordinator_not_available, NO_LEADER, "", -1
    return ErrorCode.none, node_id, address[0], address[1]
