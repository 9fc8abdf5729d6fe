"""core/cluster/local.py: LocalMetadata over a real data dir: the on-disk layout before the
MetadataStore interface existed reads the same, and apply/watch keep their promises."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from core.api import PROTOCOL_AMQP, AckQueueConfig, BrokerAPI, ClientContext
from core.broker import Node
from core.broker.eager import Pending, run_eagerly
from core.cluster import (
    KIND_BINDING,
    KIND_LIMIT,
    KIND_QUEUE,
    KIND_REDRIVE,
    KIND_SECURITY,
    KIND_SETTING,
    KIND_TOPIC,
    Change,
    LocalMetadata,
    MetadataConflict,
    MetadataGap,
)
from core.cluster.local import LIMITS_TOPIC, SECURITY_TOPIC
from core.cluster.metadata import WATCH_BACKLOG
from core.limits import LimitsStore
from core.limits.store import MAX_CONNECTIONS, USER
from core.log import LogConfig, LogStore
from core.log.names import META_TOPIC
from core.security.model import User
from core.security.store import SecurityStore
from core.state.table import DurableTable


def open_store(data_dir: Path) -> LogStore:
    return LogStore(LogConfig(data_dir, segment_size=256 * 1024, retention_ms=None))


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Callable[[], LogStore]]:
    """``stores()`` opens the test's data directory (again, after the last one is closed)."""
    opened: list[LogStore] = []

    def factory() -> LogStore:
        for store in opened:
            if not store.closed:
                store.close()
        opened.append(open_store(tmp_path / "data"))
        return opened[-1]

    yield factory
    for store in opened:
        if not store.closed:
            await store.aclose()


# The keys each table held before the interface (core/broker, core/security, core/limits of
# commit 5b68d11), written here with raw DurableTables as that code wrote them.
OLD_META = {
    "topic:orders": json.dumps({"queues": 2, "config": {"type": "topic"}}),
    "binding:" + json.dumps(["orders", "topic", "a.*", ["q", 0], None]): json.dumps(
        {
            "source": "orders",
            "kind": "topic",
            "pattern": "a.*",
            "destination": ["q", 0],
            "arguments": None,
        }
    ),
    "topic:q": json.dumps({"queues": 1, "config": {}}),
    "ackq:q\x000": json.dumps({"topic": "q", "queue": 0, "config": {}}),
    "redrive:q.dlq": json.dumps({"offsets": [1], "targets": {"q": 0}}),
    "kafka:txn:t1": json.dumps({"producer_id": 7}),
}
OLD_SECURITY = {
    json.dumps(["initialized"]): "{}",
    json.dumps(["user", "bob"]): json.dumps(User("bob").to_json(), sort_keys=True),
}
OLD_LIMITS = {json.dumps(["vhost", "/"]): json.dumps({"max-queues": 5})}


def write_old_layout(store: LogStore) -> None:
    for topic, entries in (
        (META_TOPIC, OLD_META),
        (SECURITY_TOPIC, OLD_SECURITY),
        (LIMITS_TOPIC, OLD_LIMITS),
    ):
        table = DurableTable(store, topic)
        for key, value in entries.items():
            table.put(key, value.encode())
    store.flush()


def test_a_data_dir_written_before_reads_the_same(stores):
    write_old_layout(stores())
    metadata = LocalMetadata(stores())
    assert dict(metadata.items(KIND_TOPIC)) == {
        "orders": OLD_META["topic:orders"].encode(),
        "q": OLD_META["topic:q"].encode(),
    }
    (binding_key, _), *more = list(metadata.items(KIND_BINDING))
    assert not more
    assert "binding:" + binding_key in OLD_META
    assert list(metadata.items(KIND_QUEUE)) == [("q\x000", OLD_META["ackq:q\x000"].encode())]
    assert [key for key, _ in metadata.items(KIND_REDRIVE)] == ["q.dlq"]
    # Settings are the __meta keys no other kind claims.
    assert [key for key, _ in metadata.items(KIND_SETTING)] == ["kafka:txn:t1"]
    assert metadata.get(KIND_SETTING, "topic:orders") is None
    assert metadata.get(KIND_TOPIC, "orders") == OLD_META["topic:orders"].encode()
    assert dict(metadata.items(KIND_SECURITY)) == {k: v.encode() for k, v in OLD_SECURITY.items()}
    assert dict(metadata.items(KIND_LIMIT)) == {k: v.encode() for k, v in OLD_LIMITS.items()}


async def test_the_stores_over_it_see_the_old_data_and_write_the_old_keys(stores):
    write_old_layout(stores())
    broker = Node(stores())
    topic = broker.topics.get("orders")
    assert topic is not None
    assert topic.queues == 2
    assert broker.route("orders", "a.b") == [("q", 0)]
    assert broker.ack_queue("q") is not None
    security = SecurityStore(broker.metadata)
    assert security.user("bob") is not None
    assert security.user("guest") is None  # "initialized" was there: no first-boot user
    limits = LimitsStore(broker.metadata)
    assert limits.limits("vhost") == {"/": {"max-queues": 5}}

    await broker.declare_topic("events", 3)
    await broker.bind("events", "topic", "#", ("q", 0))
    await broker.declare_ack_queue("events", 0)
    await security.put_user(User("carol"))
    await limits.set_limit(USER, "carol", MAX_CONNECTIONS, 3)
    store = broker.shard.store
    store.flush()

    # Read back with raw tables: the keys are the old layout's.
    meta = dict(DurableTable(store, META_TOPIC).items())
    assert json.loads(meta["topic:events"]) == {"queues": 3, "config": {}}
    assert json.loads(meta["ackq:events\x000"])["topic"] == "events"
    assert any(key.startswith('binding:["events"') for key in meta)
    assert DurableTable(store, SECURITY_TOPIC).get('["user", "carol"]') is not None
    assert json.loads(DurableTable(store, LIMITS_TOPIC).get('["user", "carol"]') or b"") == {
        MAX_CONNECTIONS: 3
    }

    again = Node(stores())
    assert again.topics.get("events") is not None
    assert ("q", 0) in again.route("events", "x")
    assert SecurityStore(again.metadata).user("carol") is not None
    assert LimitsStore(again.metadata).limit(USER, "carol", MAX_CONNECTIONS) == 3


async def test_apply_is_versioned_conditional_and_all_or_nothing(stores):
    store = stores()
    metadata = LocalMetadata(store)
    assert metadata.version == 0
    first = await metadata.apply([Change(KIND_TOPIC, "a", b"1"), Change(KIND_TOPIC, "b", b"2")])
    assert first == 1
    assert metadata.get(KIND_TOPIC, "a") == b"1"
    end = metadata.durable_mark
    with pytest.raises(MetadataConflict) as refused:
        await metadata.apply(
            [Change(KIND_TOPIC, "a", b"changed"), Change(KIND_TOPIC, "c", b"3")],
            expect={(KIND_TOPIC, "a"): b"1", (KIND_TOPIC, "b"): None},
        )
    assert (refused.value.kind, refused.value.key) == (KIND_TOPIC, "b")
    assert metadata.get(KIND_TOPIC, "a") == b"1"
    assert metadata.get(KIND_TOPIC, "c") is None
    assert (metadata.version, metadata.durable_mark) == (1, end)  # nothing written
    second = await metadata.apply(
        [Change(KIND_TOPIC, "a", None)],
        expect={(KIND_TOPIC, "a"): b"1", (KIND_TOPIC, "c"): None},
    )
    assert second == 2
    assert metadata.get(KIND_TOPIC, "a") is None
    # Deleting what is absent changes nothing: no record, no version.
    assert await metadata.apply([Change(KIND_TOPIC, "a", None)]) == 2
    assert metadata.durable_mark > end
    with pytest.raises(ValueError, match="unknown metadata kind"):
        await metadata.apply([Change(KIND_TOPIC, "d", b"4"), Change("nonsense", "x", b"")])
    assert metadata.get(KIND_TOPIC, "d") is None


def test_one_local_metadata_per_log_store(stores):
    store = stores()
    broker = Node(store)
    with pytest.raises(ValueError, match="share that one"):
        LocalMetadata(store)
    assert broker.metadata.store is store


async def test_wait_durable_covers_the_version(stores):
    store = stores()
    metadata = LocalMetadata(store)
    version = await metadata.apply([Change(KIND_SETTING, "k", b"v")])
    await asyncio.wait_for(metadata.wait_durable(version), 30)
    assert store.commitlog.flushed_position >= metadata.durable_mark


async def test_watch_replays_then_follows(stores):
    metadata = LocalMetadata(stores())
    await metadata.apply([Change(KIND_TOPIC, "a", b"1")])
    await metadata.apply([Change(KIND_TOPIC, "b", b"2"), Change(KIND_QUEUE, "b\x000", b"{}")])
    seen: list[tuple[int, str, str]] = []

    async def follow() -> None:
        async for entry in metadata.watch(1):
            seen.append((entry.version, entry.change.kind, entry.change.key))
            if len(seen) == 3:
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)  # the follower has replayed version 2 and waits
    assert seen == [(2, KIND_TOPIC, "b"), (2, KIND_QUEUE, "b\x000")]
    await metadata.apply([Change(KIND_TOPIC, "b", None)])
    await asyncio.wait_for(follower, 30)
    assert seen[-1] == (3, KIND_TOPIC, "b")


async def test_watch_from_too_far_back_is_a_gap(stores):
    metadata = LocalMetadata(stores())
    for number in range(WATCH_BACKLOG + 2):
        await metadata.apply([Change(KIND_SETTING, f"k{number}", b"v")])
    with pytest.raises(MetadataGap):
        await anext(aiter(metadata.watch(0)))
    latest = await anext(aiter(metadata.watch(metadata.version - 1)))
    assert latest.version == metadata.version


def test_apply_is_done_in_its_first_step(stores):
    """The single node's change completes without suspending, so its callers run it eagerly
    (core/broker/eager.py) and pay no loop turn: an await point inside would fail this."""
    metadata = LocalMetadata(stores())
    assert run_eagerly(metadata.apply([Change(KIND_TOPIC, "a", b"1")])) == 1
    assert metadata.get(KIND_TOPIC, "a") == b"1"


async def test_the_broker_api_changes_metadata_without_suspending(stores):
    """Every awaitable metadata call of the Broker API completes at once on a single node, so
    a gateway that runs it eagerly handles the next frame in the same loop turn."""
    api = BrokerAPI(Node(stores()))
    context = ClientContext(PROTOCOL_AMQP, user="guest")
    changes: list[tuple[str, Callable[[], Coroutine[Any, Any, object]]]] = [
        ("declare_exchange", lambda: api.declare_exchange(context, "x", {"k": 1})),
        ("declare_queue", lambda: api.declare_queue(context, "q", {}, AckQueueConfig())),
        ("open_queue", lambda: api.open_queue("q2", AckQueueConfig())),
        ("bind", lambda: api.bind(context, "x", "exact", "k", ("q", 0))),
        ("unbind", lambda: api.unbind(context, "x", "exact", "k", ("q", 0))),
        ("create_topic", lambda: api.create_topic(context, "t", 2)),
        ("add_partitions", lambda: api.add_partitions(context, "t", 3)),
        ("set_topic_config", lambda: api.set_topic_config(context, "t", "k", 1)),
        ("set_topic_retention", lambda: api.set_topic_retention(context, "t", (1000, None))),
        ("put_metadata", lambda: api.put_metadata(context, "s", b"v")),
        ("delete_metadata", lambda: api.delete_metadata(context, "s")),
        ("declare_session_queue", lambda: api.declare_session_queue(context, "s1")),
        ("bind_session_queue", lambda: api.bind_session_queue(context, "x", "topic", "#", "s1")),
        (
            "unbind_session_queue",
            lambda: api.unbind_session_queue(context, "x", "topic", "#", "s1"),
        ),
        ("discard_session_queue", lambda: api.discard_session_queue(context, "s1")),
        ("set_user_limit", lambda: api.set_user_limit(context, "guest", MAX_CONNECTIONS, 5)),
        ("clear_user_limit", lambda: api.clear_user_limit(context, "guest", MAX_CONNECTIONS)),
        ("delete_queue", lambda: api.delete_queue(context, "q")),
        ("delete_exchange", lambda: api.delete_exchange(context, "x")),
        ("delete_topic", lambda: api.delete_topic(context, "t")),
    ]
    for name, change in changes:
        assert not isinstance(run_eagerly(change()), Pending), f"{name} waited"
    assert not api.has_topic(context, "x")
    assert api.topic_info(context, "q2") is None  # open_queue made only its ack queue
    assert api.has_session_queue(context, "q2")
