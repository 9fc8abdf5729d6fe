"""The in-place append paths, batched index entries and the read path's trusted range.

Each fast path must write exactly the bytes the general encoder writes (frames decode and verify
the same) and the read path must still catch a corrupt frame wherever the engine promises to.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.log import LogReader, LogStore, names
from core.log import record as rec
from core.transactions.decisions import DecisionWriter, LinkDecision, TargetIndex

from .conftest import SMALL_SEGMENT, small_config


def _flip_byte(data_dir: Path, position: int, segment_size: int = SMALL_SEGMENT) -> None:
    """Flip one byte of the commit log through the file (the page cache the mapping shares)."""
    path = (
        data_dir / names.COMMITLOG_DIR / names.segment_name(position // segment_size * segment_size)
    )
    fd = os.open(path, os.O_RDWR)
    try:
        offset = position % segment_size
        (byte,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte ^ 0x20]), offset)
    finally:
        os.close(fd)


def _reencoded(store: LogStore, position: int) -> bytes:
    """The frame at ``position`` encoded again by the general encoder from its decoded fields
    (every field a half or a decision LINK may carry)."""
    record = store.read_at(position)
    return rec.encode_record(
        record.topic.encode(),
        record.queue,
        record.body,
        store_ms=record.store_ms,
        key=record.key,
        headers=rec.encode_headers(record.headers),
        tags=rec.encode_tags(record.tags),
        client=record.client.encode(),
        destinations=rec.encode_destinations(record.destinations),
        flags=record.flags,
        protocol=record.protocol,
        born_ms=record.born_ms,
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # queue
            st.one_of(  # bodies: of any sizes, or all of one size (append_many's uniform path)
                st.lists(st.binary(max_size=700), min_size=1, max_size=30),
                st.integers(0, 700).flatmap(
                    lambda size: st.lists(
                        st.binary(min_size=size, max_size=size), min_size=2, max_size=30
                    )
                ),
            ),
            st.sampled_from([b"", b"k", b"key-" * 9]),
            st.sampled_from([rec.PROTOCOL_INTERNAL, rec.PROTOCOL_AMQP, rec.PROTOCOL_MQTT]),
            st.booleans(),  # append_many, or single appends
            st.sampled_from([0, 1_600_000_000_000]),  # born_ms (single appends)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_in_place_frames_equal_the_general_encoder(tmp_path_factory, calls):
    data_dir = tmp_path_factory.mktemp("fast")
    store = LogStore(small_config(data_dir, segment_size=16 * 1024))
    expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    positions = []
    for queue, bodies, key, protocol, many, born_ms in calls:
        if many:
            appended = store.append_many("f", queue, bodies, key=key, protocol=protocol)
            assert [offset for _, _, offset in appended.offsets] == list(
                range(len(expected[queue]), len(expected[queue]) + len(bodies))
            )
        else:
            for body in bodies:
                appended = store.append(
                    "f", queue, body, key=key, protocol=protocol, born_ms=born_ms
                )
                assert appended.offsets == [("f", queue, len(expected[queue]) + 0)]
                expected[queue].append(body)
                positions.append(appended.position)
            continue
        expected[queue].extend(bodies)
    assert store.verify() == []
    for position in positions:
        buf, start, size = store.commitlog.read_frame(position)
        assert bytes(buf[start : start + size]) == _reencoded(store, position)
    for queue, bodies in expected.items():
        got = store.read("f", queue, 0, max_records=100_000)
        assert [bytes(r.body) for r in got] == bodies
        assert [r.offset for r in got] == list(range(len(bodies)))
    store.close()
    reader = LogReader(data_dir)
    assert reader.verify() == []
    for queue, bodies in expected.items():
        assert [bytes(r.body) for r in reader.read("f", queue, 0, max_records=100_000)] == bodies
    reader.close()


def test_append_many_runs_cross_index_files_and_segments(tmp_path: Path):
    # 64 entries per index file: batches of 100 straddle files; 16 KiB segments: batches roll.
    store = LogStore(small_config(tmp_path / "d", segment_size=16 * 1024))
    bodies = [bytes([i]) * (i % 50) for i in range(100)]
    for _ in range(30):
        store.append_many("m", 0, bodies)
    assert len(store.commitlog.segments) > 3
    index = store.queue_index("m", 0)
    assert index is not None
    assert len(index.files) > 40
    got = store.read("m", 0, 0, max_records=10_000)
    assert [bytes(r.body) for r in got] == bodies * 30
    assert [r.offset for r in got] == list(range(3000))
    store.close()
    reopened = LogStore(small_config(tmp_path / "d", segment_size=16 * 1024))
    assert reopened.recovery.replayed_records == 0
    assert reopened.queue_bounds("m", 0) == (0, 3000)
    reopened.close()


def test_checkpoint_covers_entries_written_by_the_fast_paths(tmp_path: Path):
    """Index entries written without ConsumeQueue.append still reach the checkpoint's fsync
    list, and a store opened after a crash (no clean close) finds every one of them."""
    data_dir = tmp_path / "cp"
    store = LogStore(small_config(data_dir))
    for i in range(100):
        store.append("cp", 0, b"%d" % i)
    index = store.queue_index("cp", 0)
    assert index is not None
    store.checkpoint()
    assert index.take_dirty() == set()  # the checkpoint took them
    store.append("cp", 0, b"one more")
    assert index.take_dirty() == {100 // 64}
    store.append_many("cp", 0, [b"x"] * 40)  # entries 101..140: files 1 and 2
    assert index.take_dirty() == {1, 2}
    store.checkpoint()
    # A crash: no close, so nothing but the checkpoint and the recovery scan is trusted.
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)
    reopened = LogStore(small_config(data_dir))
    assert reopened.queue_bounds("cp", 0) == (0, 141)
    assert reopened.recovery.replayed_records == 0
    assert [bytes(r.body) for r in reopened.read("cp", 0, 99, max_records=3)] == [
        b"99",
        b"one more",
        b"x",
    ]
    reopened.close()


@pytest.mark.parametrize("how", ["trusted", "argument", "config"])
def test_a_flipped_byte_under_a_running_writer(tmp_path: Path, how: str):
    """Frames this process appended skip the CRC check on its own reads unless
    ``check_own_writes`` (argument, or ``[log] check_own_writes``); a reader in another process,
    or the writer after a restart, always checks them (the flip happens on the file, i.e. as a
    disk would corrupt it)."""
    data_dir = tmp_path / "w"
    check_own_writes = how != "trusted"
    if how == "config":
        store = LogStore(dataclasses.replace(small_config(data_dir), check_own_writes=True))
    else:
        store = LogStore(small_config(data_dir), check_own_writes=check_own_writes)
    appended = [store.append("w", 0, b"%04d" % i * 40) for i in range(400)]
    assert len(store.commitlog.segments) > 1
    victim = appended[10]
    assert victim.end <= SMALL_SEGMENT  # in the first, sealed segment
    _flip_byte(data_dir, victim.position + 100)
    # A read serves the records before the damage; one that starts at it raises (issue 21
    # item 6: before, the whole read raised).
    if check_own_writes:
        assert len(store.read("w", 0, 0, max_records=1000)) == 10
        with pytest.raises(rec.CorruptRecordError) as caught:
            store.read("w", 0, 10, max_records=1000)
        assert caught.value.position == victim.position
    else:
        assert len(store.read("w", 0, 0, max_records=1000)) == 400
    reader = LogReader(data_dir)
    assert len(reader.read("w", 0, 0, max_records=1000)) == 10
    with pytest.raises(rec.CorruptRecordError) as caught:
        reader.read("w", 0, 10, max_records=1000)
    assert caught.value.position == victim.position
    assert [bytes(r.body) for r in reader.read("w", 0, 11, max_records=2)] == [
        b"0011" * 40,
        b"0012" * 40,
    ]
    reader.close()
    store.close()
    reopened = LogStore(small_config(data_dir))
    with pytest.raises(rec.CorruptRecordError):
        reopened.read("w", 0, 10, max_records=1)
    reopened.close()


def test_frames_written_before_this_process_are_checked(tmp_path: Path):
    data_dir = tmp_path / "a"
    store = LogStore(small_config(data_dir))
    appended = [store.append("a", 0, b"r%03d" % i) for i in range(20)]
    store.close()
    reopened = LogStore(small_config(data_dir))
    _flip_byte(data_dir, appended[5].position + 75)  # in its body
    with pytest.raises(rec.CorruptRecordError):
        reopened.read("a", 0, 5, max_records=1)
    fresh = reopened.append("a", 0, b"new")
    assert [bytes(r.body) for r in reopened.read("a", 0, fresh.offsets[0][2])] == [b"new"]
    assert [bytes(r.body) for r in reopened.read("a", 0, 6, max_records=2)] == [b"r006", b"r007"]
    reopened.close()


def test_queue_records_keep_their_attributes_and_identity(store: LogStore):
    first = store.append("q", 0, b"same", key=b"k")
    store.append("q", 0, b"same", key=b"k")
    one, two = store.read("q", 0, 0)
    assert (one.topic, one.queue, one.offset, one.next_offset) == ("q", 0, 0, 1)
    assert (one.position, one.size, one.record_count) == (
        first.position,
        first.end - first.position,
        1,
    )
    assert one.tag_mask == 0
    assert one.link_headers is None
    assert one.store_ms > 0
    assert bytes(one.body) == b"same"
    assert one.record().key == b"k"
    # Compared and hashed by identity, as before, although the two frames are equal.
    assert one != two
    assert len({one, two}) == 2
    assert one == one


def test_large_batches_written_with_pwrite_read_back_through_the_mapping(tmp_path: Path):
    """Batches past the staging threshold go through pwrite: the mapping, a reader in another
    process and recovery all see them, interleaved with single appends written in place."""
    data_dir = tmp_path / "big"
    config = small_config(data_dir, segment_size=1 << 20, index_entries_per_file=1000)
    store = LogStore(config)
    expected = []
    for round_number in range(20):
        bodies = [bytes([round_number, i]) * 600 for i in range(60)]  # 60 x 1.2 KB: staged
        store.append_many("big", 0, bodies, key=b"k" if round_number % 2 else b"")
        expected += bodies
        single = b"single %d" % round_number
        store.append("big", 0, single)
        expected.append(single)
    assert len(store.commitlog.segments) > 1
    assert [bytes(r.body) for r in store.read("big", 0, 0, max_records=10_000)] == expected
    assert store.verify() == []
    reader = LogReader(data_dir)
    assert [bytes(r.body) for r in reader.read("big", 0, 0, max_records=10_000)] == expected
    reader.close()
    # A crash: nothing but the mapping's pages, the checkpoint and recovery.
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)
    reopened = LogStore(config)
    assert [bytes(r.body) for r in reopened.read("big", 0, 0, max_records=10_000)] == expected
    reopened.close()


def test_memoryview_and_bytearray_bodies_take_the_copying_path(store: LogStore):
    """Bodies that are not ``bytes`` (gateways pass views of their receive buffers) are copied
    on their own rather than packed with the frame; the frames come out the same."""
    raw = bytearray(b"0123456789" * 30)
    bodies = [memoryview(raw)[i : i + 25 + i] for i in range(10)]
    expected = [bytes(body) for body in bodies]
    many = store.append_many("v", 0, bodies, key=b"key")
    single = [store.append("v", 0, body, key=b"k") for body in (bytearray(b"ba"), bodies[3])]
    # All of one size, views and bytes mixed (append_many's uniform path).
    same_size = [memoryview(raw)[i : i + 20] if i % 2 else bytes(raw[i : i + 20]) for i in range(6)]
    uniform = store.append_many("v", 0, same_size, key=b"")
    got = store.read("v", 0, 0)
    assert [bytes(r.body) for r in got] == [
        *expected,
        b"ba",
        expected[3],
        *(bytes(body) for body in same_size),
    ]
    assert [r.record().key for r in got] == [b"key"] * 10 + [b"k", b"k"] + [b""] * 6
    assert store.verify() == []
    for appended in (many, *single, uniform):
        buf, start, size = store.commitlog.read_frame(appended.position)
        assert bytes(buf[start : start + size]) == _reencoded(store, appended.position)


def test_disk_use_follows_the_data_not_the_segment_size(tmp_path: Path):
    """Blocks are reserved a stretch ahead of the writer, never a whole 1 GiB segment (every
    test and small deployment would take a GiB of disk per data directory)."""
    store = LogStore(small_config(tmp_path / "d", segment_size=1 << 30))
    for _ in range(100):
        store.append("d", 0, b"x" * 1000)
    store.append_many("d", 0, [b"y" * 1000] * 100)
    (segment,) = store.commitlog.segments.values()
    allocated = os.fstat(segment.fd).st_blocks * 512
    assert allocated <= 64 << 20
    store.close()


def _queue_entries(store: LogReader, topic: str, queue: int) -> list[tuple[int, ...]]:
    index = store.queue_index(topic, queue)
    if index is None:
        return []
    return [tuple(entry) for entry in index.raw_entries(0, index.next_entry)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.lists(  # the halves: (queue, body, key, headers)
                st.tuples(
                    st.integers(0, 1),
                    st.binary(max_size=900),
                    st.sampled_from([b"", b"k", b"key-" * 7]),
                    st.sampled_from([b"", rec.encode_headers([("x-braid-txn", b"t" * 19)])]),
                ),
                min_size=1,
                max_size=3,
            ),
            st.sampled_from(["g", "producer-group-" * 3]),  # the decision's client
            st.booleans(),  # known targets given, or read back from the frames
            st.integers(0, 10**9),  # a resume mark: the op headers' length varies
        ),
        min_size=1,
        max_size=15,
    )
)
def test_half_and_decision_paths_equal_the_general_encoder_and_dispatch(
    tmp_path_factory, transactions
):
    """``append_half`` and a decision LINK (with ``known_targets`` or without) write the frames
    the general encoder writes, and the index entries recovery writes when it dispatches those
    frames again from the commit log (over segment rolls: 16 KiB segments)."""
    data_dir = tmp_path_factory.mktemp("half")
    config = small_config(data_dir, segment_size=16 * 1024)
    store = LogStore(config)
    decisions = DecisionWriter(store)
    positions = []
    halves_stored = 0
    # Then enough large ones to roll several segments, whatever was drawn.
    rolling = [([(0, b"z" * 900, b"k", b"")], "g", True, 7)] * 40
    for number, (halves, client, known, mark) in enumerate(transactions + rolling):
        targets = []
        known_targets = []
        for queue, body, key, headers in halves:
            appended = store.append_half("h", queue, body, key, headers)
            if appended is None:  # rolls the segment: the general path
                appended = store.append(
                    "h", queue, body, key=key, headers=headers, flags=rec.FLAG_HALF
                )
            assert appended.offsets == [(names.HALF_TOPIC, 0, halves_stored)]
            halves_stored += 1
            positions.append(appended.position)
            targets.append((appended.position, appended.end - appended.position))
            known_targets.append(TargetIndex(0, 1, (("h", queue),)))
        decision = LinkDecision(
            b"txn-%d" % number,
            client,
            ("commit",),
            rec.encode_headers([("x-braid-txn-resume", b"%d 0" % mark)]),
        )
        committed = decisions.append(targets, decision, known_targets if known else None)
        assert committed.offsets[0] == (names.TRANSACTIONS_TOPIC, 0, number)
        positions.append(committed.position)
    assert len(store.commitlog.segments) > 2
    for position in positions:
        buf, start, size = store.commitlog.read_frame(position)
        assert bytes(buf[start : start + size]) == _reencoded(store, position)
    queues = [(names.HALF_TOPIC, 0), (names.TRANSACTIONS_TOPIC, 0), ("h", 0), ("h", 1)]
    written = {queue: _queue_entries(store, *queue) for queue in queues}
    # Crash with the checkpoint back at the start: recovery dispatches every frame again.
    (data_dir / names.CHECKPOINT_FILE).write_text('{"position": 0, "queues": {}}')
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)
    reopened = LogStore(config)
    assert {queue: _queue_entries(reopened, *queue) for queue in queues} == written
    assert reopened.verify() == []
    reopened.close()


def test_large_frames_written_with_pwrite_read_back_and_survive_a_crash(tmp_path: Path):
    """Frames of 32 KiB and more (a Kafka batch, a big message) go to the segment file with
    pwrite/pwritev instead of through the mapping: they read back through the mapping as the
    general encoder's bytes, across segment rolls, and recovery after a crash finds them all."""
    data_dir = tmp_path / "large"
    config = small_config(data_dir, segment_size=256 * 1024)
    store = LogStore(config)
    sizes = [31 * 1024, 32 * 1024, 40 * 1024, 100 * 1024, 200 * 1024, 7, 64 * 1024] * 3
    expected = []
    positions = []
    for number, size in enumerate(sizes):
        body = bytes([number % 251]) * size
        if number % 2:  # the general path with headers: encode_record_parts + append_parts
            appended = store.append("big", 0, body, headers=[("h", b"%d" % number)])
        else:  # a Kafka-style batch record, from a view of a larger buffer
            appended = store.append_batch("big", 0, memoryview(b"!" + body)[1:], 1)
        expected.append(body)
        positions.append(appended.position)
    assert len(store.commitlog.segments) > 5
    for position in positions:
        buf, start, size = store.commitlog.read_frame(position)
        assert bytes(buf[start : start + size]) == _reencoded(store, position)
    assert [bytes(r.body) for r in store.read("big", 0, 0, max_records=100)] == expected
    assert store.verify() == []
    # Crash with the checkpoint back at the start: recovery re-reads every frame.
    (data_dir / names.CHECKPOINT_FILE).write_text('{"position": 0, "queues": {}}')
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)
    reopened = LogStore(config)
    assert [bytes(r.body) for r in reopened.read("big", 0, 0, max_records=100)] == expected
    assert reopened.verify() == []
    reopened.close()
