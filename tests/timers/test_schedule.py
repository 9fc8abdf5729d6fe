"""TimerSchedule on its own: a tiny wheel (many rounds, many rolls, many timer-log files), fake
time, resumable visits, and the checkpoint/restore protocol the service follows after a crash."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from core.timers.checkpoint import CheckpointError, TimerCheckpoint
from core.timers.schedule import TimerSchedule
from core.timers.timerlog import ENTRY_SIZE, TimerLog
from core.timers.wheel import SLOT_SIZE, TimerWheel

SLOTS = 8
SLOT_MS = 10  # a round is 80 ms
LOOKAHEAD_MS = 20
PER_FILE = 16


def new_schedule(directory: Path, start_ms: int = 0) -> TimerSchedule:
    return TimerSchedule(
        directory, slots=SLOTS, slot_ms=SLOT_MS, entries_per_file=PER_FILE, start_slot=start_ms
    )


class Model:
    """Drives a schedule like the service does: a 'queue' of scheduled timers (the log's
    __timers/0) and a 'fired queue' (__timers/1), both surviving a simulated crash."""

    def __init__(self, directory: Path, rng: random.Random, budget: int) -> None:
        self.directory = directory
        self.rng = rng
        self.budget = budget
        self.now = 1000
        self.schedule = new_schedule(directory, self.now // SLOT_MS)
        self.queue: list[tuple[int, int]] = []  # (deliver_at, position), in insert order
        self.inserted = 0  # queue entries inserted into the schedule
        self.fired: list[int] = []  # positions, in firing order
        self.fired_at: dict[int, int] = {}
        self.recovered: set[int] | None = None
        self.recovered_floor = 0
        self.recovered_until = 0
        self.checkpoint: TimerCheckpoint | None = None

    def fired_mark(self) -> int:
        mark = len(self.fired)
        return mark if self.recovered is None else min(mark, self.recovered_floor)

    def schedule_timer(self, deliver_at: int) -> None:
        position = len(self.queue) * 100
        self.queue.append((deliver_at, position))

    def ingest(self) -> None:
        for deliver_at, position in self.queue[self.inserted :]:
            if self.recovered is None or position not in self.recovered:
                self.schedule.insert(deliver_at, position, 100, self.fired_mark())
        self.inserted = len(self.queue)

    def step(self) -> None:
        self.ingest()
        schedule = self.schedule
        # Like the service: one bounded advance per step when the budget is small.
        for _ in range(1 if self.budget < 10 else 1000):
            walked = schedule.advance(
                (self.now + LOOKAHEAD_MS) // SLOT_MS,
                self.fired_mark(),
                max_window=10_000,
                is_fired=self.recovered.__contains__ if self.recovered else None,
                budget=self.budget,
            )
            if walked < self.budget:
                break
        due = schedule.pop_due(self.now, 1 << 30)
        for deliver_at, position, _size, _slot in due:
            assert deliver_at <= self.now
            self.fired.append(position)
            self.fired_at[position] = self.now
        schedule.fired(due, self.fired_mark())
        if self.recovered is not None and schedule.visited_every_chain_since(self.recovered_until):
            self.recovered = None

    def take_checkpoint(self) -> None:
        schedule = self.schedule
        fired_now = len(self.fired)
        self.checkpoint = TimerCheckpoint(
            SLOT_MS,
            SLOTS,
            PER_FILE,
            self.inserted,
            fired_now,
            min(schedule.fired_floor(fired_now), self.fired_mark()),
            schedule.oldest_live_entry(),
            schedule.timerlog.end,
            schedule.resume_slot(),
            self.now,
            0,
            {},
            bytes(schedule.wheel.buf),
        )
        schedule.timerlog.delete_before(self.checkpoint.timerlog_start)

    def crash_and_recover(self) -> None:
        """The process dies: memory is lost, files stay as they are (mmap). Recover like the
        service: the checkpoint, the queue after it, the fired queue since its floor."""
        checkpoint = TimerCheckpoint.decode(self.checkpoint.encode())  # type: ignore[union-attr]
        self.schedule = new_schedule(self.directory)
        self.schedule.restore(
            checkpoint.wheel,
            checkpoint.resume_slot,
            checkpoint.timerlog_start,
            checkpoint.timerlog_end,
        )
        fired = set(self.fired[checkpoint.fired_floor :])
        self.recovered = fired or None
        self.recovered_floor = checkpoint.fired_floor
        self.recovered_until = (self.now + LOOKAHEAD_MS) // SLOT_MS + 1
        self.inserted = checkpoint.queue_entries


@pytest.mark.parametrize("seed", range(8))
def test_random_timers_fire_once_in_time_across_crashes(tmp_path: Path, seed: int):
    rng = random.Random(seed)
    model = Model(tmp_path / "timerlog", rng, budget=rng.choice((1, 3, 50, 10_000)))
    start = model.now
    inserted_at: dict[int, int] = {}
    for tick in range(600):
        for _ in range(rng.randrange(4)):
            # Late, near and far (several rounds ahead) timers.
            model.schedule_timer(
                model.now + rng.choice((-30, 0, 5, 40, 200, 900)) + rng.randrange(9)
            )
            inserted_at[model.queue[-1][1]] = model.now
        model.step()
        if tick % 37 == 0 or (model.recovered and tick % 2):
            model.take_checkpoint()
        if tick % 53 == 52 and model.checkpoint is not None:
            model.crash_and_recover()
        model.now += rng.randrange(1, 8)
    model.now += 2000
    everything = {position for _, position in model.queue}
    for _ in range(50_000):  # a budget of 1 entry per step takes a while to catch up
        if set(model.fired) >= everything:
            break
        model.step()
        model.now += 1
    counts = Counter(model.fired)
    assert [p for p, n in counts.items() if n > 1] == []
    assert set(counts) == everything
    if model.budget >= 50:
        # Without crashes in between, a timer fires at the first step at or after its time.
        for deliver_at, position in model.queue:
            assert model.fired_at[position] >= deliver_at
            assert model.fired_at[position] - max(deliver_at, inserted_at[position]) < 200 + (
                0 if model.fired_at[position] < start + 4000 else 2000
            )
    assert model.schedule.metrics["rolled"] > 0


def test_order_is_due_time_then_position(tmp_path: Path):
    schedule = new_schedule(tmp_path, 0)
    rng = random.Random(7)
    timers = [(rng.randrange(0, 500), n) for n in range(300)]
    for deliver_at, position in timers:
        schedule.insert(deliver_at, position, 1, 0)
    order: list[tuple[int, int]] = []
    for now in range(0, 600):
        schedule.advance((now + LOOKAHEAD_MS) // SLOT_MS, 0, max_window=1000)
        due = schedule.pop_due(now, 1000)
        order += [(d, p) for d, p, _, _ in due]
        schedule.fired(due, 0)
    assert order == sorted(timers)


def test_window_holds_only_the_near_term(tmp_path: Path):
    schedule = TimerSchedule(
        tmp_path, slots=1024, slot_ms=100, entries_per_file=1 << 12, start_slot=0
    )
    for n in range(5000):
        schedule.insert(100 * n, n, 1, 0)  # one per slot, 500 s of them
    schedule.advance(10, 0, max_window=1000)
    assert len(schedule.window) == 11  # slots 0..10
    assert schedule.timerlog.end == 5000


def test_a_dense_slot_is_walked_over_several_calls(tmp_path: Path):
    schedule = new_schedule(tmp_path, 0)
    for n in range(100):
        schedule.insert(15, n, 1, 0)
    assert schedule.advance(1, 0, max_window=1000, budget=30) >= 30
    assert schedule.walking()
    schedule.insert(15, 1000, 1, 0)  # appended during the walk: picked up before it ends
    while schedule.advance(1, 0, max_window=1000, budget=30) >= 30:
        pass
    assert not schedule.walking()
    due = schedule.pop_due(20, 1000)
    assert len(due) == 101
    schedule.fired(due, 0)
    assert schedule.open_slots() == 0


def test_the_roll_keeps_later_rounds_walked_and_appended_after_the_walk(tmp_path: Path):
    # The roll copies the later-round entries the walk listed plus those appended to the open
    # chain since, without walking the chain again: none may be lost or copied twice.
    schedule = new_schedule(tmp_path, 0)
    round_ms = SLOTS * SLOT_MS
    for n in range(20):
        schedule.insert(5, n, 1, 0)  # slot 0, due now
    schedule.insert(5 + round_ms, 100, 1, 0)  # slot 8: same chain, walked as a later round
    schedule.advance(0, 0, max_window=100)
    assert not schedule.walking()
    schedule.insert(6 + 2 * round_ms, 101, 1, 0)  # slot 16: appended to the open chain
    due = schedule.pop_due(10, 100)
    assert len(due) == 20
    schedule.fired(due, 0)  # slot 0 closes: its chain rolls
    assert schedule.open_slots() == 0
    assert schedule.metrics["rolled"] == 2
    fired: list[int] = []
    for now in range(10, 3 * round_ms, SLOT_MS):
        schedule.advance(now // SLOT_MS, 0, max_window=100)
        items = schedule.pop_due(now, 100)
        fired += [item[1] for item in items]
        schedule.fired(items, 0)
    assert fired == [100, 101]
    assert schedule.open_slots() == 0


def test_a_slot_open_for_a_whole_round_is_visited_when_it_closes(tmp_path: Path):
    schedule = new_schedule(tmp_path, 0)
    schedule.insert(5, 1, 1, 0)  # slot 0
    schedule.insert(5 + SLOTS * SLOT_MS, 2, 1, 0)  # slot 8: same chain, next round
    schedule.advance(0, 0, max_window=100)
    stuck = schedule.pop_due(10, 100)  # slot 0's timer is handed out, its link fails...
    schedule.advance(SLOTS + 2, 0, max_window=100)  # ...while a whole round passes
    assert schedule.pop_due(10_000, 100) == []
    schedule.fired(stuck, 0)  # now it fires: slot 8 is visited at once
    assert [item[1] for item in schedule.pop_due(10_000, 100)] == [2]


def test_timerlog_files_are_reclaimed(tmp_path: Path):
    schedule = new_schedule(tmp_path, 0)
    for now in range(0, 5000, 5):
        schedule.insert(now + 30, now, 1, 0)
        schedule.advance((now + LOOKAHEAD_MS) // SLOT_MS, 0, max_window=1000)
        due = schedule.pop_due(now, 1000)
        schedule.fired(due, 0)
        schedule.timerlog.delete_before(schedule.oldest_live_entry())
    assert schedule.timerlog.end == 1000
    assert schedule.timerlog.disk_files() <= 3


def test_timerlog_entries_and_reset(tmp_path: Path):
    timerlog = TimerLog(tmp_path, entries_per_file=4)
    for n in range(10):
        assert timerlog.append(1000 + n, n * 64, 64, n - 1, 0) == n
    assert timerlog.read(9).deliver_at_ms == 1009
    assert timerlog.read(9).prev == 8
    assert timerlog.disk_files() == 3
    assert (tmp_path / "00000000000000000004.tlog").stat().st_size == 4 * ENTRY_SIZE
    timerlog.reset(5, 7)  # as a checkpoint recorded it: files wholly outside go
    assert timerlog.file_numbers_on_disk() == [1]
    assert timerlog.append(1, 2, 3, -1, 0) == 7
    with pytest.raises(IndexError):
        timerlog.read(4)
    timerlog.close()


def test_wheel_slots():
    wheel = TimerWheel(slots=4, slot_ms=1000)
    assert len(wheel.buf) == 4 * SLOT_SIZE
    assert wheel.slot_of(2999) == 2
    assert wheel.index_of(6) == 2
    assert wheel.oldest_entry() is None
    wheel.put(1, wheel.get(1)._replace(first=7, last=9, entries=3))
    wheel.put(3, wheel.get(3)._replace(first=4, last=4, entries=1))
    assert wheel.oldest_entry() == 4
    assert wheel.chains() == 2


def test_checkpoint_codec_round_trip_and_corruption():
    checkpoint = TimerCheckpoint(1000, 4, 16, 10, 3, 2, 5, 20, 77, 123, 5, {0: 4, 3: 1}, b"w" * 128)
    raw = checkpoint.encode()
    assert TimerCheckpoint.decode(raw) == checkpoint
    for at in (0, 9, 30, len(raw) - 1):
        broken = bytearray(raw)
        broken[at] ^= 0x40
        with pytest.raises(CheckpointError):
            TimerCheckpoint.decode(bytes(broken))
    with pytest.raises(CheckpointError):
        TimerCheckpoint.decode(raw[:40])
