"""core/cluster/mqtt_routes.py against a real redis-server: three route tables as three nodes
of one cluster, local reference counting, wildcard filters, a node restarted, and changes
published while the tables were disconnected (only a reload can bring those)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from core.cluster.mqtt_routes import RouteTable
from tests.cluster.redis_server import RedisProcesses, RedisServer, redis_processes

DEADLINE_S = 10.0  # waits only
CLUSTER = "routes1"
PREFIX = f"braid:{CLUSTER}:"
NODE_BACKOFF = ExponentialWithJitterBackoff(base=0.01, cap=1.0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    processes: RedisProcesses
    with redis_processes(tmp_path) as processes:
        yield processes.redis()


@pytest.fixture
async def tables(server: RedisServer) -> AsyncIterator[Callable[[int], Any]]:
    """``await tables(node)``: a started RouteTable of ``node`` on its own client."""
    opened: list[tuple[RouteTable, Redis]] = []

    async def open_table(node: int) -> RouteTable:
        # The retry policy a node's clients have (core/cluster/redis_metadata.py): with it,
        # redis-py reconnects a pub/sub silently, the case the reload after a reconnect is for.
        client = Redis.from_url(server.url, retry=Retry(NODE_BACKOFF, retries=10))
        table = RouteTable(client, CLUSTER, node)
        opened.append((table, client))
        await table.start()
        return table

    yield open_table
    for table, client in opened:
        await table.aclose()
        await client.aclose()


async def eventually(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def barrier(writer: RouteTable, readers: list[RouteTable], name: str) -> None:
    """A route added by ``writer`` and seen by every reader: the channel is ordered, so every
    change ``writer`` published before it has reached the readers too."""
    await writer.subscribe(name)
    for reader in readers:
        await eventually(lambda r=reader: writer.node in r.nodes_for(name), f"barrier {name}")


def redis_set(server: RedisServer, node: int) -> set[bytes]:
    with server.client() as client:
        return set(client.smembers(f"{PREFIX}mqtt:routes:{node}"))


async def test_first_and_last_local_subscriber_write_the_route(
    server: RedisServer, tables: Callable[[int], Any]
) -> None:
    one, two, three = await tables(1), await tables(2), await tables(3)
    await one.subscribe("home/kitchen/temp")
    await one.subscribe("home/kitchen/temp")
    assert redis_set(server, 1) == {b"home/kitchen/temp"}
    for table in (two, three):
        await eventually(lambda t=table: t.nodes_for("home/kitchen/temp") == {1}, "node 1's route")
    assert one.nodes_for("home/kitchen/temp") == {1}  # its own, at once
    assert two.nodes_for("home/kitchen/humidity") == set()

    assert await one.unsubscribe("home/kitchen/temp")  # one subscriber left
    await barrier(one, [two, three], "barrier/1")
    assert redis_set(server, 1) == {b"home/kitchen/temp", b"barrier/1"}
    assert two.nodes_for("home/kitchen/temp") == {1}
    assert three.nodes_for("home/kitchen/temp") == {1}

    await three.subscribe("home/kitchen/temp")
    await eventually(lambda: two.nodes_for("home/kitchen/temp") == {1, 3}, "node 3's route")
    assert await one.unsubscribe("home/kitchen/temp")  # the last on node 1
    assert not await one.unsubscribe("home/kitchen/temp")  # none left to remove
    assert redis_set(server, 1) == {b"barrier/1"}
    for table in (two, three):
        await eventually(
            lambda t=table: t.nodes_for("home/kitchen/temp") == {3}, "node 1's route gone"
        )
    assert one.nodes_for("home/kitchen/temp") == {3}
    assert one.local_filters() == {"barrier/1": 1}


async def test_wildcard_filters_and_the_dollar_rule(tables: Callable[[int], Any]) -> None:
    one, two, three = await tables(1), await tables(2), await tables(3)
    await one.subscribe("sensors/+/temp")
    await two.subscribe("sensors/#")
    await three.subscribe("#")
    await three.subscribe("$SYS/#")
    await three.subscribe("a//b")
    for table in (one, two, three):
        await eventually(lambda t=table: len(t.routes()) == 3, "every node's routes")
        assert table.nodes_for("sensors/kitchen/temp") == {1, 2, 3}
        assert table.nodes_for("sensors/kitchen/humidity") == {2, 3}
        assert table.nodes_for("sensors") == {2, 3}  # 'a/#' matches 'a' [MQTT-4.7.1-1]
        assert table.nodes_for("other/topic") == {3}
        # [MQTT-4.7.2-1]: '#' does not see '$SYS/...'; '$SYS/#' does.
        assert table.nodes_for("$SYS/broker/load") == {3}
        assert table.nodes_for("a//b") == {3}
    await three.unsubscribe("$SYS/#")
    await three.unsubscribe("#")
    await eventually(lambda: one.nodes_for("$SYS/broker/load") == set(), "$SYS/# gone")
    await eventually(lambda: one.nodes_for("other/topic") == set(), "# gone")
    assert one.nodes_for("sensors/x/temp") == {1, 2}
    with pytest.raises(ValueError, match="shared"):
        await one.subscribe("$share/g/sensors/#")
    with pytest.raises(ValueError, match="last level"):
        await one.subscribe("sensors/#/temp")


async def test_a_restarted_node_drops_its_old_routes_and_loads_the_others(
    server: RedisServer, tables: Callable[[int], Any]
) -> None:
    one, two, three = await tables(1), await tables(2), await tables(3)
    await one.subscribe("a/+")
    await two.subscribe("b/#")
    await two.subscribe("c")
    await three.subscribe("a/+")
    await eventually(lambda: one.nodes_for("b/x") == {2}, "node 2's route")
    await two.aclose()  # a crash: its routes stay in Redis
    assert redis_set(server, 2) == {b"b/#", b"c"}

    fresh = await tables(4)  # a node started later loads everything, node 2's stale ones too
    assert fresh.routes() == {1: {"a/+"}, 2: {"b/#", "c"}, 3: {"a/+"}}
    assert fresh.nodes_for("a/x") == {1, 3}

    restarted = await tables(2)  # node 2's next process: its clean sessions died with it
    assert redis_set(server, 2) == set()
    assert restarted.routes() == {1: {"a/+"}, 3: {"a/+"}}
    for table in (one, three, fresh):
        await eventually(lambda t=table: t.nodes_for("b/x") == set(), "node 2's old routes gone")
        assert table.nodes_for("c") == set()
    await restarted.subscribe("c")
    await eventually(lambda: one.nodes_for("c") == {2}, "node 2's new route")


async def test_changes_missed_while_disconnected_come_with_the_reload(
    server: RedisServer, tables: Callable[[int], Any]
) -> None:
    one, two = await tables(1), await tables(2)
    await one.subscribe("before")
    await eventually(lambda: two.nodes_for("before") == {1}, "node 1's route")
    reloads = (one.reloads, two.reloads)
    # Node 9's route, written and announced right after every subscriber is cut off, in one
    # transaction: its message reaches nobody, so only a reload can show it.
    with server.client() as client:
        pipe = client.pipeline(transaction=True)
        pipe.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        pipe.sadd(f"{PREFIX}mqtt:routes:9", "missed/+")
        pipe.publish(f"{PREFIX}mqtt:routes", "9 + missed/+")
        killed, added, receivers = pipe.execute()
    assert killed == 2
    assert added == 1
    assert receivers == 0
    for table in (one, two):
        await eventually(lambda t=table: t.nodes_for("missed/x") == {9}, "the missed route")
    assert one.reloads > reloads[0]
    assert two.reloads > reloads[1]
    # And the channel works again after the reconnect.
    await two.subscribe("after")
    await eventually(lambda: one.nodes_for("after") == {2}, "a route after the reconnect")


async def test_a_route_lost_by_redis_is_written_again_on_reconnect(
    server: RedisServer, tables: Callable[[int], Any]
) -> None:
    """What a Sentinel failover that lost a recent SADD looks like to the node: its set no
    longer holds a filter it has subscribers of; the rewrite on reconnect puts it back."""
    one = await tables(1)
    await one.subscribe("kept")
    with server.client() as client:
        pipe = client.pipeline(transaction=True)
        pipe.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        pipe.delete(f"{PREFIX}mqtt:routes:1")
        pipe.execute()
    await eventually(lambda: redis_set(server, 1) == {b"kept"}, "the route rewritten")
