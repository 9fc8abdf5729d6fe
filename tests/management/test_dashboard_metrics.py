"""``/metrics`` and ``/metrics/per-object`` with the RabbitMQ Prometheus plugin's names and
kafka_exporter's lag names (issue 19 item 2), parsed with prometheus_client's parser after
real pika and kafka-python traffic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client.parser import text_string_to_metric_families

from tests.braid_process import BraidProcess

# Metric names the "RabbitMQ-Overview" Grafana dashboard (grafana.com 10991) queries.
OVERVIEW_DASHBOARD_METRICS = (
    "rabbitmq_identity_info",
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages_unacked",
    "rabbitmq_global_messages_received_total",
    "rabbitmq_global_messages_confirmed_total",
    "rabbitmq_global_messages_routed_total",
    "rabbitmq_global_messages_unroutable_dropped_total",
    "rabbitmq_global_messages_unroutable_returned_total",
    "rabbitmq_global_messages_delivered_consume_manual_ack_total",
    "rabbitmq_global_messages_delivered_consume_auto_ack_total",
    "rabbitmq_global_messages_delivered_get_manual_ack_total",
    "rabbitmq_global_messages_delivered_get_auto_ack_total",
    "rabbitmq_global_messages_get_empty_total",
    "rabbitmq_global_messages_redelivered_total",
    "rabbitmq_global_messages_acknowledged_total",
    "rabbitmq_connections",
    "rabbitmq_channels",
    "rabbitmq_queues",
    "rabbitmq_consumers",
    "rabbitmq_connections_opened_total",
    "rabbitmq_connections_closed_total",
    "rabbitmq_channels_opened_total",
    "rabbitmq_channels_closed_total",
    "rabbitmq_queues_declared_total",
    "rabbitmq_queues_created_total",
    "rabbitmq_queues_deleted_total",
    "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_resident_memory_limit_bytes",
    "rabbitmq_disk_space_available_bytes",
    "rabbitmq_disk_space_available_limit_bytes",
    "rabbitmq_process_open_fds",
    "rabbitmq_process_max_fds",
    "rabbitmq_process_open_tcp_sockets",
    "rabbitmq_process_max_tcp_sockets",
    "rabbitmq_build_info",
)


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def scrape(braid: BraidProcess, path: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = requests.get(f"http://127.0.0.1:{braid.http_port}{path}", timeout=30)
    assert response.status_code == 200
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def test_rabbitmq_names_aggregated_and_per_queue(braid: BraidProcess) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials("guest", "guest")
        )
    )
    channel = connection.channel()
    channel.confirm_delivery()
    for name, count in (("alpha", 3), ("beta", 4)):
        channel.queue_declare(name, durable=True)
        for _ in range(count):
            channel.basic_publish("", name, b"x")

    aggregated = scrape(braid, "/metrics")
    missing = [name for name in OVERVIEW_DASHBOARD_METRICS if name not in aggregated]
    assert missing == []
    assert aggregated["rabbitmq_queue_messages_ready"] == [({}, 7.0)]
    assert aggregated["rabbitmq_queues"] == [({}, 2.0)]
    assert aggregated["rabbitmq_connections"][0][1] >= 1
    assert aggregated["rabbitmq_global_messages_received_total"][0][1] >= 7
    identity = aggregated["rabbitmq_identity_info"][0][0]
    assert {"rabbitmq_node", "rabbitmq_cluster"} <= set(identity)
    assert "braid_log_appends_total" in aggregated or any(
        n.startswith("braid_") for n in aggregated
    )

    per_object = scrape(braid, "/metrics/per-object")
    ready = {
        (labels["vhost"], labels["queue"]): value
        for labels, value in per_object["rabbitmq_queue_messages_ready"]
    }
    assert ready == {("/", "alpha"): 3.0, ("/", "beta"): 4.0}
    connection.close()


def test_kafka_exporter_lag_per_partition(braid: BraidProcess) -> None:
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    for index in range(10):
        producer.send("lagged", f"m{index}".encode(), partition=0).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=braid.kafka_bootstrap, group_id="lag-group", enable_auto_commit=False
    )
    partition = TopicPartition("lagged", 0)
    consumer.assign([partition])
    consumer.commit({partition: OffsetAndMetadata(4, "", -1)})
    consumer.close()

    deadline = time.monotonic() + 30
    while True:
        samples = scrape(braid, "/metrics")
        lag = [
            value
            for labels, value in samples.get("kafka_consumergroup_lag", [])
            if labels == {"consumergroup": "lag-group", "topic": "lagged", "partition": "0"}
        ]
        if lag or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert lag == [6.0]
    current = {
        (labels["topic"], labels["partition"]): value
        for labels, value in samples["kafka_topic_partition_current_offset"]
    }
    assert current[("lagged", "0")] == 10.0
    assert ({"consumergroup": "lag-group", "topic": "lagged"}, 6.0) in samples[
        "kafka_consumergroup_lag_sum"
    ]
