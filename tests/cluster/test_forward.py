"""Forwarding over ``Append`` (docs/cluster.md section 7): core/cluster/rpc/forward.py on the
origin and core/cluster/rpc/append.py on the owner, over real loopback gRPC into real
``LogStore``s, read back with the log's reader. The ownership table is a small real table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
from grpc import aio

from core.broker.remote import Destination, ForwardResult, OwnerAddress, RemoteAppend
from core.broker.shards import DurableMarks
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.append import AppendReceiver, ShardLog
from core.cluster.rpc.forward import Forwarder
from core.cluster.settings import ClusterSettings
from core.errors import ShardUnavailable
from core.log import LogConfig, LogStore
from core.log import record as rec
from core.log.store import Appended
from core.transactions.service import RecordFields

SECRET = "braid-forward-secret"
# Waits only: a test that hangs fails here instead of at pytest's timeout.
DEADLINE_S = 10.0
ORIGIN_NODE = 1
SHARD = 3
TOPIC = "orders"
WAIT_MS = 400  # unavailable_wait_ms of the tests that wait for it


class OwnerTable:
    """The ownership table as a node sees it: ``cached`` is what ``owner_of`` answers,
    ``current`` what a ``refresh`` reads (and caches); ``refresh_gate`` holds refreshes."""

    def __init__(self) -> None:
        self.cached: dict[int, OwnerAddress] = {}
        self.current: dict[int, OwnerAddress] = {}
        self.refreshes = 0
        self.refresh_gate = asyncio.Event()
        self.refresh_gate.set()

    def set(self, shard: int, owner: OwnerAddress) -> None:
        self.cached[shard] = self.current[shard] = owner

    def owner_of(self, shard: int) -> OwnerAddress | None:
        return self.cached.get(shard)

    async def refresh(self, shard: int) -> OwnerAddress | None:
        self.refreshes += 1
        await self.refresh_gate.wait()
        owner = self.current.get(shard)
        if owner is None:
            self.cached.pop(shard, None)
        else:
            self.cached[shard] = owner
        return owner


class GatedLog:
    """A real store whose durability waits are let through only once ``gate`` is set."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def append(self, *args: object, **fields: object) -> Appended:
        return self.store.append(*args, **fields)  # type: ignore[arg-type]

    def append_encoded(self, frame: bytes) -> Appended:
        return self.store.append_encoded(frame)

    def add_durable_waiter(self, end: int, future: asyncio.Future[None]) -> None:
        async def later() -> None:
            await self.gate.wait()
            self.store.add_durable_waiter(end, future)

        task = asyncio.get_running_loop().create_task(later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class Shards:
    """The shards a node owns: number -> (log, epoch)."""

    def __init__(self) -> None:
        self.owned: dict[int, tuple[ShardLog, int]] = {}
        self.full: set[Destination] = set()  # destinations refusing new records

    def shard(self, number: int) -> tuple[ShardLog, int] | None:
        return self.owned.get(number)

    def refused(self, shard: int, destinations: Sequence[Destination]) -> list[Destination]:
        return [dest for dest in destinations if dest in self.full]


class Node:
    """An owner node: its gRPC server with an ``AppendReceiver``, its shards' stores, and the
    ``AppendBatch`` messages it received."""

    def __init__(self, node_id: int, tmp: Path) -> None:
        self.node_id = node_id
        self.tmp = tmp
        self.shards = Shards()
        self.receiver = AppendReceiver(self.shards, node_id=node_id)
        self.service = NodeService(node_id, incarnation=1)
        self.service.append = self._counted
        self.server: RpcServer | None = None
        self.port = 0
        self.stores: list[LogStore] = []
        self.batches = 0
        self.records = 0
        self.largest_batch = 0  # bytes on the wire

    def _counted(
        self, requests: AsyncIterator[pb.AppendBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.AppendResult]:
        async def counting() -> AsyncIterator[pb.AppendBatch]:
            async for batch in requests:
                self.batches += 1
                self.records += len(batch.records)
                self.largest_batch = max(self.largest_batch, batch.ByteSize())
                yield batch

        return self.receiver(counting(), context)

    def open_store(self, name: str) -> LogStore:
        store = LogStore(
            LogConfig(
                self.tmp / f"node{self.node_id}-{name}",
                segment_size=1 << 20,
                index_entries_per_file=1024,
                retention_ms=None,
            )
        )
        self.stores.append(store)
        return store

    async def start(self, rpc: RpcSettings) -> None:
        self.server = RpcServer(rpc, self.service)
        self.port = await self.server.start("127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace_s=0)
            self.server = None

    def owner(self, epoch: int) -> OwnerAddress:
        return OwnerAddress(self.node_id, f"127.0.0.1:{self.port}", epoch)


@pytest.fixture
def rpc() -> RpcSettings:
    return RpcSettings(secret=SECRET, heartbeat_ms=500)


@pytest.fixture
async def nodes(
    tmp_path: Path, rpc: RpcSettings
) -> AsyncIterator[Callable[[int], Awaitable[Node]]]:
    started: list[Node] = []

    async def start(node_id: int) -> Node:
        node = Node(node_id, tmp_path)
        await node.start(rpc)
        started.append(node)
        return node

    yield start
    for node in started:
        await node.stop()
        for store in node.stores:
            store.close()


class Origin:
    """The forwarding node: a Forwarder over its own RpcClient and an OwnerTable."""

    def __init__(self, rpc: RpcSettings, *, incarnation: int = 7, **settings: int) -> None:
        self.client = RpcClient(rpc)
        self.owners = OwnerTable()
        settings.setdefault("heartbeat_ms", 500)
        settings.setdefault("lease_ms", 3000)
        self.forwarder = Forwarder(
            self.client,
            self.owners,
            ClusterSettings(**settings),
            node=ORIGIN_NODE,
            incarnation=incarnation,
        )
        remote: RemoteAppend = self.forwarder  # the node's seam: mypy checks the fit
        self.remote = remote

    def send(
        self, first: int, count: int, *, dests: Sequence[Destination] = ((TOPIC, 0),)
    ) -> list[asyncio.Future[ForwardResult]]:
        """Forward records ``first`` .. ``first + count - 1`` in one loop turn."""
        fields: RecordFields = {"key": b"k", "client": "publisher-1"}
        return [
            self.forwarder.forward(
                SHARD,
                TOPIC,
                0,
                b"record-%d" % n,
                destinations=dests,
                copy=False,
                deliver_at_ms=0,
                fields=fields,
            )
            for n in range(first, first + count)
        ]

    async def close(self) -> None:
        await self.forwarder.aclose()
        await self.client.close()


@pytest.fixture
async def origin(rpc: RpcSettings) -> AsyncIterator[Origin]:
    made = Origin(rpc)
    yield made
    await made.close()


async def settled(futures: Sequence[asyncio.Future[ForwardResult]]) -> list[ForwardResult]:
    async with asyncio.timeout(DEADLINE_S):
        return list(await asyncio.gather(*futures))


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            if condition():
                return
            await asyncio.sleep(0.005)


def bodies(store: LogStore, topic: str = TOPIC, queue: int = 0) -> list[bytes]:
    """Every body in ``(topic, queue)``, read with the log's reader from offset 0."""
    read: list[bytes] = []
    while entries := store.read(topic, queue, len(read)):
        read.extend(bytes(entry.body) for entry in entries)
    return read


def numbered(first: int, count: int) -> list[bytes]:
    return [b"record-%d" % n for n in range(first, first + count)]


async def test_records_land_in_order_with_their_fields_and_destinations(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    owner.shards.owned[SHARD] = (store, 1)
    origin.owners.set(SHARD, owner.owner(1))
    fields: RecordFields = {
        "key": None,
        "headers": [("h", b"v1"), ("h", b"v2")],
        "tags": ["red", "blue"],
        "subject": "eu.orders",
        "client": "c-9",
        "address": "amq.topic/eu.orders",
        "protocol": rec.PROTOCOL_AMQP,
        "born_ms": 1234,
    }
    forward = origin.forwarder.forward
    home = [
        forward(SHARD, TOPIC, 0, b"home-%d" % n, destinations=[(TOPIC, 0), ("audit", 2)],
                copy=False, deliver_at_ms=0, fields=fields)
        for n in range(20)
    ]  # fmt: skip
    copies = [
        forward(SHARD, "elsewhere", 5, b"copy-%d" % n, destinations=[("audit", 2)],
                copy=True, deliver_at_ms=0, fields={})
        for n in range(5)
    ]  # fmt: skip
    results = await settled(home + copies)
    assert [r.offset for r in results[:20]] == list(range(20))
    assert [r.offset for r in results[20:]] == [-1] * 5  # a copy is not indexed in its queue
    assert all(r.refused == [] for r in results)
    assert bodies(store) == [b"home-%d" % n for n in range(20)]
    audit = [entry.record() for entry in store.read("audit", 2, 0, max_records=100)]
    assert [r.body for r in audit] == [b"home-%d" % n for n in range(20)] + [
        b"copy-%d" % n for n in range(5)
    ]
    first = audit[0]
    assert first.key is None
    assert first.headers == [("h", b"v1"), ("h", b"v2")]
    assert first.tags == ["red", "blue"]
    assert (first.subject, first.client, first.address) == (
        "eu.orders",
        "c-9",
        "amq.topic/eu.orders",
    )
    assert (first.protocol, first.born_ms) == (rec.PROTOCOL_AMQP, 1234)
    assert first.destinations == [(TOPIC, 0), ("audit", 2)]
    assert not first.flags & rec.FLAG_COPY
    assert audit[20].flags & rec.FLAG_COPY
    assert (audit[20].topic, audit[20].queue) == ("elsewhere", 5)
    assert bodies(store, "elsewhere", 5) == []  # only indexed in its destinations


async def test_a_kafka_batch_keeps_its_flag_and_record_count(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    """A Kafka batch routed to another node's queue arrives as the batch it is: FLAG_BATCH
    and its record count kept, its offsets taken in its own queue (one per record)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    owner = await nodes(2)
    store = owner.open_store("s3")
    owner.shards.owned[SHARD] = (store, 1)
    origin.owners.set(SHARD, owner.owner(1))
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for delta in range(3):
        builder.append(delta, timestamp=0, key=b"k%d" % delta, value=b"v%d" % delta, headers=[])
    batch = bytes(builder.build())
    forward = origin.forwarder.forward
    first, second = await settled(
        [
            forward(SHARD, TOPIC, 0, batch, destinations=[(TOPIC, 0)], copy=False,
                    deliver_at_ms=0, fields={"protocol": rec.PROTOCOL_KAFKA},
                    record_count=3, flags=rec.FLAG_BATCH)
            for _ in range(2)
        ]
    )  # fmt: skip
    assert (first.offset, second.offset) == (0, 3)
    stored = [entry.record() for entry in store.read(TOPIC, 0, 0, max_records=10)]
    assert [(r.flags & rec.FLAG_BATCH, r.record_count, r.body) for r in stored] == [
        (rec.FLAG_BATCH, 3, batch),
        (rec.FLAG_BATCH, 3, batch),
    ]


async def test_refusing_destinations_are_reported_and_skipped(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    owner.shards.owned[SHARD] = (store, 1)
    origin.owners.set(SHARD, owner.owner(1))
    owner.shards.full.add(("full", 1))
    some = await settled(origin.send(0, 2, dests=[(TOPIC, 0), ("full", 1)]))
    assert some == [ForwardResult(0, [("full", 1)]), ForwardResult(1, [("full", 1)])]
    (none,) = await settled(origin.send(2, 1, dests=[("full", 1)]))
    assert none == ForwardResult(-1, [("full", 1)])
    owner.shards.full.add((TOPIC, 0))
    (own,) = await settled(origin.send(3, 1, dests=[]))  # its own queue only, refusing
    assert own == ForwardResult(-1, [(TOPIC, 0)])
    assert owner.receiver.stored == 2
    assert bodies(store) == numbered(0, 2)
    assert bodies(store, "full", 1) == []


async def test_a_turns_records_go_in_few_batches(
    nodes: Callable[[int], Awaitable[Node]], rpc: RpcSettings
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    owner.shards.owned[SHARD] = (store, 1)
    big = Origin(rpc)
    # Another incarnation: its seqs start again at 1, and are not the first one's duplicates.
    small = Origin(rpc, incarnation=8, forward_batch_bytes=4096)
    try:
        for sender in (big, small):
            sender.owners.set(SHARD, owner.owner(1))
        results = await settled(big.send(0, 500))
        assert (owner.batches, owner.records) == (1, 500)
        # The 500 plain OKs come back as one AppendResult listing their offsets, in seq order.
        assert results == [ForwardResult(n, []) for n in range(500)]
        assert big.forwarder.answers_received == 1
        one_turn = owner.largest_batch
        owner.largest_batch = 0
        await settled(small.send(500, 500))
        assert owner.records == 1000
        assert owner.largest_batch <= 4096
        # As few as fit: each batch holds at least half the limit's worth.
        assert one_turn / 4096 < owner.batches - 1 <= 2 * one_turn / 4096 + 1
        assert bodies(store) == numbered(0, 1000)
    finally:
        await big.close()
        await small.close()


async def test_futures_resolve_only_once_durable(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    gated = GatedLog(store)
    owner.shards.owned[SHARD] = (gated, 1)
    origin.owners.set(SHARD, owner.owner(1))
    futures = origin.send(0, 10)
    await until(lambda: owner.receiver.stored == 10)
    await asyncio.sleep(0.05)  # room for a wrong early answer to arrive
    assert not any(f.done() for f in futures)
    last = store.read(TOPIC, 0, 9, max_records=1)[0]
    assert store.commitlog.flushed_position < last.position + last.size
    gated.gate.set()
    await settled(futures)
    assert store.commitlog.flushed_position >= last.position + last.size


async def test_not_owner_resends_in_order_to_the_new_owner(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    old, new = await nodes(2), await nodes(3)
    old_store, new_store = old.open_store("s3"), new.open_store("s3")
    old.shards.owned[SHARD] = (old_store, 1)
    origin.owners.set(SHARD, old.owner(1))
    first = await settled(origin.send(0, 10))
    assert [r.offset for r in first] == list(range(10))
    # The shard moves to node 3 at epoch 2; the origin still has node 2 cached.
    del old.shards.owned[SHARD]
    new.shards.owned[SHARD] = (new_store, 2)
    origin.owners.current[SHARD] = new.owner(2)
    origin.owners.refresh_gate.clear()
    refused = origin.send(10, 20)
    await until(lambda: origin.owners.refreshes == 1)
    held = origin.send(30, 10)  # while the owner is being read again: held behind the rest
    origin.owners.refresh_gate.set()
    results = await settled(refused + held)
    assert [r.offset for r in results] == list(range(30))
    assert bodies(old_store) == numbered(0, 10)
    assert bodies(new_store) == numbered(10, 30)
    assert old.receiver.stored == 10


async def test_an_owner_still_opening_the_shard_gets_the_records_on_a_new_stream(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    origin.owners.set(SHARD, owner.owner(1))  # claimed in the table, not opened yet
    futures = origin.send(0, 5)
    await until(lambda: origin.owners.refreshes >= 1)
    owner.shards.owned[SHARD] = (store, 1)
    more = origin.send(5, 5)
    results = await settled(futures + more)
    assert [r.offset for r in results] == list(range(10))
    assert bodies(store) == numbered(0, 10)
    assert origin.forwarder.streams_opened >= 2


async def test_a_restarted_server_gets_the_unanswered_again_and_drops_duplicates(
    nodes: Callable[[int], Awaitable[Node]], origin: Origin, rpc: RpcSettings
) -> None:
    owner = await nodes(2)
    store = owner.open_store("s3")
    gated = GatedLog(store)
    owner.shards.owned[SHARD] = (gated, 1)
    origin.owners.set(SHARD, owner.owner(1))
    gated.gate.set()
    await settled(origin.send(0, 10))
    gated.gate.clear()
    futures = origin.send(10, 10)
    await until(lambda: owner.receiver.stored == 20)  # stored, not durable: no answers yet
    await owner.stop()
    await asyncio.sleep(0.1)  # the origin sees the stream break and fails to reconnect
    assert not any(f.done() for f in futures)
    await owner.start(rpc)  # same port, same receiver (its window of seqs)
    await until(lambda: owner.receiver.duplicates == 10)
    gated.gate.set()
    results = await settled(futures)
    assert [r.offset for r in results] == list(range(10, 20))
    assert owner.receiver.stored == 20
    assert bodies(store) == numbered(0, 20)
    assert origin.forwarder.streams_opened >= 2


async def test_no_owner_fails_after_the_wait(rpc: RpcSettings) -> None:
    origin = Origin(rpc, unavailable_wait_ms=WAIT_MS)
    try:
        started = time.monotonic()
        futures = origin.send(0, 3)
        for future in futures:
            with pytest.raises(ShardUnavailable) as failed:
                await asyncio.wait_for(future, DEADLINE_S)
            assert failed.value.shard == SHARD
            assert "no live owner" in str(failed.value)
        assert time.monotonic() - started >= WAIT_MS / 1000
        assert origin.owners.refreshes >= 2  # it kept looking for an owner meanwhile
    finally:
        await origin.close()


async def test_an_owner_that_does_not_answer_fails_after_the_wait(
    nodes: Callable[[int], Awaitable[Node]], rpc: RpcSettings
) -> None:
    owner = await nodes(2)
    address = owner.owner(1)
    await owner.stop()  # nothing listens there any more
    origin = Origin(rpc, unavailable_wait_ms=WAIT_MS)
    try:
        origin.owners.set(SHARD, address)
        started = time.monotonic()
        (future,) = origin.send(0, 1)
        with pytest.raises(ShardUnavailable) as failed:
            await asyncio.wait_for(future, DEADLINE_S)
        assert failed.value.owner == owner.node_id
        assert "no answer" in str(failed.value)
        assert time.monotonic() - started >= WAIT_MS / 1000
    finally:
        await origin.close()


async def test_durable_marks_wait_for_the_forwards_up_to_theirs_and_fail_their_own(
    nodes: Callable[[int], Awaitable[Node]], rpc: RpcSettings
) -> None:
    """The publish path's use (core/broker/cross_shard.py): each forward sent with
    ``Forwarder.send`` settles its publish's mark in ``DurableMarks``. A wait for a mark ends
    once every forward of the marks up to it is durable on its owner, not before and without
    waiting for later marks; a failed forward fails the wait of its own mark only, and
    ``failed`` names it for a gateway that waited for a later mark."""
    owner = await nodes(2)
    gated = GatedLog(owner.open_store("s3"))
    owner.shards.owned[SHARD] = (gated, 1)
    origin = Origin(rpc, unavailable_wait_ms=WAIT_MS)
    marks = DurableMarks([])  # no local shard: the forwards alone
    fields: RecordFields = {"key": b"k"}

    def publish(shard: int, body: bytes, refused: list[Destination]) -> int:
        mark = marks.next()
        settle = marks.forwarded(mark, 1, refused)
        origin.forwarder.send(
            shard, TOPIC, 0, body, destinations=[(TOPIC, 0)], copy=False, deliver_at_ms=0,
            fields=fields, settled=settle,
        )  # fmt: skip
        return mark

    try:
        origin.owners.set(SHARD, owner.owner(1))
        refused: list[Destination] = []
        first = publish(SHARD, b"first", refused)
        local = marks.next()  # a publish stored in local shards only, after the forward
        waits = [asyncio.ensure_future(marks.wait(mark)) for mark in (first, local)]
        await until(lambda: owner.receiver.stored == 1)
        await asyncio.sleep(0.05)  # room for a wrong early end
        assert not any(wait.done() for wait in waits)
        assert not marks.is_durable(local)
        gated.gate.set()
        async with asyncio.timeout(DEADLINE_S):
            await asyncio.gather(*waits)
        assert marks.is_durable(local)
        assert refused == []
        # A forward to a shard without an owner fails after unavailable_wait_ms: its mark's
        # wait raises; a later mark's wait does not wait for it nor raise.
        lost = publish(SHARD + 1, b"lost", [])
        later = marks.next()
        stuck = asyncio.ensure_future(marks.wait(later))
        await asyncio.sleep(0.05)
        assert not stuck.done()  # a forward up to it is unanswered
        with pytest.raises(ShardUnavailable):
            await asyncio.wait_for(marks.wait(lost), DEADLINE_S)
        await asyncio.wait_for(stuck, DEADLINE_S)
        assert not marks.is_durable(lost)
        assert marks.is_durable(later)
        assert set(marks.failed([first, lost, later])) == {lost}
    finally:
        await origin.close()
