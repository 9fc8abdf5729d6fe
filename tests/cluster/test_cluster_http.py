"""braid/cluster_http.py and core/cluster/admin_calls.py: two in-process nodes, each with a real
gRPC server on loopback, a real MetricsRegistry and a real broker behind the management API's
listings, registered with leases and shard claims in a real redis-server. Node 1's HTTP
listener answers for both: /metrics (parsed with prometheus_client's parser) with every
sample labelled by node, node_up and shard owners; /api/queues with each queue's stats from
its shard's owner; and when node 2's gRPC server stops, node_up 0 for it and the rest still
served."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pika
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from braid.cluster_http import (
    ClusterHttp,
    NodeListings,
    enable_cluster_http,
    local_families,
    start_cluster_http,
)
from braid.metrics import Family, MetricsRegistry, merge_node_families, render_families
from braid.web import WebServer, build_app
from braid.web.rabbit import ManagementSources, RabbitResources
from braid.web.server import ResponseCounter
from core.api import INTERNAL_CONTEXT, AckQueueConfig, BrokerAPI
from core.broker import Node
from core.cluster.admin_calls import ADMIN_METRICS, ADMIN_QUEUES, ClusterGather
from core.cluster.membership import NodeAddresses
from core.cluster.placement import queue_shard
from core.cluster.redis_metadata import RedisMetadata, connect
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.log import LogConfig, LogStore
from core.security import SecurityService
from gateway.amqp.vhost import CONFIG_KEY, QUEUE_TOPIC_PREFIX
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer, redis_processes
from tests.cluster.test_node import DEADLINE_S, amqp, eventually

SECRET = "braid-test-secret"
CLUSTER = "http1"
SHARDS = 2
LEASE_MS = 30_000  # never expires within a test
GUEST = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
Samples = dict[str, list[tuple[dict[str, str], float]]]


def queue_on(shard: int, prefix: str) -> str:
    """A queue name of vhost "/" that the placement rule puts on ``shard``."""
    return next(
        f"{prefix}-{i}" for i in range(1000) if queue_shard("/", f"{prefix}-{i}", SHARDS) == shard
    )


# Queue name -> the shard it is placed on, and the messages its owner holds.
QUEUES = {queue_on(0, "orders"): (0, 3), queue_on(1, "billing"): (1, 2)}


class TestNode:
    """One node: metadata (node record with its gRPC address, lease, claimed shard), a broker
    with the queues declared (messages published only where the queue's shard is owned), its
    registry, and its Admin calls on a real gRPC server."""

    __test__ = False

    def __init__(self, node_id: int, shard: int, directory: Path) -> None:
        self.node_id = node_id
        self.shard = shard
        self.directory = directory
        self.settings = RpcSettings(secret=SECRET, heartbeat_ms=500, rpc_timeout_ms=2000)
        self.service = NodeService(node_id, 1)
        self.server = RpcServer(self.settings, self.service)
        self.client = RpcClient(self.settings)
        self.registry = MetricsRegistry()
        self.counters = {"published": 10 * node_id}
        self.registry.register_counters("braid_test_", lambda: self.counters)
        self.metadata: RedisMetadata | None = None
        self.store: LogStore | None = None
        self.broker: Node | None = None
        self.gather: ClusterGather | None = None
        self.cluster: ClusterHttp | None = None

    async def start(self, redis_url: str) -> None:
        self.store = LogStore(LogConfig(self.directory / "data", durability="async"))
        await self.store.start()
        self.broker = Node(self.store)
        await self.broker.start()
        security = SecurityService(self.broker.metadata)
        api = BrokerAPI(self.broker, security)
        for name, (shard, messages) in QUEUES.items():
            config = {"object": "queue", "name": name, "durable": True, "arguments": {}}
            topic = QUEUE_TOPIC_PREFIX + name
            await api.declare_queue(INTERNAL_CONTEXT, topic, {CONFIG_KEY: config}, AckQueueConfig())
            for i in range(messages if shard == self.shard else 0):
                await api.publish(INTERNAL_CONTEXT, topic, b"m%d" % i, subject=name)
        self.sources = ManagementSources(api, {})
        self.resources = RabbitResources(security, self.sources)
        port = await self.server.start("127.0.0.1", 0)
        self.metadata = metadata = await connect(redis_url, CLUSTER, shards=SHARDS)
        node = str(self.node_id)
        fields = NodeAddresses(host="127.0.0.1", grpc=f"127.0.0.1:{port}").fields()
        incarnation = await metadata.register_node(node, fields)
        await metadata.acquire_lease(node, incarnation, LEASE_MS, wait_ms=0)
        await metadata.claim_shard(self.shard, node, incarnation, 0)
        # What braid serve does on a cluster node: the calls once, the broker attached.
        admin, self.cluster = start_cluster_http(
            self.service,
            metadata,
            self.client,
            self.node_id,
            timeout_s=self.settings.rpc_timeout_s,
        )
        admin.attach(local_families(self.registry, self.resources), NodeListings(self.resources))
        self.gather = self.cluster.gather

    async def stop(self) -> None:
        await self.server.stop(grace_s=0)
        await self.client.close()
        if self.metadata is not None:
            await self.metadata.aclose()
        if self.broker is not None:
            await self.broker.close()
        if self.store is not None:
            await self.store.aclose()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_processes(tmp_path / "redis") as processes:
        yield processes.redis()


@pytest.fixture
async def nodes(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[dict[int, TestNode]]:
    started = {node: TestNode(node, node - 1, tmp_path / f"node{node}") for node in (1, 2)}
    try:
        for node in started.values():
            await node.start(redis_server.url)
        yield started
    finally:
        for node in started.values():
            await node.stop()


@pytest.fixture
async def http(nodes: dict[int, TestNode]) -> AsyncIterator[str]:
    """Node 1's HTTP listener, answering for the cluster; its base URL."""
    node = nodes[1]
    assert node.cluster is not None
    counter = ResponseCounter()
    app = build_app(
        lambda: (True, {}), node.registry, node.resources.security, sources=node.sources
    )
    enable_cluster_http(app, node.cluster, node.resources)
    server = WebServer(app, counter)
    await server.start("127.0.0.1", 0)
    assert server.address is not None
    try:
        yield f"http://127.0.0.1:{server.address[1]}"
    finally:
        await server.close()


async def get(url: str, *, auth: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=auth, timeout=aiohttp.ClientTimeout(total=30)) as response,
    ):
        return response.status, await response.text()


async def scrape(base: str) -> Samples:
    status, text = await get(f"{base}/metrics")
    assert status == 200, text
    samples: Samples = {}
    # The parser refuses a second HELP/TYPE of one name and malformed lines: the text is valid.
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def by_node(samples: Samples, name: str) -> dict[str, float]:
    return {labels["node"]: value for labels, value in samples[name]}


async def test_metrics_merge_every_nodes_families_with_node_labels(
    nodes: dict[int, TestNode], http: str
) -> None:
    samples = await scrape(http)
    assert by_node(samples, "braid_test_published_total") == {"1": 10, "2": 20}
    assert by_node(samples, "braid_metrics_collector_errors_total") == {"1": 0, "2": 0}
    assert by_node(samples, "braid_cluster_node_up") == {"1": 1, "2": 1}
    # The dashboards' families (braid/web/prometheus.py) from each node too.
    assert set(by_node(samples, "rabbitmq_identity_info")) == {"1", "2"}
    owners = {labels["shard"]: labels["node"] for labels, _ in samples["braid_shard_owner"]}
    assert owners == {"0": "1", "1": "2"}
    assert all(value == 1 for _, value in samples["braid_shard_owner"])
    # Every sample of every node's families carries its node.
    assert all("node" in labels for series in samples.values() for labels, _ in series)


async def test_a_node_that_stops_answering_is_down_and_the_rest_served(
    nodes: dict[int, TestNode], http: str
) -> None:
    await nodes[2].server.stop(grace_s=0)  # its lease lives on: known, live, silent
    samples = await scrape(http)
    assert by_node(samples, "braid_cluster_node_up") == {"1": 1, "2": 0}
    assert by_node(samples, "braid_test_published_total") == {"1": 10}
    owners = {labels["shard"]: labels["node"] for labels, _ in samples["braid_shard_owner"]}
    assert owners == {"0": "1", "1": "2"}

    # The queue on node 2's shard is listed from its definition, without stats, down.
    status, text = await get(f"{http}/api/queues", auth=GUEST)
    assert status == 200, text
    queues = {queue["name"]: queue for queue in json.loads(text)}
    orders, billing = sorted(QUEUES, key=lambda name: QUEUES[name][0])
    assert queues[orders]["messages"] == 3
    assert queues[orders]["node"] == "1"
    assert queues[billing]["state"] == "down"
    assert "messages" not in queues[billing]


async def test_queue_listing_takes_each_queues_stats_from_its_owner(
    nodes: dict[int, TestNode], http: str
) -> None:
    status, text = await get(f"{http}/api/queues", auth=GUEST)
    assert status == 200, text
    listed = {(queue["name"], queue["node"], queue["messages"]) for queue in json.loads(text)}
    expected = {(name, str(shard + 1), messages) for name, (shard, messages) in QUEUES.items()}
    assert listed == expected
    # Each node alone sees only its own queue's messages: the merge picked the owners'.
    for node in nodes.values():
        alone = {
            queue["name"]: queue["messages"]
            for queue in node.resources.queues_of(INTERNAL_CONTEXT, ["/"])
        }
        assert alone == {
            name: messages if shard == node.shard else 0
            for name, (shard, messages) in QUEUES.items()
        }
    name = next(iter(QUEUES))
    status, text = await get(f"{http}/api/queues/%2F/{name}", auth=GUEST)
    assert status == 200, text
    assert json.loads(text)["messages"] == QUEUES[name][1]
    status, _ = await get(f"{http}/api/queues", auth=None)
    assert status == 401  # the local handler's access check stands

    status, text = await get(f"{http}/api/overview", auth=GUEST)
    assert status == 200, text
    overview = json.loads(text)
    assert overview["object_totals"]["queues"] == len(QUEUES)
    assert overview["queue_totals"]["messages_ready"] == sum(m for _, m in QUEUES.values())


async def test_gather_reports_missing_nodes_and_never_raises(nodes: dict[int, TestNode]) -> None:
    gather = nodes[1].gather
    assert gather is not None
    gathered = await gather.gather(ADMIN_QUEUES)
    assert sorted(gathered.answers) == ["1", "2"]
    assert gathered.missing == {}
    assert gathered.owners == {0: "1", 1: "2"}
    # Node 2 releases its lease (a clean stop): known, but not asked.
    assert nodes[2].metadata is not None
    await nodes[2].metadata.release_lease("2", (await nodes[2].metadata.lease_holder("2")) or 0)
    gathered = await gather.gather(ADMIN_METRICS)
    assert list(gathered.answers) == ["1"]
    assert gathered.missing == {"2": "no live lease"}
    # An unknown call: every node's part missing, no exception.
    gathered = await gather.gather("no-such-call")
    assert gathered.answers == {}
    assert set(gathered.missing) == {"1", "2"}


def test_merged_families_render_one_help_and_type_per_name() -> None:
    per_node: dict[str, list[tuple[str, str, str, Any]]] = {
        "1": [("braid_x_total", "counter", "X.", 1), ("up_like", "gauge", "Y.", [({}, 1)])],
        "2": [
            ("braid_x_total", "counter", "X.", 2),
            ("up_like", "gauge", "Y.", [({"node": "inner"}, 0)]),
        ],
    }
    text = render_families(
        merge_node_families({n: [Family(*f) for f in fs] for n, fs in per_node.items()})
    )
    assert text.count("# TYPE braid_x_total counter") == 1
    assert 'braid_x_total{node="1"} 1' in text
    assert 'braid_x_total{node="2"} 2' in text
    assert 'up_like{node="2",exported_node="inner"} 0' in text
    assert [f.name for f in text_string_to_metric_families(text)] == ["braid_x", "up_like"]


async def test_gather_calls_nodes_in_parallel(nodes: dict[int, TestNode]) -> None:
    """Both nodes' answers come back within one gather even when each is slow: the calls
    overlap (a sequential gather would see the first node's call end before the second's
    begins)."""
    running: set[str] = set()
    overlapped = asyncio.Event()

    def slow(node: str):  # type: ignore[no-untyped-def]
        async def call(_args: dict[str, Any]) -> dict[str, Any]:
            running.add(node)
            if len(running) == 2:
                overlapped.set()
            await asyncio.wait_for(overlapped.wait(), 10)
            return {"node": node}

        return call

    nodes[2].service.register("slow", slow("2"))
    assert nodes[1].metadata is not None
    # This node answers itself without gRPC, from its local calls.
    gather = ClusterGather(
        nodes[1].metadata, nodes[1].client.admin, "1", {"slow": slow("1")}, timeout_s=5
    )
    gathered = await gather.gather("slow")
    assert gathered.answers == {"1": {"node": "1"}, "2": {"node": "2"}}


# -- three real braid serve nodes -------------------------------------------------------------
# The management API of each node of a real cluster answers for the cluster (the routes a
# RabbitMQ user and rabbitmqadmin use): one module-scoped cluster for all these tests.

CLUSTER_SHARDS = 12
RABBITMQADMIN = shutil.which("rabbitmqadmin")
LOGIN = ("-u", "guest", "-p", "guest")
QUEUE_TOPIC = "amq.queue."


@pytest.fixture(scope="module")
def cluster_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_processes(tmp_path_factory.mktemp("redis")) as processes:
        yield processes.redis()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster_redis: RedisServer
) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("http3"), cluster_redis.url, shards=CLUSTER_SHARDS
    ) as started:
        yield started


def api(cluster: Cluster, node_id: int, method: str, path: str, body: Any = None) -> Any:
    """``method`` ``/api/<path>`` on node ``node_id`` as guest: (status, JSON or None)."""
    response = requests.request(
        method,
        f"http://127.0.0.1:{cluster[node_id].http_port}/api/{path}",
        auth=("guest", "guest"),
        json=body,
        timeout=DEADLINE_S,
    )
    return response.status_code, response.json() if response.content else None


def node_name_of(node_id: int) -> str:
    """How the management API names a cluster node: its id, as the listings' ``node``."""
    return str(node_id)


def queue_messages(cluster: Cluster, node_id: int, name: str) -> int | None:
    status, queue = api(cluster, node_id, "GET", f"queues/%2F/{name}")
    return int(queue["messages"]) if status == 200 and "messages" in queue else None


def test_overview_and_nodes_name_the_cluster_and_every_node(cluster: Cluster) -> None:
    for node_id in (1, 2, 3):
        status, overview = api(cluster, node_id, "GET", "overview")
        assert status == 200, overview
        assert overview["node"] == node_name_of(node_id), overview["node"]
        status, nodes = api(cluster, node_id, "GET", "nodes")
        assert status == 200, nodes
        assert [(n["name"], n["running"]) for n in nodes] == [
            (node_name_of(n), True) for n in (1, 2, 3)
        ]
        status, node = api(cluster, node_id, "GET", f"nodes/{node_name_of(3)}")
        assert (status, node["name"], node["running"]) == (200, "3", True), node
    names = {api(cluster, n, "GET", "overview")[1]["cluster_name"] for n in (1, 2, 3)}
    assert len(names) == 1
    assert api(cluster, 1, "GET", "nodes/9")[0] == 404


def test_a_queue_of_node_2_is_managed_through_nodes_1_and_3(cluster: Cluster) -> None:
    name = cluster.name_owned_by(2, "mq.", QUEUE_TOPIC)
    status, body = api(cluster, 1, "PUT", f"queues/%2F/{name}", {"durable": True})
    assert status in (201, 204), body
    for number in range(5):
        status, body = api(
            cluster,
            3,
            "POST",
            "exchanges/%2F/amq.default/publish",
            {
                "properties": {},
                "routing_key": name,
                "payload": f"m{number}",
                "payload_encoding": "string",
            },
        )
        assert (status, body) == (200, {"routed": True})
    eventually(lambda: queue_messages(cluster, 1, name) == 5, "5 messages listed on node 1")
    for node_id in (1, 2, 3):
        status, queue = api(cluster, node_id, "GET", f"queues/%2F/{name}")
        assert status == 200, queue
        assert (queue["node"], queue["messages"]) == ("2", 5)
    status, got = api(
        cluster,
        3,
        "POST",
        f"queues/%2F/{name}/get",
        {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"},
    )
    assert status == 200, got
    assert [message["payload"] for message in got] == ["m0", "m1"]
    status, got = api(
        cluster,
        1,
        "POST",
        f"queues/%2F/{name}/get",
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
    )
    assert status == 200, got
    # The first of the two requeued, in publish order, though the owner sweeps queues other
    # nodes declared for expired heads (QueueHandle.expire_head; 1970520 keeps the order).
    assert [(m["payload"], m["redelivered"]) for m in got] == [("m0", True)]
    eventually(lambda: queue_messages(cluster, 2, name) == 4, "4 left on the owner")
    status, body = api(cluster, 3, "DELETE", f"queues/%2F/{name}/contents")
    assert status == 204, body
    eventually(lambda: queue_messages(cluster, 2, name) == 0, "purged on the owner")
    status, body = api(cluster, 1, "DELETE", f"queues/%2F/{name}")
    assert status == 204, body
    for node_id in (1, 2, 3):
        eventually(
            lambda node_id=node_id: api(cluster, node_id, "GET", f"queues/%2F/{name}")[0] == 404,
            f"the queue gone on node {node_id}",
        )


def test_exchanges_bindings_and_definitions_are_the_clusters(cluster: Cluster) -> None:
    queue = cluster.name_owned_by(2, "mb.", QUEUE_TOPIC)
    assert api(cluster, 1, "PUT", "exchanges/%2F/mb.fan", {"type": "fanout"})[0] in (201, 204)
    assert api(cluster, 3, "PUT", f"queues/%2F/{queue}", {"durable": True})[0] in (201, 204)
    status, body = api(cluster, 3, "POST", f"bindings/%2F/e/mb.fan/q/{queue}", {})
    assert status == 201, body
    for node_id in (1, 2, 3):
        assert api(cluster, node_id, "GET", "exchanges/%2F/mb.fan")[1]["type"] == "fanout"

        def bound(node_id: int = node_id) -> bool:
            status, bindings = api(cluster, node_id, "GET", "bindings/%2F")
            assert status == 200, bindings
            return ("mb.fan", queue) in {(b["source"], b["destination"]) for b in bindings}

        eventually(bound, f"the binding listed on node {node_id}")
        status, definitions = api(cluster, node_id, "GET", "definitions")
        assert status == 200, definitions
        assert "mb.fan" in {e["name"] for e in definitions["exchanges"]}
        cluster_name = api(cluster, node_id, "GET", "overview")[1]["cluster_name"]
        assert definitions["global_parameters"] == [{"name": "cluster_name", "value": cluster_name}]
        assert queue in {q["name"] for q in definitions["queues"]}
        assert ("mb.fan", queue) in {
            (b["source"], b["destination"]) for b in definitions["bindings"]
        }
    status, body = api(
        cluster,
        1,
        "POST",
        "exchanges/%2F/mb.fan/publish",
        {"properties": {}, "routing_key": "", "payload": "x", "payload_encoding": "string"},
    )
    assert (status, body) == (200, {"routed": True})
    eventually(lambda: queue_messages(cluster, 3, queue) == 1, "the fanout's message listed")

    # Definitions imported through node 2 are every node's.
    imported = cluster.name_owned_by(3, "md.", QUEUE_TOPIC)
    document = {
        "queues": [
            {"name": imported, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        ],
        "exchanges": [
            {
                "name": "md.direct",
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "bindings": [
            {
                "source": "md.direct",
                "vhost": "/",
                "destination": imported,
                "destination_type": "queue",
                "routing_key": "k",
                "arguments": {},
            }
        ],
    }
    status, body = api(cluster, 2, "POST", "definitions", document)
    assert status in (200, 201, 204), body
    for node_id in (1, 3):
        eventually(
            lambda node_id=node_id: (
                api(cluster, node_id, "GET", f"queues/%2F/{imported}")[0] == 200
            ),
            f"the imported queue on node {node_id}",
        )
        eventually(
            lambda node_id=node_id: (
                api(cluster, node_id, "GET", "exchanges/%2F/md.direct")[0] == 200
            ),
            f"the imported exchange on node {node_id}",
        )
    status, body = api(
        cluster,
        1,
        "POST",
        "exchanges/%2F/md.direct/publish",
        {"properties": {}, "routing_key": "k", "payload": "y", "payload_encoding": "string"},
    )
    assert (status, body) == (200, {"routed": True})


def test_channels_and_consumers_of_every_node_are_listed(cluster: Cluster) -> None:
    on_2 = cluster.name_owned_by(2, "mc.", QUEUE_TOPIC)
    on_1 = cluster.name_owned_by(1, "mc.", QUEUE_TOPIC)
    for name in (on_2, on_1):
        assert api(cluster, 1, "PUT", f"queues/%2F/{name}", {"durable": True})[0] in (201, 204)
    connections = [amqp(cluster[2]), amqp(cluster[3])]
    try:
        for connection, name, tag in zip(
            connections, (on_2, on_1), ("tag-2", "tag-3"), strict=True
        ):
            channel = connection.channel()
            channel.basic_qos(prefetch_count=7)
            channel.basic_consume(name, lambda *_: None, consumer_tag=tag)
        for node_id in (1, 2, 3):

            def consumers(node_id: int = node_id) -> list[tuple[str, str, int, str]] | None:
                status, listed = api(cluster, node_id, "GET", "consumers")
                assert status == 200, listed
                found = sorted(
                    (
                        c["queue"]["name"],
                        c["consumer_tag"],
                        c["prefetch_count"],
                        c["channel_details"].get("node", ""),
                    )
                    for c in listed
                    if c["consumer_tag"] in ("tag-2", "tag-3")
                )
                # Each once, its channel's details from the node the channel is on.
                expected = sorted([(on_2, "tag-2", 7, "2"), (on_1, "tag-3", 7, "3")])
                return found if found == expected else None

            eventually(consumers, f"both consumers listed on node {node_id}")
            status, channels = api(cluster, node_id, "GET", "channels")
            assert status == 200, channels
            assert sorted(c["node"] for c in channels if c["consumer_count"]) == ["2", "3"]

        status, channels = api(cluster, 1, "GET", "vhosts/%2F/channels")
        assert status == 200, channels
        assert sorted(c["node"] for c in channels if c["consumer_count"]) == ["2", "3"]
        status, listed = api(cluster, 1, "GET", "vhosts/%2F/connections")
        assert status == 200, listed
        assert {"2", "3"} <= {c["node"] for c in listed}

        # A connection to node 3, through node 1: shown, its channels listed, closed.
        status, listed = api(cluster, 1, "GET", "connections")
        assert status == 200, listed
        on_3 = [c["name"] for c in listed if c["node"] == "3"]
        assert len(on_3) == 1, listed
        path = "connections/" + urllib.parse.quote(on_3[0], safe="")
        status, connection = api(cluster, 1, "GET", path)
        assert (status, connection["node"], connection["user"]) == (200, "3", "guest")
        status, channels = api(cluster, 1, "GET", f"{path}/channels")
        assert (status, [c["consumer_count"] for c in channels]) == (200, [1]), channels
        status, _ = api(cluster, 1, "DELETE", path)
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connections[1].process_data_events(time_limit=DEADLINE_S)
        assert closed.value.reply_code == 320
        assert "Closed via management plugin" in closed.value.reply_text
        assert api(cluster, 2, "GET", path)[0] == 404
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()


def test_rabbitmqadmin_through_a_node_that_does_not_own_the_queue(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The real ``rabbitmqadmin`` pointed at node 3 manages node 2's queue (and the
    aliveness test of node 3 passes, its queue wherever the placement puts it)."""
    assert RABBITMQADMIN is not None, "rabbitmqadmin (Debian's rabbitmq-server) is needed"
    name = cluster.name_owned_by(2, "ma.", QUEUE_TOPIC)

    def admin(*args: str) -> str:
        done = subprocess.run(
            [RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(cluster[3].http_port), *LOGIN, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def listed() -> dict[str, Any]:
        queues = json.loads(admin("-f", "raw_json", "list", "queues"))
        found: dict[str, Any] = next(q for q in queues if q["name"] == name)
        return found

    assert "queue declared" in admin("declare", "queue", f"name={name}", "durable=true")
    for number in range(2):
        published = admin(
            "publish", "exchange=amq.default", f"routing_key={name}", f"payload=a{number}"
        )
        assert "Message published" in published
    eventually(lambda: listed()["messages"] == 2, "2 messages listed")
    assert listed()["node"] == "2"
    assert "a0" in admin("get", f"queue={name}", "ackmode=ack_requeue_true")
    assert listed()["messages"] == 2
    assert "queue purged" in admin("purge", "queue", f"name={name}")
    assert listed()["messages"] == 0
    nodes = json.loads(admin("-f", "raw_json", "list", "nodes"))
    assert [(node["name"], node["running"]) for node in nodes] == [
        ("1", True),
        ("2", True),
        ("3", True),
    ]
    target = tmp_path / "defs.json"
    assert "Exported definitions" in admin("export", str(target))
    assert name in [q["name"] for q in json.loads(target.read_text())["queues"]]
    assert "queue deleted" in admin("delete", "queue", f"name={name}")
    assert api(cluster, 2, "GET", f"queues/%2F/{name}")[0] == 404
    assert api(cluster, 3, "GET", "aliveness-test/%2F") == (200, {"status": "ok"})


def test_a_stopped_node_is_listed_not_running_and_its_queues_answer_503(cluster: Cluster) -> None:
    """Last in the module: node 3 stops (SIGTERM, its shards wait for it: no takeover)."""
    name = cluster.name_owned_by(3, "ms.", QUEUE_TOPIC)
    assert api(cluster, 1, "PUT", f"queues/%2F/{name}", {"durable": True})[0] in (201, 204)
    assert cluster[3].stop() == 0

    def node_3_down() -> bool:
        status, nodes = api(cluster, 1, "GET", "nodes")
        return status == 200 and [(n["name"], n["running"]) for n in nodes] == [
            ("1", True),
            ("2", True),
            ("3", False),
        ]

    eventually(node_3_down, "node 3 listed not running")
    status, queue = api(cluster, 2, "GET", f"queues/%2F/{name}")
    assert (status, queue["state"], "messages" in queue) == (200, "down", False)
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    for path, method, body in (
        (f"queues/%2F/{name}/get", "POST", get),
        (f"queues/%2F/{name}/contents", "DELETE", None),
    ):
        status, answer = api(cluster, 1, method, path, body)
        assert (status, answer["error"]) == (503, "service_unavailable"), (path, answer)
