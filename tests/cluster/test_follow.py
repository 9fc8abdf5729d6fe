"""core/cluster/follow.py and SplitMetadata.watch (docs/cluster.md section 4, step 6 of section
15): two "nodes" in one process, each a RedisMetadata on one real redis-server and a
SplitMetadata over its own LogStore, with the registries built as the Node builds them. What
node 1 changes reaches node 2's registries; what node 2 changes itself is applied there once;
a node started again catches up from Redis. (Two `braid serve --cluster` processes cannot serve
together yet: a second node is a standby.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core.broker.topics import TopicRegistry
from core.cluster import Change, LocalMetadata, Versioned
from core.cluster.follow import MetadataFollower
from core.cluster.metadata import KIND_BINDING, KIND_QUEUE, KIND_SETTING, KIND_TOPIC
from core.cluster.redis_metadata import RedisMetadata, connect
from core.cluster.split import SplitMetadata
from core.limits.store import MAX_CONNECTIONS, MAX_QUEUES, USER, VHOST, LimitsStore
from core.log import LogConfig, LogStore
from core.routing.table import BindingTable
from core.security.model import User, VhostPermission
from core.security.store import SecurityStore
from tests.cluster.redis_server import RedisProcesses, RedisServer, redis_processes

DEADLINE_S = 10.0  # waits only: the assertions are about what happened, not how fast

Destination = tuple[str, int]


@dataclass
class QueueDefinitions:
    """The Node's side of ``on_queue``: every call, and the definitions it holds."""

    calls: list[tuple[str, bytes | None]] = field(default_factory=list)
    defined: dict[str, bytes] = field(default_factory=dict)

    def on_queue(self, key: str, value: bytes | None) -> None:
        self.calls.append((key, value))
        if value is None:
            self.defined.pop(key, None)
        else:
            self.defined[key] = value


@dataclass
class FakeNode:
    """What one node holds: its stores and the registries the Node builds over them."""

    redis: RedisMetadata
    store: LogStore
    metadata: SplitMetadata
    topics: TopicRegistry
    bindings: BindingTable[Destination]
    queues: QueueDefinitions
    security: SecurityStore
    limits: LimitsStore
    follower: MetadataFollower

    async def bind(self, source: str, kind: str, pattern: str, destination: Destination) -> None:
        """As Node.bind writes a binding (its key and value)."""
        assert self.bindings.add(source, kind, pattern, destination)
        await self.metadata.apply(
            [Change(KIND_BINDING, *binding_entry(source, kind, pattern, destination))]
        )

    async def unbind(self, source: str, kind: str, pattern: str, destination: Destination) -> None:
        assert self.bindings.remove(source, kind, pattern, destination)
        key, _ = binding_entry(source, kind, pattern, destination)
        await self.metadata.apply([Change(KIND_BINDING, key, None)])

    async def close(self) -> None:
        await self.follower.aclose()
        await self.metadata.aclose()
        await self.redis.aclose()
        await self.store.aclose()


def binding_entry(
    source: str, kind: str, pattern: str, destination: Destination
) -> tuple[str, bytes]:
    """Node._binding_key and the value Node.bind stores (no arguments)."""
    key = json.dumps([source, kind, pattern, list(destination), None], sort_keys=True, default=str)
    value = {
        "source": source,
        "kind": kind,
        "pattern": pattern,
        "destination": list(destination),
        "arguments": None,
    }
    return key, json.dumps(value).encode()


def queue_entry(topic: str, queue: int) -> tuple[str, bytes]:
    """A queue definition as Node.declare_ack_queue stores it."""
    value = {"topic": topic, "queue": queue, "config": {}}
    return f"{topic}\0{queue}", json.dumps(value).encode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    processes: RedisProcesses
    with redis_processes(tmp_path / "redis") as processes:
        yield processes.redis()


@pytest.fixture
async def nodes(
    server: RedisServer, tmp_path: Path
) -> AsyncIterator[Callable[[str], Awaitable[FakeNode]]]:
    """``await nodes(name)``: a node over ``tmp_path/name`` (again after it was closed)."""
    opened: list[FakeNode] = []

    async def open_node(name: str) -> FakeNode:
        redis = await connect(server.url, "c1", shards=1)
        store = LogStore(LogConfig(tmp_path / name, segment_size=256 * 1024, retention_ms=None))
        metadata = SplitMetadata(redis, LocalMetadata(store))
        topics = TopicRegistry(metadata)
        bindings: BindingTable[Destination] = BindingTable()
        for _key, value in metadata.items(KIND_BINDING):  # as Node._load_bindings_and_queues
            raw = json.loads(value)
            destination = (raw["destination"][0], int(raw["destination"][1]))
            bindings.add(
                raw["source"], raw["kind"], raw["pattern"], destination, raw.get("arguments")
            )
        queues = QueueDefinitions(defined=dict(metadata.items(KIND_QUEUE)))
        security = await SecurityStore.open(metadata)
        limits = LimitsStore(metadata)
        follower = MetadataFollower(
            metadata,
            topics=topics,
            bindings=bindings,
            queues=queues,
            security=security,
            limits=limits,
        )
        follower.start()
        node = FakeNode(
            redis, store, metadata, topics, bindings, queues, security, limits, follower
        )
        opened.append(node)
        return node

    yield open_node
    for node in opened:
        if not node.store.closed:
            await node.close()


async def eventually(check: Callable[[], Any], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def test_what_one_node_changes_reaches_the_others_registries(nodes):
    one, two = await nodes("one"), await nodes("two")

    await one.topics.declare("orders", 3, {"x-type": "topic"})
    await one.bind("amq.topic", "topic", "order.*", ("orders", 0))
    await one.metadata.apply([Change(KIND_QUEUE, *queue_entry("orders", 0))])
    await one.security.put_user(User("alice", tags=("monitoring",)))
    await one.security.set_permission("/", "alice", VhostPermission("^orders$", "", ".*"))
    await one.limits.set_limit(VHOST, "/", MAX_QUEUES, 5)
    await one.limits.set_limit(USER, "alice", MAX_CONNECTIONS, 2)

    await eventually(
        lambda: two.limits.limit(USER, "alice", MAX_CONNECTIONS) == 2, "the last change"
    )
    info = two.topics.get("orders")
    assert info is not None
    assert (info.queues, info.config) == (3, {"x-type": "topic"})
    assert (len(two.topics), two.topics.total_queues) == (1, 3)
    assert two.bindings.route("amq.topic", "order.new") == {("orders", 0)}
    assert two.queues.defined == dict([queue_entry("orders", 0)])
    alice = two.security.user("alice")
    assert alice is not None
    assert alice.tags == ("monitoring",)
    assert two.security.permission("/", "alice") == VhostPermission("^orders$", "", ".*")
    assert two.limits.limit(VHOST, "/", MAX_QUEUES) == 5

    # Changed, then removed.
    await one.topics.add_queues("orders", 5)
    await one.unbind("amq.topic", "topic", "order.*", ("orders", 0))
    await one.security.clear_permission("/", "alice")
    await one.limits.clear_limit(USER, "alice", "all")
    await one.metadata.apply([Change(KIND_QUEUE, queue_entry("orders", 0)[0], None)])
    await eventually(lambda: not two.queues.defined, "the queue definition gone")
    assert two.topics.get("orders").queues == 5
    assert two.topics.total_queues == 5
    assert two.bindings.route("amq.topic", "order.new") == set()
    assert len(two.bindings) == 0
    assert two.security.permission("/", "alice") is None
    assert two.limits.limit(USER, "alice", MAX_CONNECTIONS) is None

    await one.topics.delete("orders")
    await eventually(lambda: "orders" not in two.topics, "the topic gone")
    assert (len(two.topics), two.topics.total_queues) == (0, 0)
    assert one.follower.applied == 0  # node 1 made every change itself


async def test_a_nodes_own_changes_are_applied_once(nodes):
    one, two = await nodes("one"), await nodes("two")
    generation = two.security.generation
    changes: list[Versioned] = []

    async def collect() -> None:
        async for entry in two.metadata.watch(0):
            changes.append(entry)

    collector = asyncio.get_running_loop().create_task(collect())
    try:
        await two.topics.declare("mine", 2)
        await two.security.put_user(User("bob"))
        await two.metadata.apply([Change(KIND_QUEUE, *queue_entry("mine", 1))])
        await two.metadata.apply([Change(KIND_SETTING, "tag-filter", b"{}")])  # shard-local
        await one.topics.declare("theirs", 1)  # after node 2's: once it is there, so are they
        await eventually(lambda: "theirs" in two.topics, "node 1's topic")

        assert (len(two.topics), two.topics.total_queues) == (2, 3)
        assert two.security.generation == generation + 1  # node 2's own put_user only
        assert two.queues.calls == []  # node 2's own queue: the Node declared it itself
        assert two.follower.applied == 1  # node 1's topic

        # The watch: every change once, node 2's and node 1's, dense versions in order.
        await eventually(lambda: len(changes) == 5, "five changes watched")
        assert [(entry.version, entry.change.kind, entry.change.key) for entry in changes] == [
            (1, KIND_TOPIC, "mine"),
            (2, "security", '["user", "bob"]'),
            (3, KIND_QUEUE, "mine\x001"),
            (4, KIND_SETTING, "tag-filter"),
            (5, KIND_TOPIC, "theirs"),
        ]
        assert [two.metadata.made_here(v) for v in range(1, 6)] == [True] * 4 + [False]
        # Node 1: its first-boot security entries, node 2's three cluster changes, its topic.
        made = [one.metadata.made_here(v) for v in range(1, one.metadata.version + 1)]
        assert made == [True] * 3 + [False] * 3 + [True]
    finally:
        collector.cancel()


async def test_an_apply_returns_the_version_its_watchers_see(nodes):
    one = await nodes("one")
    base = one.metadata.version  # its first-boot security entries
    seen: list[Versioned] = []

    async def collect() -> None:
        async for entry in one.metadata.watch(base):
            seen.append(entry)

    collector = asyncio.get_running_loop().create_task(collect())
    try:
        first = await one.metadata.apply(
            [Change(KIND_TOPIC, "a", b'{"queues": 1}'), Change(KIND_TOPIC, "b", b'{"queues": 1}')]
        )
        local = await one.metadata.apply([Change(KIND_SETTING, "s", b"1")])
        again = await one.metadata.apply([Change(KIND_TOPIC, "gone", None)])  # changes nothing
        last = await one.metadata.apply([Change(KIND_TOPIC, "a", None)])
        assert (first, local, again, last) == (base + 1, base + 2, base + 2, base + 3)
        await eventually(lambda: len(seen) == 4, "four changes")
        assert [(entry.version - base, entry.change.key) for entry in seen] == [
            (1, "a"),
            (1, "b"),
            (2, "s"),
            (3, "a"),
        ]
    finally:
        collector.cancel()


async def test_a_node_started_again_catches_up_from_redis(nodes):
    one, two = await nodes("one"), await nodes("two")
    await two.topics.declare("before", 1)
    await two.close()

    await one.topics.declare("while-down", 4)
    await one.bind("x", "fanout", "", ("while-down", 2))
    await one.security.put_user(User("carol"))
    await one.limits.set_limit(VHOST, "/", MAX_CONNECTIONS, 10)
    await one.metadata.apply([Change(KIND_QUEUE, *queue_entry("while-down", 2))])

    two = await nodes("two")
    assert {info.name for info in two.topics.all()} == {"before", "while-down"}
    assert two.topics.total_queues == 5
    assert two.bindings.route("x", "any") == {("while-down", 2)}
    assert two.security.user("carol") is not None
    assert two.limits.limit(VHOST, "/", MAX_CONNECTIONS) == 10
    assert set(two.queues.defined) == {"while-down\x002"}

    # And it follows from there.
    await one.topics.delete("before")
    await eventually(lambda: "before" not in two.topics, "node 1's delete")
    assert two.topics.total_queues == 4
    assert two.follower.applied == 1


async def test_changes_redis_lost_leave_the_registries_after_a_reload(nodes, server):
    """Redis loses node 1's last change (as a failover without WAIT can) and the next apply
    gets its version number: both nodes' stores reload, their watches report a gap, and the
    followers give every definition again, dropping what no longer exists."""
    one, two = await nodes("one"), await nodes("two")
    await one.topics.declare("kept", 1)
    await one.topics.declare("lost", 2)
    await eventually(lambda: "lost" in two.topics, "node 2 to see the topic")
    lost_version = one.redis.version
    with server.client() as raw:  # what a failover to a replica that missed it leaves
        raw.xdel("braid:c1:changes", f"{lost_version}-0")
        ((top, _),) = raw.xrevrange("braid:c1:changes", count=1)
        raw.execute_command("XSETID", "braid:c1:changes", top)
        raw.hdel("braid:c1:def:topic", "lost")
        raw.set("braid:c1:version", lost_version - 1)
    await one.topics.declare("new", 1)  # the lost one's version number again

    for node in (one, two):
        await eventually(lambda node=node: "lost" not in node.topics, "the lost topic gone")
        assert {info.name for info in node.topics.all()} == {"kept", "new"}
        assert node.topics.total_queues == 2
