"""TimerService over a real LogStore: timing, ordering, restarts, crash images, levels,
retention, rebuilds."""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path

import pytest

from core.log.store import now_ms
from core.timers import (
    DELAY_LEVELS_MS,
    FIRED_DESTINATION,
    MAX_DELAY_LEVEL,
    delay_for_level,
    deliver_at_for_level,
)
from core.timers.checkpoint import CHECKPOINT_FILE
from core.timers.service import TIMERS_DIR

from ..log_images import copy_image
from .conftest import (
    FakeClock,
    assert_exactly_once,
    open_store,
    open_timers,
    positions,
    scheduled_positions,
    wait_until,
)

YEAR_MS = 365 * 24 * 3600 * 1000
DEST = ("orders", 0)


def schedule(store, count: int, low_ms: int, high_ms: int, rng: random.Random, **fields):
    """Append ``count`` delayed records to DEST; returns {position: deliver_at_ms}."""
    out = {}
    for n in range(count):
        due = now_ms() + rng.randint(low_ms, high_ms)
        appended = store.append(*DEST, f"timer {n}".encode(), deliver_at_ms=due, **fields)
        out[appended.position] = due
    return out


async def test_a_delayed_record_becomes_visible_at_its_time(tmp_path: Path):
    store = open_store(tmp_path / "data")
    timers = open_timers(store)
    await timers.start()
    due = now_ms() + 300
    appended = store.append(*DEST, b"later", deliver_at_ms=due, tags=["t1"], key=b"k")
    assert positions(store, *DEST) == []
    assert timers.pending_count() == 1
    await wait_until(lambda: positions(store, *DEST), 3, "the timer to fire")
    fired_at = now_ms()
    assert fired_at >= due
    (seen,) = store.read(*DEST, 0)
    record = seen.record()
    assert (record.body, record.key, record.tags) == (b"later", b"k", ["t1"])
    assert seen.position == appended.position
    assert timers.pending_count() == 0
    assert timers.metrics["fired"] == 1
    assert timers.lateness_percentiles()["max"] < 400  # a sanity bound; see the benchmark
    await timers.stop()
    store.close()


async def test_many_random_timers_fire_once_in_due_order_and_on_time(tmp_path: Path):
    store = open_store(tmp_path / "data")
    timers = open_timers(store)
    await timers.start()
    rng = random.Random(1)
    # Due after the appends are done (a timer already due when read fires at once: out of order).
    dues = schedule(store, 3000, 300, 1500, rng)
    # Others go to several destinations at once (a routed record): every one gets it once.
    fanned = store.append(
        "orders",
        1,
        b"fan",
        destinations=[("orders", 1), ("audit", 0)],
        deliver_at_ms=now_ms() + 200,
    )
    await wait_until(lambda: timers.pending_count() == 0, 6, "every timer to fire")
    seen = positions(store, *DEST)
    assert_exactly_once(store, DEST, list(dues))
    assert [dues[p] for p in seen] == sorted(dues[p] for p in seen)  # in due order
    assert positions(store, "orders", 1) == [fanned.position]
    assert positions(store, "audit", 0) == [fanned.position]
    lateness = timers.lateness_percentiles()
    assert lateness["p50"] < 100
    assert lateness["p99"] < 400  # sanity bounds for shared CI machines; see the benchmark
    await timers.stop()
    store.close()


async def test_a_timer_one_year_ahead_stays_pending_across_restarts(tmp_path: Path):
    data = tmp_path / "data"
    store = open_store(data)
    clock = FakeClock()
    timers = open_timers(store, clock=clock)
    await timers.start()
    due = clock.now + YEAR_MS
    store.append(*DEST, b"next year", deliver_at_ms=due)
    await wait_until(lambda: timers.stats()["schedule_inserted"] == 1, 2, "the insert")
    await timers.stop()
    store.close()
    for _ in range(2):
        store = open_store(data)
        timers = open_timers(store, clock=clock)
        assert timers.recovery.mode == "checkpoint"
        assert timers.pending_count() == 1
        await timers.start()
        clock.now += 30 * 24 * 3600 * 1000  # a month later: still pending
        await wait_until(lambda t=timers: t.stats()["schedule_visited"] > 0, 2, "a visit")
        assert positions(store, *DEST) == []
        await timers.stop()
        store.close()
    store = open_store(data)
    clock.now = due + 5
    timers = open_timers(store, clock=clock)
    await timers.start()
    await wait_until(lambda: timers.pending_count() == 0, 3, "the year to pass")
    assert_exactly_once(store, DEST, scheduled_positions(store))
    await timers.stop()
    store.close()


async def test_restart_with_timers_pending_fires_each_once(tmp_path: Path):
    data = tmp_path / "data"
    store = open_store(data)
    timers = open_timers(store)
    await timers.start()
    dues = schedule(store, 400, 100, 900, random.Random(2))
    await wait_until(lambda: timers.metrics["fired"] > 50, 3, "some timers to fire")
    await timers.stop()
    await store.aclose()
    store = open_store(data)
    fired_before = len(positions(store, *DEST))
    assert 0 < fired_before < 400
    timers = open_timers(store)
    assert timers.recovery.mode == "checkpoint"
    assert timers.pending_count() == 400 - fired_before
    await timers.start()
    await wait_until(lambda: timers.pending_count() == 0, 4, "the rest to fire")
    assert_exactly_once(store, DEST, list(dues))
    await timers.stop()
    store.close()


async def test_crash_images_lose_nothing_and_fire_nothing_twice(tmp_path: Path):
    """Copy the data directory at random moments while timers fire and checkpoints are taken:
    each copy is exactly what a process crash (kill -9) at that moment leaves on disk, since
    every file is a shared memory map. Each copy, reopened, fires every timer exactly once."""
    data = tmp_path / "data"
    store = open_store(data)
    timers = open_timers(store, checkpoint_interval_ms=30, slot_ms=100, lookahead_ms=300)
    await store.start()
    await timers.start()
    rng = random.Random(3)
    dues = schedule(store, 300, 0, 1000, rng)
    images = []
    started = now_ms()
    while now_ms() - started < 1100:
        await asyncio.sleep(rng.uniform(0.02, 0.2))
        if rng.random() < 0.5:
            schedule(store, 5, 0, 300, rng)  # more keep coming
        image = tmp_path / f"image{len(images)}"
        copy_image(data, image)
        images.append(image)
    await timers.stop()
    await store.aclose()
    modes = set()
    filtered = 0
    for image in images:
        store = open_store(image)
        timers = open_timers(store, checkpoint_interval_ms=30, slot_ms=100, lookahead_ms=300)
        modes.add(timers.recovery.mode)
        filtered += timers.recovery.fired_since_checkpoint
        expected = scheduled_positions(store)
        already = set(positions(store, *DEST))
        await timers.start()
        await wait_until(lambda t=timers: t.pending_count() == 0, 5, f"{image.name} to drain")
        assert_exactly_once(store, DEST, expected)
        assert set(dues) & set(expected) == set(dues) & set(scheduled_positions(store))
        assert timers.metrics["fired"] == len(expected) - len(already)
        await timers.stop()
        store.close()
    assert "checkpoint" in modes
    assert filtered > 0  # some images had fired timers still listed in the wheel
    assert len(images) >= 5


async def test_rebuild_without_a_usable_checkpoint(tmp_path: Path):
    data = tmp_path / "data"
    store = open_store(data)
    timers = open_timers(store)
    await timers.start()
    dues = schedule(store, 200, 50, 900, random.Random(4))
    await wait_until(lambda: timers.metrics["fired"] > 20, 3, "some timers to fire")
    await timers.stop()
    store.close()
    # Corrupt the checkpoint: the service rebuilds from the two queues.
    checkpoint = data / TIMERS_DIR / CHECKPOINT_FILE
    raw = bytearray(checkpoint.read_bytes())
    raw[100] ^= 0xFF
    checkpoint.write_bytes(bytes(raw))
    store = open_store(data)
    fired_before = len(positions(store, *DEST))
    timers = open_timers(store)
    assert timers.recovery.mode == "rebuild"
    assert "crc32c" in timers.recovery.reason
    assert timers.pending_count() == 200 - fired_before
    await timers.stop()
    store.close()
    # Wheel parameters changed, and the timers directory lost: rebuilt too.
    store = open_store(data)
    timers = open_timers(store, slot_ms=500)
    assert timers.recovery.mode == "rebuild"
    assert "parameters" in timers.recovery.reason
    await timers.stop()
    store.close()
    shutil.rmtree(data / TIMERS_DIR)
    store = open_store(data)
    timers = open_timers(store)
    assert timers.recovery.mode == "rebuild"
    assert timers.pending_count() == 200 - fired_before
    await timers.start()
    await wait_until(lambda: timers.pending_count() == 0, 4, "the rest to fire")
    assert_exactly_once(store, DEST, list(dues))
    await timers.stop()
    store.close()


async def test_rolls_on_a_small_wheel_across_restarts(tmp_path: Path):
    """A wheel of 8 x 50 ms (a 0.4 s round): timers 0.6-1.6 s ahead go round several times."""
    data = tmp_path / "data"
    options = {"slots": 8, "slot_ms": 50, "lookahead_ms": 100, "entries_per_file": 32}
    store = open_store(data)
    timers = open_timers(store, **options)
    await timers.start()
    dues = schedule(store, 150, 600, 1600, random.Random(5))
    await wait_until(lambda: timers.stats()["schedule_rolled"] > 50, 3, "rolls")
    await timers.stop()
    store.close()
    store = open_store(data)
    timers = open_timers(store, **options)
    await timers.start()
    await wait_until(lambda: timers.pending_count() == 0, 5, "every timer to fire")
    assert_exactly_once(store, DEST, list(dues))
    seen = positions(store, *DEST)
    assert [dues[p] for p in seen] == sorted(dues[p] for p in seen)
    await timers.checkpoint()
    assert timers.stats()["timerlog_files"] <= 2  # old timer-log files were deleted
    await timers.stop()
    store.close()


def test_delay_levels():
    assert len(DELAY_LEVELS_MS) == MAX_DELAY_LEVEL == 18
    expected_s = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800]
    assert [ms // 1000 for ms in DELAY_LEVELS_MS] == [*expected_s, 3600, 7200]
    assert deliver_at_for_level(1, 10_000) == 11_000
    assert deliver_at_for_level(18, 0) == 2 * 3600 * 1000
    assert deliver_at_for_level(40, 0) == deliver_at_for_level(18, 0)  # clamped, as RocketMQ
    assert delay_for_level(0) == 0
    with pytest.raises(ValueError, match="delay level"):
        delay_for_level(-1)


async def test_delay_level_one_fires_after_a_second(tmp_path: Path):
    store = open_store(tmp_path / "data")
    timers = open_timers(store)
    await timers.start()
    published = now_ms()
    store.append(*DEST, b"level 1", deliver_at_ms=deliver_at_for_level(1, published))
    await wait_until(lambda: positions(store, *DEST), 3, "level 1")
    assert now_ms() - published >= 1000
    await timers.stop()
    store.close()


async def test_retention_keeps_segments_with_pending_timers(tmp_path: Path):
    store = open_store(tmp_path / "data", segment_size=64 * 1024, retention_bytes=64 * 1024)
    timers = open_timers(store)
    await timers.start()
    assert timers.owes_segment in store.retention_guards  # beside the topic-limits guard
    due = now_ms() + 400
    timer = store.append(*DEST, b"in segment 0", deliver_at_ms=due)
    for _ in range(200):
        store.append("bulk", 0, bytes(1000))
    assert store.commitlog.segment_numbers()[0] == 0
    assert timers.owes_segment(0, 64 * 1024)
    assert not timers.owes_segment(64 * 1024, 128 * 1024)
    assert store.enforce_retention() == []  # segment 0 is owed to the timer
    await wait_until(lambda: positions(store, *DEST), 3, "the timer to fire")
    assert not timers.owes_segment(0, 64 * 1024)
    assert 0 in store.enforce_retention()
    assert timer.position < store.commitlog.start_position
    await timers.stop()
    store.close()


async def test_timers_scheduled_while_not_running_are_counted_and_owed(tmp_path: Path):
    store = open_store(tmp_path / "data", segment_size=64 * 1024)
    timers = open_timers(store)
    store.append(*DEST, b"x", deliver_at_ms=now_ms() + 60_000)
    assert timers.pending_count() == 1  # before start: not inserted yet, but counted
    await timers.stop()
    for _ in range(100):
        store.append("bulk", 0, bytes(1000))
    late = store.append(*DEST, b"y", deliver_at_ms=now_ms() + 60_000)
    assert late.position > 64 * 1024
    assert timers.pending_count() == 2  # stopped: still counted
    assert timers.owes_segment(0, 64 * 1024)
    assert timers.owes_segment(late.position, late.position + 1)
    store.close()


async def test_fired_queue_is_the_mark(tmp_path: Path):
    store = open_store(tmp_path / "data")
    timers = open_timers(store)
    await timers.start()
    dues = schedule(store, 20, 10, 100, random.Random(6))
    await wait_until(lambda: timers.pending_count() == 0, 3, "firing")
    assert sorted(positions(store, *FIRED_DESTINATION)) == sorted(dues)
    stats = timers.stats()
    assert stats["fired"] == 20
    assert stats["pending"] == 0
    assert stats["links"] >= 1
    await timers.stop()
    store.close()


async def test_a_delayed_link_fires_like_a_retry_with_back_off(tmp_path: Path):
    """The broker's retry: ``link([position], [queue], headers=..., deliver_at_ms=...)``. When it
    fires, the queue gets an entry for the LINK, which readers follow to the record (with the
    LINK's headers); the record it points at stays owed meanwhile."""
    store = open_store(tmp_path / "data", segment_size=64 * 1024, retention_bytes=64 * 1024)
    timers = open_timers(store)
    await timers.start()
    original = store.append("work", 0, b"payload", tags=["blue"])
    for _ in range(100):
        store.append("bulk", 0, bytes(1000))  # the original is now in a sealed segment
    retry = store.link(
        [original.position],
        [("work", 1)],
        headers=[("x-retry-count", b"1")],
        deliver_at_ms=now_ms() + 300,
    )
    plain = store.link([original.position], deliver_at_ms=now_ms() + 300)
    assert timers.owes_segment(0, 64 * 1024)  # the original's segment, before the loop ran
    assert store.enforce_retention() == []
    await wait_until(lambda: timers.pending_count() == 0, 3, "the retries")
    (seen,) = store.read("work", 1, 0)
    assert seen.position == retry.position
    record = seen.record()
    assert record.body == b"payload"
    assert ("x-retry-count", b"1") in record.headers
    assert [r.position for r in store.read("work", 0, 0)] == [original.position, plain.position]
    assert sorted(positions(store, *FIRED_DESTINATION)) == sorted([retry.position, plain.position])
    assert not timers.owes_segment(0, 64 * 1024)
    await timers.stop()
    store.close()


async def test_a_delayed_link_with_several_targets(tmp_path: Path):
    store = open_store(tmp_path / "data")
    timers = open_timers(store)
    await timers.start()
    first = store.append("a", 0, b"1")
    second = store.append("b", 0, b"2")
    both = store.link([first.position, second.position], deliver_at_ms=now_ms() + 200)
    await wait_until(lambda: timers.pending_count() == 0, 3, "the LINK")
    assert positions(store, "a", 0) == [first.position, first.position]
    assert positions(store, "b", 0) == [second.position, second.position]
    assert positions(store, *FIRED_DESTINATION) == [both.position]
    assert timers.metrics["split_fires"] == 1
    await timers.stop()
    store.close()


async def test_an_idle_service_writes_no_checkpoint_again(tmp_path: Path):
    """The periodic checkpoint is skipped while the image is the one written last (an idle
    shard wrote, fsynced and renamed the same file every interval), and written once new
    timers change it."""
    data = tmp_path / "data"
    store = open_store(data)
    # Slots of an hour: the wheel does not move on to a new slot (a change of the image) while
    # the test runs. Slots are aligned to the clock: with 10 s slots a run crossed a boundary
    # about once in thirty (CI: 2 checkpoints).
    timers = open_timers(store, checkpoint_interval_ms=20, slot_ms=3_600_000)
    await store.start()
    await timers.start()
    await wait_until(lambda: timers.metrics["checkpoints"] >= 1, 5, "the first checkpoint")
    await asyncio.sleep(0.3)  # 15 intervals with nothing to record
    assert timers.metrics["checkpoints"] == 1
    schedule(store, 3, 50, 100, random.Random(1))
    await wait_until(lambda: timers.metrics["checkpoints"] >= 2, 5, "a checkpoint of them")
    await timers.stop()
    await store.aclose()
