"""``/metrics`` reports the broker's anonymous memory apart from its resident set (issue 21 item
8): RSS counts the pages of the memory-mapped log, so after some MB of records it says little
about what the broker itself holds. Records written with confluent-kafka, then the gauges read
as Prometheus parses them."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from tests.braid_process import BraidProcess
from tests.management.test_dashboard_metrics import scrape

DEADLINE_S = 30
MIB = 1024 * 1024


def gauge(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    assert name in samples, f"{name} missing from /metrics"
    ((_labels, value),) = samples[name]
    return value


def test_anonymous_and_file_backed_memory_beside_the_resident_set(tmp_path: Path) -> None:
    with BraidProcess(tmp_path, listeners=("kafka", "http")) as braid:
        producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "log_level": 0})
        value = bytes(range(256)) * (64 * 1024 // 256)
        for _ in range(20 * MIB // len(value)):  # 20 MiB of records into the mapped log
            producer.produce("memory", value)
            producer.poll(0)
        assert producer.flush(DEADLINE_S) == 0
        samples = scrape(braid, "/metrics")
        resident = gauge(samples, "rabbitmq_process_resident_memory_bytes")
        anonymous = gauge(samples, "braid_process_anonymous_memory_bytes")
        file_backed = gauge(samples, "braid_process_file_memory_bytes")
        assert anonymous > 0
        assert file_backed > 0
        assert anonymous <= resident
