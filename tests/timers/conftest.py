from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from core.clock import ManualClock
from core.log import DURABILITY_ASYNC, LogConfig, LogStore
from core.log.names import TIMERS_TOPIC
from core.timers import FIRED_QUEUE, SCHEDULED_QUEUE, TimerService

SMALL_SEGMENT = 256 * 1024


def small_config(data_dir: Path, **overrides: object) -> LogConfig:
    settings: dict[str, object] = {
        "segment_size": SMALL_SEGMENT,
        "index_entries_per_file": 256,
        "retention_ms": None,
        "durability": DURABILITY_ASYNC,
    }
    settings.update(overrides)
    return LogConfig(data_dir, **settings)  # type: ignore[arg-type]


def open_store(data_dir: Path, **overrides: object) -> LogStore:
    return LogStore(small_config(data_dir, **overrides))


# Small timer files so tests cross file boundaries; a short checkpoint interval.
SERVICE_DEFAULTS: dict[str, object] = {"entries_per_file": 128, "checkpoint_interval_ms": 200}


def open_timers(store: LogStore, **overrides: object) -> TimerService:
    settings = {**SERVICE_DEFAULTS, **overrides}
    return TimerService(store, **settings)  # type: ignore[arg-type]


class FakeClock(ManualClock):
    """Wall time in ms that tests move by hand (starts at the real time): ``now``."""

    def __init__(self, now: int | None = None) -> None:
        super().__init__()
        self.now = int(time.time() * 1000) if now is None else now

    def wall_ms(self) -> int:
        return self.now


def positions(store: LogStore, topic: str, queue: int) -> list[int]:
    index = store.queue_index(topic, queue)
    if index is None:
        return []
    return [entry.position for entry in index.entries(index.start_entry, index.next_entry)]


def scheduled_positions(store: LogStore) -> list[int]:
    return positions(store, TIMERS_TOPIC, SCHEDULED_QUEUE)


def fired_positions(store: LogStore) -> list[int]:
    return positions(store, TIMERS_TOPIC, FIRED_QUEUE)


def assert_exactly_once(store: LogStore, destination: tuple[str, int], expected: list[int]):
    """Every expected record is visible in ``destination`` exactly once, and nothing else is;
    the fired queue agrees."""
    seen = Counter(positions(store, *destination))
    twice = {p: n for p, n in seen.items() if n > 1}
    assert not twice, f"visible more than once: {twice}"
    missing = set(expected) - set(seen)
    assert not missing, f"never visible: {sorted(missing)[:10]} ({len(missing)} in all)"
    assert set(seen) == set(expected)
    fired = Counter(fired_positions(store))
    assert all(n == 1 for n in fired.values()), "a timer is in the fired queue twice"
    unmarked = set(expected) - set(fired)
    assert not unmarked, f"visible, not in the fired queue: {len(unmarked)} of {len(fired)}"


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)
