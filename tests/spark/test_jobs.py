"""The example jobs, run locally (local[2], the shared session) on a log of all three protocols,
as the compose file runs them on the Spark cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark.jobs import crossprotocol, deadletters, traffic

from .logdata import write_jobs_data

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def jobs_data(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("jobs") / "data"
    write_jobs_data(data_dir)
    return data_dir


def test_traffic_job_writes_parquet_and_chart(spark, jobs_data: Path, tmp_path: Path, capsys):
    assert traffic.main([str(jobs_data), str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    rows = spark.read.parquet(str(tmp_path / "traffic")).collect()
    by_key = {(r.protocol, r.topic): r for r in rows}
    kafka = by_key[("kafka", "orders")]
    assert kafka.records == 5
    assert kafka.bytes == 150
    assert kafka.p50_bytes == 30
    assert kafka.p99_bytes == 50
    # AMQP messages are counted once (in the exchange), not once per bound queue.
    assert by_key[("amqp", "amq.direct")].records == 6
    assert ("amqp", "work") not in by_key
    assert ("amqp", "%DLQ%workers") not in by_key
    assert by_key[("mqtt", "devices")].records == 2
    assert (tmp_path / "traffic.png").read_bytes().startswith(PNG_MAGIC)


def test_dead_letter_report_counts_each_death_once(spark, jobs_data: Path, tmp_path: Path):
    result = deadletters.run(spark, jobs_data, tmp_path)
    summary = {(r["reason"], r["died_in"], r["original_address"]): r for r in result["rows"]}
    assert set(summary) == {
        ("rejected", "work", "amq.direct/work"),
        ("expired", "work", "amq.direct/work"),
    }
    assert summary[("rejected", "work", "amq.direct/work")]["records"] == 2
    assert summary[("expired", "work", "amq.direct/work")]["records"] == 1
    assert summary[("expired", "work", "amq.direct/work")]["protocols"] == ["amqp"]


def test_cross_protocol_join_on_a_shared_key(spark, jobs_data: Path, tmp_path: Path):
    result = crossprotocol.run(spark, jobs_data, tmp_path)
    rows = {r["correlation"]: r for r in result["rows"]}
    assert set(rows) == {"order-1", "order-2", "order-3", "order-4"}
    assert rows["order-2"]["protocols"] == 3
    assert rows["order-2"]["mqtt_topics"] == ["devices"]
    assert rows["order-1"]["amqp_records"] == 1
    assert rows["order-1"]["mqtt_records"] is None
    assert rows["order-4"]["kafka_records"] == 1
    assert rows["order-4"]["mqtt_records"] == 1
    assert all(r["span_ms"] >= 0 for r in rows.values())
