"""The ``braid`` format in a real local SparkSession: batch reads, pruning, visibility, a log
being appended to while Spark reads it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from core.log import LogStore
from core.log import record as rec
from spark.schema import COLUMN_NAMES

from .logdata import small_config, write_mixed


def braid(spark, data_dir: Path, **options: str):
    reader = spark.read.format("braid").option("path", str(data_dir))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("mixed") / "data"
    return data_dir, write_mixed(data_dir)


def test_schema_and_rows_equal_what_was_appended(spark, mixed):
    data_dir, expected = mixed
    frame = braid(spark, data_dir)
    assert tuple(frame.columns) == COLUMN_NAMES
    assert frame.schema["headers"].dataType.simpleString() == (
        "array<struct<key:string,value:binary>>"
    )
    rows = {(r.topic, r.queue, r.offset): r for r in frame.collect()}
    assert set(rows) == set(expected.rows)
    for key, columns in expected.rows.items():
        row = rows[key]
        for column, value in columns.items():
            if column == "timestamp_ms":
                assert int(row.timestamp.timestamp() * 1000) == value
            elif column == "headers":
                assert [(h.key, bytes(h.value)) for h in row.headers] == value
            else:
                got = getattr(row, column)
                assert (bytes(got) if isinstance(got, bytearray) else got) == value, key
    by_protocol = dict(frame.groupBy("protocol").count().collect())
    assert set(by_protocol) == {"kafka", "amqp", "mqtt"}


def test_pruning_reads_only_what_is_selected(spark, mixed):
    data_dir, expected = mixed
    orders = braid(spark, data_dir, topics="orders", maxRecordsPerPartition="4")
    total = expected.count("orders")
    assert orders.count() == total
    assert orders.rdd.getNumPartitions() == -(-total // 4)
    one_queue = braid(spark, data_dir, topics="orders", queues="1")
    assert {r.queue for r in one_queue.select("queue").collect()} == {1}
    ranged = braid(
        spark,
        data_dir,
        topics="orders",
        startingOffsets='{"orders": {"0": 2, "1": 3}}',
        endingOffsets='{"orders": {"0": 6, "1": 4}}',
    )
    assert sorted((r.queue, r.offset) for r in ranged.select("queue", "offset").collect()) == [
        (0, 2),
        (0, 3),
        (0, 4),
        (0, 5),
        (1, 3),
    ]
    assert ranged.rdd.getNumPartitions() == 1
    future = braid(spark, data_dir, startTime=str(int(time.time() * 1000) + 3_600_000))
    assert future.count() == 0
    past = braid(spark, data_dir, endTime="2001-01-01T00:00:00Z")
    assert past.count() == 0
    system = braid(spark, data_dir, includeSystem="true").where(F.col("topic").startswith("__"))
    assert system.select("topic").distinct().count() >= 2


def test_user_schema_reads_only_those_columns(spark, mixed):
    data_dir, expected = mixed
    frame = (
        spark.read.format("braid")
        .schema("value binary, topic string")
        .option("path", str(data_dir))
        .load()
    )
    assert frame.columns == ["value", "topic"]
    assert frame.count() == len(expected.rows)
    with pytest.raises(Exception, match="no column"):
        spark.read.format("braid").schema("nope int").option("path", str(data_dir)).load().count()


def test_half_messages_appear_only_once_committed(spark, tmp_path: Path):
    store = LogStore(small_config(tmp_path / "d"))
    store.append("payments", 0, b"visible")
    half = store.append("payments", 0, b"half", flags=rec.FLAG_HALF)
    rolled_back = store.append("payments", 0, b"rolled back", flags=rec.FLAG_HALF)
    delayed = store.append(
        "payments", 0, b"later", deliver_at_ms=int(time.time() * 1000) + 3_600_000
    )
    store.flush()
    values = lambda: sorted(bytes(r.value) for r in braid(spark, tmp_path / "d").collect())  # noqa: E731
    assert values() == [b"visible"]
    store.link([half.position], [("payments", 0)])
    store.link([delayed.position], [("payments", 0)])
    store.flush()
    assert values() == [b"half", b"later", b"visible"]
    assert rolled_back.offsets == [("__half", 0, 1)]
    store.close()


def test_empty_selection_reads_nothing(spark, mixed):
    data_dir, _ = mixed
    assert braid(spark, data_dir, topics="no-such-topic").count() == 0


def test_reads_a_log_while_it_is_appended_to(spark, tmp_path: Path):
    """A writer appends (plain records and Kafka batches) in a thread while Spark counts: every
    read sees a prefix of each queue, rows intact, counts never going down."""
    data_dir = tmp_path / "d"
    store = LogStore(small_config(data_dir, segment_size=1 << 20, index_entries_per_file=1024))
    store.append("live", 0, b"0:0")
    stop = threading.Event()
    written = [0]

    def write() -> None:
        number = 1
        while not stop.is_set() and number < 200_000:
            for queue in range(2):
                store.append_many(
                    "live", queue, [f"{queue}:{number + i}".encode() for i in range(50)]
                )
            number += 50
            written[0] = number
            time.sleep(0.002)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        counts = []
        for _ in range(4):
            rows = braid(spark, data_dir, topics="live").select("queue", "offset", "value")
            got = rows.collect()
            by_queue: dict[int, list] = {0: [], 1: []}
            for row in got:
                by_queue[row.queue].append((row.offset, bytes(row.value)))
            for queue, items in by_queue.items():
                items.sort()
                assert [offset for offset, _ in items] == list(range(len(items)))
                # Queue 0 holds one extra first record: values are "queue:n" in order.
                first = 0 if queue == 0 else 1
                assert [value for _, value in items] == [
                    f"{queue}:{n}".encode() for n in range(first, first + len(items))
                ]
            counts.append(len(got))
    finally:
        stop.set()
        writer.join()
        store.close()
    assert counts == sorted(counts)
    assert counts[-1] > counts[0]
