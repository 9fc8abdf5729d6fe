"""Structured streaming from the ``braid`` format into a file sink with a checkpoint."""

from __future__ import annotations

from pathlib import Path

from core.log import LogStore

from .logdata import kafka_batch, small_config


def append(store: LogStore, first: int, count: int) -> None:
    for number in range(first, first + count):
        store.append("events", number % 2, f"event {number}".encode())
    store.flush()


def stream(spark, data_dir: Path, **options: str):
    reader = spark.readStream.format("braid").option("path", str(data_dir))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def sink_rows(spark, out: Path) -> list[tuple[int, int, bytes]]:
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r.queue, r.offset, bytes(r.value)) for r in rows)


def test_stream_sees_appends_and_restarts_from_its_checkpoint(spark, tmp_path: Path):
    data_dir, out, checkpoint = tmp_path / "d", tmp_path / "out", tmp_path / "checkpoint"
    store = LogStore(small_config(data_dir))
    append(store, 0, 100)

    def start(**trigger):
        return (
            stream(spark, data_dir, topics="events")
            .select("queue", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start(processingTime="200 milliseconds")
    try:
        query.processAllAvailable()
        assert len(sink_rows(spark, out)) == 100
        append(store, 100, 50)  # while the query runs
        query.processAllAvailable()
        assert len(sink_rows(spark, out)) == 150
    finally:
        query.stop()
    append(store, 150, 30)
    # A queue created while the query was down is read from its beginning.
    store.append_batch("events", 2, kafka_batch([(1, None, b"batched", [])] * 3), 3)
    store.flush()
    query = start(availableNow=True)
    query.awaitTermination(120)
    rows = sink_rows(spark, out)
    assert len(rows) == 183
    assert len({(queue, offset) for queue, offset, _ in rows}) == 183  # exactly once
    values = sorted(value for queue, _, value in rows if queue < 2)
    assert values == sorted(f"event {n}".encode() for n in range(180))
    store.close()


def test_available_now_honours_max_records_per_trigger(spark, tmp_path: Path):
    data_dir = tmp_path / "d"
    store = LogStore(small_config(data_dir))
    append(store, 0, 200)
    query = (
        stream(spark, data_dir, maxRecordsPerTrigger="40", startingOffsets="earliest")
        .writeStream.format("memory")
        .queryName("capped")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 200
    assert max(sizes) <= 40
    assert len(sizes) == 5
    assert spark.table("capped").select("queue", "offset").distinct().count() == 200
    store.close()


def test_starting_offsets_latest_skips_what_is_there(spark, tmp_path: Path):
    data_dir = tmp_path / "d"
    store = LogStore(small_config(data_dir))
    append(store, 0, 20)
    query = (
        stream(spark, data_dir, startingOffsets="latest")
        .writeStream.format("memory")
        .queryName("latest_only")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        append(store, 20, 6)
        query.processAllAvailable()
    finally:
        query.stop()
    values = sorted(bytes(r.value) for r in spark.table("latest_only").collect())
    assert values == sorted(f"event {n}".encode() for n in range(20, 26))
    store.close()
