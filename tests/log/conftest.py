from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.log import LogConfig, LogStore

SMALL_SEGMENT = 64 * 1024


def small_config(data_dir: Path, **overrides: object) -> LogConfig:
    settings: dict[str, object] = {
        "segment_size": SMALL_SEGMENT,
        "index_entries_per_file": 64,
        "retention_ms": None,
    }
    settings.update(overrides)
    return LogConfig(data_dir, **settings)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LogStore]:
    opened = LogStore(small_config(tmp_path / "data"))
    yield opened
    opened.close()
