"""Kafka transactions as Spark shows them (issue 17 item 14): committed records only, aborted
ones with ``includeAborted``, never a control record, and nothing at or past the first record of
a transaction still open (the Last Stable Offset), in batch and in streaming, from both readers
(the JVM reader and the Python source), on a log a real ``braid serve`` writes while a
confluent-kafka transactional producer commits one transaction, aborts another and leaves a
third open.

The partition ``ledger/0``, offset by offset::

    0 plain-0   1 committed-1   2 committed-2   3 COMMIT   4 plain-4   5 aborted-5   6 aborted-6
    7 ABORT     8 plain-8       9 open-9 (a transaction still open)    10 plain-10

so the Last Stable Offset is 9 while the third transaction is open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from core.log import LogReader
from core.log import record as rec
from spark import PYTHON_FORMAT, decode
from spark.options import ReadOptions
from spark.readers import transactions
from tests.braid_process import BraidProcess
from tests.kafka.conftest import create_topic

TOPIC = "ledger"
TIMEOUT_S = 30.0
COMMITTED = [(1, b"committed-1"), (2, b"committed-2")]
ABORTED = [(5, b"aborted-5"), (6, b"aborted-6")]
PLAIN_BEFORE_OPEN = [(0, b"plain-0"), (4, b"plain-4"), (8, b"plain-8")]
OPEN = (9, b"open-9")
AFTER_OPEN = (10, b"plain-10")
MARKER_OFFSETS = (3, 7)
# Committed data below the Last Stable Offset (9): what a read of committed data shows.
STABLE = sorted(PLAIN_BEFORE_OPEN + COMMITTED)
READERS = ("braid", PYTHON_FORMAT)  # the JVM reader (see jvm_loaded) and the Python source


def produce(producer: Producer, value: bytes) -> int:
    """Produce ``value`` to ``ledger/0``; the offset the producer was told."""
    told: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        told.append(message.offset())

    producer.produce(TOPIC, value, partition=0, on_delivery=delivered)
    assert producer.flush(TIMEOUT_S) == 0
    return told[0]


async def last_stable_offset(braid: BraidProcess) -> int:
    """What a read_committed consumer is told the partition's end is: its LSO."""
    partition = TopicPartition(TOPIC, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=braid.kafka_bootstrap, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        return int((await consumer.end_offsets([partition]))[partition])
    finally:
        await consumer.stop()


def wait_for_lso(braid: BraidProcess, wanted: int) -> None:
    """Until the broker's LSO is ``wanted`` (its markers are written)."""
    deadline = time.monotonic() + TIMEOUT_S
    while (found := asyncio.run(last_stable_offset(braid))) != wanted:
        assert time.monotonic() < deadline, f"LSO {found}, never {wanted}"
        time.sleep(0.05)


class Ledger:
    """``braid serve`` with ``ledger/0`` written as the module docstring shows, and the
    producer of the transaction still open (to end it later)."""

    def __init__(self, braid: BraidProcess) -> None:
        self.braid = braid
        asyncio.run(create_topic(braid.kafka_bootstrap, TOPIC, 1))
        plain = Producer({"bootstrap.servers": braid.kafka_bootstrap, "enable.idempotence": True})
        self.txn = Producer(
            {"bootstrap.servers": braid.kafka_bootstrap, "transactional.id": "spark-ledger"}
        )
        self.txn.init_transactions(TIMEOUT_S)
        assert produce(plain, b"plain-0") == 0
        self.txn.begin_transaction()
        assert [produce(self.txn, v) for v in (b"committed-1", b"committed-2")] == [1, 2]
        self.txn.commit_transaction(TIMEOUT_S)
        assert produce(plain, b"plain-4") == 4
        self.txn.begin_transaction()
        assert [produce(self.txn, v) for v in (b"aborted-5", b"aborted-6")] == [5, 6]
        self.txn.abort_transaction(TIMEOUT_S)
        assert produce(plain, b"plain-8") == 8
        self.txn.begin_transaction()
        assert produce(self.txn, b"open-9") == 9
        assert produce(plain, b"plain-10") == 10
        wait_for_lso(braid, 9)

    @property
    def data_dir(self) -> Path:
        return self.braid.data_dir

    def abort_the_open_one(self) -> None:
        self.txn.abort_transaction(TIMEOUT_S)
        wait_for_lso(self.braid, 12)  # past the ABORT marker at 11


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with BraidProcess(tmp_path, listeners=("kafka",)) as braid:
        yield Ledger(braid)


@pytest.fixture(scope="module")
def jvm_loaded(spark: SparkSession) -> None:
    from spark import register

    assert register(spark, reader="jvm") == "jvm"


def read(spark: SparkSession, source: str, data_dir: Path, **options: str) -> DataFrame:
    reader = spark.read.format(source).option("path", str(data_dir)).option("topics", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows_of(frame: DataFrame) -> list[tuple[int, bytes]]:
    rows = frame.select("offset", "value", "flags").collect()
    for row in rows:  # never a control record
        assert not row.flags & rec.FLAG_TXN_CONTROL
        assert row.offset not in MARKER_OFFSETS
    return sorted((row.offset, bytes(row.value)) for row in rows)


# -- without Spark: the decoder and the planner ----------------------------------------------


def test_the_decoder_shows_committed_records_and_the_planner_stops_at_the_lso(
    ledger: Ledger,
) -> None:
    with LogReader(ledger.data_dir) as reader:

        def decoded(**options: bool) -> list[tuple[int, bytes]]:
            return [
                (row["offset"], row["value"])
                for batch in decode.read_range(reader, TOPIC, 0, 0, 1 << 62, **options)
                for row in batch.to_pylist()
            ]

        # The decoder alone: no record of the open transaction, nor of the aborted one
        # unless asked for; the range is not cut (the planner cuts it, below).
        assert decoded() == [*STABLE, AFTER_OPEN]
        assert decoded(include_aborted=True) == sorted([*STABLE, *ABORTED, AFTER_OPEN])
        reader.refresh()
        outcomes = transactions(reader)
        assert outcomes.last_stable_offset(reader, TOPIC, 0) == OPEN[0]
        options = ReadOptions.parse({"path": str(ledger.data_dir), "topics": TOPIC})
        (piece,) = options.batch_slices(reader, outcomes)
        assert (piece.start, piece.end) == (0, OPEN[0])
        assert options.bounds(reader, TOPIC, 0) == (0, 11)  # without transactions: as stored
    ledger.abort_the_open_one()
    with LogReader(ledger.data_dir) as reader:
        outcomes = transactions(reader)
        assert outcomes.last_stable_offset(reader, TOPIC, 0) == 12
        (piece,) = options.batch_slices(reader, outcomes)
        assert (piece.start, piece.end) == (0, 12)


# -- through Spark: both readers ---------------------------------------------------------------


def test_batch_reads_show_committed_records_below_the_lso(
    spark: SparkSession, jvm_loaded: None, ledger: Ledger
) -> None:
    for source in READERS:
        assert rows_of(read(spark, source, ledger.data_dir)) == STABLE, source
        with_aborted = rows_of(read(spark, source, ledger.data_dir, includeAborted="true"))
        assert with_aborted == sorted(STABLE + ABORTED), source
        # An explicit end past the LSO is cut at it, as a read_committed consumer's end.
        ending = read(spark, source, ledger.data_dir, endingOffsets="11")
        assert rows_of(ending) == STABLE, source
    ledger.abort_the_open_one()
    for source in READERS:
        assert rows_of(read(spark, source, ledger.data_dir)) == [*STABLE, AFTER_OPEN], source
        with_aborted = rows_of(read(spark, source, ledger.data_dir, includeAborted="true"))
        assert with_aborted == sorted([*STABLE, *ABORTED, OPEN, AFTER_OPEN]), source


def test_streams_hold_at_the_lso_and_never_emit_what_is_later_aborted(
    spark: SparkSession, jvm_loaded: None, ledger: Ledger
) -> None:
    queries = {}
    for source in READERS:
        for include_aborted in ("false", "true"):
            name = f"txn_{'jvm' if source == 'braid' else 'python'}_{include_aborted}"
            queries[(source, include_aborted)] = (
                name,
                spark.readStream.format(source)
                .option("path", str(ledger.data_dir))
                .option("topics", TOPIC)
                .option("includeAborted", include_aborted)
                .load()
                .select("offset", "value", "flags")
                .writeStream.format("memory")
                .queryName(name)
                .trigger(processingTime="200 milliseconds")
                .start(),
            )
    try:
        for (source, include_aborted), (name, query) in queries.items():
            query.processAllAvailable()
            shown = STABLE if include_aborted == "false" else sorted(STABLE + ABORTED)
            assert rows_of(spark.table(name)) == shown, (source, include_aborted)
        # The open transaction is aborted: the streams go on past it, its record shown only
        # to those that asked for aborted ones, and plain-10 after it to all.
        ledger.abort_the_open_one()
        for (source, include_aborted), (name, query) in queries.items():
            query.processAllAvailable()
            if include_aborted == "false":
                shown = [*STABLE, AFTER_OPEN]
            else:
                shown = sorted([*STABLE, *ABORTED, OPEN, AFTER_OPEN])
            assert rows_of(spark.table(name)) == shown, (source, include_aborted)
    finally:
        for _, query in queries.values():
            query.stop()
