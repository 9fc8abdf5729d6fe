from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.clock import ManualClock
from core.log import LogConfig, LogReader, LogStore, names
from core.transactions import TransactionService

SMALL_SEGMENT = 64 * 1024
TIMEOUT_MS = 1000


def small_config(data_dir: Path, **overrides: object) -> LogConfig:
    settings: dict[str, object] = {
        "segment_size": SMALL_SEGMENT,
        "index_entries_per_file": 64,
        "retention_ms": None,
    }
    settings.update(overrides)
    return LogConfig(data_dir, **settings)  # type: ignore[arg-type]


def crash(store: LogStore, *, forget_checkpoint: bool = True) -> None:
    """Drop a store as a killed process would: no flush, no clean-shutdown marker. What was
    written into the shared mappings stays (as after kill -9). With ``forget_checkpoint`` the
    checkpoint goes back to the start, so recovery replays every frame."""
    if forget_checkpoint:
        (store.data_dir / names.CHECKPOINT_FILE).write_text(
            json.dumps({"position": 0, "queues": {}})
        )
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)


def bodies(store: LogReader, topic: str, queue: int = 0) -> list[bytes]:
    return [bytes(r.body) for r in store.read(topic, queue, 0, max_records=10_000)]


class Harness:
    """Opens stores and services over one data directory, with a manual clock."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.clock = ManualClock()
        self.stores: list[LogStore] = []
        self.services: list[TransactionService] = []

    def open(self, **service_options: object) -> tuple[LogStore, TransactionService]:
        store = LogStore(small_config(self.data_dir))
        options: dict[str, object] = {"check_timeout_ms": TIMEOUT_MS, "clock": self.clock}
        options.update(service_options)
        service = TransactionService(store, **options)  # type: ignore[arg-type]
        self.stores.append(store)
        self.services.append(service)
        return store, service

    async def advance(self, service: TransactionService, ms: float) -> None:
        """Move the clock in small steps, letting the checks each step starts finish."""
        step = service.sweep_interval_ms
        moved = 0.0
        while moved < ms:
            delta = min(step, ms - moved)
            self.clock.advance(delta)
            moved += delta
            await service.settle()

    async def close(self, store: LogStore, service: TransactionService) -> None:
        await service.aclose()
        await store.aclose()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    opened = Harness(tmp_path / "data")
    yield opened
    for service in opened.services:
        await service.aclose()
    for store in opened.stores:
        if not store.closed:
            await store.aclose()
