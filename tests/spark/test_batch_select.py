"""A Kafka batch stored once and indexed into an AMQP queue that took only some of its records:
the queue's rows are the records it took, at its offsets (issue 17, item 18), from the decoder
and through Spark."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.delivery.message import BATCH_SELECT_HEADER
from core.log import LogReader
from spark import decode
from tests.braid_process import BraidProcess
from tests.cli.fleet import EXCHANGE, QUEUE_ROWS, QUEUE_TOPIC, TOPIC_OFFSETS, write_fleet


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet log (tests/cli/fleet.py), written by a real broker, which is then stopped."""
    with BraidProcess(tmp_path_factory.mktemp("fleet"), listeners=("amqp", "kafka")) as braid:
        asyncio.run(write_fleet(braid))
    return braid.data_dir


def test_the_header_name_is_the_brokers() -> None:
    assert decode.BATCH_SELECT_HEADER == BATCH_SELECT_HEADER


def test_decoder_shows_only_what_the_queue_took(fleet_dir: Path) -> None:
    with LogReader(fleet_dir) as reader:
        rows = [
            row
            for batch in decode.read_range(reader, QUEUE_TOPIC, 0, 0, 1 << 62)
            for row in batch.to_pylist()
        ]
        topic_rows = [
            row
            for batch in decode.read_range(reader, EXCHANGE, 0, 0, 1 << 62)
            for row in batch.to_pylist()
        ]
    assert [(row["offset"], row["key"], row["value"]) for row in rows] == [
        (shown.offset, shown.key, shown.value) for shown in QUEUE_ROWS
    ]
    assert [row["offset"] for row in topic_rows] == list(TOPIC_OFFSETS)
    # Adjacent ranges cut inside the batch still give each record once.
    with LogReader(fleet_dir) as reader:
        pieces = [
            row["offset"]
            for start, end in ((0, 2), (2, 4), (4, 9))
            for batch in decode.read_range(reader, QUEUE_TOPIC, 0, start, end)
            for row in batch.to_pylist()
        ]
    assert pieces == [shown.offset for shown in QUEUE_ROWS]


def test_spark_rows_of_the_queue_are_what_it_took(spark, fleet_dir: Path) -> None:
    frame = spark.read.format("braid").option("path", str(fleet_dir)).load()
    rows = frame.where(f"topic = '{QUEUE_TOPIC}'").orderBy("offset").collect()
    assert [(row.offset, row.key, row.value) for row in rows] == [
        (shown.offset, shown.key, bytes(shown.value)) for shown in QUEUE_ROWS
    ]
    assert frame.where(f"topic = '{QUEUE_TOPIC}' and key like 'car.%'").count() == 0
    assert frame.where(f"topic = '{EXCHANGE}'").count() == len(TOPIC_OFFSETS)
