"""``python -m bench cluster`` (bench/cluster.py) in its quickest form, once, with tiny counts:
a real single node and a real ``braid serve --workers 2`` supervisor (its private redis-server,
two workers over two shards, one each), the lean clients of bench amqp/mqtt/kafka, and the
cross-node publish. It must print the table, the gate line and the cross-node lines and write
the JSON, every point with positive figures and the message counts asked for. No timing
asserts: the numbers are the machine's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.braid_process import REPO_ROOT

RUN_TIMEOUT_S = 240
AMQP_MESSAGES = 1_000  # in all, over the two queues
KAFKA_RECORDS = 100_000  # in all, over the two topics: enough for several CPU ticks
KAFKA_FETCH_RECORDS = 20_000  # the first of them, read back
CROSS_MESSAGES = (
    2_000  # per cross-node run: at ~20 us each, several 10 ms CPU ticks (500 read 0 once)
)
WORKLOADS = ("amqp", "mqtt-qos0", "mqtt-qos1", "kafka-produce", "kafka-fetch")


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "cluster.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "bench", "cluster", "--quick", "--out", str(out)]
    command += ["--dir", str(tmp_path), *args]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    return done, out


@pytest.mark.slow  # ~20 s alone, up to ~30 s beside other work on 2 cores
def test_bench_cluster_quick_prints_the_table_and_writes_the_json(tmp_path: Path) -> None:
    done, out = run_bench(
        tmp_path,
        "--workers",
        "1,2",
        "--shards",
        "2",
        "--amqp-queues",
        "2",
        "--amqp-messages",
        str(AMQP_MESSAGES),
        "--mqtt-seconds",
        "0.3",
        "--kafka-topics",
        "2",
        "--kafka-records",
        str(KAFKA_RECORDS),
        "--kafka-fetch-records",
        str(KAFKA_FETCH_RECORDS),
        "--idle-seconds",
        "0.5",
        "--cross-messages",
        str(CROSS_MESSAGES),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())

    points = {(p["workload"], p["workers"]): p for p in report["points"]}
    cases = [f"{pub}->{sub}" for pub in (0, 1) for sub in (0, 1)]
    mqtt_cases = {(f"mqtt-qos{qos} {case}", 2) for qos in (0, 1) for case in cases}
    assert set(points) == {(w, n) for w in WORKLOADS for n in (1, 2)} | mqtt_cases
    for key, point in points.items():
        for figure in ("messages", "seconds", "broker_cpu_s", "rate", "cpu_us_per_message"):
            assert point[figure] > 0, (key, figure, point)
    for workers in (1, 2):
        assert points["amqp", workers]["messages"] == AMQP_MESSAGES
        assert points["kafka-produce", workers]["messages"] == KAFKA_RECORDS
        # Fetched: at least the warm-up request's records (one batch of 1,000) and the first
        # of the timed ones, per topic (the consumer counts whole batches of up to 10,000).
        fetched = points["kafka-fetch", workers]["messages"]
        assert KAFKA_FETCH_RECORDS + 2 * 1_000 <= fetched <= KAFKA_RECORDS + 2 * 1_000
    # The supervisor's workers are told apart: each MQTT landing case ran with its publisher
    # and subscriber on the workers it names (found from the workers' sockets), and the MQTT
    # rows of the gate are the mean of the cases' CPU per message.
    for qos in (0, 1):
        for case in cases:
            note = points[f"mqtt-qos{qos} {case}", 2]["note"]
            assert re.fullmatch(rf"pub->sub on worker {case}, topic on worker [01]", note)
            assert points[f"mqtt-qos{qos} {case}", 2]["case_of"] == f"mqtt-qos{qos}"
        mean = points[f"mqtt-qos{qos}", 2]
        assert re.fullmatch(
            r"mean of 4 landing cases \(pub->sub on worker 0->0, 0->1, 1->0, 1->1\), "
            r"topic on worker [01]",
            mean["note"],
        )
        each = [points[f"mqtt-qos{qos} {case}", 2]["cpu_us_per_message"] for case in cases]
        assert mean["cpu_us_per_message"] == pytest.approx(sum(each) / len(each))
        assert mean["messages"] == sum(points[f"mqtt-qos{qos} {c}", 2]["messages"] for c in cases)

    # The ratios against the single node, and the gate of issue 22 over them.
    gate = report["gate"]
    assert set(gate["ratios"]) == set(WORKLOADS)
    assert all(ratio > 0 for ratio in gate["ratios"].values())
    assert gate["passed"] == all(ratio <= gate["limit"] for ratio in gate["ratios"].values())
    assert set(report["idle_cpu_per_s"]) == {"1", "2"}
    assert all(rate >= 0 for rate in report["idle_cpu_per_s"].values())
    assert all(point["busy_us_per_message"] is not None for point in report["points"])
    assert report["failed"] == []
    # Two shards, one per worker: publishes from one connection to its worker's queue and,
    # forwarded, to the other's (--quick: one round), each checked stored.
    assert report["owners"] == {"1": {"0": [0]}, "2": {"0": [0], "1": [1]}}
    cross = {c["kind"]: c for c in report["cross"]}
    assert len(report["cross"]) == 2
    assert cross["local"]["owner"] == cross["local"]["connected_node"]
    assert cross["remote"]["owner"] != cross["remote"]["connected_node"]
    for point in cross.values():
        assert point["messages"] == CROSS_MESSAGES
        assert point["rate"] > 0
        assert point["cpu_us_per_message"] > 0
    assert report["cross_ratio"] > 0
    assert report["skipped"] == []

    lines = done.stdout.splitlines()
    assert any(line.startswith("| workload | workers | msgs/s |") for line in lines)
    rows = [line for line in lines if line.startswith(("| amqp ", "| mqtt-", "| kafka-"))]
    assert len(rows) == 2 * len(WORKLOADS) + len(mqtt_cases)
    assert any(
        line.startswith("gate: broker CPU per message, 2 workers / 1 <= 1.25: ") for line in lines
    )
    # Everything it started is gone: no data directory left behind.
    assert not list(tmp_path.glob("bench-cluster-*"))


def test_bench_cluster_refuses_bad_arguments(tmp_path: Path) -> None:
    done, out = run_bench(tmp_path, "--workers", "0,2")
    assert done.returncode == 2
    assert "--workers: at least one count, each >= 1" in done.stderr
    done, out = run_bench(tmp_path, "--workloads", "amqp,nats")
    assert done.returncode == 2
    assert "--workloads: a subset of amqp,mqtt,kafka,cross" in done.stderr
    assert not out.exists()
