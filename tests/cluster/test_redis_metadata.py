"""core/cluster/redis_metadata.py against real redis-server processes (tests/cluster/
redis_server.py): versions, the cache and watch across instances, conflicts, trimming, restarts
and lost changes, leases, shard claims, producer-id blocks, the Sentinel URL and a failover."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from core.cluster import Change, MetadataConflict, MetadataGap, Versioned
from core.cluster.redis_metadata import (
    REFUSED_EPOCH,
    REFUSED_LEASE,
    REFUSED_OWNED,
    ClaimRefused,
    ClusterMismatch,
    LeaseHeld,
    MetadataCapExceeded,
    MetadataNotReplicated,
    RedisMetadata,
    SentinelTarget,
    connect,
    parse_sentinel_url,
)
from tests.cluster.redis_server import RedisProcesses, RedisServer, redis_processes, until

DEADLINE_S = 10.0  # waits only: every assertion below is about what happened, not how fast
SHARDS = 4
# Long enough that only the doorbell (pub/sub) can bring a change within DEADLINE_S.
NO_HEARTBEAT_MS = 600_000


def topic(name: str, queues: int = 1) -> Change:
    return Change("topic", name, b'{"queues": %d}' % queues)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[RedisProcesses]:
    with redis_processes(tmp_path) as started:
        yield started


@pytest.fixture
def server(processes: RedisProcesses) -> RedisServer:
    return processes.redis()


@pytest.fixture
async def stores(server: RedisServer) -> AsyncIterator[Callable[..., Any]]:
    """``await stores(**options)``: a RedisMetadata on the test's server, closed at the end."""
    opened: list[RedisMetadata] = []

    async def open_store(url: str | None = None, **options: Any) -> RedisMetadata:
        options.setdefault("shards", SHARDS)
        options.setdefault("heartbeat_ms", NO_HEARTBEAT_MS)
        store = await connect(url or server.url, options.pop("cluster_id", "c1"), **options)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.aclose()


async def eventually(check: Callable[[], Any], what: str) -> Any:
    """Poll ``check()`` (sync or async) until it returns something true; fail after
    DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def until_version(store: RedisMetadata, version: int) -> None:
    """Wait (no reads of our own: the store's watcher must bring it) for ``version``."""
    await eventually(lambda: store.version >= version, f"version {version}")


async def until_count(items: list[Any], count: int) -> None:
    await eventually(lambda: len(items) >= count, f"{count} items")


async def collect(store: RedisMetadata, from_version: int, into: list[Versioned]) -> None:
    async for entry in store.watch(from_version):
        into.append(entry)


# -- versions, cache, watch ------------------------------------------------------------------


async def test_versions_are_dense_across_two_instances(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    assert await a.apply([topic("t1")]) == 1
    assert a.get("topic", "t1") == b'{"queues": 1}'  # read-your-writes, no waiting
    assert await b.apply([topic("t2")]) == 2
    assert b.get("topic", "t1") == b'{"queues": 1}'  # B caught up to apply after version 1
    assert await a.apply([topic("t3"), Change("binding", "x", b"{}")]) == 3
    # Deleting an absent key changes nothing: no version.
    assert await b.apply([Change("topic", "absent", None)]) == 3
    assert await b.apply([Change("topic", "t1", None)]) == 4
    await until_version(a, 4)
    for store in (a, b):
        assert store.version == 4
        assert sorted(store.items("topic")) == [("t2", b'{"queues": 1}'), ("t3", b'{"queues": 1}')]
        assert store.get("binding", "x") == b"{}"
        assert store.get("topic", "t1") is None
    c = await stores()  # a new instance loads the same state
    assert c.version == 4
    assert sorted(c.items("topic")) == sorted(a.items("topic"))


async def test_b_sees_a_change_by_the_doorbell_and_in_watch(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    seen: list[Versioned] = []
    watcher = asyncio.create_task(collect(b, b.version, seen))
    try:
        await a.apply([topic("orders", 3)])
        await a.apply([topic("orders", 4), Change("queue", "orders\x000", b"{}")])
        await a.apply([Change("topic", "orders", None)])
        await until_version(b, 3)  # heartbeat is 10 minutes: the pub/sub ring brought these
        assert b.get("topic", "orders") is None
        assert b.get("queue", "orders\x000") == b"{}"
        await until_count(seen, 4)
        assert seen == [
            Versioned(1, topic("orders", 3)),
            Versioned(2, topic("orders", 4)),
            Versioned(2, Change("queue", "orders\x000", b"{}")),
            Versioned(3, Change("topic", "orders", None)),
        ]
    finally:
        watcher.cancel()
    # A new watch from an old version replays from Redis's stream (B's memory has it too).
    replay: list[Versioned] = []
    c = await stores()
    watcher = asyncio.create_task(collect(c, 1, replay))
    try:
        await until_count(replay, 3)
        assert replay == seen[1:]
    finally:
        watcher.cancel()


async def test_expect_conflict_applies_nothing(stores: Callable[..., Any], server: RedisServer):
    a, b = await stores(), await stores()
    await a.apply([topic("t", 1)])
    await until_version(b, 1)
    with pytest.raises(MetadataConflict) as refused:
        await b.apply(
            [topic("t", 9), topic("u")], expect={("topic", "u"): None, ("topic", "t"): b"{}"}
        )
    assert (refused.value.kind, refused.value.key) == ("topic", "t")
    with pytest.raises(MetadataConflict):
        await b.apply([topic("t", 9)], expect={("topic", "t"): None})  # present, not absent
    with server.client() as raw:
        assert raw.get("braid:c1:version") == b"1"
        assert raw.hgetall("braid:c1:def:topic") == {b"t": b'{"queues": 1}'}
        assert raw.xlen("braid:c1:changes") == 1
    assert b.get("topic", "u") is None
    assert await b.apply([topic("t", 2)], expect={("topic", "t"): b'{"queues": 1}'}) == 2
    await until_version(a, 2)
    assert a.get("topic", "t") == b'{"queues": 2}'


async def test_caps_and_placements(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    caps = {"topic": 2}
    await a.apply([topic("t1"), Change("place:topic", "t1", b"3")], caps=caps)
    await a.apply([topic("t2")], caps=caps)
    with pytest.raises(MetadataCapExceeded):
        await b.apply([topic("t3")], caps=caps)
    assert await b.apply([topic("t2", 5)], caps=caps) == 3  # replacing takes no slot
    assert await b.apply([Change("topic", "t1", None), topic("t3")], caps=caps) == 4
    await until_version(a, 4)
    assert sorted(key for key, _ in a.items("topic")) == ["t2", "t3"]
    assert a.get("place:topic", "t1") == b"3"
    with pytest.raises(ValueError, match="no shard"):
        await a.apply([Change("place:topic", "t9", str(SHARDS).encode())])
    with pytest.raises(ValueError, match="bad metadata kind"):
        await a.apply([Change("Topic!", "x", b"")])


# -- catching up: reconnects, trimming, restarts, lost changes --------------------------------


def add_user(server: RedisServer, user: str, *, enabled: bool = True) -> None:
    with server.client() as raw:
        raw.acl_setuser(
            user,
            enabled=enabled,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
            reset=True,
        )


def cut_off(server: RedisServer, user: str) -> None:
    """The user cannot log in, and its open connections are dropped."""
    add_user(server, user, enabled=False)
    with server.client() as raw:
        raw.execute_command("CLIENT", "KILL", "USER", user)


async def test_reconnect_catches_up_and_a_trimmed_stream_reloads(
    stores: Callable[..., Any], server: RedisServer
) -> None:
    add_user(server, "bob")
    bob_url = server.url + "?username=bob&password=pw"
    a = await stores(stream_maxlen=10)
    b = await stores(bob_url, stream_maxlen=10)
    await a.apply([topic("t0")])
    await until_version(b, 1)
    seen: list[Versioned] = []
    watcher = asyncio.create_task(collect(b, 1, seen))
    try:
        cut_off(server, "bob")  # B's watcher keeps trying to reconnect
        for i in range(1, 4):
            await a.apply([topic(f"t{i}")])
        add_user(server, "bob")
        await until_version(b, 4)  # caught up by its reconnect: no ring was heard
        await until_count(seen, 3)
        assert [entry.change.key for entry in seen] == ["t1", "t2", "t3"]
        assert not watcher.done()

        cut_off(server, "bob")
        for i in range(4, 304):  # MAXLEN ~ 10 trims whole stream nodes of 100 entries
            await a.apply([Change("topic", f"t{i - 4}", None), topic(f"t{i}")])
        with server.client() as raw:
            first = raw.xrange("braid:c1:changes", count=1)[0][0]
            assert int(first.split(b"-")[0]) > 5  # trimmed past B's version
        add_user(server, "bob")
        await until_version(b, a.version)
        assert sorted(b.items("topic")) == sorted(a.items("topic"))
        assert len(list(b.items("topic"))) == 4
        with pytest.raises(MetadataGap):
            await asyncio.wait_for(watcher, DEADLINE_S)  # its next changes are gone
    finally:
        watcher.cancel()
    c = await stores()
    with pytest.raises(MetadataGap):
        await anext(aiter(c.watch(1)))


async def test_catching_up_reads_page_by_page_and_keeps_versions_whole(
    stores: Callable[..., Any], server: RedisServer
) -> None:
    """Versions larger than a page (1000 stream entries) and a page ending inside one."""
    add_user(server, "bob")
    a = await stores()
    b = await stores(server.url + "?username=bob&password=pw")
    await a.apply([topic("t")])
    await until_version(b, 1)
    cut_off(server, "bob")
    sizes = {2: 1500, 3: 700, 4: 700}
    for version, size in sizes.items():
        changes = [Change("queue", f"q{version}.{i}", b"%d" % i) for i in range(size)]
        assert await a.apply(changes) == version
    add_user(server, "bob")
    await until_version(b, 4)
    assert len(list(b.items("queue"))) == sum(sizes.values())
    seen: list[Versioned] = []
    c = await stores()  # nothing in memory: watch reads the stream from Redis
    watcher = asyncio.create_task(collect(c, 1, seen))
    try:
        await until_count(seen, sum(sizes.values()))
    finally:
        watcher.cancel()
    assert [entry.version for entry in seen] == [v for v, n in sizes.items() for _ in range(n)]
    assert [entry.change.key for entry in seen[:2]] == ["q2.0", "q2.1"]


async def test_restarted_redis_with_its_aof_is_caught_up(
    stores: Callable[..., Any], processes: RedisProcesses
) -> None:
    server = processes.redis(appendonly=True)
    a = await stores(server.url)
    await a.apply([topic("before")])
    seen: list[Versioned] = []
    watcher = asyncio.create_task(collect(a, a.version, seen))
    try:
        server.kill()
        server.start()  # same socket, same directory: the AOF (appendfsync always) replays
        b = await stores(server.url)
        assert b.get("topic", "before") is not None
        await b.apply([topic("after")])
        await until_version(a, 2)
        assert a.get("topic", "after") == b'{"queues": 1}'
        await until_count(seen, 1)
        assert seen == [Versioned(2, topic("after"))]  # same history: no gap
        assert await a.apply([topic("again")]) == 3
    finally:
        watcher.cancel()


async def test_changes_lost_by_redis_are_noticed(
    stores: Callable[..., Any], processes: RedisProcesses
) -> None:
    """Redis restarts from an older snapshot (as a failover without WAIT can lose the last
    writes), and a second writer reaches the same version number with other changes: the
    cache reloads what Redis holds and an open watch raises MetadataGap."""
    server = processes.redis()
    add_user(server, "alice")
    a = await stores(server.url + "?username=alice&password=pw")
    b = await stores(server.url)
    await a.apply([topic("kept")])
    with server.client() as raw:
        raw.save()  # dump.rdb at version 1
    await a.apply([topic("lost1")])
    await a.apply([topic("lost2")])
    seen: list[Versioned] = []
    watcher = asyncio.create_task(collect(a, a.version, seen))
    try:
        server.kill()
        await b.aclose()
        server.start()  # from dump.rdb: version 1; ACL users are gone, so A stays out
        b = await stores(server.url)
        assert b.version == 1
        await b.apply([topic("new2")])
        await b.apply([topic("new3")])  # version 3 again, another change
        add_user(server, "alice")
        with pytest.raises(MetadataGap):
            await asyncio.wait_for(watcher, DEADLINE_S)
        assert seen == []
        await eventually(lambda: a.get("topic", "lost1") is None, "A to drop what was lost")
        assert a.version == 3
        assert sorted(key for key, _ in a.items("topic")) == ["kept", "new2", "new3"]
        # A's own apply right after builds on the history Redis has.
        assert await a.apply([topic("more")]) == 4
        await until_version(b, 4)
        assert sorted(a.items("topic")) == sorted(b.items("topic"))
    finally:
        watcher.cancel()


# -- nodes, leases, claims, ids ---------------------------------------------------------------


async def expired(store: RedisMetadata, node_id: str) -> bool:
    return await store.lease_holder(node_id) is None


async def test_leases(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    first = await a.register_node("n1", {"host": "127.0.0.1", "grpc": "127.0.0.1:1"})
    await a.acquire_lease("n1", first, 300, wait_ms=0)
    await a.acquire_lease("n1", first, 300, wait_ms=0)  # mine already: extended
    nodes = await b.live_nodes()
    assert list(nodes) == ["n1"]
    assert nodes["n1"].incarnation == first
    assert nodes["n1"].fields["grpc"] == "127.0.0.1:1"
    assert nodes["n1"].fields["incarnation"] == str(first)

    second = await b.register_node("n1", {"host": "127.0.0.1"})  # the node restarted
    assert second != first
    with pytest.raises(LeaseHeld) as held:
        await b.acquire_lease("n1", second, 300, wait_ms=0)
    assert held.value.holder == first
    assert await a.renew_lease("n1", first, 300)
    assert not await b.renew_lease("n1", second, 300)
    # The first stops renewing; the second waits for the lease to expire, then holds it.
    await b.acquire_lease("n1", second, 300, wait_ms=int(DEADLINE_S * 1000))
    assert await a.lease_holder("n1") == second
    assert not await a.renew_lease("n1", first, 300)
    assert await b.renew_lease("n1", second, 300)
    await eventually(lambda: expired(a, "n1"), "n1's lease to expire")
    assert not await b.renew_lease("n1", second, 300)  # expired: the node must fence itself
    assert await b.live_nodes() == {}
    await b.acquire_lease("n1", second, 10_000, wait_ms=0)
    assert await b.release_lease("n1", second)
    assert await b.lease_holder("n1") is None


async def test_claims(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    n1 = await a.register_node("n1", {})
    n2 = await b.register_node("n2", {})
    await a.acquire_lease("n1", n1, 300, wait_ms=0)
    await b.acquire_lease("n2", n2, 60_000, wait_ms=0)
    assert await a.claim_shard(0, "n1", n1, 0) == 1
    with pytest.raises(ClaimRefused) as refused:
        await b.claim_shard(0, "n2", n2, 1)
    assert (refused.value.reason, refused.value.owner) == (REFUSED_OWNED, "n1")
    with pytest.raises(ClaimRefused) as refused:
        await a.claim_shard(0, "n1", n1, 0)  # stale epoch
    assert (refused.value.reason, refused.value.epoch) == (REFUSED_EPOCH, 1)
    with pytest.raises(ClaimRefused) as refused:
        await a.claim_shard(1, "n1", n1 + 1, 0)  # not the lease's incarnation
    assert refused.value.reason == REFUSED_LEASE
    assert await a.claim_shard(0, "n1", n1, 1) == 2  # a restart claims its own back
    owners = await b.shard_owners()
    assert list(owners) == [0]
    assert (owners[0].owner, owners[0].incarnation, owners[0].epoch) == ("n1", n1, 2)
    assert owners[0].since_ms is not None

    # n1 stops renewing: once its lease expires, n2 may take the shard.
    await eventually(lambda: expired(a, "n1"), "n1's lease to expire")
    with pytest.raises(ClaimRefused) as refused:
        await a.claim_shard(0, "n1", n1, 2)  # n1 lost its lease: refused too
    assert refused.value.reason == REFUSED_LEASE
    assert await b.claim_shard(0, "n2", n2, 2) == 3
    # Section 5.2's EEXIST path: the epoch files on disk are ahead of Redis.
    assert await b.set_epoch_at_least(0, 10) == 10
    assert await b.set_epoch_at_least(0, 5) == 10
    with pytest.raises(ClaimRefused) as refused:
        await b.claim_shard(0, "n2", n2, 3)
    assert (refused.value.reason, refused.value.epoch) == (REFUSED_EPOCH, 10)
    assert await b.claim_shard(0, "n2", n2, 10) == 11
    owners = await a.shard_owners()
    assert (owners[0].owner, owners[0].epoch) == ("n2", 11)
    with pytest.raises(ValueError, match="no shard"):
        await a.claim_shard(SHARDS, "n2", n2, 0)


async def test_next_ids_blocks_are_disjoint(stores: Callable[..., Any]) -> None:
    a, b = await stores(), await stores()
    blocks = await asyncio.gather(*(store.next_ids() for store in (a, b) for _ in range(20)))
    ids = sorted(i for block in blocks for i in block)
    assert ids == list(range(40 * 1000))
    assert len(await a.next_ids(5)) == 5


# -- connecting ------------------------------------------------------------------------------


async def test_connect_checks_the_cluster_record(
    stores: Callable[..., Any], server: RedisServer
) -> None:
    await stores(shards=SHARDS)
    with pytest.raises(ClusterMismatch, match="shards"):
        await stores(shards=SHARDS + 1)
    await stores(cluster_id="other", shards=SHARDS + 1)  # another cluster, side by side
    with server.client() as raw:
        raw.hset("braid:c1:cluster", "format", "99")
    with pytest.raises(ClusterMismatch, match="format 99"):
        await stores()
    with pytest.raises(ValueError, match="URL"):
        await connect("http://127.0.0.1/", "c1", shards=SHARDS)
    with pytest.raises(ValueError, match="cluster id"):
        await stores(cluster_id="a b")


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://h1:26380,h2/braid",
            SentinelTarget([("h1", 26380), ("h2", 26379)], "braid"),
        ),
        (
            "redis+sentinel://us%40r:p%3Ass@[::1]:5000,10.0.0.2:26379/svc/3",
            SentinelTarget([("::1", 5000), ("10.0.0.2", 26379)], "svc", 3, "us@r", "p:ss"),
        ),
        (
            "redis+sentinel://:secret@h/svc",
            SentinelTarget([("h", 26379)], "svc", 0, None, "secret"),
        ),
    ],
)
def test_sentinel_url(url: str, target: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == target


@pytest.mark.parametrize(
    "url",
    [
        "redis://h/svc",
        "redis+sentinel://h1:26379/",
        "redis+sentinel://h1:26379/svc/db",
        "redis+sentinel://h1:26379/svc/0/extra",
        "redis+sentinel://h1:port/svc",
        "redis+sentinel://h1:70000/svc",
        "redis+sentinel://h1,/svc",
        "redis+sentinel://[::1/svc",
        "redis+sentinel://h1/svc?db=1",
    ],
)
def test_bad_sentinel_url(url: str) -> None:
    with pytest.raises(ValueError, match=r"sentinel|URL"):
        parse_sentinel_url(url)


# -- Sentinel: WAIT with a replica, and a failover ----------------------------------------------


def failover(processes: RedisProcesses, service: str, new_master: RedisServer) -> None:
    """``SENTINEL FAILOVER`` until a sentinel accepts it, then until all three name the new
    master (a sentinel refuses while it has no fresh view of a replica it can promote)."""
    leader = processes.sentinels[0]

    def start() -> bool:
        with leader.client() as client:
            try:
                return bool(client.execute_command("SENTINEL", "FAILOVER", service))
            except redis.ResponseError as exc:
                if "INPROG" in str(exc):  # the sentinels started one on their own
                    return True
                raise

    until(start, DEADLINE_S, "a sentinel to start the failover")
    until(
        lambda: all(s.master_port() == new_master.port for s in processes.sentinels),
        DEADLINE_S,
        "every sentinel to name the promoted replica",
    )


async def test_sentinel_failover_keeps_a_replicated_change(
    stores: Callable[..., Any], processes: RedisProcesses
) -> None:
    master = processes.redis(tcp=True)
    replica = processes.redis(replica_of=master)
    url = processes.sentinel_group(master, "braid")
    a = await stores(url, metadata_wait_ms=300)
    # A replica whose link is up can still miss its first WAIT by 300 ms on a loaded machine
    # (CI saw it at this line): apply until one change is acknowledged, within a deadline. The
    # WAIT that must time out is the SIGSTOP one below.
    deadline = time.monotonic() + DEADLINE_S
    while True:
        version = await a.apply([topic("replicated")])
        try:
            await a.wait_durable(version)  # WAIT 1 answered by the replica
            break
        except MetadataNotReplicated:
            if time.monotonic() > deadline:
                raise
    with replica.client() as raw:
        assert raw.hget("braid:c1:def:topic", "replicated") == b'{"queues": 1}'

    replica.signal(signal.SIGSTOP)  # a replica that does not answer: the WAIT times out
    try:
        version = await a.apply([topic("unacknowledged")])
        assert a.get("topic", "unacknowledged") is not None  # applied on the master
        with pytest.raises(MetadataNotReplicated):
            await a.wait_durable(version)
    finally:
        replica.signal(signal.SIGCONT)
    version = await a.apply([topic("acknowledged")])
    await a.wait_durable(version)
    await a.wait_durable(version - 1)  # acknowledged now, with everything before it

    master.kill()
    failover(processes, "braid", replica)
    version = await a.apply([topic("after-failover")])
    await a.wait_durable(version)  # the new master has no replica: returns at once
    b = await stores(url)
    for store in (a, b):
        await until_version(store, version)
        for name in ("replicated", "acknowledged", "after-failover"):
            assert store.get("topic", name) == b'{"queues": 1}'
    with redis.Redis(host="127.0.0.1", port=replica.port) as raw:
        assert raw.hget("braid:c1:def:topic", "after-failover") == b'{"queues": 1}'
        assert raw.info("replication")["role"] == "master"
