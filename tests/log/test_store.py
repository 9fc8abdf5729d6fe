"""LogStore over real files: order, rolls, multi-queue indexing, batches, tags, time, retention."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.log import LogReader, LogStore, TagFilter, names
from core.log import record as rec

from .conftest import SMALL_SEGMENT, small_config


def test_per_queue_offsets_are_dense_and_ordered(store: LogStore):
    expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for i in range(600):
        queue = i % 3
        body = f"record {i}".encode() * (i % 7 + 1)
        appended = store.append("orders", queue, body, key=str(i).encode())
        assert appended.offsets == [("orders", queue, len(expected[queue]))]
        expected[queue].append(body)
    assert len(store.commitlog.segments) > 1, "small segments must have rolled"
    for queue, bodies in expected.items():
        assert store.queue_bounds("orders", queue) == (0, len(bodies))
        got = store.read("orders", queue, 0, max_records=10_000)
        assert [r.offset for r in got] == list(range(len(bodies)))
        assert [bytes(r.body) for r in got] == bodies
        middle = store.read("orders", queue, 57, max_records=3)
        assert [r.offset for r in middle] == [57, 58, 59]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.binary(min_size=0, max_size=3000)), min_size=1, max_size=80
    )
)
def test_property_round_trip_across_reopen(tmp_path_factory, appends):
    data_dir = tmp_path_factory.mktemp("prop")
    store = LogStore(small_config(data_dir, segment_size=8192))
    for queue, body in appends:
        store.append("p", queue, body)
    store.close()
    reader = LogReader(data_dir)
    for queue in range(4):
        bodies = [body for q, body in appends if q == queue]
        got = reader.read("p", queue, 0, max_records=1000)
        assert [r.record().body for r in got] == bodies
    reader.close()


def test_segment_roll_never_splits_a_frame(store: LogStore):
    body = b"z" * 1000
    positions = [store.append("t", 0, body).position for _ in range(200)]
    for position in positions:
        start_segment = position // SMALL_SEGMENT
        end_segment = (position + 1000 + rec.HEADER_SIZE + 1 - 1) // SMALL_SEGMENT
        assert start_segment == end_segment
    files = sorted((store.data_dir / names.COMMITLOG_DIR).iterdir())
    assert next(f.name for f in files) == "00000000000000000000.log"
    assert all(names.number_of(f) % SMALL_SEGMENT == 0 for f in files)


def test_one_record_indexed_in_many_queues_is_stored_once(store: LogStore):
    before = store.commitlog.write_position
    appended = store.append(
        "amq.topic",
        0,
        b"shared body",
        subject="a.b",
        destinations=[("amq.topic", 0), ("q.one", 0), ("q.two", 0), ("mqtt-session-7", 0)],
    )
    written = store.commitlog.write_position - before
    assert written == appended.end - appended.position
    assert written < 200  # one frame, not four
    positions = set()
    for topic in ("amq.topic", "q.one", "q.two", "mqtt-session-7"):
        (got,) = store.read(topic, 0, 0)
        assert bytes(got.body) == b"shared body"
        positions.add(got.position)
    assert positions == {appended.position}


def test_batch_record_indexed_once_and_patched_on_read(store: LogStore):
    # A Kafka RecordBatch: base offset (8 bytes) + the rest, which must come back unchanged.
    fake_batch = (0).to_bytes(8, "big") + b"\x00\x00\x00\x30" + bytes(range(48))
    store.append("k", 0, b"plain")  # offset 0
    appended = store.append_batch("k", 0, fake_batch, record_count=5)
    assert appended.offsets == [("k", 0, 1)]
    store.append("k", 0, b"after")
    assert store.queue_bounds("k", 0) == (0, 7)
    index = store.queue_index("k", 0)
    assert index is not None
    assert index.next_entry == 3
    for offset in range(1, 6):
        (got,) = store.read("k", 0, offset, max_records=1)
        assert got.offset == 1
        assert got.record_count == 5
        patched = got.batch_with_base_offset()
        assert patched[:8] == (1).to_bytes(8, "big")
        assert patched[8:] == fake_batch[8:]
    (after,) = store.read("k", 0, 6, max_records=1)
    assert bytes(after.body) == b"after"


def test_tag_filter_uses_index_and_confirms_tags(store: LogStore):
    tags_cycle = [["TagA"], ["TagB"], ["TagC"], [], ["TagA", "TagC"]]
    for i in range(100):
        store.append("tagged", 0, str(i).encode(), tags=tags_cycle[i % 5])
    got = store.read("tagged", 0, 0, max_records=1000, tag_filter=TagFilter.parse("TagA || TagB"))
    assert [int(bytes(r.body)) for r in got] == [i for i in range(100) if i % 5 in (0, 1, 4)]
    assert TagFilter.parse("*") is None
    only_c = store.read("tagged", 0, 0, max_records=1000, tag_filter=TagFilter(["TagC"]))
    assert [int(bytes(r.body)) for r in only_c] == [i for i in range(100) if i % 5 in (2, 4)]


def test_tag_hash_collision_is_confirmed_against_the_body(store: LogStore):
    from core.log.tags import tag_mask

    wanted = tag_mask("wanted")
    colliding = next(
        f"t{i}"
        for i in range(1_000_000)
        if tag_mask(f"t{i}") & wanted == wanted and f"t{i}" != "wanted"
    )
    store.append("c", 0, b"collides", tags=[colliding])
    store.append("c", 0, b"real", tags=["wanted"])
    got = store.read("c", 0, 0, tag_filter=TagFilter(["wanted"]))
    assert [bytes(r.body) for r in got] == [b"real"]


def test_read_by_time(store: LogStore):
    store.append("time", 0, b"early")
    time.sleep(0.02)
    cut = time.time_ns() // 1_000_000
    time.sleep(0.01)
    store.append("time", 0, b"late")
    assert store.offset_for_time("time", 0, 0) == 0
    assert store.offset_for_time("time", 0, cut) == 1
    assert store.offset_for_time("time", 0, cut + 10_000_000) == 2


def test_half_and_delayed_records_are_invisible_until_linked(store: LogStore):
    half = store.append("orders", 0, b"half", flags=rec.FLAG_HALF)
    future = time.time_ns() // 1_000_000 + 3_600_000
    delayed = store.append("orders", 0, b"later", deliver_at_ms=future)
    assert store.read("orders", 0, 0) == []
    assert [bytes(r.body) for r in store.read(names.HALF_TOPIC, 0, 0)] == [b"half"]
    assert [bytes(r.body) for r in store.read(names.TIMERS_TOPIC, 0, 0)] == [b"later"]
    store.link([half.position], [("orders", 0), ("audit", 0)])
    store.link([delayed.position], [("orders", 0)])
    assert [bytes(r.body) for r in store.read("orders", 0, 0)] == [b"half", b"later"]
    assert [bytes(r.body) for r in store.read("audit", 0, 0)] == [b"half"]


def test_links_and_indexes_survive_recovery_without_checkpoint(tmp_path: Path):
    data_dir = tmp_path / "d"
    store = LogStore(small_config(data_dir))
    half = store.append("orders", 0, b"half", flags=rec.FLAG_HALF, tags=["T"])
    for i in range(300):
        store.append("orders", i % 2, b"x" * i)
    store.link([half.position], [("orders", 0)])
    store.flush()
    # Simulate a crash: no clean close, and a checkpoint from before everything.
    (data_dir / names.CHECKPOINT_FILE).write_text('{"position": 0, "queues": {}}')
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)
    reopened = LogStore(small_config(data_dir))
    assert reopened.recovery.replayed_records == 302
    assert reopened.queue_bounds("orders", 0) == (0, 151)
    last = reopened.read("orders", 0, 150)
    assert [bytes(r.body) for r in last] == [b"half"]
    assert reopened.read("orders", 0, 0, tag_filter=TagFilter(["T"]))[0].offset == 150
    reopened.close()


def test_retention_by_size_deletes_whole_segments_unless_guarded(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "r", retention_bytes=3 * SMALL_SEGMENT))
    for _ in range(400):
        store.append("r", 0, b"y" * 1000)
    segments_before = len(store.commitlog.segments)
    assert segments_before > 4
    owed_from = store.commitlog.segment_size  # pretend segment 1 still owes a record
    store.retention_guards.append(lambda start, end: start <= owed_from < end)
    deleted = store.enforce_retention()
    assert deleted == [0]
    assert store.commitlog.start_position == SMALL_SEGMENT
    store.retention_guards.clear()
    deleted = store.enforce_retention()
    assert len(store.commitlog.segments) == 3
    start, end = store.queue_bounds("r", 0)
    assert end == 400
    assert start > 0
    got = store.read("r", 0, 0, max_records=1000)
    assert got[0].offset == start
    assert len(got) == end - start
    store.close()


def test_retention_by_time(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "r", retention_ms=60_000))
    for _ in range(200):
        store.append("r", 0, b"y" * 1000)
    now = time.time_ns() // 1_000_000
    assert store.enforce_retention(now) == []
    sealed = len(store.commitlog.segments) - 1
    assert sealed >= 2
    deleted = store.enforce_retention(now + 120_000)
    # Everything sealed goes; the active segment stays.
    assert len(deleted) == sealed
    assert len(store.commitlog.segments) == 1
    store.close()


def test_flipped_byte_in_sealed_segment_is_reported_never_served(tmp_path: Path):
    data_dir = tmp_path / "c"
    store = LogStore(small_config(data_dir))
    for i in range(300):
        store.append("c", 0, f"{i:04d}".encode() * 50)
    store.close()
    first = sorted((data_dir / names.COMMITLOG_DIR).iterdir())[0]
    with first.open("r+b") as handle:
        handle.seek(5000)
        byte = handle.read(1)
        handle.seek(5000)
        handle.write(bytes([byte[0] ^ 0x40]))
    reader = LogReader(data_dir)
    errors = reader.verify()
    assert len(errors) == 1
    assert errors[0].position < SMALL_SEGMENT
    served = []
    corrupt_offsets = []
    for offset in range(300):
        try:
            served.extend(reader.read("c", 0, offset, max_records=1))
        except rec.CorruptRecordError:
            corrupt_offsets.append(offset)
    assert len(corrupt_offsets) == 1
    assert all(r.position + r.size <= 5000 or r.position > 5000 for r in served)
    assert len(served) == 299
    reader.close()


def test_reader_in_another_process_sees_a_running_writer(tmp_path: Path):
    data_dir = tmp_path / "live"
    store = LogStore(small_config(data_dir))
    for i in range(50):
        store.append("live", 0, f"m{i}".encode())
    script = (
        "import sys, json; from core.log import LogReader\n"
        "r = LogReader(sys.argv[1])\n"
        "got = r.read('live', 0, 0, max_records=10**6)\n"
        "print(json.dumps([bytes(x.body).decode() for x in got]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == str([f"m{i}" for i in range(50)]).replace("'", '"')
    store.close()


def test_reader_refresh_picks_up_appends(tmp_path: Path):
    data_dir = tmp_path / "live"
    store = LogStore(small_config(data_dir))
    store.append("live", 0, b"first")
    reader = LogReader(data_dir)
    assert len(reader.read("live", 0, 0)) == 1
    for _i in range(500):
        store.append("live", 0, b"more" * 30)
        store.append("other", 0, b"o")
    reader.refresh()
    assert reader.queue_bounds("live", 0) == (0, 501)
    assert len(reader.read("live", 0, 0, max_records=10_000)) == 501
    assert ("other", 0) in reader.queues()
    reader.close()
    store.close()


async def test_group_commit_shares_fsyncs(tmp_path: Path):
    store = LogStore(small_config(tmp_path / "gc"))
    await store.start()
    fsyncs_before = store.metrics["fsyncs"]

    async def writer(n: int) -> None:
        for _ in range(n):
            appended = store.append("g", 0, b"v" * 100)
            await store.wait_durable(appended.end, "g")
            assert store.commitlog.flushed_position >= appended.end

    await asyncio.gather(*(writer(10) for _ in range(64)))
    fsyncs = store.metrics["fsyncs"] - fsyncs_before
    assert fsyncs < 640 / 4, f"{fsyncs} fsyncs for 640 concurrent sync appends"
    await store.aclose()


async def test_async_durability_per_topic_override(tmp_path: Path):
    store = LogStore(
        small_config(tmp_path / "a", durability="async", topic_durability={"safe": "sync"})
    )
    await store.start()
    fast = store.append("fast", 0, b"x")
    await store.wait_durable(fast.end, "fast")  # async: returns without an fsync
    safe = store.append("safe", 0, b"y")
    await store.wait_durable(safe.end, "safe")
    assert store.commitlog.flushed_position >= safe.end
    await store.aclose()


def test_system_topic_names_are_reserved():
    assert all(names.is_system_topic(t) for t in names.SYSTEM_TOPICS)
    assert not names.is_system_topic("orders")


def test_topic_directory_names_round_trip():
    for topic in ("plain", "a/b", "amq.topic", ".hidden", "ünï", "", "x y%z"):
        encoded = names.encode_topic_dir(topic)
        assert "/" not in encoded
        assert not encoded.startswith(".")
        assert names.decode_topic_dir(encoded) == topic


def test_link_many_uses_each_targets_own_destinations_atomically(store: LogStore):
    first = store.append("a", 0, b"one", flags=rec.FLAG_HALF, destinations=[("a", 0), ("q", 0)])
    second = store.append("b", 2, b"two", flags=rec.FLAG_HALF)
    assert store.read("a", 0, 0) == []
    link = store.link([first.position, second.position])
    assert sorted(link.offsets) == [("a", 0, 0), ("b", 2, 0), ("q", 0, 0)]
    assert [bytes(r.body) for r in store.read("q", 0, 0)] == [b"one"]
    assert [bytes(r.body) for r in store.read("b", 2, 0)] == [b"two"]


def test_link_with_headers_adds_them_for_readers_of_the_destination(store: LogStore):
    original = store.append("orders", 0, b"payload", headers=[("h", b"1")], tags=["T"])
    store.link([original.position], [("dlq", 0)], headers=[("x-death-reason", b"rejected")])
    (dead,) = store.read("dlq", 0, 0, tag_filter=TagFilter(["T"]))
    record = dead.record()
    assert record.body == b"payload"
    assert record.headers == [("h", b"1"), ("x-death-reason", b"rejected")]
    assert bytes(dead.body) == b"payload"
    (plain,) = store.read("orders", 0, 0)
    assert plain.record().headers == [("h", b"1")]


def test_an_encoded_frame_is_stored_as_append_would_store_it(tmp_path: Path) -> None:
    """LogStore.append_encoded (a record forwarded by another node, stored as it came): the
    same record and index entries as append gives, its store time set here (FLAG_DELAYED by
    it), kept across a reopen; a frame whose checksum fails is refused, nothing stored."""
    dests = [("orders", 0), ("audit", 2)]
    encoded = rec.encode_record(
        b"orders",
        0,
        b"body-1",
        store_ms=1,  # the sender's clock: replaced by the store's
        key=b"k-1",
        headers=rec.encode_headers([("h", b"v")]),
        tags=rec.encode_tags(["red"]),
        client=b"publisher-1",
        address=b"10.0.0.1:5672",
        destinations=rec.encode_destinations(dests),
        flags=rec.FLAG_COPY,
        protocol=rec.PROTOCOL_AMQP,
        born_ms=1_000,
    )
    later = int(time.time() * 1000) + 3_600_000
    delayed = rec.encode_record(b"orders", 1, b"later", store_ms=1, deliver_at_ms=later)
    direct = LogStore(small_config(tmp_path / "direct"))
    forwarded = LogStore(small_config(tmp_path / "forwarded"))
    try:
        before = int(time.time() * 1000)
        expected = direct.append(
            "orders",
            0,
            b"body-1",
            key=b"k-1",
            headers=[("h", b"v")],
            tags=["red"],
            client="publisher-1",
            address="10.0.0.1:5672",
            destinations=dests,
            protocol=rec.PROTOCOL_AMQP,
            born_ms=1_000,
            flags=rec.FLAG_COPY,
        )
        got = forwarded.append_encoded(encoded)
        assert got.offsets == expected.offsets == [("orders", 0, 0), ("audit", 2, 0)]
        assert got.end - got.position == len(encoded)
        corrupt = bytearray(encoded)
        corrupt[-1] ^= 0xFF
        with pytest.raises(rec.CorruptRecordError):
            forwarded.append_encoded(bytes(corrupt))
        forwarded.append_encoded(delayed)
        assert forwarded.queue_bounds("orders", 1) == (0, 0)  # on the timers until due
        forwarded.close()
        forwarded = LogStore(small_config(tmp_path / "forwarded"))
        for topic, queue in dests:
            (mine,) = forwarded.read(topic, queue, 0, max_records=10)
            (theirs,) = direct.read(topic, queue, 0, max_records=10)
            stored, reference = mine.record(), theirs.record()
            assert stored.store_ms >= before
            assert stored._replace(store_ms=0, position=0) == reference._replace(
                store_ms=0, position=0
            )
        assert forwarded.commitlog.write_position == got.end + len(delayed)
    finally:
        direct.close()
        forwarded.close()
