from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from core.log import LogConfig, LogStore


def open_store(data_dir: Path) -> LogStore:
    return LogStore(
        LogConfig(data_dir, segment_size=256 * 1024, index_entries_per_file=256, retention_ms=None)
    )


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Callable[[], LogStore]]:
    """``stores()`` opens the test's data directory (again, after the last one is closed)."""
    opened: list[LogStore] = []

    def factory() -> LogStore:
        for store in opened:
            if not store.closed:
                store.close()
        store = open_store(tmp_path / "data")
        opened.append(store)
        return store

    yield factory
    for store in opened:
        if not store.closed:
            await store.aclose()
