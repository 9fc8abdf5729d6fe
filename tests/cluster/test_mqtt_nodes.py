"""MQTT across nodes (docs/cluster.md section 8) in the gateway's path: three in-process nodes,
each a broker on its own log with a real MQTT listener, a real gRPC server (``Deliver``,
``TakeOverSession``) and the cluster's MQTT side (core/cluster/mqtt_cluster.py) on one real
redis-server (routes, session registry, node records and leases), driven by real paho clients.

A clean-session subscriber on node 1 and one on node 3 get what a publisher on node 2 sends at
QoS 0, 1 and 2, once each; an unsubscribe removes the route; a client id connecting on another
node takes the connection over (MQTT 5: DISCONNECT 0x8E; 3.1.1: closed); a node that holds the
client id, lives and does not answer makes the CONNACK 0x88 (3.1.1: return code 3). And a node
of many local shards: records of another protocol indexed in any of them reach live
subscribers (the live feed follows every local shard).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from redis.asyncio import Redis

from core.api import PROTOCOL_AMQP, PROTOCOL_MQTT, BrokerAPI, ClientContext
from core.broker import Node
from core.cluster.mqtt_cluster import NodeMqttCluster
from core.cluster.mqtt_routes import RouteTable
from core.cluster.mqtt_sessions import SessionOwner, SessionRegistry
from core.cluster.redis_metadata import RedisMetadata, connect
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.cluster.rpc.fanout import FanoutSender
from core.cluster.rpc.takeover import MetadataPeers, SessionTakeover
from core.log import LogConfig, LogStore
from gateway.mqtt.server import MQTTServer
from tests.cluster.redis_server import RedisProcesses, RedisServer, redis_processes

SECRET = "braid-test-secret"
CLUSTER = "mqttnodes1"
SHARDS = 4
DEADLINE_S = 10.0  # waits only
LEASE_MS = 30_000  # never expires within a test
TAKEOVER_TIMEOUT_MS = 300
SERVER_UNAVAILABLE = 0x88
SESSION_TAKEN_OVER = 0x8E


async def eventually(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Client:
    """A paho client on its own network thread; the test's event loop (where the brokers run)
    only polls what its callbacks recorded, never blocks."""

    def __init__(self, port: int, client_id: str, *, version: int = mqtt.MQTTv5) -> None:
        self.port = port
        self.version = version
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": version}
        if version != mqtt.MQTTv5:
            kwargs["clean_session"] = True
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, **kwargs)
        self.messages: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
        self.connack: int | None = None
        self.disconnect_reason: int | None = None
        self.disconnected = threading.Event()
        self.acked: set[int] = set()  # SUBACK / UNSUBACK message ids
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_ack
        self.paho.on_unsubscribe = self._on_ack

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = int(reason.value)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        self.disconnect_reason = int(reason.value)
        self.disconnected.set()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put((message.topic, message.payload, message.qos))

    def _on_ack(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        self.acked.add(mid)

    async def connect(self, *, expect: int = 0) -> Client:
        if self.version == mqtt.MQTTv5:
            self.paho.connect("127.0.0.1", self.port, clean_start=True)
        else:
            self.paho.connect("127.0.0.1", self.port)
        self.paho.reconnect_delay_set(60, 60)  # a refused or taken-over client stays away
        self.paho.loop_start()
        await eventually(lambda: self.connack is not None, "the CONNACK")
        assert self.connack == expect
        return self

    async def subscribe(self, topic_filter: str) -> None:
        _, mid = self.paho.subscribe(topic_filter, qos=2)
        await eventually(lambda: mid in self.acked, f"the SUBACK of {topic_filter}")

    async def unsubscribe(self, topic_filter: str) -> None:
        _, mid = self.paho.unsubscribe(topic_filter)
        await eventually(lambda: mid in self.acked, f"the UNSUBACK of {topic_filter}")

    async def publish(self, topic: str, payload: bytes, qos: int) -> None:
        info = self.paho.publish(topic, payload, qos=qos)
        await eventually(info.is_published, f"the publish of {payload!r}")

    async def until(self, payload: bytes) -> list[tuple[str, bytes, int]]:
        """What arrives up to and with the message of ``payload``."""
        got: list[tuple[str, bytes, int]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while not got or got[-1][1] != payload:
            try:
                got.append(self.messages.get_nowait())
            except queue.Empty:
                if loop.time() > deadline:
                    pytest.fail(f"timed out waiting for {payload!r}; got {got}")
                await asyncio.sleep(0.01)
        return got

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


class ClusterNodeUnderTest:
    """One node: a broker on its own log, its Broker API, MQTT listener, gRPC server, node
    record and lease in Redis, and the cluster's MQTT side wired as a cluster node wires it."""

    def __init__(self, node: int, directory: Path, settings: RpcSettings) -> None:
        self.node = node
        self.directory = directory
        self.settings = settings
        self.service = NodeService(node, 0)
        self.rpc = RpcServer(settings, self.service)
        self.client = RpcClient(settings)
        self.incarnation = 0
        self.store: LogStore | None = None
        self.broker: Node | None = None
        self.api: BrokerAPI | None = None
        self.mqtt: MQTTServer | None = None
        self.metadata: RedisMetadata | None = None
        self.redis: Redis | None = None
        self.routes: RouteTable | None = None
        self.cluster: NodeMqttCluster | None = None

    @property
    def mqtt_port(self) -> int:
        assert self.mqtt is not None
        assert self.mqtt.address is not None
        return self.mqtt.address[1]

    async def start(self, url: str) -> None:
        port = await self.rpc.start("127.0.0.1", 0)
        self.metadata = metadata = await connect(url, CLUSTER, shards=SHARDS, heartbeat_ms=600_000)
        self.incarnation = await metadata.register_node(
            str(self.node), {"grpc": f"127.0.0.1:{port}"}
        )
        await metadata.acquire_lease(str(self.node), self.incarnation, LEASE_MS, wait_ms=0)
        self.service.incarnation = self.incarnation
        self.store = LogStore(LogConfig(self.directory, durability="async"))
        await self.store.start()
        self.broker = Node(self.store)
        await self.broker.start()
        self.api = BrokerAPI(self.broker)

        # What the process assembling a cluster node does (the wirenode task's lines).
        self.redis = redis = Redis.from_url(url)
        self.routes = RouteTable(redis, CLUSTER, self.node)
        await self.routes.start()
        peers = MetadataPeers(metadata)
        registry = SessionRegistry(redis, CLUSTER)

        def takeover(close: Callable[[str, int, int], Awaitable[bool]]) -> SessionTakeover:
            return SessionTakeover(
                registry,
                self.client,
                peers,
                node=self.node,
                incarnation=self.incarnation,
                shards=SHARDS,
                takeover_timeout_ms=TAKEOVER_TIMEOUT_MS,
                close_local=close,
            )

        sender = FanoutSender(self.client, self.node, self.incarnation, peers.address_of)
        self.cluster = NodeMqttCluster(self.node, self.routes, sender, registry, takeover)
        self.cluster.attach(self.service)
        self.api.set_mqtt_cluster(self.cluster)

        self.mqtt = MQTTServer(self.api)
        await self.mqtt.start("127.0.0.1", 0)

    async def stop(self) -> None:
        if self.mqtt is not None:
            await self.mqtt.close()
        if self.cluster is not None:
            await self.cluster.aclose()
        if self.routes is not None:
            await self.routes.aclose()
        await self.rpc.stop(grace_s=0)
        await self.client.close()
        if self.broker is not None:
            await self.broker.close()
        if self.store is not None:
            await self.store.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        if self.metadata is not None:
            await self.metadata.aclose()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    processes: RedisProcesses
    with redis_processes(tmp_path) as processes:
        yield processes.redis()


@pytest.fixture
async def nodes(
    tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[dict[int, ClusterNodeUnderTest]]:
    settings = RpcSettings(secret=SECRET, heartbeat_ms=500, rpc_timeout_ms=5000)
    started: dict[int, ClusterNodeUnderTest] = {}
    try:
        for number in (1, 2, 3):
            node = started[number] = ClusterNodeUnderTest(number, tmp_path / f"n{number}", settings)
            await node.start(redis_server.url)
        yield started
    finally:
        for node in started.values():
            await node.stop()


def routes_of(node: ClusterNodeUnderTest) -> RouteTable:
    assert node.routes is not None
    return node.routes


def cluster_of(node: ClusterNodeUnderTest) -> NodeMqttCluster:
    assert node.cluster is not None
    return node.cluster


async def test_a_publish_on_one_node_reaches_live_subscribers_on_two_others(
    nodes: dict[int, ClusterNodeUnderTest],
) -> None:
    one, two, three = nodes[1], nodes[2], nodes[3]
    first = await Client(one.mqtt_port, "sub-1").connect()
    third = await Client(three.mqtt_port, "sub-3", version=mqtt.MQTTv311).connect()
    publisher = await Client(two.mqtt_port, "pub-2").connect()
    clients = [first, third, publisher]
    try:
        await first.subscribe("plant/+/temp")
        await third.subscribe("plant/#")
        await third.subscribe("marks/#")  # stays: ordered after anything sent to node 3
        await eventually(
            lambda: routes_of(two).nodes_for("plant/a/temp") == {1, 3}, "node 2 learns the routes"
        )
        for qos in (0, 1, 2):
            await publisher.publish("plant/a/temp", b"q%d" % qos, qos)
        sent = [("plant/a/temp", b"q%d" % qos, qos) for qos in (0, 1, 2)]
        # Each exactly once, in order, at the publish's QoS (the subscriptions are QoS 2).
        assert await first.until(b"q2") == sent
        assert await third.until(b"q2") == sent
        fanout = cluster_of(two).sender
        assert fanout.sent(1) == fanout.sent(3) == 3
        assert fanout.sent(2) == 0  # never to itself
        assert fanout.dropped(1) == fanout.dropped(3) == 0

        # A topic only node 3 subscribes to goes to node 3 alone.
        await publisher.publish("plant/a/humidity", b"h", 1)
        assert await third.until(b"h") == [("plant/a/humidity", b"h", 1)]
        assert fanout.sent(1) == 3

        # Node 3's last subscriber of plant/# leaves: its route goes, nothing more is sent
        # there (the marker behind it on the same stream arrives alone).
        await third.unsubscribe("plant/#")
        await eventually(
            lambda: routes_of(two).nodes_for("plant/a/temp") == {1}, "node 3's route removed"
        )
        await publisher.publish("plant/a/temp", b"after", 1)
        await publisher.publish("marks/end", b"end", 1)
        assert await third.until(b"end") == [("marks/end", b"end", 1)]
        assert await first.until(b"after") == [("plant/a/temp", b"after", 1)]
        assert fanout.sent(3) == 5  # q0, q1, q2, h, end
    finally:
        for client in clients:
            client.close()
    # Clean stops: each node's routes left the cluster's table.
    await eventually(lambda: not routes_of(two).routes(), "the routes gone")


async def test_a_client_id_connecting_on_another_node_takes_the_connection_over(
    nodes: dict[int, ClusterNodeUnderTest],
) -> None:
    one, two, three = nodes[1], nodes[2], nodes[3]
    registry = cluster_of(one).registry
    old = await Client(one.mqtt_port, "dev-5").connect()
    await old.subscribe("cmd/dev-5")
    assert await registry.owner("dev-5") == SessionOwner(1, one.incarnation, 1)

    new = await Client(two.mqtt_port, "dev-5").connect()  # MQTT 5 on both
    await eventually(old.disconnected.is_set, "the old connection closed")
    assert old.disconnect_reason == SESSION_TAKEN_OVER
    assert await registry.owner("dev-5") == SessionOwner(2, two.incarnation, 2)
    # The old one's live subscription and route went with it; the new connection works.
    await eventually(lambda: not routes_of(three).nodes_for("cmd/dev-5"), "the old route gone")
    await new.subscribe("cmd/dev-5")
    await eventually(lambda: routes_of(three).nodes_for("cmd/dev-5") == {2}, "the new route")
    sender = await Client(three.mqtt_port, "ops").connect()
    await sender.publish("cmd/dev-5", b"reboot", 1)
    assert await new.until(b"reboot") == [("cmd/dev-5", b"reboot", 1)]
    assert old.messages.empty()

    # MQTT 3.1.1: the old connection is closed (no DISCONNECT in that version).
    legacy = await Client(one.mqtt_port, "dev-6", version=mqtt.MQTTv311).connect()
    moved = await Client(three.mqtt_port, "dev-6", version=mqtt.MQTTv311).connect()
    await eventually(legacy.disconnected.is_set, "the 3.1.1 connection closed")
    assert await registry.owner("dev-6") == SessionOwner(3, three.incarnation, 2)

    # A clean disconnect releases the client id: the next CONNECT takes it from nobody.
    for client in (old, new, sender, legacy, moved):
        client.close()
    for client_id in ("dev-5", "dev-6"):
        await _released(registry, client_id)


async def _released(registry: SessionRegistry, client_id: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while await registry.owner(client_id) is not None:
        if loop.time() > deadline:
            pytest.fail(f"{client_id} was not released")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("version", [mqtt.MQTTv5, mqtt.MQTTv311])
async def test_a_holder_that_lives_and_does_not_answer_refuses_the_connect(
    nodes: dict[int, ClusterNodeUnderTest], version: int
) -> None:
    one, two = nodes[1], nodes[2]
    held = await Client(one.mqtt_port, "dev-7", version=version).connect()
    await one.rpc.stop(grace_s=0)  # unreachable; its lease still held
    refused = Client(two.mqtt_port, "dev-7", version=version)
    # 0x88 Server unavailable; 3.1.1's return code 3 reads the same in paho.
    await refused.connect(expect=SERVER_UNAVAILABLE)
    registry = cluster_of(one).registry
    assert await registry.owner("dev-7") == SessionOwner(1, one.incarnation, 1)  # undone
    assert not held.disconnected.is_set()
    refused.close()
    held.close()


async def test_records_in_any_local_shard_reach_live_subscribers(tmp_path: Path) -> None:
    """The live feed follows every local shard of a node (not only the lowest one)."""
    stores = []
    for number in range(SHARDS):
        store = LogStore(LogConfig(tmp_path / f"s{number}", durability="async"))
        await store.start()
        stores.append((number, store))
    broker = Node(stores)
    await broker.start()
    api = BrokerAPI(broker)
    server = MQTTServer(api)
    await server.start("127.0.0.1", 0)
    assert server.address is not None
    client = await Client(server.address[1], "live").connect()
    try:
        await client.subscribe("+/x")
        # AMQP-style publishes to four topics spread over the shards, each its own subject.
        by_shard: dict[int, str] = {}
        for index in range(64):
            name = f"feed{index}"
            by_shard.setdefault(broker.shards.queue_number(name, 0), name)
        assert sorted(by_shard) == list(range(SHARDS))
        context = ClientContext(PROTOCOL_AMQP, connection_id="test")
        for shard, name in sorted(by_shard.items()):
            await api.create_topic(context, name, 1)
            await api.publish(context, name, b"s%d" % shard, subject="x")
        # Each one as the MQTT topic <topic>/<subject>, whichever shard stored it.
        got: set[bytes] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while len(got) < SHARDS:
            try:
                _, payload, _ = client.messages.get_nowait()
                got.add(payload)
            except queue.Empty:
                if loop.time() > deadline:
                    pytest.fail(f"only {sorted(got)} arrived")
                await asyncio.sleep(0.01)
        assert got == {b"s%d" % shard for shard in range(SHARDS)}
    finally:
        client.close()
        await server.close()
        await broker.close()
        for _, store in stores:
            await store.aclose()


async def test_an_mqtt_publish_read_back_only_for_other_nodes_is_skipped(tmp_path: Path) -> None:
    """A shard's owner reads back records other nodes' routes may want (to fan out AMQP and
    Kafka records); an MQTT publish among them was sent to those nodes by its publisher, so
    with no subscriber here it is skipped before it is decoded: the hub taps only the AMQP one."""
    store = LogStore(LogConfig(tmp_path / "s0", durability="async"))
    await store.start()
    broker = Node(store)
    await broker.start()
    api = BrokerAPI(broker)
    server = MQTTServer(api)
    await server.start("127.0.0.1", 0)
    # As set_mqtt_cluster does on a node whose route table says another node wants the topic.
    api._live_feed().others_want = lambda topic: topic == "plant"
    try:
        await api.create_topic(ClientContext(PROTOCOL_AMQP, connection_id="a"), "plant", 1)
        mqtt_context = ClientContext(PROTOCOL_MQTT, connection_id="m", client_id="pub")
        amqp_context = ClientContext(PROTOCOL_AMQP, connection_id="a")
        await api.publish(mqtt_context, "plant", b"from mqtt", subject="a")
        await api.publish(amqp_context, "plant", b"from amqp", subject="a")
        await eventually(lambda: server.metrics["tapped_records"] >= 1, "the AMQP record")
        await asyncio.sleep(0.1)  # a second read-back would come by now
        assert server.metrics["tapped_records"] == 1
    finally:
        await server.close()
        await broker.close()
        await store.aclose()
