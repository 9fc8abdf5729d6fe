"""``braid tail`` and ``braid log dump`` on what a real broker wrote: a Kafka batch indexed into an
AMQP queue shows only the records the queue took, at the queue's offsets (issue 17, item 18);
dump decodes Kafka batches record by record and tail names a topic that does not exist yet
(item 23)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.braid_process import REPO_ROOT, BraidProcess

from .conftest import braid_env, run_braid
from .fleet import (
    CARS_FIRST,
    EXCHANGE,
    MIXED_BATCH,
    QUEUE_ROWS,
    QUEUE_TOPIC,
    TOPIC_OFFSETS,
    write_fleet,
)

TIMEOUT_S = 60
TAIL = (sys.executable, "-m", "braid", "tail")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    """A running broker holding the fleet log (tests/cli/fleet.py)."""
    with BraidProcess(tmp_path_factory.mktemp("fleet"), listeners=("amqp", "kafka")) as braid:
        asyncio.run(write_fleet(braid))
        yield braid


def tail(data_dir: Path, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TAIL, topic, "--data-dir", str(data_dir), *args],
        cwd=REPO_ROOT,
        env=braid_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_tail_of_a_queue_shows_what_it_took_at_its_offsets(fleet: BraidProcess) -> None:
    shown = tail(fleet.data_dir, QUEUE_TOPIC, "--last", "100", "--limit", "3", "--json")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(line["topic"], line["queue"], line["offset"]) for line in lines] == [
        (QUEUE_TOPIC, 0, row.offset) for row in QUEUE_ROWS
    ]
    assert [line["body"].encode() for line in lines] == [row.value for row in QUEUE_ROWS]
    assert [line["protocol"] for line in lines] == ["kafka", "kafka", "amqp"]

    text = tail(fleet.data_dir, QUEUE_TOPIC, "--last", "100", "--limit", "3")
    assert text.returncode == 0, text.stderr
    assert [line.split()[1] for line in text.stdout.splitlines()] == [
        f"{QUEUE_TOPIC}/0@{row.offset}" for row in QUEUE_ROWS
    ]
    assert "car." not in text.stdout


def test_tail_of_the_topic_shows_every_record(fleet: BraidProcess) -> None:
    shown = tail(fleet.data_dir, EXCHANGE, "--last", "100", "--limit", str(len(TOPIC_OFFSETS)))
    assert shown.returncode == 0, shown.stderr
    where = [line.split()[1] for line in shown.stdout.splitlines()]
    assert where == [f"{EXCHANGE}/0@{offset}" for offset in TOPIC_OFFSETS]


def test_tail_of_a_topic_that_does_not_exist_yet_says_so_and_waits(fleet: BraidProcess) -> None:
    topic = "not-yet"
    process = subprocess.Popen(
        [*TAIL, topic, "--data-dir", str(fleet.data_dir), "--limit", "1", "--interval-ms", "20"],
        cwd=REPO_ROOT,
        env=braid_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        said = process.stderr.readline()
        assert f"topic {topic!r} does not exist yet" in said, said

        async def produce() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=fleet.kafka_bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topic, b"first ever", partition=0)
            finally:
                await producer.stop()

        asyncio.run(produce())
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert f"{topic}/0@0" in out
    assert "first ever" in out


def test_dump_decodes_kafka_batches_record_by_record(fleet: BraidProcess) -> None:
    result = run_braid("log", "dump", str(fleet.data_dir), "--topic", EXCHANGE, "--json")
    assert result.returncode == 0, result.stderr
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    batches = [frame for frame in frames if "batch" in frame]
    assert [frame["batch"]["codec"] for frame in batches] == ["gzip", "gzip"]
    inner = [record for frame in batches for record in frame["batch"]["records"]]
    assert [record["key"] for record in inner] == [k.decode() for k in CARS_FIRST + MIXED_BATCH]
    assert [record["offset"] for record in inner] == list(TOPIC_OFFSETS[:-1])
    assert [record["value"] for record in inner] == [
        f"from {k.decode()}" for k in CARS_FIRST + MIXED_BATCH
    ]
    assert all("body" not in frame for frame in batches)  # no gzip bytes as a preview

    # Through the queue: only what it took, at its offsets, and where the batch is stored.
    result = run_braid("log", "dump", str(fleet.data_dir), "--topic", QUEUE_TOPIC)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{QUEUE_TOPIC}/0@0 ")
    assert f"stored_in={EXCHANGE}/0" in lines[0]
    assert "kafka-batch[" in lines[0]
    assert "codec=gzip skipped=2" in lines[0]
    assert lines[1].startswith("  @1 ")
    assert "key=b'truck.1'" in lines[1]
    assert "value[12]=b'from truck.1'" in lines[1]
    assert lines[2].startswith("  @3 ")
    assert lines[3].startswith(f"{QUEUE_TOPIC}/0@4 ")
    assert len(lines) == 4

    # A commit-log scan shows each batch's records with their offset deltas.
    result = run_braid("log", "dump", str(fleet.data_dir))
    assert result.returncode == 0, result.stderr
    deltas = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  +")]
    assert deltas[:7] == ["+0", "+1", "+2", "+0", "+1", "+2", "+3"]
