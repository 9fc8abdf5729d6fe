"""Fixtures of the Kafka front-end tests.

End-to-end tests run the real clients against a real ``braid serve`` subprocess with only the
Kafka listener on (``braid``: one per test module, so its tests use their own topic names);
the in-process tests run ``KafkaServer`` over the Broker API of a ``Node`` on a temporary
directory in the test's own event loop (``kafka_server``; ``broker_of`` gives its Node back to
the tests that set up records through the core directly).
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from core.api import BrokerAPI
from core.broker import BrokerConfig, Node
from core.log import LogConfig, LogStore
from gateway.kafka.server import KafkaServer
from tests.braid_process import BraidProcess

_names = itertools.count()


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


def unique(prefix: str) -> str:
    """A topic or group name no other test of the session uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid"), listeners=("kafka",)) as process:
        yield process


_apis: weakref.WeakKeyDictionary[Node, BrokerAPI] = weakref.WeakKeyDictionary()
_brokers: weakref.WeakKeyDictionary[BrokerAPI, Node] = weakref.WeakKeyDictionary()


def api_of(broker: Node) -> BrokerAPI:
    """The one BrokerAPI of ``broker`` in these tests (as braid/server.py makes one)."""
    api = _apis.get(broker)
    if api is None:
        api = _apis[broker] = BrokerAPI(broker)
        _brokers[api] = broker
    return api


def broker_of(server: KafkaServer) -> Node:
    """The Node behind a ``kafka_server``."""
    return _brokers[server.api]


def open_broker(data_dir: Path) -> Node:
    store = LogStore(LogConfig(data_dir, segment_size=4 * 1024 * 1024, index_entries_per_file=4096))
    return Node(store, BrokerConfig())


@pytest.fixture
async def kafka_server(tmp_path: Path) -> AsyncIterator[KafkaServer]:
    broker = open_broker(tmp_path / "data")
    await broker.shard.store.start()
    await broker.start()
    server = KafkaServer(api_of(broker))
    await server.start("127.0.0.1", 0)
    yield server
    await server.close()
    await broker.close()
    await broker.shard.store.aclose()


def bootstrap(server: KafkaServer) -> str:
    address = server.address
    assert address is not None
    return f"{address[0]}:{address[1]}"
