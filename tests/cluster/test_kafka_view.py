"""Kafka on a cluster (docs/cluster.md section 8): a real Kafka gateway in the test's event loop
answering from ``core/cluster/kafka_view.py:MembershipView`` over a real ownership table in a
real redis-server.

The table: this broker is node 1; node 2 is registered at a port where nothing listens; node
3 claimed a shard and died (its lease is gone); a fourth shard was never claimed. Topic
``orders`` has 4 partitions, one per shard (``(h(t) + q) % 4``): partition 0 is node 1's
(claimed twice: epoch 2), partition 1 node 2's (epoch 1), partitions 2 and 3 have no live
owner. Requests go through raw frames (kio entities over a socket) so that every error code is
seen, and Metadata through librdkafka too.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from core.api import INTERNAL_CONTEXT, BrokerAPI, BrokerNode, PartitionLeader
from core.cluster.kafka_view import FULL_READ_EVERY, MembershipView, parse_address
from core.cluster.membership import NodeAddresses
from core.cluster.placement import group_shard, partition_shard, transaction_shard
from core.cluster.redis_metadata import RedisMetadata, connect
from gateway.kafka.apis import SUPPORTED_APIS, ApiKey
from gateway.kafka.codec import Request, encode_response
from gateway.kafka.entities import build, build_response
from gateway.kafka.records import build_batch
from gateway.kafka.server import KafkaServer
from gateway.kafka.wire import NodeEndpoint, ProducePartition, encode_produce_response
from tests.cluster.redis_server import free_port, redis_processes
from tests.kafka.conftest import open_broker
from tests.kafka.raw import AsyncRawClient

SHARDS = 4
TOPIC = "orders"
LEASE_MS = 60_000  # outlives every test: a lease runs out only when released
HOST = "127.0.0.1"
_clusters = itertools.count()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_processes(tmp_path_factory.mktemp("redis")) as processes:
        yield processes.redis().url


def key_on_shard(prefix: str, shard: int, rule: Any) -> str:
    """A name whose placement rule puts it on ``shard``."""
    return next(
        name for name in (f"{prefix}-{i}" for i in itertools.count()) if rule(name, SHARDS) == shard
    )


@dataclass
class Cluster:
    metadata: RedisMetadata
    api: BrokerAPI
    view: MembershipView
    client: AsyncRawClient
    port: int  # node 1's Kafka port (this broker)
    dead_port: int  # node 2's: nothing listens there
    shards: list[int]  # partition q of TOPIC is on shards[q]
    incarnations: dict[str, int]

    async def claim(self, shard: int, node: str) -> int:
        owners = await self.metadata.shard_owners()
        epoch = owners[shard].epoch if shard in owners else 0
        return await self.metadata.claim_shard(shard, node, self.incarnations[node], epoch)

    async def request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        return await self.client.request(build(load_request_schema(api_key, version), values))

    def group_on(self, partition: int) -> str:
        """A group whose shard is partition ``partition``'s."""
        return key_on_shard("group", self.shards[partition], group_shard)


@pytest.fixture
async def cluster(redis_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    metadata = await connect(redis_url, f"kafka-view-{next(_clusters)}", shards=SHARDS)
    node = open_broker(tmp_path / "data")
    await node.shard.store.start()
    await node.start()
    api = BrokerAPI(node)
    server = KafkaServer(api)
    await server.start(HOST, 0)
    assert server.address is not None
    port = server.address[1]
    dead_port = free_port()
    incarnations: dict[str, int] = {}
    for node_id, kafka_port in (("1", port), ("2", dead_port), ("3", free_port())):
        fields = NodeAddresses(host=HOST, kafka=f"{HOST}:{kafka_port}").fields()
        incarnations[node_id] = await metadata.register_node(node_id, fields)
        await metadata.acquire_lease(node_id, incarnations[node_id], LEASE_MS, wait_ms=0)
    shards = [partition_shard(TOPIC, q, SHARDS) for q in range(4)]
    assert sorted(shards) == list(range(SHARDS))  # one partition per shard
    view = MembershipView(metadata, 1, refresh_ms=60_000)  # refreshed by the tests
    client = await AsyncRawClient.connect(HOST, port)
    made = Cluster(metadata, api, view, client, port, dead_port, shards, incarnations)
    try:
        assert await made.claim(shards[0], "1") == 1
        assert await made.claim(shards[0], "1") == 2
        assert await made.claim(shards[1], "2") == 1
        assert await made.claim(shards[2], "3") == 1
        assert await metadata.release_lease("3", incarnations["3"])  # node 3 died
        await view.start()
        api.set_cluster_view(view)
        await api.create_topic(INTERNAL_CONTEXT, TOPIC, 4)
        yield made
    finally:
        await client.close()
        await view.stop()
        await server.close()
        await node.close()
        await node.shard.store.aclose()
        await metadata.aclose()


def batch(value: bytes) -> bytes:
    return build_batch([(1_700_000_000_000, None, value, [])])


# -- Metadata ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version", range(SUPPORTED_APIS[ApiKey.METADATA][0], SUPPORTED_APIS[ApiKey.METADATA][1] + 1)
)
async def test_metadata_lists_the_live_brokers_and_the_leaders_of_the_table(
    cluster: Cluster, version: int
) -> None:
    response = await cluster.request(ApiKey.METADATA, version, {"topics": [{"name": TOPIC}]})
    brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
    # Node 3's lease is gone: not a broker any more.
    assert brokers == {1: (HOST, cluster.port), 2: (HOST, cluster.dead_port)}
    if version >= 1:
        assert response.controller_id == 1
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.none
    partitions = {p.partition_index: p for p in topic.partitions}
    assert sorted(partitions) == [0, 1, 2, 3]
    for index, leader, epoch in ((0, 1, 2), (1, 2, 1)):
        answer = partitions[index]
        assert answer.error_code == ErrorCode.none
        assert answer.leader_id == leader
        assert tuple(answer.replica_nodes) == tuple(answer.isr_nodes) == (leader,)
        if version >= 7:
            assert answer.leader_epoch == epoch
    for index in (2, 3):  # a dead owner, no owner at all
        answer = partitions[index]
        assert answer.error_code == ErrorCode.leader_not_available
        assert answer.leader_id == -1


async def test_librdkafka_sees_both_brokers_and_the_leaders(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{cluster.port}", "log_level": 0})
    found = await asyncio.to_thread(admin.list_topics, TOPIC, 10)
    assert sorted(found.brokers) == [1, 2]
    assert (found.brokers[2].host, found.brokers[2].port) == (HOST, cluster.dead_port)
    partitions = found.topics[TOPIC].partitions
    assert [partitions[q].leader for q in range(4)] == [1, 2, -1, -1]


# -- partition requests on a node that does not lead -------------------------------------------


async def test_produce_to_a_partition_led_elsewhere_is_not_leader_or_follower(
    cluster: Cluster,
) -> None:
    produce = {
        "acks": -1,
        "timeout": 5000,
        "topic_data": [
            {
                "name": TOPIC,
                "partition_data": [{"index": q, "records": batch(b"to %d" % q)} for q in (0, 1, 2)],
            }
        ],
    }
    response = await cluster.request(ApiKey.PRODUCE, 10, produce)
    mine, elsewhere, nobody = response.responses[0].partition_responses
    assert (mine.error_code, mine.base_offset) == (ErrorCode.none, 0)
    assert elsewhere.error_code == ErrorCode.not_leader_or_follower
    # KIP-951: the leader and its address come with the error.
    assert (elsewhere.current_leader.leader_id, elsewhere.current_leader.leader_epoch) == (2, 1)
    endpoints = [(e.node_id, e.host, e.port) for e in response.node_endpoints]
    assert endpoints == [(2, HOST, cluster.dead_port)]
    assert nobody.error_code == ErrorCode.not_leader_or_follower
    assert nobody.current_leader.leader_id == -1
    # v9 has no KIP-951 fields: the same errors.
    older = await cluster.request(ApiKey.PRODUCE, 9, produce)
    codes = [p.error_code for p in older.responses[0].partition_responses]
    assert codes == [
        ErrorCode.none,
        ErrorCode.not_leader_or_follower,
        ErrorCode.not_leader_or_follower,
    ]
    # Nothing was stored in the partitions this node does not lead.
    assert cluster.api.partition_offsets(INTERNAL_CONTEXT, TOPIC, 1) == (0, 0)
    assert cluster.api.partition_offsets(INTERNAL_CONTEXT, TOPIC, 0) == (0, 2)


async def test_fetch_list_offsets_and_delete_records_check_leader_and_epoch(
    cluster: Cluster,
) -> None:
    def fetch(partition: int, epoch: int) -> dict[str, Any]:
        return {
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": epoch,
                            "fetch_offset": 0,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
        }

    async def fetch_error(partition: int, epoch: int) -> ErrorCode:
        response = await cluster.request(ApiKey.FETCH, 12, fetch(partition, epoch))
        return ErrorCode(response.responses[0].partitions[0].error_code)

    assert await fetch_error(1, -1) == ErrorCode.not_leader_or_follower
    assert await fetch_error(2, -1) == ErrorCode.not_leader_or_follower
    assert await fetch_error(0, 1) == ErrorCode.fenced_leader_epoch
    assert await fetch_error(0, 3) == ErrorCode.unknown_leader_epoch
    assert await fetch_error(0, 2) == ErrorCode.none
    assert await fetch_error(0, -1) == ErrorCode.none

    async def list_offsets(partition: int, epoch: int) -> Any:
        response = await cluster.request(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [
                            {
                                "partition_index": partition,
                                "current_leader_epoch": epoch,
                                "timestamp": -1,
                            }
                        ],
                    }
                ],
            },
        )
        return response.topics[0].partitions[0]

    assert (await list_offsets(1, -1)).error_code == ErrorCode.not_leader_or_follower
    assert (await list_offsets(0, 1)).error_code == ErrorCode.fenced_leader_epoch
    latest = await list_offsets(0, 2)
    assert (latest.error_code, latest.offset, latest.leader_epoch) == (ErrorCode.none, 0, 2)

    async def end_of_epoch(partition: int, epoch: int) -> Any:
        response = await cluster.request(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            4,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {
                                "partition": partition,
                                "current_leader_epoch": epoch,
                                "leader_epoch": 0,
                            }
                        ],
                    }
                ],
            },
        )
        return response.topics[0].partitions[0]

    assert (await end_of_epoch(1, -1)).error_code == ErrorCode.not_leader_or_follower
    assert (await end_of_epoch(0, 5)).error_code == ErrorCode.unknown_leader_epoch
    ours = await end_of_epoch(0, 2)
    assert (ours.error_code, ours.leader_epoch, ours.end_offset) == (ErrorCode.none, 2, 0)

    deleted = await cluster.request(
        ApiKey.DELETE_RECORDS,
        2,
        {
            "timeout": 5000,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [{"partition_index": q, "offset": -1} for q in (0, 1, 3)],
                }
            ],
        },
    )
    codes = [p.error_code for p in deleted.topics[0].partitions]
    assert codes == [
        ErrorCode.none,
        ErrorCode.not_leader_or_follower,
        ErrorCode.not_leader_or_follower,
    ]


# -- coordinators ------------------------------------------------------------------------------


async def test_find_coordinator_names_the_owner_of_the_key_shard(cluster: Cluster) -> None:
    elsewhere, mine, orphan = cluster.group_on(1), cluster.group_on(0), cluster.group_on(3)
    for version in (0, 3):
        found = await cluster.request(ApiKey.FIND_COORDINATOR, version, {"key": elsewhere})
        assert (found.error_code, found.node_id) == (ErrorCode.none, 2)
        assert (found.host, found.port) == (HOST, cluster.dead_port)
    found = await cluster.request(ApiKey.FIND_COORDINATOR, 3, {"key": mine})
    assert (found.node_id, found.host, found.port) == (1, HOST, cluster.port)
    found = await cluster.request(ApiKey.FIND_COORDINATOR, 3, {"key": orphan})
    assert (found.error_code, found.node_id) == (ErrorCode.coordinator_not_available, -1)
    txn_id = key_on_shard("txn", cluster.shards[1], transaction_shard)
    found = await cluster.request(ApiKey.FIND_COORDINATOR, 3, {"key": txn_id, "key_type": 1})
    assert (found.error_code, found.node_id) == (ErrorCode.none, 2)
    # v4 (KIP-699): one answer per key, in the order asked.
    batched = await cluster.request(
        ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [elsewhere, mine, orphan]}
    )
    answers = [(c.key, c.error_code, c.node_id, c.port) for c in batched.coordinators]
    assert answers == [
        (elsewhere, ErrorCode.none, 2, cluster.dead_port),
        (mine, ErrorCode.none, 1, cluster.port),
        (orphan, ErrorCode.coordinator_not_available, -1, -1),
    ]


async def test_group_and_transaction_requests_elsewhere_get_not_coordinator(
    cluster: Cluster,
) -> None:
    join = {
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    refused = await cluster.request(ApiKey.JOIN_GROUP, 7, {**join, "group_id": cluster.group_on(1)})
    assert refused.error_code == ErrorCode.not_coordinator
    # The group this node coordinates is served (v4+: the first join asks for a member id).
    served = await cluster.request(ApiKey.JOIN_GROUP, 7, {**join, "group_id": cluster.group_on(0)})
    assert served.error_code == ErrorCode.member_id_required
    beat = await cluster.request(
        ApiKey.HEARTBEAT,
        4,
        {"group_id": cluster.group_on(3), "generation_id": 1, "member_id": "m"},
    )
    assert beat.error_code == ErrorCode.not_coordinator  # no live coordinator at all
    commit = await cluster.request(
        ApiKey.OFFSET_COMMIT,
        8,
        {
            "group_id": cluster.group_on(1),
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": [
                {"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 1}]}
            ],
        },
    )
    assert commit.topics[0].partitions[0].error_code == ErrorCode.not_coordinator
    txn_id = key_on_shard("txn", cluster.shards[1], transaction_shard)
    init = await cluster.request(
        ApiKey.INIT_PRODUCER_ID,
        4,
        {"transactional_id": txn_id, "transaction_timeout": 10_000, "producer_id": -1},
    )
    assert init.error_code == ErrorCode.not_coordinator


# -- the view follows the table ----------------------------------------------------------------


async def test_a_refresh_follows_a_node_leaving_and_a_shard_claimed(cluster: Cluster) -> None:
    metadata_request = {"topics": [{"name": TOPIC}]}
    assert await cluster.metadata.release_lease("2", cluster.incarnations["2"])  # node 2 left
    before = cluster.view.refreshes
    await cluster.view.refresh()
    assert cluster.view.refreshes == before + 1
    response = await cluster.request(ApiKey.METADATA, 9, metadata_request)
    assert [b.node_id for b in response.brokers] == [1]
    partition = response.topics[0].partitions[1]
    assert (partition.error_code, partition.leader_id) == (ErrorCode.leader_not_available, -1)
    found = await cluster.request(ApiKey.FIND_COORDINATOR, 3, {"key": cluster.group_on(1)})
    assert found.error_code == ErrorCode.coordinator_not_available

    # Node 1 takes the shard over: it leads partition 1 at the next epoch and serves it.
    assert await cluster.claim(cluster.shards[1], "1") == 2
    await cluster.view.refresh()
    response = await cluster.request(ApiKey.METADATA, 9, metadata_request)
    partition = response.topics[0].partitions[1]
    assert (partition.error_code, partition.leader_id, partition.leader_epoch) == (0, 1, 2)
    produced = await cluster.request(
        ApiKey.PRODUCE,
        10,
        {
            "acks": 1,
            "timeout": 5000,
            "topic_data": [
                {"name": TOPIC, "partition_data": [{"index": 1, "records": batch(b"now")}]}
            ],
        },
    )
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none


async def test_a_restarted_owner_leads_again_only_once_it_has_claimed_back(
    cluster: Cluster,
) -> None:
    metadata, view = cluster.metadata, cluster.view
    assert await metadata.release_lease("2", cluster.incarnations["2"])
    fields = NodeAddresses(host=HOST, kafka=f"{HOST}:{cluster.dead_port}").fields()
    cluster.incarnations["2"] = await metadata.register_node("2", fields)
    await metadata.acquire_lease("2", cluster.incarnations["2"], LEASE_MS, wait_ms=0)
    await view.refresh()
    # Live again, but the shard's record names its previous incarnation: it leads nothing,
    # and a node serving no shard has no listeners, so it is no broker yet.
    assert [broker.node_id for broker in view.brokers()] == [1]
    assert view.partition_leader(TOPIC, 1) is None
    assert view.coordinator("group", cluster.group_on(1)) is None
    assert await cluster.claim(cluster.shards[1], "2") == 2
    await view.refresh()
    assert view.partition_leader(TOPIC, 1) == PartitionLeader(2, 2)
    assert view.coordinator("group", cluster.group_on(1)) == 2
    assert [broker.node_id for broker in view.brokers()] == [1, 2]


async def test_the_heartbeat_refresh_reads_the_owner_table_only_when_it_may_have_changed(
    cluster: Cluster,
) -> None:
    metadata, view = cluster.metadata, cluster.view
    assert await cluster.claim(cluster.shards[2], "1") == 2  # node 3's shard, taken over
    assert await cluster.claim(cluster.shards[3], "1") == 1  # every shard has a live owner
    await view.refresh()
    read = view.owner_readings
    for _ in range(3):  # nobody came or went, every shard led: the table is not read
        await view.refresh_if_changed()
    assert view.owner_readings == read
    assert view.partition_leader(TOPIC, 3) == PartitionLeader(1, 1)

    assert await metadata.release_lease("2", cluster.incarnations["2"])  # node 2 left
    await view.refresh_if_changed()
    assert view.partition_leader(TOPIC, 1) is None
    assert view.owner_readings == read + 1
    fields = NodeAddresses(host=HOST, kafka=f"{HOST}:{cluster.dead_port}").fields()
    cluster.incarnations["2"] = await metadata.register_node("2", fields)
    await metadata.acquire_lease("2", cluster.incarnations["2"], LEASE_MS, wait_ms=0)
    await view.refresh_if_changed()  # a new incarnation: read; shard 1 still has no live owner
    await view.refresh_if_changed()  # so read again, until a claim gives it one
    assert view.owner_readings == read + 3
    assert await cluster.claim(cluster.shards[1], "2") == 2
    await view.refresh_if_changed()
    assert view.partition_leader(TOPIC, 1) == PartitionLeader(2, 2)
    await view.refresh_if_changed()
    assert view.owner_readings == read + 4

    for _ in range(FULL_READ_EVERY):  # the safety net: read once in FULL_READ_EVERY anyway
        await view.refresh_if_changed()
    assert view.owner_readings == read + 5


# -- pieces ------------------------------------------------------------------------------------


def test_produce_v10_leader_tags_are_kios_bytes() -> None:
    topics = [
        (
            "t",
            [
                ProducePartition(0, 0, 5, 0),
                ProducePartition(1, ErrorCode.not_leader_or_follower.value, -1, -1, None, (7, 3)),
            ],
        )
    ]
    endpoints = [NodeEndpoint(7, "node7.example", 9092)]
    values = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {"index": 0, "error_code": 0, "base_offset": 5, "log_start_offset": 0},
                    {
                        "index": 1,
                        "error_code": ErrorCode.not_leader_or_follower.value,
                        "base_offset": -1,
                        "log_start_offset": -1,
                        "current_leader": {"leader_id": 7, "leader_epoch": 3},
                    },
                ],
            }
        ],
        "throttle_time": 0,
        "node_endpoints": [{"node_id": 7, "host": "node7.example", "port": 9092}],
    }
    request = Request(ApiKey.PRODUCE, 10, 9, None, None, 0)  # type: ignore[arg-type]
    expected = encode_response(request, build_response(ApiKey.PRODUCE, 10, values))
    assert encode_produce_response(10, 9, topics, 0, endpoints) == expected
    # Before v10 the same partitions carry no tags.
    assert encode_produce_response(9, 9, topics, 0, endpoints) == encode_produce_response(
        9, 9, [("t", [p._replace(current_leader=None) for p in topics[0][1]])], 0
    )


async def test_a_broker_alone_leads_everything_at_epoch_0(tmp_path: Path) -> None:
    node = open_broker(tmp_path / "data")
    await node.shard.store.start()
    await node.start()
    try:
        api = BrokerAPI(node)
    finally:
        await node.close()
        await node.shard.store.aclose()
    assert api.this_node() == 0
    assert list(api.brokers(INTERNAL_CONTEXT)) == [BrokerNode(0, "", 0)]
    assert api.partition_leader(INTERNAL_CONTEXT, "t", 7) == PartitionLeader(0, 0)
    assert api.coordinator(INTERNAL_CONTEXT, "group", "g") == 0
    assert api.leader_table(INTERNAL_CONTEXT) is None  # nothing to check per partition
    with pytest.raises(ValueError, match="coordinator kind"):
        api.coordinator(INTERNAL_CONTEXT, "queue", "q")


def test_registered_addresses_parse() -> None:
    assert parse_address("10.0.0.5:9092") == ("10.0.0.5", 9092)
    assert parse_address("[::1]:19092") == ("::1", 19092)
    assert parse_address("") is None
    assert parse_address("host:") is None
