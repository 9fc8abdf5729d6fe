"""kafka_exporter's cluster and replica families on ``/metrics`` (issue 19 item 2), beside the
offset and lag families of ``prometheus.py``'s ``kafka()``, so a kafka_exporter dashboard
(grafana.com 7589) fills its broker and replication panels too.

BraidMQ is a one-broker cluster, as its Metadata answers say (``gateway/kafka/admin.py``): node
``0`` leads every partition, which has that one replica, in sync and preferred:

- ``kafka_brokers``: 1 while the Kafka listener runs (0 without it);
- ``kafka_broker_info{address, id}``: the listener's address and the node id;
- ``kafka_topic_partition_leader``, ``kafka_topic_partition_replicas``,
  ``kafka_topic_partition_in_sync_replica``, ``kafka_topic_partition_leader_is_preferred``,
  ``kafka_topic_partition_under_replicated_partition``: per ``{topic, partition}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from braid import metrics
from core.api import INTERNAL_CONTEXT, BrokerAPI

# The node id every Metadata answer gives this broker (gateway/kafka/context.py NODE_ID).
NODE_ID: Final = 0
KAFKA_LISTENERS: Final = ("kafka", "kafka-tls")


def _kafka_address(listeners: Mapping[str, Any]) -> str | None:
    for name in KAFKA_LISTENERS:
        address = getattr(listeners.get(name), "address", None)
        if isinstance(address, tuple) and len(address) >= 2:
            return f"{address[0]}:{address[1]}"
    return None


def kafka_cluster_families(api: BrokerAPI, listeners: Mapping[str, Any]) -> list[metrics.Family]:
    address = _kafka_address(listeners)
    info = [({"address": address, "id": str(NODE_ID)}, 1)] if address is not None else []
    per_partition: list[tuple[dict[str, str], int]] = []
    for topic in api.list_topics(INTERNAL_CONTEXT):
        per_partition.extend(
            ({"topic": topic.name, "partition": str(partition)}, 1)
            for partition in range(topic.queues)
        )
    leaders = [(labels, NODE_ID) for labels, _ in per_partition]
    healthy = [(labels, 0) for labels, _ in per_partition]
    return [
        metrics.Family(
            "kafka_brokers",
            metrics.GAUGE,
            "Number of Brokers in the Kafka Cluster.",
            1 if address is not None else 0,
        ),
        metrics.Family(
            "kafka_broker_info", metrics.GAUGE, "Information about the Kafka Broker.", info
        ),
        metrics.Family(
            "kafka_topic_partition_leader",
            metrics.GAUGE,
            "Leader Broker ID of this Topic/Partition",
            leaders,
        ),
        metrics.Family(
            "kafka_topic_partition_replicas",
            metrics.GAUGE,
            "Number of Replicas for this Topic/Partition",
            per_partition,
        ),
        metrics.Family(
            "kafka_topic_partition_in_sync_replica",
            metrics.GAUGE,
            "Number of In-Sync Replicas for this Topic/Partition",
            per_partition,
        ),
        metrics.Family(
            "kafka_topic_partition_leader_is_preferred",
            metrics.GAUGE,
            "1 if Topic/Partition is using the Preferred Broker",
            per_partition,
        ),
        metrics.Family(
            "kafka_topic_partition_under_replicated_partition",
            metrics.GAUGE,
            "1 if Topic/Partition is under Replicated",
            healthy,
        ),
    ]
