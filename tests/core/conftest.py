from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from core.broker import BrokerConfig, Node
from core.log import LogConfig, LogStore


def open_broker(data_dir: Path, **config: object) -> Node:
    store = LogStore(
        LogConfig(data_dir, segment_size=256 * 1024, index_entries_per_file=256, retention_ms=None)
    )
    return Node(store, BrokerConfig(**config))  # type: ignore[arg-type]


async def close_broker(broker: Node) -> None:
    await broker.close()
    await broker.shard.store.aclose()


@pytest.fixture
async def broker_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Node]]:
    opened: list[Node] = []

    def factory(**config: object) -> Node:
        broker = open_broker(tmp_path / "data", **config)
        opened.append(broker)
        return broker

    yield factory
    for broker in opened:
        if not broker.shard.store.closed:
            await close_broker(broker)
