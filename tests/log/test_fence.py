"""core/log/fence.py with LogStores over real files, in one process (tests/cluster/test_fencing.py
does it with a paused subprocess): a store without a fence asks nothing; a fenced one releases
nobody, refuses appends and writes nothing more; the fence is asked once per fsync, not per
record; a clean change of owner continues the segment, an unclean one seals the recovered end
and starts at the next segment boundary, and every reader ignores what the old owner writes past
the seal, also when it rolls into a new segment or when the log ended on a segment boundary.

Two stores on one directory in one process stand for the paused old owner and the new one: they
map the same files, as two processes on one machine do.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

import pytest

from braid import logtool
from core.cluster import epochs
from core.cluster.epochs import EpochClaim
from core.log import Fence, LogReader, LogStore, StoreFenced, names
from core.log.fence import Seals, sealed_bounds

from .conftest import SMALL_SEGMENT, small_config


class CountingCheck:
    """A fence asked of the filesystem (``newer`` exists: the next epoch's file), counting how
    often it is asked."""

    def __init__(self, newer: Path) -> None:
        self.newer = newer
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.newer.exists()


def claim(shard_dir: Path, epoch: int) -> Fence:
    """Claim ``epoch`` of ``shard_dir`` as a node does and return the fence to open it with."""
    shard_dir.mkdir(parents=True, exist_ok=True)  # as `braid cluster init` made it
    epochs.claim_epoch(
        shard_dir, epoch, EpochClaim(node=str(epoch), incarnation=1, claimed_ms=1, start=0)
    )
    return epochs.log_fence(shard_dir, epoch)


def bodies(reader: LogReader, topic: str, queue: int) -> list[bytes]:
    return [bytes(r.body) for r in reader.read(topic, queue, 0, max_records=100_000)]


async def test_without_a_fence_nothing_is_asked_and_appends_take_the_plain_path(tmp_path: Path):
    data_dir = tmp_path / "single"
    store = LogStore(small_config(data_dir))
    assert store.commitlog.fence_check is None
    # No check was put in the append path: the commit log's activate is the class's own.
    assert "activate" not in vars(store.commitlog)
    # Files that would fence a cluster shard mean nothing to a single node.
    epochs.claim_epoch(data_dir, 1, EpochClaim("1", 1, 1, 0))
    epochs.claim_epoch(data_dir, 2, EpochClaim("2", 1, 1, 0))
    acked = await asyncio.gather(*(store.publish("t", 0, b"r%d" % i) for i in range(64)))
    assert len(acked) == 64
    assert store.fenced is None
    store.close()
    assert (data_dir / names.CLEAN_SHUTDOWN_FILE).exists()
    with LogReader(data_dir) as reader:
        assert len(bodies(reader, "t", 0)) == 64


async def test_the_fence_is_asked_once_per_fsync_not_per_record(tmp_path: Path):
    check = CountingCheck(tmp_path / "newer")
    store = LogStore(small_config(tmp_path / "d"), fence=Fence(is_fenced=check))
    at_open = store.durability.fsyncs  # recovery's flush, before the fence is wired
    for _ in range(3):
        await asyncio.gather(*(store.publish("t", i % 4, b"x" * 100) for i in range(200)))
    fsyncs = store.durability.fsyncs - at_open
    assert fsyncs < 600  # the group commit shared fsyncs
    # Once per fsync, and once per segment the writer starts (a roll asks before writing there).
    segments = len(store.commitlog.segments)
    assert segments > 1
    assert check.calls == fsyncs + segments
    store.close()
    assert check.calls == fsyncs + segments + 1  # close asks it once more


async def test_a_fenced_store_releases_nobody_refuses_appends_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    data_dir = tmp_path / "d"
    check = CountingCheck(tmp_path / "newer")
    store = LogStore(small_config(data_dir), fence=Fence(is_fenced=check))
    for i in range(10):
        await store.publish("t", 0, b"acked %d" % i)
    await store.checkpoint_async()
    flushed = store.commitlog.flushed_position
    checkpoint = (data_dir / names.CHECKPOINT_FILE).read_bytes()
    written = store.checkpoints.written

    check.newer.touch()  # a newer owner claimed the shard
    caplog.set_level(logging.ERROR, logger="core.log.durability")
    in_flight = [store.append("t", 0, b"late %d" % i) for i in range(5)]
    results = await asyncio.gather(
        *(store.wait_durable(appended.end) for appended in in_flight), return_exceptions=True
    )
    assert all(isinstance(result, StoreFenced) for result in results), results
    assert store.commitlog.flushed_position == flushed  # nothing past the check was released
    assert isinstance(store.fenced, StoreFenced)
    errors = [r for r in caplog.records if r.name == "core.log.durability"]
    assert len(errors) == 1
    assert "fenced" in errors[0].getMessage()

    asked = check.calls
    with pytest.raises(StoreFenced):
        store.append("t", 0, b"plain")  # the fast path
    with pytest.raises(StoreFenced):
        store.append("t", 0, b"with headers", headers=[("h", b"v")])  # the general path
    with pytest.raises(StoreFenced):
        store.append_many("t", 0, [b"a", b"b"])
    with pytest.raises(StoreFenced):
        store.append_batch("k", 0, b"\0" * 80, 1)
    with pytest.raises(StoreFenced):
        await store.publish("t", 1, b"another queue")
    with pytest.raises(StoreFenced):
        store.flush()
    with pytest.raises(StoreFenced):
        store.drop_queues("t")
    await store.durability.flush_async()
    await store.checkpoint_async()
    assert store.enforce_retention() == []
    assert check.calls == asked  # refused without asking again: no more fsyncs either
    store.close()
    assert len([r for r in caplog.records if r.name == "core.log.durability"]) == 1
    assert (data_dir / names.CHECKPOINT_FILE).read_bytes() == checkpoint
    assert store.checkpoints.written == written
    assert not (data_dir / names.CLEAN_SHUTDOWN_FILE).exists()


async def test_close_asks_the_fence_and_a_fenced_store_closes_unwritten(tmp_path: Path):
    data_dir = tmp_path / "d"
    check = CountingCheck(tmp_path / "newer")
    store = LogStore(small_config(data_dir), fence=Fence(is_fenced=check))
    await store.publish("t", 0, b"acked")
    checkpoint = (data_dir / names.CHECKPOINT_FILE).read_bytes()
    check.newer.touch()
    store.close()  # nothing pending: only the check at close can tell
    assert isinstance(store.fenced, StoreFenced)
    assert (data_dir / names.CHECKPOINT_FILE).read_bytes() == checkpoint
    assert not (data_dir / names.CLEAN_SHUTDOWN_FILE).exists()


async def test_a_clean_change_of_owner_continues_the_segment(tmp_path: Path):
    shard = tmp_path / "shard"
    first = LogStore(small_config(shard), fence=claim(shard, 1))
    for i in range(20):
        await first.publish("t", 0, b"first %d" % i)
    end = first.commitlog.write_position
    first.close()
    epochs.mark_closed(shard, 1)

    fence = claim(shard, 2)
    assert not fence.start_at_segment_boundary
    second = LogStore(small_config(shard), fence=fence)
    assert second.commitlog.write_position == end
    assert second.recovery.sealed == {}
    recorded = epochs.read_claim(shard, 2)
    assert recorded is not None
    assert (recorded.start, recorded.sealed) == (end, {})
    appended = await second.publish("t", 0, b"second")
    assert appended.position == end  # the same segment, right after the first owner's records
    second.close()
    assert sealed_bounds(shard) == {}


async def test_an_unclean_change_seals_the_end_and_readers_ignore_the_old_owner_past_it(
    tmp_path: Path,
):
    shard = tmp_path / "shard"
    old = LogStore(small_config(shard), fence=claim(shard, 1))
    acked = [b"acked %d" % i for i in range(30)]
    for body in acked:
        await old.publish("t", 0, body)
    in_flight = old.append("t", 0, b"in flight")  # written, never acknowledged
    end = old.commitlog.write_position

    # The old owner is paused; a new one claims epoch 2 and opens the shard.
    fence = claim(shard, 2)
    assert fence.start_at_segment_boundary
    new = LogStore(small_config(shard), fence=fence)
    assert new.recovery.end_position == end
    assert new.recovery.sealed == {0: end}
    assert new.commitlog.write_position == SMALL_SEGMENT
    recorded = epochs.read_claim(shard, 2)
    assert recorded is not None
    assert (recorded.start, recorded.sealed) == (SMALL_SEGMENT, {0: end})
    assert sealed_bounds(shard) == {0: end}
    # What the old owner wrote before the claim is the new owner's log, acknowledged or not.
    assert bodies(new, "t", 0) == [*acked, b"in flight"]

    # The old owner wakes: it writes on (a queue the new owner has not written), then learns.
    woken = [old.append("t", 1, b"woken %d" % i) for i in range(3)]
    assert all(appended.position >= end for appended in woken)
    results = await asyncio.gather(
        old.wait_durable(in_flight.end),
        *(old.wait_durable(appended.end) for appended in woken),
        return_exceptions=True,
    )
    assert all(isinstance(result, StoreFenced) for result in results)
    old.close()

    mine = [b"new %d" % i for i in range(5)]
    for body in mine:
        appended = await new.publish("t", 2, body)
        assert appended.position >= SMALL_SEGMENT
    new.close()

    with LogReader(shard) as reader:
        assert reader.commitlog.seals == {0: end}
        assert bodies(reader, "t", 0) == [*acked, b"in flight"]
        assert bodies(reader, "t", 1) == []  # its index entries point past the seal
        assert bodies(reader, "t", 2) == mine
        scanned = [bytes(record.body or b"") for record in reader.scan()]
        assert not [body for body in scanned if body.startswith(b"woken")]
        assert scanned[-5:] == mine
        assert reader.verify() == []
        with pytest.raises(KeyError):
            reader.read_at(woken[0].position)
    out = io.StringIO()
    assert logtool.verify(str(shard), out=out) == logtool.EXIT_OK
    assert "epoch seal" in out.getvalue()

    # A third owner after the second one died: the seal holds for its recovery too.
    third = LogStore(small_config(shard), fence=claim(shard, 3))
    assert third.recovery.sealed == {SMALL_SEGMENT: third.recovery.end_position}
    assert bodies(third, "t", 1) == []
    assert bodies(third, "t", 2) == mine
    third.close()


async def test_an_old_owner_rolling_into_the_next_segment_is_fenced_before_writing_there(
    tmp_path: Path,
):
    shard = tmp_path / "shard"
    old = LogStore(small_config(shard), fence=claim(shard, 1))
    body = b"o" * 1000
    while old.commitlog.write_position + 2 * len(body) < SMALL_SEGMENT:
        await old.publish("t", 0, body)
    end = old.commitlog.write_position
    new = LogStore(small_config(shard), fence=claim(shard, 2))
    assert new.commitlog.write_position == SMALL_SEGMENT
    mine = await new.publish("t", 1, b"the new owner's first record")
    assert mine.position == SMALL_SEGMENT

    with pytest.raises(StoreFenced):
        old.append("t", 0, b"too big for the rest of the segment" * 100)  # it must roll
    old.close()
    new.close()
    with LogReader(shard) as reader:
        assert bodies(reader, "t", 1) == [b"the new owner's first record"]
        assert all(r.position < end for r in reader.read("t", 0, 0, max_records=1000))


async def test_a_log_ending_on_a_segment_boundary_seals_the_next_segment_unwritten(
    tmp_path: Path,
):
    shard = tmp_path / "shard"
    old = LogStore(small_config(shard), fence=claim(shard, 1))
    first = await old.publish("t", 0, b"x")
    overhead = first.end - first.position - 1
    while SMALL_SEGMENT - old.commitlog.write_position > 2000 + overhead:
        await old.publish("t", 0, b"y" * 1000)
    filler = b"z" * (SMALL_SEGMENT - old.commitlog.write_position - overhead)
    last = await old.publish("t", 0, filler)
    assert last.end == SMALL_SEGMENT  # the segment is exactly full

    new = LogStore(small_config(shard), fence=claim(shard, 2))
    # The old owner would write its next record at offset 0 of segment 1: sealed there.
    assert new.recovery.sealed == {SMALL_SEGMENT: SMALL_SEGMENT}
    assert new.commitlog.write_position == 2 * SMALL_SEGMENT
    mine = await new.publish("t", 0, b"new")
    assert mine.position == 2 * SMALL_SEGMENT
    assert 1 not in new.commitlog.segments  # never written: the scan goes past the hole
    # The old owner wakes: its next record would start segment 1, so it asks first.
    with pytest.raises(StoreFenced):
        old.append("t", 0, b"woken")
    assert not (shard / names.COMMITLOG_DIR / names.segment_name(SMALL_SEGMENT)).exists()
    old.close()
    new.close()
    with LogReader(shard) as reader:
        assert bodies(reader, "t", 0)[-2:] == [filler, b"new"]
        assert [bytes(record.body or b"") for record in reader.scan(SMALL_SEGMENT)] == [b"new"]
    third = LogStore(small_config(shard), fence=claim(shard, 3))
    assert bodies(third, "t", 0)[-1] == b"new"
    third.close()


def test_seals_come_from_claims_and_their_companions_smallest_end_first(tmp_path: Path):
    shard = tmp_path / "shard"
    seals = Seals(shard)
    assert seals.refresh() == {}  # no epochs directory: a single node
    directory = shard / "epochs"
    directory.mkdir(parents=True)
    (directory / epochs.epoch_name(1)).write_text(json.dumps({"start": 0, "sealed": {"0": 900}}))
    torn = directory / epochs.epoch_name(2)
    torn.write_text('{"node": "2", "sea')  # its claimer still writing it
    (directory / f"{epochs.epoch_name(2)}.sealed.tmp").write_text('{"sealed": {"0": 1}}')
    assert seals.refresh() == {0: 900}
    torn.write_text(json.dumps({"start": 0, "sealed": {}}))
    epochs.record_start(shard, 2, 8192, {0: 500, 4096: 4100})
    assert seals.refresh() == {0: 500, 4096: 4100}
    epochs.record_start(shard, 3, 12288, {0: 700})  # a later, larger end does not widen it
    assert seals.refresh() == {0: 500, 4096: 4100}
    assert sealed_bounds(shard) == epochs.sealed_bounds(shard) == {0: 500, 4096: 4100}
