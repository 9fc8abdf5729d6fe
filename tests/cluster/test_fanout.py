"""core/cluster/rpc/fanout.py and takeover.py over real loopback gRPC: ``Deliver`` hands the
messages to the target's dispatch in order, batched per loop turn, and a target that is gone is
counted, not raised; ``TakeOverSession`` between two in-process nodes with the real session
registry and leases in a real redis-server (core/cluster/mqtt_sessions.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from core.cluster.mqtt_sessions import SessionOwner, SessionRegistry
from core.cluster.redis_metadata import RedisMetadata, connect
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.cluster.rpc.fanout import FanoutReceiver, FanoutSender
from core.cluster.rpc.takeover import (
    MetadataPeers,
    SessionTakeover,
    SessionTakeoverFailed,
    TakeOverHandler,
)
from core.errors import ShardUnavailable
from tests.cluster.redis_server import RedisProcesses, RedisServer, free_port, redis_processes

SECRET = "braid-test-secret"
DEADLINE_S = 10.0  # waits only
SHARDS = 4
CLUSTER = "fanout1"
LEASE_MS = 30_000  # never expires within a test: the tests release a lease to end it
TAKEOVER_TIMEOUT_MS = 300  # the old node's silence is waited for this long

Received = list[tuple[str, bytes, int]]


@pytest.fixture
def settings() -> RpcSettings:
    return RpcSettings(secret=SECRET, heartbeat_ms=500, rpc_timeout_ms=5000)


async def eventually(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Receiving:
    """A node that only receives fan-out: a gRPC server whose dispatch records messages."""

    def __init__(self, node: int, settings: RpcSettings) -> None:
        self.node = node
        self.received: Received = []
        self.receiver = FanoutReceiver(self.dispatch)
        service = NodeService(node, 1)
        service.deliver = self.receiver.deliver
        self.server = RpcServer(settings, service)
        self.fail_on: str | None = None

    def dispatch(self, topic: str, fields: bytes, qos: int) -> None:
        if topic == self.fail_on:
            raise RuntimeError("a subscriber's failure")
        self.received.append((topic, fields, qos))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
async def peers(settings: RpcSettings) -> AsyncIterator[dict[int, Receiving]]:
    started = {node: Receiving(node, settings) for node in (2, 3)}
    for peer in started.values():
        await peer.server.start("127.0.0.1", 0)
    yield started
    for peer in started.values():
        await peer.server.stop(grace_s=0)


@pytest.fixture
async def sender(settings: RpcSettings, peers: dict[int, Receiving]) -> AsyncIterator[FanoutSender]:
    addresses = {node: peer.address for node, peer in peers.items()}
    addresses[4] = f"127.0.0.1:{free_port()}"  # registered, but nothing listens there

    async def address_of(node: int) -> str | None:
        return addresses.get(node)  # node 5: none (not live)

    client = RpcClient(settings)
    fanout = FanoutSender(client, 1, 11, address_of)
    yield fanout
    await fanout.aclose(grace_s=1.0)
    await client.close()


def message(i: int) -> tuple[str, bytes, int]:
    return f"sensors/{i % 7}/temp", b"fields-%d" % i, i % 3


async def test_messages_reach_each_target_in_order_batched_per_turn(
    sender: FanoutSender, peers: dict[int, Receiving]
) -> None:
    sent: dict[int, Received] = {2: [], 3: []}
    for turn in range(5):
        for i in range(turn * 100, turn * 100 + 100):  # one loop turn: no await in between
            node = 2 if i % 3 else 3
            sender.send(node, *message(i))
            sent[node].append(message(i))
        await asyncio.sleep(0)
    for node in (2, 3):
        await eventually(lambda n=node: len(peers[n].received) == len(sent[n]), f"node {node}")
        assert peers[node].received == sent[node]
        assert sender.sent(node) == len(sent[node])
        assert sender.dropped(node) == 0
        # Coalesced: never more bursts than turns, far fewer than messages.
        assert 1 <= sender.batches(node) <= 5
    assert peers[2].receiver.received == len(sent[2])


async def test_one_turn_of_messages_is_one_grpc_message(
    sender: FanoutSender, peers: dict[int, Receiving]
) -> None:
    for i in range(200):  # one loop turn
        sender.send(2, *message(i))
    await eventually(lambda: len(peers[2].received) == 200, "the 200 messages")
    assert peers[2].received == [message(i) for i in range(200)]
    # One FanoutBatch read by the receiver, not one message per publish.
    assert peers[2].receiver.batches == 1
    assert sender.batches(2) == 1


async def test_a_dispatch_that_raises_does_not_end_the_stream(
    sender: FanoutSender, peers: dict[int, Receiving]
) -> None:
    peers[2].fail_on = "bad/topic"
    sender.send(2, "good/1", b"a", 0)
    sender.send(2, "bad/topic", b"b", 1)
    sender.send(2, "good/2", b"c", 1)
    await eventually(lambda: len(peers[2].received) == 2, "the messages around the failure")
    assert peers[2].received == [("good/1", b"a", 0), ("good/2", b"c", 1)]
    assert peers[2].receiver.failed == 1


async def test_a_peer_gone_is_counted_not_raised(
    sender: FanoutSender, peers: dict[int, Receiving]
) -> None:
    for i in range(20):
        sender.send(4, *message(i))  # nothing listens there
        sender.send(5, *message(i))  # no address
        sender.send(2, *message(i))
    await eventually(lambda: sender.dropped(4) == 20, "node 4's messages dropped")
    await eventually(lambda: sender.dropped(5) == 20, "node 5's messages dropped")
    await eventually(lambda: len(peers[2].received) == 20, "node 2's messages")
    assert sender.sent(4) == sender.sent(5) == 0

    # A peer that goes away after its stream was open: later messages are dropped and counted,
    # the others keep flowing, and it is reached again once it is back.
    sender.send(3, "before", b"x", 0)
    await eventually(lambda: len(peers[3].received) == 1, "node 3 reached")
    port = peers[3].server.port
    await peers[3].server.stop(grace_s=0)
    await eventually(lambda: _send_until_dropped(sender, 3), "node 3's messages dropped")
    sender.send(2, "still", b"y", 0)
    await eventually(lambda: peers[2].received[-1:] == [("still", b"y", 0)], "node 2 still")

    await peers[3].server.start("127.0.0.1", port)  # back, on the address it had
    await eventually(lambda: _send_until_received(sender, peers[3], "again"), "node 3 again")


def _send_until_dropped(sender: FanoutSender, node: int) -> bool:
    sender.send(node, "lost", b"z", 0)
    return sender.dropped(node) > 0


def _send_until_received(sender: FanoutSender, peer: Receiving, topic: str) -> bool:
    sender.send(peer.node, topic, b"w", 1)
    return any(received[0] == topic for received in peer.received)


async def test_a_slow_peer_past_the_pending_bound_drops_the_excess(
    settings: RpcSettings, peers: dict[int, Receiving]
) -> None:
    resolve: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    async def address_of(node: int) -> str | None:
        return await resolve  # the stream cannot open until the test says so

    client = RpcClient(settings)
    fanout = FanoutSender(client, 1, 11, address_of, max_pending=5)
    try:
        for i in range(8):
            fanout.send(2, *message(i))
        assert fanout.dropped(2) == 3
        resolve.set_result(peers[2].address)
        await eventually(lambda: len(peers[2].received) == 5, "the five kept")
        assert peers[2].received == [message(i) for i in range(5)]
    finally:
        await fanout.aclose(grace_s=1.0)
        await client.close()


# -- TakeOverSession ------------------------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    processes: RedisProcesses
    with redis_processes(tmp_path) as processes:
        yield processes.redis()


class Node:
    """One node of the takeover tests: its metadata (node record, lease), registry, gRPC
    server with the takeover handler, and the connections its 'gateway' holds (client id ->
    gen), closed by the callback."""

    def __init__(self, node: int, settings: RpcSettings) -> None:
        self.node = node
        self.settings = settings
        self.connections: dict[str, int] = {}
        self.closed: list[tuple[str, int, int]] = []  # (client id, by gen, for node)
        self.answer_delay_s = 0.0
        self.metadata: RedisMetadata | None = None
        self.incarnation = 0
        self.service = NodeService(node, 0)
        self.service.take_over_session = TakeOverHandler(self.close_session).take_over_session
        self.server = RpcServer(settings, self.service)
        self.client = RpcClient(settings)
        self.takeover: SessionTakeover | None = None
        self.redis: Redis | None = None
        self.registry: SessionRegistry | None = None

    async def close_session(self, client_id: str, gen: int, new_node: int) -> bool:
        await asyncio.sleep(self.answer_delay_s)
        held = self.connections.get(client_id)
        if held is None or held >= gen:
            return False  # none, or newer than the one taking over
        del self.connections[client_id]
        self.closed.append((client_id, gen, new_node))
        return True

    async def start(self, url: str) -> None:
        port = await self.server.start("127.0.0.1", 0)
        self.metadata = await connect(url, CLUSTER, shards=SHARDS, heartbeat_ms=600_000)
        self.incarnation = await self.metadata.register_node(
            str(self.node), {"grpc": f"127.0.0.1:{port}"}
        )
        await self.metadata.acquire_lease(str(self.node), self.incarnation, LEASE_MS, wait_ms=0)
        self.service.incarnation = self.incarnation
        self.redis = Redis.from_url(url)
        self.registry = SessionRegistry(self.redis, CLUSTER)
        self.takeover = SessionTakeover(
            self.registry,
            self.client,
            MetadataPeers(self.metadata),
            node=self.node,
            incarnation=self.incarnation,
            shards=SHARDS,
            takeover_timeout_ms=TAKEOVER_TIMEOUT_MS,
            close_local=self.close_session,
        )

    async def connect_client(self, client_id: str) -> bool:
        """A CONNECT here: take the client id over, then hold its connection."""
        assert self.takeover is not None
        connected = await self.takeover.connect(client_id)
        self.connections[client_id] = connected.gen
        return connected.found

    async def stop(self) -> None:
        await self.server.stop(grace_s=0)
        await self.client.close()
        if self.metadata is not None:
            await self.metadata.aclose()
        if self.redis is not None:
            await self.redis.aclose()


@pytest.fixture
async def nodes(
    redis_server: RedisServer, settings: RpcSettings
) -> AsyncIterator[Callable[[int], Awaitable[Node]]]:
    started: list[Node] = []

    async def start(node_id: int) -> Node:
        node = Node(node_id, settings)
        started.append(node)
        await node.start(redis_server.url)
        return node

    yield start
    for node in started:
        await node.stop()


async def test_a_client_moving_to_another_node_is_taken_over(
    nodes: Callable[[int], Awaitable[Node]],
) -> None:
    one, two = await nodes(1), await nodes(2)
    assert not await one.connect_client("dev-1")  # new: nobody to take it from
    assert one.connections == {"dev-1": 1}

    assert await two.connect_client("dev-1")  # found and closed on node 1
    assert one.connections == {}
    assert one.closed == [("dev-1", 2, 2)]
    assert two.connections == {"dev-1": 2}
    registry = one.registry
    assert registry is not None
    assert await registry.owner("dev-1") == SessionOwner(2, two.incarnation, 2)

    assert await one.connect_client("dev-1")  # and back
    assert two.closed == [("dev-1", 3, 1)]
    assert await registry.holds("dev-1", 3)
    assert not await registry.holds("dev-1", 2)

    assert await one.connect_client("dev-1")  # again on the same node: closed locally
    assert one.closed[-1] == ("dev-1", 4, 1)
    assert not await registry.release("dev-1", 3)  # an old connection's release: kept
    assert await registry.release("dev-1", 4)
    assert await registry.owner("dev-1") is None


async def test_an_old_node_that_does_not_answer_but_lives_refuses(
    nodes: Callable[[int], Awaitable[Node]],
) -> None:
    one, two = await nodes(1), await nodes(2)
    await one.connect_client("dev-2")
    one.answer_delay_s = 5.0  # past takeover_timeout_ms
    with pytest.raises(SessionTakeoverFailed) as failed:
        await two.connect_client("dev-2")
    assert isinstance(failed.value, ShardUnavailable)  # what the gateway maps to 0x88
    assert failed.value.owner == 1
    assert 0 <= failed.value.shard < SHARDS
    assert "dev-2" not in two.connections
    registry = one.registry
    assert registry is not None
    assert await registry.owner("dev-2") == SessionOwner(1, one.incarnation, 1)  # undone

    await one.server.stop(grace_s=0)  # unreachable, lease still held: refused too
    with pytest.raises(SessionTakeoverFailed):
        await two.connect_client("dev-2")
    assert await registry.owner("dev-2") == SessionOwner(1, one.incarnation, 1)
    assert one.connections == {"dev-2": 1}


async def test_an_old_node_whose_lease_is_gone_is_not_waited_for(
    nodes: Callable[[int], Awaitable[Node]],
) -> None:
    one, two = await nodes(1), await nodes(2)
    await one.connect_client("dev-3")
    await one.connect_client("dev-4")
    one.answer_delay_s = 5.0
    assert one.metadata is not None
    # Its lease ends while node 2 waits for an answer: node 2 proceeds after the timeout.
    call = asyncio.create_task(two.connect_client("dev-3"))
    await asyncio.sleep(TAKEOVER_TIMEOUT_MS / 1000 / 3)
    assert await one.metadata.release_lease("1", one.incarnation)
    assert not await call  # not found, but taken over
    assert two.connections["dev-3"] == 2

    # Known dead before calling (no lease): no call at all.
    await one.server.stop(grace_s=0)
    assert not await two.connect_client("dev-4")
    assert two.connections["dev-4"] == 2
    assert one.closed == []
