"""The decoder behind the source, without Spark: rows equal what LogStore appended."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from crc32c import crc32c

from core.log import LogReader, LogStore
from core.log import record as rec
from spark import decode, readers
from spark.options import OptionError, ReadOptions, Slice, pack_slices, partition_count
from spark.schema import COLUMN_NAMES, arrow_schema
from spark.source import cap_offsets, merge_offsets

from .logdata import kafka_batch, small_config, write_mixed


def rows_of(
    reader: LogReader, topic: str, queue: int, start: int = 0, end: int = 1 << 62, **kwargs
) -> list[dict]:
    out: list[dict] = []
    for batch in decode.read_range(reader, topic, queue, start, end, **kwargs):
        assert batch.schema.equals(arrow_schema(tuple(kwargs.get("columns", COLUMN_NAMES))))
        out.extend(batch.to_pylist())
    return out


def as_headers(pairs):
    return [{"key": name, "value": value} for name, value in pairs]


def test_rows_equal_what_was_appended(tmp_path: Path):
    expected = write_mixed(tmp_path / "d")
    reader = LogReader(tmp_path / "d")
    got = {}
    for topic, queue in reader.queues():
        for row in rows_of(reader, topic, queue):
            got[(topic, queue, row["offset"])] = row
    assert set(got) == set(expected.rows)
    for key, columns in expected.rows.items():
        row = got[key]
        for column, value in columns.items():
            if column == "timestamp_ms":
                assert int(row["timestamp"].timestamp() * 1000) == value, key
            elif column == "headers":
                assert row["headers"] == as_headers(value), key
            else:
                assert row[column] == value, (key, column)
    # A record fanned out by an exchange is one frame seen in each queue it is in.
    fanned = [row for row in got.values() if row["subject"] == "sensor.eu.0"]
    assert len(fanned) == 2
    assert len({row["position"] for row in fanned}) == 1
    # The DLQ row is the original record (same position), seen with the LINK's headers.
    (dead,) = [row for key, row in got.items() if key[0] == "%DLQ%billing"]
    (original,) = [row for row in got.values() if row["value"] == b"poison" and row is not dead]
    assert dead["position"] == original["position"]


def test_half_message_is_invisible_until_linked(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "d"))
    half = store.append("payments", 0, b"half", flags=rec.FLAG_HALF)
    reader = LogReader(tmp_path / "d")
    assert reader.queues() == []
    assert [r["value"] for r in rows_of(reader, "__half", 0)] == [b"half"]
    store.link([half.position], [("payments", 0)])
    readers.refresh(reader)
    assert [r["value"] for r in rows_of(reader, "payments", 0)] == [b"half"]
    store.close()


def test_adjacent_ranges_split_kafka_batches_without_loss_or_repeat(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "d"))
    values = []
    for number in range(20):
        records = [(1000, None, f"{number}.{i}".encode(), []) for i in range(number % 5 + 1)]
        store.append_batch("k", 0, kafka_batch(records), len(records))
        values += [value for _, _, value, _ in records]
        store.append("k", 0, f"plain {number}".encode())
        values.append(f"plain {number}".encode())
    store.close()
    reader = LogReader(tmp_path / "d")
    assert reader.queue_bounds("k", 0) == (0, len(values))
    for _ in range(20):
        cuts = sorted(random.sample(range(1, len(values)), 4))
        got = []
        for start, end in zip([0, *cuts], [*cuts, len(values)], strict=True):
            rows = rows_of(reader, "k", 0, start, end, batch_rows=7)
            assert [r["offset"] for r in rows] == list(range(start, end))
            got += [r["value"] for r in rows]
        assert got == values


def test_matches_log_reader_across_segment_and_index_file_boundaries(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "d", segment_size=8192, index_entries_per_file=16))
    rng = random.Random(7)
    for i in range(600):
        body = None if i % 97 == 5 else rng.randbytes(rng.randrange(0, 700))
        store.append(
            "t",
            i % 3,
            body,
            key=None if i % 4 else str(i).encode(),
            subject="s" * (i % 14),
            client="c" * (i % 3),
        )
    store.close()
    reader = LogReader(tmp_path / "d")
    assert len(reader.commitlog.segments) > 10
    for queue in range(3):
        expected = [entry.record() for entry in reader.read("t", queue, 0, max_records=10_000)]
        rows = rows_of(reader, "t", queue, batch_rows=50)
        assert [r["value"] for r in rows] == [record.body for record in expected]
        assert [r["key"] for r in rows] == [record.key for record in expected]
        assert [r["subject"] for r in rows] == [record.subject for record in expected]
        assert [r["client_id"] for r in rows] == [record.client for record in expected]
        assert [r["position"] for r in rows] == [record.position for record in expected]


def test_columns_subset_in_any_order(tmp_path: Path):
    write_mixed(tmp_path / "d")
    reader = LogReader(tmp_path / "d")
    rows = rows_of(reader, "amq.topic", 0, columns=("value", "offset"))
    assert rows[0] == {"value": b"amqp body 0", "offset": 0}
    kafka = rows_of(reader, "orders", 1, columns=("key",))
    assert kafka[0] == {"key": b"order-1-0"}


def test_dedupe_keeps_each_record_in_its_home_queue_only(tmp_path: Path):
    write_mixed(tmp_path / "d")
    reader = LogReader(tmp_path / "d")
    alerts = rows_of(reader, "alerts", 0, dedupe=True)
    exchange = rows_of(reader, "amq.topic", 0, dedupe=True)
    dlq = rows_of(reader, "%DLQ%billing", 0, dedupe=True)
    assert alerts == []
    assert dlq == []
    assert len(exchange) == 6
    assert len(rows_of(reader, "orders", 0, dedupe=True)) == len(rows_of(reader, "orders", 0))


def test_a_flipped_byte_is_an_error_never_a_row(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "d"))
    appended = [store.append("t", 0, f"body {i}".encode() * 10) for i in range(50)]
    store.close()
    segment = tmp_path / "d" / "commitlog" / "00000000000000000000.log"
    with segment.open("r+b") as handle:
        handle.seek(appended[20].end - 3)
        byte = handle.read(1)
        handle.seek(appended[20].end - 3)
        handle.write(bytes([byte[0] ^ 0xFF]))
    reader = LogReader(tmp_path / "d")
    with pytest.raises(rec.CorruptRecordError):
        rows_of(reader, "t", 0)
    assert len(rows_of(reader, "t", 0, 0, 20)) == 20
    assert len(rows_of(reader, "t", 0, verify_checksums=False)) == 50


def test_bulk_and_record_by_record_decoding_agree(tmp_path: Path, monkeypatch):
    """The column-by-column decoder and the record-by-record one (core.log.record, used for
    Kafka batches and LINKs) yield identical tables on a mixed log: plain records with and
    without keys, null and empty bodies, headers, tags, short (inline) and long fields, fanned
    out, across segments and index files; Kafka batches; LINKs (half messages, timers, DLQ)."""
    data_dir = tmp_path / "d"
    write_mixed(data_dir)
    store = LogStore(small_config(data_dir))
    rng = random.Random(11)
    for i in range(2500):
        store.append(
            "plain",
            i % 3,
            None if i % 7 == 3 else rng.randbytes(rng.choice([0, 3, 12, 13, 90, 400])),
            key=None if i % 3 else rng.randbytes(rng.choice([0, 4, 12, 40])),
            headers=[("h", b"v" * (i % 4)), ("h", b"")] if i % 5 == 0 else (),
            tags=["a", "bb"] if i % 6 == 0 else [],
            subject="s" * (i % 20),
            client="c" * (i % 15),
            address="x" * (i % 13),
            protocol=i % 5,
            destinations=[("plain", (i + 1) % 3), ("plain", i % 3)] if i % 11 == 0 else None,
        )
    store.close()
    reader = LogReader(data_dir)
    assert len(reader.commitlog.segments) >= 2

    def tables(**kwargs) -> dict:
        return {
            (topic, queue): pa.Table.from_batches(
                list(decode.read_range(reader, topic, queue, 0, 1 << 62, batch_rows=700, **kwargs)),
                schema=arrow_schema(),
            )
            for topic, queue in reader.queues(include_system=True)
        }

    for kwargs in ({}, {"dedupe": True}, {"verify_checksums": False}):
        bulk = tables(**kwargs)
        with monkeypatch.context() as patched:
            patched.setattr(
                decode, "_record_by_record", lambda headers, _: np.ones(len(headers), np.bool_)
            )
            one_by_one = tables(**kwargs)
        assert bulk.keys() == one_by_one.keys()
        assert sum(table.num_rows for table in bulk.values()) > 2500
        for key, table in bulk.items():
            assert table.equals(one_by_one[key]), (kwargs, key)


def test_chained_crc_check_is_every_frames_crc(tmp_path: Path):
    """The one-call CRC check over a run of frames accepts exactly the runs whose frames all
    match their CRCs, and a mismatch names the bad frame."""
    mask = decode.chain_mask()
    rng = random.Random(5)
    chained = b""
    for _ in range(50):
        message = rng.randbytes(rng.randrange(0, 300))
        chained += message + (crc32c(message) ^ mask).to_bytes(4, "little")
        assert crc32c(chained) == 0
    store = LogStore(small_config(tmp_path / "d"))
    appended = [store.append("t", i % 2, rng.randbytes(rng.randrange(1, 500))) for i in range(400)]
    store.close()
    segment = tmp_path / "d" / "commitlog" / "00000000000000000000.log"
    reader = LogReader(tmp_path / "d")
    assert len(rows_of(reader, "t", 0)) == len(rows_of(reader, "t", 1)) == 200
    for victim in (appended[0], appended[201], appended[-1]):  # scattered and adjacent frames
        original = segment.read_bytes()
        for at in (victim.position + 9, victim.position + 50, victim.end - 1):  # CRC, header, body
            data = bytearray(original)
            data[at] ^= 0x10
            segment.write_bytes(bytes(data))
            reader = LogReader(tmp_path / "d")
            queue = victim.offsets[0][1]
            with pytest.raises(rec.CorruptRecordError) as caught:
                rows_of(reader, "t", queue)
            assert caught.value.position == victim.position
            assert len(rows_of(reader, "t", 1 - queue)) == 200
            reader.close()
        segment.write_bytes(original)


def test_struct_dtypes_match_the_struct_layouts():
    assert decode.header_dtype().itemsize == rec.HEADER_SIZE
    raw = rec.HEADER.pack(*range(1, 20))
    parsed = pa.array([raw]).to_pylist()[0]
    import numpy as np

    row = np.frombuffer(parsed, dtype=decode.header_dtype())[0]
    assert [int(row[name]) for name in decode.HEADER_FIELDS] == list(range(1, 20))


# -- options and planning ---------------------------------------------------------------------


def test_options_parse_and_select(tmp_path: Path):
    write_mixed(tmp_path / "d")
    reader = LogReader(tmp_path / "d")
    options = ReadOptions.parse({"path": str(tmp_path / "d")})
    assert ("__half", 0) not in options.selected_queues(reader)
    everything = ReadOptions.parse({"path": str(tmp_path / "d"), "includeSystem": "true"})
    assert ("__half", 0) in everything.selected_queues(reader)
    named = ReadOptions.parse({"path": str(tmp_path / "d"), "topics": "orders,__timers"})
    assert named.selected_queues(reader) == [("__timers", 0), ("orders", 0), ("orders", 1)]
    queues = ReadOptions.parse({"PATH": str(tmp_path / "d"), "queues": "1,amq.topic:0"})
    assert queues.selected_queues(reader) == [("amq.topic", 0), ("devices", 1), ("orders", 1)]
    pattern = ReadOptions.parse({"path": "x", "topicPattern": "dev.*"})
    assert pattern.selects("devices", 3)
    assert not pattern.selects("orders", 0)
    offsets = ReadOptions.parse(
        {
            "path": str(tmp_path / "d"),
            "topics": "orders",
            "startingOffsets": '{"orders": {"0": 3, "1": -2}}',
            "endingOffsets": "5",
        }
    )
    assert offsets.batch_slices(reader) == [Slice("orders", 0, 3, 5), Slice("orders", 1, 0, 5)]
    for bad in (
        {},
        {"path": "x", "queues": "a"},
        {"path": "x", "startTime": "yesterday"},
        {"path": "x", "maxRecordsPerPartition": "0"},
        {"path": "x", "dedupe": "maybe"},
    ):
        with pytest.raises(OptionError):
            ReadOptions.parse(bad)
    epoch_plus_one = ReadOptions.parse({"path": "x", "startTime": "1970-01-01T00:00:01Z"})
    assert epoch_plus_one.start_time_ms == 1000


def test_pack_slices_splits_large_and_groups_small():
    slices = [Slice("big", 0, 0, 25), Slice("a", 0, 5, 8), Slice("b", 0, 0, 2), Slice("c", 0, 0, 9)]
    packed = pack_slices(slices, 10)
    assert [sum(s.records for s in group) for group in packed] == [10, 10, 10, 9]
    flat = [s for group in packed for s in group]
    assert sum(s.records for s in flat) == 25 + 3 + 2 + 9
    assert [s for s in flat if s.topic == "big"] == [
        Slice("big", 0, 0, 10),
        Slice("big", 0, 10, 20),
        Slice("big", 0, 20, 25),
    ]


def test_partitions_are_balanced_and_fill_every_core():
    assert partition_count(5_000_000, 4_000_000, 2) == 2
    assert partition_count(5_000_000, 1_000_000, 2) == 6  # 3 full waves, not 2 and a half
    assert partition_count(5_000_000, 1_000_000, 1) == 5
    assert partition_count(250_000, 4_000_000, 8) == 2  # never below 100,000 records a task
    assert partition_count(50, 4_000_000, 8) == 1
    assert partition_count(0, 10, 2) == 0
    for total in range(1, 80):
        for most in (1, 3, 7, 100):
            for cores in (1, 2, 3, 8):
                groups = pack_slices([Slice("t", 0, 0, total)], most, cores)
                sizes = [sum(piece.records for piece in group) for group in groups]
                assert sum(sizes) == total
                assert max(sizes) <= most
                assert max(sizes) - min(sizes) <= 1
    options = ReadOptions.parse({"path": "x", "minPartitions": "4"})
    assert options.min_partitions == 4


def test_register_default_min_partitions_travels_to_the_workers():
    """spark.register's default reaches the planner: the registered subclass is pickled by
    value (Python workers unpickle the class Spark was given), and a read's own option wins."""
    from pyspark import cloudpickle

    from spark.source import BraidDataSource, with_default_min_partitions

    assert with_default_min_partitions(None) is BraidDataSource
    assert with_default_min_partitions(1) is BraidDataSource
    clone = cloudpickle.loads(cloudpickle.dumps(with_default_min_partitions(3)))
    assert issubclass(clone, BraidDataSource)
    assert clone.name() == "braid"
    assert clone({"path": "x"})._options()["minPartitions"] == "3"
    assert clone({"path": "x", "MINPARTITIONS": "5"})._options() == {
        "path": "x",
        "MINPARTITIONS": "5",
    }


def test_streaming_offsets_never_go_back_and_caps_share_the_budget():
    assert merge_offsets({"t": {"0": 5}}, {"t": {"0": 3, "1": 7}}) == {"t": {"0": 5, "1": 7}}
    start = {"t": {"0": 0, "1": 100}}
    end = {"t": {"0": 300, "1": 200}, "u": {"0": 1}}
    capped = cap_offsets(start, end, 40)
    taken = capped["t"]["0"] + (capped["t"]["1"] - 100) + capped["u"]["0"]
    assert taken == 40
    assert capped["t"]["0"] > capped["t"]["1"] - 100 > 0
    assert cap_offsets(start, end, 10_000) == end


def test_batches_are_bounded_in_bytes_as_well_as_rows(tmp_path: Path, monkeypatch):
    store = LogStore(small_config(tmp_path / "d"))
    bodies = [bytes([i]) * (1000 + i) for i in range(40)]
    for body in bodies:
        store.append("big", 0, body)
    store.append_batch("big", 0, kafka_batch([(1, None, b"k" * 900, [])] * 30), 30)
    store.close()
    monkeypatch.setattr(decode, "DEFAULT_BATCH_BYTES", 5000)
    reader = LogReader(tmp_path / "d")
    batches = list(decode.read_range(reader, "big", 0, 0, 1 << 62))
    assert len(batches) > 10
    assert all(batch.nbytes < 20_000 for batch in batches)
    values = [value for batch in batches for value in batch.column("value").to_pylist()]
    assert values == bodies + [b"k" * 900] * 30
