"""Metrics the stock dashboards read (issue 19 item 2), served next to ``braid_*`` on
``/metrics`` and per object on ``/metrics/per-object``.

- RabbitMQ's Prometheus plugin names (``rabbitmq_identity_info``, ``rabbitmq_queue_messages_ready``,
  ``rabbitmq_queue_messages_unacked``, ``rabbitmq_queue_consumers``, ``rabbitmq_connections``,
  ``rabbitmq_channels``, ``rabbitmq_global_messages_*_total``, the process and disk gauges), so
  the "RabbitMQ-Overview" Grafana dashboard fills in. As the plugin does, ``/metrics`` sums the
  queue metrics over queues (no labels) and ``/metrics/per-object`` has one sample per queue
  with ``vhost`` and ``queue`` labels. The dashboard joins every panel on
  ``rabbitmq_identity_info``'s ``rabbitmq_node`` and ``rabbitmq_cluster`` labels.
- kafka_exporter's names for topics and consumer groups: ``kafka_topic_partitions``,
  ``kafka_topic_partition_current_offset``, ``kafka_topic_partition_oldest_offset``,
  ``kafka_consumergroup_current_offset``, ``kafka_consumergroup_lag`` (per partition) and
  ``kafka_consumergroup_lag_sum``, ``kafka_consumergroup_members``.

Counters RabbitMQ has and the broker does not count yet (per-delivery kinds: get vs. consume,
auto vs. manual ack) are exported from the AMQP listener's counters where one matches and as 0
otherwise; the HELP text says which.
"""

from __future__ import annotations

import os
import resource
from typing import Any, Final

from braid import metrics
from braid.web.metrics_kafka import kafka_cluster_families
from braid.web.metrics_mqtt import mqtt_families
from braid.web.rabbit import ManagementSources, RabbitResources, node_name, rss_bytes
from core.api import INTERNAL_CONTEXT

# RabbitMQ global counter -> the AMQP listener's counter it is read from (None: not counted).
GLOBAL_COUNTERS: Final[dict[str, tuple[str | None, str]]] = {
    "rabbitmq_global_messages_received_total": ("published", "Messages received from publishers"),
    "rabbitmq_global_messages_received_confirm_total": (
        "published",
        "Messages received from publishers (counted with or without confirms)",
    ),
    "rabbitmq_global_messages_confirmed_total": ("confirms", "Messages confirmed to publishers"),
    "rabbitmq_global_messages_routed_total": ("published", "Messages routed (as received)"),
    "rabbitmq_global_messages_unroutable_returned_total": (
        "returned",
        "Messages returned to publishers as unroutable",
    ),
    "rabbitmq_global_messages_unroutable_dropped_total": (None, "Unroutable dropped: not counted"),
    "rabbitmq_global_messages_delivered_total": ("delivered", "Messages delivered to consumers"),
    "rabbitmq_global_messages_delivered_consume_manual_ack_total": (
        "delivered",
        "Messages delivered to consumers (all kinds counted here)",
    ),
    "rabbitmq_global_messages_delivered_consume_auto_ack_total": (None, "Not counted apart"),
    "rabbitmq_global_messages_delivered_get_manual_ack_total": (None, "Not counted apart"),
    "rabbitmq_global_messages_delivered_get_auto_ack_total": (None, "Not counted apart"),
    "rabbitmq_global_messages_get_empty_total": (None, "Not counted"),
    "rabbitmq_global_messages_redelivered_total": (None, "Not counted"),
    "rabbitmq_global_messages_acknowledged_total": (None, "Not counted"),
    "rabbitmq_connections_opened_total": ("connections_opened", "AMQP connections opened"),
    "rabbitmq_connections_closed_total": ("connections_closed", "AMQP connections closed"),
    "rabbitmq_channels_opened_total": ("channels_opened", "AMQP channels opened"),
    "rabbitmq_channels_closed_total": ("channels_closed", "AMQP channels closed"),
    "rabbitmq_queues_declared_total": (None, "Not counted"),
    "rabbitmq_queues_created_total": (None, "Not counted"),
    "rabbitmq_queues_deleted_total": (None, "Not counted"),
}


# The lines of /proc/self/status that split the resident set (VmRSS = RssAnon + RssFile +
# RssShmem, Linux 4.5+): RSS alone counts every page of the log the broker has mapped and
# touched, which says little about what the broker itself holds (issue 21 item 8).
RESIDENT_PARTS: Final = ("RssAnon", "RssFile", "RssShmem")


def resident_memory() -> dict[str, int]:
    """``{"RssAnon": bytes, "RssFile": bytes, "RssShmem": bytes}`` of this process; empty
    where ``/proc/self/status`` has no such lines (not Linux)."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in RESIDENT_PARTS:
                    found[name] = int(value.split()[0]) * 1024  # "RssAnon:   1234 kB"
    except (OSError, ValueError, IndexError):
        return {}
    return found


class DashboardMetrics:
    """Builds the families on each scrape from the Broker API (no state kept but the
    resources' rate samples)."""

    def __init__(self, resources: RabbitResources, sources: ManagementSources) -> None:
        self.resources = resources
        self.sources = sources
        self.api = sources.api

    def identity(self) -> list[metrics.Family]:
        node = node_name()
        return [
            metrics.Family(
                "rabbitmq_identity_info",
                metrics.GAUGE,
                "RabbitMQ node & cluster identity info",
                [
                    (
                        {
                            "rabbitmq_node": node,
                            "rabbitmq_cluster": node,
                            "rabbitmq_cluster_permanent_id": node,
                        },
                        1,
                    )
                ],
            ),
            metrics.Family(
                "rabbitmq_build_info",
                metrics.GAUGE,
                "RabbitMQ & Erlang/OTP version info",
                [
                    (
                        {
                            "rabbitmq_version": "3.10.0",
                            "product_name": "BraidMQ",
                            "prometheus_plugin_version": "3.10.0",
                        },
                        1,
                    )
                ],
            ),
        ]

    def _queues(self) -> list[dict[str, Any]]:
        resources = self.resources
        return resources.queues_of(INTERNAL_CONTEXT, list(resources.security.vhosts))

    def aggregated(self) -> list[metrics.Family]:
        queues = self._queues()
        families = self.identity()
        for name, key, text in (
            ("rabbitmq_queue_messages_ready", "messages_ready", "Messages ready to be delivered"),
            (
                "rabbitmq_queue_messages_unacked",
                "messages_unacknowledged",
                "Messages delivered and not yet acknowledged",
            ),
            ("rabbitmq_queue_messages", "messages", "Ready and unacknowledged messages"),
            ("rabbitmq_queue_consumers", "consumers", "Consumers on a queue"),
        ):
            total = sum(int(q[key]) for q in queues)
            families.append(metrics.Family(name, metrics.GAUGE, text, total))
        consumers = len(self.api.all_consumers(INTERNAL_CONTEXT))
        families.extend(
            [
                metrics.Family("rabbitmq_queues", metrics.GAUGE, "Queues available", len(queues)),
                metrics.Family("rabbitmq_consumers", metrics.GAUGE, "Consumers", consumers),
                metrics.Family(
                    "rabbitmq_connections",
                    metrics.GAUGE,
                    "Connections currently open (all protocols)",
                    self.sources.connection_count(),
                ),
                metrics.Family(
                    "rabbitmq_channels",
                    metrics.GAUGE,
                    "AMQP channels currently open",
                    self._open_channels(),
                ),
            ]
        )
        families.extend(self._globals())
        families.extend(self._process())
        families.extend(self.kafka())
        families.extend(kafka_cluster_families(self.api, self.sources.listeners))
        families.extend(mqtt_families(self.sources.listeners))
        return families

    def per_object(self) -> list[metrics.Family]:
        queues = self._queues()
        families = self.identity()
        for name, key, text in (
            ("rabbitmq_queue_messages_ready", "messages_ready", "Messages ready to be delivered"),
            (
                "rabbitmq_queue_messages_unacked",
                "messages_unacknowledged",
                "Messages delivered and not yet acknowledged",
            ),
            ("rabbitmq_queue_messages", "messages", "Ready and unacknowledged messages"),
            ("rabbitmq_queue_consumers", "consumers", "Consumers on a queue"),
        ):
            families.append(
                metrics.Family(
                    name,
                    metrics.GAUGE,
                    text,
                    [
                        ({"vhost": str(q["vhost"]), "queue": str(q["name"])}, int(q[key]))
                        for q in queues
                    ],
                )
            )
        families.extend(self.kafka())
        return families

    def _amqp_counters(self) -> dict[str, int]:
        server = self.sources.listeners.get("amqp")
        counters = getattr(server, "metrics", None)
        return dict(counters) if isinstance(counters, dict) else {}

    def _open_channels(self) -> int:
        # From the connection registry (each AMQP connection describes its open channels), not
        # the listener's opened-minus-closed counters, which missed channels the broker closed.
        return sum(len(c.channels) for c in self.api.list_connections(INTERNAL_CONTEXT))

    def _globals(self) -> list[metrics.Family]:
        counters = self._amqp_counters()
        return [
            metrics.Family(name, metrics.COUNTER, text, counters.get(key, 0) if key else 0)
            for name, (key, text) in GLOBAL_COUNTERS.items()
        ]

    def _process(self) -> list[metrics.Family]:
        try:
            open_fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            open_fds = 0
        max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        disk = self.api.disk_status()  # the log's volume (core/log/diskspace.py)
        resident = resident_memory()
        return [
            metrics.Family(
                "rabbitmq_process_resident_memory_bytes",
                metrics.GAUGE,
                "Memory used in bytes (the resident set: it includes the pages of the "
                "memory-mapped log, which the kernel reclaims as any page cache)",
                rss_bytes(),
            ),
            metrics.Family(
                "braid_process_anonymous_memory_bytes",
                metrics.GAUGE,
                "Resident anonymous memory in bytes (RssAnon): the broker's own heap, "
                "without the mapped log",
                resident.get("RssAnon", 0),
            ),
            metrics.Family(
                "braid_process_file_memory_bytes",
                metrics.GAUGE,
                "Resident file-backed memory in bytes (RssFile): mostly the mapped log's pages",
                resident.get("RssFile", 0),
            ),
            metrics.Family(
                "rabbitmq_resident_memory_limit_bytes",
                metrics.GAUGE,
                "Memory high watermark in bytes (0: none set)",
                0,
            ),
            metrics.Family(
                "rabbitmq_disk_space_available_bytes",
                metrics.GAUGE,
                "Disk space available in bytes",
                disk.free_bytes,
            ),
            metrics.Family(
                "rabbitmq_disk_space_available_limit_bytes",
                metrics.GAUGE,
                "Free disk space low watermark in bytes (0: none set)",
                disk.limit_bytes or 0,
            ),
            metrics.Family(
                "rabbitmq_alarms_free_disk_space_watermark",
                metrics.GAUGE,
                "1 if the free disk space alarm is in effect (publishers stopped), else 0",
                1 if disk.alarm else 0,
            ),
            metrics.Family(
                "rabbitmq_process_open_fds", metrics.GAUGE, "Open file descriptors", open_fds
            ),
            metrics.Family(
                "rabbitmq_process_max_fds", metrics.GAUGE, "Open file descriptors limit", max_fds
            ),
            metrics.Family(
                "rabbitmq_process_open_tcp_sockets",
                metrics.GAUGE,
                "Open TCP sockets (client connections)",
                0,
            ),
            metrics.Family(
                "rabbitmq_process_max_tcp_sockets", metrics.GAUGE, "Open TCP sockets limit", max_fds
            ),
        ]

    def kafka(self) -> list[metrics.Family]:
        api = self.api
        context = INTERNAL_CONTEXT
        partitions: list[tuple[dict[str, str], int]] = []
        current: list[tuple[dict[str, str], int]] = []
        oldest: list[tuple[dict[str, str], int]] = []
        high: dict[tuple[str, int], int] = {}
        for info in api.list_topics(context):
            partitions.append(({"topic": info.name}, info.queues))
            for partition in range(info.queues):
                start, end = api.partition_offsets(context, info.name, partition)
                labels = {"topic": info.name, "partition": str(partition)}
                current.append((labels, end))
                oldest.append((labels, start))
                high[(info.name, partition)] = end
        group_offsets: list[tuple[dict[str, str], int]] = []
        lags: list[tuple[dict[str, str], int]] = []
        lag_sums: list[tuple[dict[str, str], int]] = []
        members: list[tuple[dict[str, str], int]] = []
        for listing in api.list_groups(context):
            group = listing.group_id
            description = api.describe_group(context, group)
            members.append(({"consumergroup": group}, len(description.members)))
            sums: dict[str, int] = {}
            for (topic, partition), committed in sorted(
                api.fetch_group_offsets(context, group).items()
            ):
                labels = {"consumergroup": group, "topic": topic, "partition": str(partition)}
                group_offsets.append((labels, committed.offset))
                log_end = high.get((topic, partition))
                if log_end is None:
                    continue
                lag = max(log_end - committed.offset, 0)
                lags.append((labels, lag))
                sums[topic] = sums.get(topic, 0) + lag
            lag_sums.extend(
                ({"consumergroup": group, "topic": topic}, lag) for topic, lag in sums.items()
            )
        return [
            metrics.Family(
                "kafka_topic_partitions",
                metrics.GAUGE,
                "Number of partitions for this Topic",
                partitions,
            ),
            metrics.Family(
                "kafka_topic_partition_current_offset",
                metrics.GAUGE,
                "Current Offset of a Broker at Topic/Partition",
                current,
            ),
            metrics.Family(
                "kafka_topic_partition_oldest_offset",
                metrics.GAUGE,
                "Oldest Offset of a Broker at Topic/Partition",
                oldest,
            ),
            metrics.Family(
                "kafka_consumergroup_current_offset",
                metrics.GAUGE,
                "Current Offset of a ConsumerGroup at Topic/Partition",
                group_offsets,
            ),
            metrics.Family(
                "kafka_consumergroup_lag",
                metrics.GAUGE,
                "Current Approximate Lag of a ConsumerGroup at Topic/Partition",
                lags,
            ),
            metrics.Family(
                "kafka_consumergroup_lag_sum",
                metrics.GAUGE,
                "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
                lag_sums,
            ),
            metrics.Family(
                "kafka_consumergroup_members",
                metrics.GAUGE,
                "Amount of members in a consumer group",
                members,
            ),
        ]
