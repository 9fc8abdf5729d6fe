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


def test_traffic_series_have_zeros_in_minutes_without_traffic():
    """A minute with no traffic of a protocol is drawn as zero, not bridged by the line
    (issue 17: the chart drew lines through quiet minutes)."""
    from datetime import datetime

    t0 = datetime(2026, 11, 26, 10, 0)
    rows = [
        {"protocol": "kafka", "topic": "a", "minute": t0, "records": 3, "bytes": 30},
        {"protocol": "kafka", "topic": "b", "minute": t0, "records": 1, "bytes": 5},
        {
            "protocol": "kafka",
            "topic": "a",
            "minute": t0.replace(minute=3),
            "records": 2,
            "bytes": 9,
        },
        {
            "protocol": "mqtt",
            "topic": "d",
            "minute": t0.replace(minute=1),
            "records": 7,
            "bytes": 70,
        },
    ]
    series = traffic.per_minute(rows)
    minutes = [t0.replace(minute=m) for m in range(4)]
    assert series == {
        "kafka": list(zip(minutes, [4, 0, 0, 2], [35, 0, 0, 9], strict=True)),
        "mqtt": list(zip(minutes, [0, 7, 0, 0], [0, 70, 0, 0], strict=True)),
    }
    assert traffic.per_minute([]) == {}
