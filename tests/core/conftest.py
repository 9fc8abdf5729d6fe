from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from core.broker import Broker, BrokerConfig
from core.log import LogConfig, LogStore


def open_broker(data_dir: Path, **config: object) -> Broker:
    store = LogStore(
        LogConfig(data_dir, segment_size=256 * 1024, index_entries_per_file=256, retention_ms=None)
    )
    return Broker(store, BrokerConfig(**config))  # type: ignore[arg-type]


async def close_broker(broker: Broker) -> None:
    await broker.close()
    await broker.store.aclose()


@pytest.fixture
async def broker_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Broker]]:
    opened: list[Broker] = []

    def factory(**config: object) -> Broker:
        broker = open_broker(tmp_path / "data", **config)
        opened.append(broker)
        return broker

    yield factory
    for broker in opened:
        if not broker.store.closed:
            await close_broker(broker)
