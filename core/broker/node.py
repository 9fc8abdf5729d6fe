"""Node: the cluster-wide half of the broker, and the object the Broker API is built over
(docs/cluster.md section 6).

It holds what the shards of a node share: the :class:`~core.cluster.MetadataStore` and what is
kept in memory from it (the topic registry, the binding table, the queue definitions), routing
(bindings followed across exchange-to-exchange hops, route hooks, the live feed of the live
subscriptions), flow control over its shards, and a :class:`~core.broker.shards.ShardSet`:
shard number -> the :class:`~core.broker.shard.Shard` that serves it. Step 2 of section 15:
one shard, number 0, over the node's one log store. On a single node that store's ``__meta``/
``__security``/``__limits`` tables are the metadata (:class:`~core.cluster.LocalMetadata`); a
cluster node is given a :class:`~core.cluster.split.SplitMetadata` instead (the cluster-wide
kinds in Redis, the shard-local ones in that same LocalMetadata). Gateways reach it only
through the Broker API (``core/api``); nothing here knows a wire format.

Publishing: ``publish(topic, body, subject=..., ...)`` picks the topic's queue (explicit, by key
hash, or round robin), routes the subject through the bindings of the topic to more destination
queues, appends ONE record indexed into all of them, and returns once it is durable. With one
shard the publish path appends to it directly (:attr:`Node.shard`): no lookup per record.

Definitions change through the metadata store, so those calls are coroutines (a cluster's store
answers over the network); the single node's complete without suspending, and the Broker API
runs them eagerly (``core/broker/eager.py``).

Addresses: a destination is ``(topic, queue)``; ``(name, EXCHANGE_QUEUE)`` names a topic used as
a routing source (exchange-to-exchange bindings), which is followed, cycles cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from core.broker import cross_shard
from core.broker.ack_queues import (
    ack_queue_config_from_json,
    ack_queue_config_to_json,
    queue_key,
)
from core.broker.broker import (
    EXCHANGE_QUEUE,
    BrokerConfig,
    Destination,
    PublishResult,
    RouteHook,
    batch_tags,
    may_carry_braid_headers,
)
from core.broker.flow import FlowControl
from core.broker.partitioner import murmur2_partition
from core.broker.remote import RemoteAppend, RemoteTransactions
from core.broker.shard import Shard
from core.broker.shards import DurableMarks, ShardSet
from core.broker.topics import TopicError, TopicInfo, TopicLimits, TopicRegistry
from core.cluster import placement
from core.cluster.local import LocalMetadata
from core.cluster.metadata import KIND_BINDING, KIND_QUEUE, Change
from core.cluster.split import SplitMetadata
from core.delivery.ackqueue import AckQueue, AckQueueConfig
from core.delivery.live import LiveFeed
from core.delivery.message import (
    BATCH_SELECT_HEADER,
    Message,
    inner_subject,
    selection_key,
)
from core.errors import ShardUnavailable
from core.log import LogStore
from core.log import record as rec
from core.log.batches import batch_is_control, unpack_batch
from core.log.store import Appended
from core.log.tags import batch_may_have_tags, tags_from_headers
from core.routing.table import BindingTable, MatchKind
from core.transactions.control import (
    CONTROL_TOPICS,
    RESULT_HEADER,
    TXN_TOPIC,
    HalfMark,
    batch_half_mark,
    half_mark,
    outcome_txn_id,
)
from core.transactions.service import RecordFields

log = logging.getLogger(__name__)

FLOW_CHECK_INTERVAL_S = 0.25
# Exchange-to-exchange routing deeper than this is cut (RabbitMQ has no limit but detects cycles).
MAX_ROUTING_HOPS = 32
# The metadata kind of recorded queue placements (Redis ``place:partition``, section 4):
# ``place:`` + placement.PLACE_PARTITION, spelled out because core.cluster.placement imports
# core.broker.partitioner, so this module may run while placement is only partly imported
# (hence ``placement.X`` read at call time, never imported names).
PLACE_PARTITION_KIND: Final = "place:partition"


def _number(numbered: tuple[int, LogStore]) -> int:
    return numbered[0]


class Node:
    def __init__(
        self,
        store: LogStore | Sequence[tuple[int, LogStore]],
        config: BrokerConfig | None = None,
        *,
        metadata: SplitMetadata | None = None,
        shard_count: int | None = None,
        remote: RemoteAppend | None = None,
    ) -> None:
        """``store``: the node's one log store (shard 0), or ``(number, store)`` of each shard
        it serves. ``metadata``: a cluster node's (its ``local`` over the lowest-numbered
        shard's store); None on a single node, whose metadata is the __meta/__security/__limits
        tables of that store. ``shard_count``: the cluster's shard count (default: the shards
        given, numbered 0..n-1). ``remote``: where records for shards of other nodes go
        (docs/cluster.md section 7); None: a destination in one of them is
        :class:`~core.errors.ShardUnavailable`."""
        self.config = config or BrokerConfig()
        stores = [(0, store)] if isinstance(store, LogStore) else sorted(store, key=_number)
        if not stores:
            raise ValueError("a node serves at least one shard")
        home_number, home_store = stores[0]
        # Cluster-wide definitions (topics, bindings, queues, security, limits): on a single
        # node the __meta/__security/__limits tables of its log (docs/cluster.md section 4).
        if metadata is None:
            local = LocalMetadata(home_store)
            self.metadata: LocalMetadata | SplitMetadata = local
        else:
            if metadata.local.store is not home_store:
                raise ValueError("the shard-local metadata must be over the node's first store")
            self.metadata = metadata
            local = metadata.local
        self.topics = TopicRegistry(
            self.metadata,
            TopicLimits(
                self.config.max_topics,
                self.config.max_partitions_per_topic,
                self.config.max_partitions,
            ),
        )
        self.bindings: BindingTable[Destination] = BindingTable()
        self.flow = FlowControl(self.config.memory_high_watermark_bytes)
        self.route_hooks: list[RouteHook] = []
        self._hook_filters: dict[RouteHook, Callable[[str], bool]] = {}
        self._round_robin: dict[str, int] = {}
        self._live: LiveFeed | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.remote = remote
        # Half messages and decisions of transactions kept in other nodes' shards go there
        # (set by a cluster node: core/cluster/remote_txn.py).
        self.remote_txn: RemoteTransactions | None = None
        # Told ``(topic, defined)`` when another node defined or deleted an ack queue of this
        # node's shards (:meth:`on_queue`): a gateway learns of its queues without a scan.
        self.queue_listeners: list[Callable[[str, bool], None]] = []
        # The lowest-numbered shard (shard 0 of a single node): what the one-shard publish
        # path appends to directly, and the home of what has no placement yet.
        self.shard = Shard(home_number, home_store, self.config, self, local)
        shards = [self.shard]
        for number, other in stores[1:]:
            # Each shard keeps its own entries (redrive intents) in its own __meta.
            shards.append(Shard(number, other, self.config, self, LocalMetadata(other)))
        count = len(stores) if shard_count is None else shard_count
        self.shards = ShardSet(shards, count=count, placements=self._recorded_placements(count))
        # Many shards: publishes are grouped by shard, and a durable mark is a node-local
        # sequence number (module docstring of core/broker/durable.py); one shard: a position
        # in its log, waited for by the store itself (no lookup, no table).
        self._many = not self.shards.single
        self.marks = DurableMarks(self.shards)
        self.when_durable: Callable[[int, str | None], Awaitable[None]] = (
            self.marks.wait if self._many else home_store.wait_durable
        )
        self._load_bindings_and_queues()
        for shard in self.shards:
            shard.listen()

    def _recorded_placements(self, count: int) -> placement.Placements:
        """The placements recorded in the cluster's store (Redis ``place:partition``); none
        on a single node, whose one shard holds everything."""
        placements = placement.Placements(count)
        if count > 1 and isinstance(self.metadata, SplitMetadata):
            for key, value in self.metadata.items(PLACE_PARTITION_KIND):
                placements.record(placement.PLACE_PARTITION, key, int(value))
        return placements

    # -- startup / shutdown ----------------------------------------------------------------

    def _load_bindings_and_queues(self) -> None:
        for _key, value in self.metadata.items(KIND_BINDING):
            raw = json.loads(value)
            self.bindings.add(
                raw["source"],
                raw["kind"],
                raw["pattern"],
                (raw["destination"][0], int(raw["destination"][1])),
                raw.get("arguments"),
            )
        for _key, value in self.metadata.items(KIND_QUEUE):
            raw = json.loads(value)
            destination = (raw["topic"], int(raw["queue"]))
            shard = self.shards.local(self.shards.queue_number(*destination))
            if shard is not None:  # (a queue of another node's shard is opened there)
                shard.open_ack_queue(destination, ack_queue_config_from_json(raw["config"]))

    async def add_shard(self, number: int, store: LogStore) -> Shard:
        """Serve shard ``number`` from now on, over its opened and started ``store`` (taken
        over from a node that died, issue 23): its queues opened as at start, then started."""
        shard = Shard(number, store, self.config, self, LocalMetadata(store))
        opened: list[str] = []
        for _key, value in self.metadata.items(KIND_QUEUE):
            raw = json.loads(value)
            destination = (raw["topic"], int(raw["queue"]))
            if self.shards.queue_number(*destination) == number:
                shard.open_ack_queue(destination, ack_queue_config_from_json(raw["config"]))
                opened.append(destination[0])
        self.shards.add(shard)
        shard.listen()
        await shard.start()
        # A gateway that reached these queues on the shard's old owner serves them here now.
        for topic in opened:
            for listener in list(self.queue_listeners):
                listener(topic, True)
        return shard

    async def start(self) -> None:
        for shard in self.shards:
            await shard.start()
        self._tasks = [asyncio.create_task(self._check_flow_periodically())]

    async def _check_flow_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLOW_CHECK_INTERVAL_S)
            try:
                self.check_flow()
            except Exception:
                log.exception("node task check_flow failed")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for shard in self.shards:
            await shard.close()

    @property
    def metrics(self) -> dict[str, int]:
        """What left ack queues unconsumed (retried, dead_lettered, dropped), all shards."""
        total: dict[str, int] = {}
        for shard in self.shards:
            for key, value in shard.metrics.items():
                total[key] = total.get(key, 0) + value
        return total

    def live_feed(self) -> LiveFeed:
        """The live router and the reading-back of records for live subscriptions (made at the
        first call: a node without live subscribers does not follow its index)."""
        feed = self._live
        if feed is None:
            # The live feed has no placement yet: it follows the lowest local shard (with many
            # shards, live subscribers see what that shard indexes; section 8's routes and
            # Fanout are step 8's).
            feed = self._live = LiveFeed(self.shards.home.store)
        return feed

    # -- topics ----------------------------------------------------------------------------

    async def declare_topic(
        self, name: str, queues: int | None = None, config: dict[str, Any] | None = None
    ) -> tuple[TopicInfo, bool]:
        declared = await self.topics.declare(name, queues or self.config.num_partitions, config)
        info, created = declared
        if created:
            await self.record_placements(name, range(info.queues))
        return declared

    async def add_queues(self, name: str, total: int) -> TopicInfo:
        """Grow the topic ``name`` to ``total`` queues (Kafka CreatePartitions), the new ones
        placed."""
        before = self.topics.get(name)
        info = await self.topics.add_queues(name, total)
        await self.record_placements(name, range(before.queues if before else 0, info.queues))
        return info

    async def record_placements(self, topic: str, queues: range) -> None:
        """Record where the new ``queues`` of ``topic`` are (Redis ``place:partition``, section
        3), so every node reads the same shard even where the rule would say otherwise later.
        Only a node of many shards over the cluster's store records; a single node's one
        shard holds everything. A separate apply after the definition's (not the same script
        as section 3 foresees): a node that stops between the two leaves the rule, which the
        record would have said anyway."""
        shards = self.shards
        if shards.single or not queues or not isinstance(self.metadata, SplitMetadata):
            return
        placed = [(queue, shards.queue_number(topic, queue)) for queue in queues]
        changes = [
            Change(
                PLACE_PARTITION_KIND, placement.partition_key(topic, queue), str(number).encode()
            )
            for queue, number in placed
            if shards.placements.shard_of(
                placement.PLACE_PARTITION, placement.partition_key(topic, queue)
            )
            is None
        ]
        if changes:
            await self.metadata.apply(changes)
            for queue, number in placed:
                shards.record_queue(topic, queue, number)

    async def _forget_placements(self, topic: str, queues: range) -> None:
        shards = self.shards
        if shards.single or not isinstance(self.metadata, SplitMetadata):
            return
        known = [
            queue
            for queue in queues
            if shards.placements.shard_of(
                placement.PLACE_PARTITION, placement.partition_key(topic, queue)
            )
            is not None
        ]
        if known:
            await self.metadata.apply(
                [
                    Change(PLACE_PARTITION_KIND, placement.partition_key(topic, q), None)
                    for q in known
                ]
            )
        for queue in queues:
            shards.forget_queue(topic, queue)

    def topic(self, name: str) -> TopicInfo:
        """The topic ``name``; :class:`TopicError` when there is none."""
        info = self.topics.get(name)
        if info is None:
            raise TopicError("unknown", f"no topic {name!r}")
        return info

    async def _auto_create(self, name: str, create: bool | None) -> TopicInfo:
        """A publish to the unknown topic ``name``: created when ``create`` (None: the
        ``auto_create_topics`` setting) says so, else :class:`TopicError`."""
        if create if create is not None else self.config.auto_create_topics:
            return (await self.declare_topic(name))[0]
        raise TopicError("unknown", f"no topic {name!r}")

    async def delete_topic(self, name: str) -> bool:
        info = self.topics.get(name)
        if info is None:
            return False
        self.bindings.remove_source(name)
        for queue in range(info.queues):
            await self.delete_ack_queue(name, queue)
            self.bindings.remove_destination((name, queue))
        await self._persist_bindings_of(name)
        deleted = await self.topics.delete(name)
        await self._forget_placements(name, range(info.queues))
        # As Kafka does: the topic's committed offsets go with it, and a topic created again
        # under the same name starts empty at offset 0.
        for shard in self.shards:
            shard.offsets.delete_topic(name)
            shard.store.drop_queues(name)
        return deleted

    # -- ack queues: definitions here, the queues in their shards ---------------------------

    def ack_queue(self, topic: str, queue: int = 0) -> AckQueue | None:
        """The ack queue over ``(topic, queue)`` on this node; None when there is none, or
        when its shard is another node's (its owner holds it: :meth:`queue_is_local`)."""
        if not self._many:
            return self.shard.ack_queues.get((topic, queue))
        shard = self.shards.local(self.shards.queue_number(topic, queue))
        return None if shard is None else shard.ack_queues.get((topic, queue))

    def queue_is_local(self, topic: str, queue: int = 0) -> bool:
        """Whether ``(topic, queue)``'s shard is one this node serves."""
        return self.shards.local(self.shards.queue_number(topic, queue)) is not None

    def queue_defined(self, topic: str, queue: int = 0) -> bool:
        """Whether an ack queue over ``(topic, queue)`` is defined, on any node."""
        return self.metadata.get(KIND_QUEUE, queue_key((topic, queue))) is not None

    async def define_remote_queue(
        self, topic: str, queue: int = 0, config: AckQueueConfig | None = None
    ) -> bool:
        """Define the ack queue over ``(topic, queue)`` whose shard another node serves: its
        definition is recorded (and its placement, for a queue of no topic); the owner opens
        it when it follows the change (:meth:`on_queue`). False when it was defined already.
        :class:`ShardUnavailable` for a queue of a local shard (:meth:`declare_ack_queue`)."""
        if self.queue_is_local(topic, queue):
            raise ShardUnavailable(
                self.shards.queue_number(topic, queue), reason="local: declare_ack_queue"
            )
        if self.queue_defined(topic, queue):
            return False
        value = {
            "topic": topic,
            "queue": queue,
            "config": ack_queue_config_to_json(config or AckQueueConfig()),
        }
        key = queue_key((topic, queue))
        await self.metadata.apply([Change(KIND_QUEUE, key, json.dumps(value).encode())])
        if topic not in self.topics:
            await self.record_placements(topic, range(queue, queue + 1))
        return True

    def on_queue(self, key: str, value: bytes | None) -> None:
        """Another node defined (``value``, the store's JSON) or deleted (None) the ack queue
        ``key``: open or close it here when its shard is this node's, as loading the
        definitions at start would (core/cluster/follow.py). Idempotent."""
        topic, _, number = key.rpartition("\x00")
        if not number.isdigit():
            raise ValueError(f"not an ack queue key: {key!r}")
        destination = (topic, int(number))
        shard = self.shards.local(self.shards.queue_number(*destination))
        if shard is None:
            return
        if value is None:
            if shard.take_ack_queue(destination) is not None:
                shard.forget_ack_state(destination)
        elif destination not in shard.ack_queues:
            raw = json.loads(value)
            shard.open_ack_queue(destination, ack_queue_config_from_json(raw["config"]))
        for listener in list(self.queue_listeners):
            listener(topic, value is not None)

    def ack_queues(self) -> list[tuple[Destination, AckQueue]]:
        """Every ack queue of every shard of the node."""
        return [item for shard in self.shards for item in shard.ack_queues.items()]

    async def declare_ack_queue(
        self, topic: str, queue: int = 0, config: AckQueueConfig | None = None
    ) -> tuple[AckQueue, bool]:
        """Get or create the durable ack queue over ``(topic, queue)``."""
        destination = (topic, queue)
        shard = self.shards.for_queue(topic, queue)
        existing = shard.ack_queues.get(destination)
        if existing is not None:
            return existing, False
        config = config or AckQueueConfig()
        value = {"topic": topic, "queue": queue, "config": ack_queue_config_to_json(config)}
        key = queue_key(destination)
        await self.metadata.apply([Change(KIND_QUEUE, key, json.dumps(value).encode())])
        existing = shard.ack_queues.get(destination)
        if existing is not None:  # declared meanwhile (the store answered after a wait)
            return existing, False
        if topic not in self.topics:  # a queue of no topic (an MQTT session's): placed here
            await self.record_placements(topic, range(queue, queue + 1))
        return shard.open_ack_queue(destination, config), True

    async def delete_ack_queue(self, topic: str, queue: int = 0) -> AckQueue | None:
        """Close the ack queue, drop its bindings and its definition, then its state. A
        queue of another node's shard: its bindings and definition (the owner closes it as
        it follows the change, :meth:`on_queue`); None."""
        destination = (topic, queue)
        shard = self.shards.local(self.shards.queue_number(topic, queue))
        if shard is None:
            if self.queue_defined(topic, queue):
                self.bindings.remove_destination(destination)
                await self._persist_bindings_of(topic)
                await self.metadata.apply([Change(KIND_QUEUE, queue_key(destination), None)])
            return None
        removed = shard.take_ack_queue(destination)
        if removed is None:
            return None
        self.bindings.remove_destination(destination)
        await self._persist_bindings_of(topic)
        await self.metadata.apply([Change(KIND_QUEUE, queue_key(destination), None)])
        shard.forget_ack_state(destination)
        return removed

    async def discard_ack_queue(self, topic: str, queue: int = 0) -> AckQueue | None:
        """:meth:`delete_ack_queue` for an ack queue that is not a topic of its own (an MQTT
        session's or shared group's), its index deleted with it: nothing of it stays on disk,
        and a queue declared again under that name starts empty at offset 0."""
        removed = await self.delete_ack_queue(topic, queue)
        if removed is not None and topic not in self.topics:
            self.shards.for_queue(topic, queue).store.drop_queues(topic)
        return removed

    # -- bindings --------------------------------------------------------------------------

    @staticmethod
    def _binding_key(
        source: str, kind: str, pattern: str, destination: Destination, arguments: Any
    ) -> str:
        identity = [source, kind, pattern, list(destination), arguments]
        return json.dumps(identity, sort_keys=True, default=str)

    async def bind(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add a durable binding; False if it existed already."""
        added = self.bindings.add(source, kind, pattern, destination, arguments)
        if added:
            kind_name = MatchKind(kind).value
            args = dict(arguments) if arguments else None
            value = json.dumps(
                {
                    "source": source,
                    "kind": kind_name,
                    "pattern": pattern,
                    "destination": list(destination),
                    "arguments": args,
                },
                default=str,
            ).encode()
            key = self._binding_key(source, kind_name, pattern, destination, args)
            await self.metadata.apply([Change(KIND_BINDING, key, value)])
        return added

    async def unbind(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        removed = self.bindings.remove(source, kind, pattern, destination, arguments)
        if removed:
            args = dict(arguments) if arguments else None
            key = self._binding_key(source, MatchKind(kind).value, pattern, destination, args)
            await self.metadata.apply([Change(KIND_BINDING, key, None)])
        return removed

    async def _persist_bindings_of(self, name: str) -> None:
        """Drop persisted bindings no longer in the table (after bulk removal)."""
        live = {
            self._binding_key(
                b.source,
                b.kind.value,
                b.pattern,
                b.destination,
                dict(b.arguments) if b.arguments else None,
            )
            for b in self.bindings.bindings()
        }
        gone = [key for key, _ in self.metadata.items(KIND_BINDING) if key not in live]
        if gone:
            await self.metadata.apply([Change(KIND_BINDING, key, None) for key in gone])

    def route(
        self, topic: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> list[Destination]:
        """Queues a record published to ``topic`` with ``subject`` reaches through bindings,
        following exchange-to-exchange bindings."""
        found: list[Destination] = []
        seen_queues: set[Destination] = set()
        visited = {topic}
        frontier = [topic]
        hops = 0
        while frontier and hops < MAX_ROUTING_HOPS:
            hops += 1
            next_frontier: list[str] = []
            for source in frontier:
                for destination in self.bindings.route(source, subject, headers):
                    if destination[1] == EXCHANGE_QUEUE:
                        name = destination[0]
                        if name not in visited:
                            visited.add(name)
                            next_frontier.append(name)
                            # The exchange's own stream sees what was routed to it.
                            own = (name, 0)
                            if own not in seen_queues and name in self.topics:
                                seen_queues.add(own)
                                found.append(own)
                    elif destination not in seen_queues:
                        seen_queues.add(destination)
                        found.append(destination)
            frontier = next_frontier
        return found

    def add_route_hook(
        self, hook: RouteHook, *, may_route: Callable[[str], bool] | None = None
    ) -> None:
        """Every publish (any protocol, plain or Kafka batch) also goes to what ``hook`` returns.
        ``may_route(topic)`` False promises that ``hook`` returns nothing for any record of
        ``topic`` right now: a Kafka batch to such a topic is then stored without decoding its
        records to route each one (most of a produce's cost otherwise)."""
        self.route_hooks.append(hook)
        if may_route is not None:
            self._hook_filters[hook] = may_route

    def remove_route_hook(self, hook: RouteHook) -> None:
        if hook in self.route_hooks:
            self.route_hooks.remove(hook)
        self._hook_filters.pop(hook, None)

    def _hooks_may_route(self, topic: str) -> bool:
        filters = self._hook_filters
        for hook in self.route_hooks:
            may_route = filters.get(hook)
            if may_route is None or may_route(topic):
                return True
        return False

    def _hooked(
        self, topic: str, subject: str, key: bytes | None, protocol: int, address: str
    ) -> list[Destination]:
        found: list[Destination] = []
        for hook in self.route_hooks:
            found.extend(hook(topic, subject, key, protocol, address))
        return found

    # -- publishing ------------------------------------------------------------------------

    def choose_queue(self, info: TopicInfo, key: bytes | None) -> int:
        if info.queues == 1:
            return 0
        if key:
            return murmur2_partition(key, info.queues)
        turn = self._round_robin.get(info.name, -1) + 1
        self._round_robin[info.name] = turn
        return turn % info.queues

    def prepare_destinations(
        self,
        topic: str,
        queue: int,
        subject: str,
        routing_headers: Mapping[str, Any] | None,
        extra: Sequence[Destination] = (),
        *,
        key: bytes | None = None,
        protocol: int = rec.PROTOCOL_INTERNAL,
        address: str = "",
    ) -> tuple[list[Destination], list[Destination]]:
        """``(destinations, refused)``: the topic's queue, routed queues, route hooks' and
        ``extra``, minus ack queues that refuse publishes (reject-publish overflow)."""
        destinations = [(topic, queue)]
        seen = {destinations[0]}
        hooked = self._hooked(topic, subject, key, protocol, address) if self.route_hooks else ()
        for destination in (*self.route(topic, subject, routing_headers), *hooked, *extra):
            if destination not in seen:
                seen.add(destination)
                destinations.append(destination)
        refused = []
        if self._many:
            for destination in destinations[1:]:
                ack_queue = self._local_ack_queue(destination)
                if ack_queue is not None and ack_queue.would_overflow():
                    refused.append(destination)
        else:
            ack_queues = self.shard.ack_queues
            for destination in destinations[1:]:
                ack_queue = ack_queues.get(destination)
                if ack_queue is not None and ack_queue.would_overflow():
                    refused.append(destination)
        if refused:
            destinations = [d for d in destinations if d not in refused]
        return destinations, refused

    async def publish(
        self,
        topic: str,
        body: bytes | memoryview | None,
        *,
        queue: int | None = None,
        key: bytes | None = None,
        subject: str = "",
        headers: rec.Headers = (),
        routing_headers: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        protocol: int = rec.PROTOCOL_INTERNAL,
        client: str = "",
        address: str = "",
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        extra_destinations: Sequence[Destination] = (),
        create_topic: bool | None = None,
        wait_durable: bool = True,
    ) -> PublishResult:
        """Store one record for every destination it reaches; returns once durable.

        Raises TopicError for an unknown topic (unless auto-created). Ack queues refusing it
        under reject-publish are listed in ``result.refused`` (AMQP nacks the publish then, as
        RabbitMQ does); every other destination still gets the record.
        """
        if self.flow.reasons:
            await self.flow.wait_unblocked()
        info = self.topics.get(topic)
        if info is None:
            info = await self._auto_create(topic, create_topic)
        if queue is None:
            # No key: the subject partitions, as a Kafka producer keyed by it would (order per
            # routing key / MQTT topic is then kept in one Kafka partition).
            chosen = self.choose_queue(info, key or (subject.encode() if subject else None))
        else:
            chosen = queue
        if not 0 <= chosen < info.queues:
            raise TopicError("unknown_queue", f"topic {topic!r} has no queue {chosen}")
        if not tags and headers:
            # Tags from any protocol: the ``x-braid-tags: A,B`` header (docs/mapping.md).
            tags = tags_from_headers(headers)
        # Half messages from any protocol (core/transactions/control.py): header
        # x-braid-txn-id makes a half message; a record to braid.txn decides one. Either goes
        # to its transaction's shard's owner when that is another node.
        mark = None
        outcome_ok = True
        elsewhere = None
        if topic in CONTROL_TOPICS:
            if topic == TXN_TOPIC:
                txn_id = outcome_txn_id(headers, subject, key)
                elsewhere = self._txn_elsewhere(txn_id)
                if elsewhere is None:
                    shard = self.shards.for_transaction(txn_id) if self._many else self.shard
                    result, outcome_ok = await shard.half_messages.apply(txn_id, body)
                    headers = [*headers, (RESULT_HEADER, result.encode())]
        elif headers:
            mark = half_mark(headers)
            if mark is not None:
                elsewhere = self._txn_elsewhere(mark.txn_id)
        if elsewhere is not None:
            there: RecordFields = {
                "key": key,
                "headers": headers,
                "tags": tags,
                "subject": subject,
                "client": client,
                "address": address,
                "protocol": protocol,
                "born_ms": born_ms,
            }
            return await self._publish_at_txn_owner(
                elsewhere, topic, chosen, body, there, half=mark is not None
            )
        destinations, refused = self.prepare_destinations(
            topic,
            chosen,
            subject,
            routing_headers,
            extra_destinations,
            key=key,
            protocol=protocol,
            address=address,
        )
        if not outcome_ok:
            refused = [*refused, (topic, chosen)]  # the outcome was not applied: nack it
        # The record's fields, whether it is stored as a half or as a plain record.
        fields: RecordFields = {
            "key": key,
            "headers": headers,
            "tags": tags,
            "subject": subject,
            "client": client,
            "address": address,
            "protocol": protocol,
            "born_ms": born_ms,
        }
        if mark is not None:
            appended = self._half_shard(mark, destinations).half_messages.add_half(
                mark, topic, chosen, body, destinations=destinations, **fields
            )
            await self._after_half(appended, topic, wait_durable)
            return PublishResult(appended, destinations, chosen, refused, half=True)
        if self._many:
            return await cross_shard.publish_across(
                self,
                topic,
                chosen,
                body,
                destinations,
                refused,
                flags=0,
                record_count=1,
                deliver_at_ms=deliver_at_ms,
                fields=fields,
                wait_durable=wait_durable,
            )
        appended = self.shard.store.append(
            topic,
            chosen,
            body,
            destinations=destinations if len(destinations) > 1 else None,
            deliver_at_ms=deliver_at_ms,
            **fields,
        )
        await self._after_append(appended, destinations, topic, wait_durable)
        return PublishResult(appended, destinations, chosen, refused)

    async def _after_append(
        self,
        appended: Appended,
        destinations: Sequence[Destination],
        topic: str,
        wait_durable: bool,
    ) -> None:
        """What every publish to one shard does once its record is stored: apply max-length
        (drop-head) on the ack queues it reached, then wait for the topic's durability."""
        ack_queues = self.shard.ack_queues
        for destination in destinations[1:]:
            ack_queue = ack_queues.get(destination)
            if ack_queue is not None and ack_queue.config.max_length is not None:
                ack_queue.enforce_max_length()
        if wait_durable:
            await self.shard.store.wait_durable(appended.end, topic)

    async def _after_half(self, appended: Appended, topic: str, wait_durable: bool) -> None:
        """A half message is indexed only in ``__half`` (its commit's LINK is what indexes it
        in its topic); a gateway that hands its own publishes to live subscribers checks
        ``PublishResult.half`` first (the MQTT hub does)."""
        if wait_durable:
            await self.when_durable(appended.end, topic)

    async def publish_batch(
        self,
        topic: str,
        queue: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int = 0,
        client: str = "",
        address: str = "",
        flags: int = 0,
        deliver_at_ms: int = 0,
        wait_durable: bool = True,
        braid_headers: bool | None = None,
    ) -> PublishResult:
        """Store a Kafka RecordBatch as one batch record in ``(topic, queue)``, indexed once;
        returns once durable (``wait_durable``) with the batch's base offset. With
        ``deliver_at_ms`` in the future the batch waits in ``__timers`` (offset known later).
        ``braid_headers=False``: the caller searched the batch and found no ``x-braid-`` header
        name in it (no tags, no half message), so it is not searched again here."""
        if self.flow.reasons:
            await self.flow.wait_unblocked()
        info = self.topic(topic)
        if not 0 <= queue < info.queues:
            raise TopicError("unknown_queue", f"topic {topic!r} has no queue {queue}")
        if braid_headers is None:
            braid_headers = may_carry_braid_headers(batch)
        mark = None
        outcome: tuple[str, bool] | None = None
        if topic == TXN_TOPIC:
            if self._many:
                outcome = await self._apply_outcome_batch(batch)
            else:
                outcome = await self.shard.half_messages.apply_batch(batch)
        elif braid_headers and topic not in CONTROL_TOPICS:
            mark = batch_half_mark(batch)
        destinations, headers = self.batch_destinations(topic, queue, batch)
        tags = batch_tags(batch) if braid_headers and batch_may_have_tags(batch) else []
        if mark is not None:
            appended = self._half_shard(mark, destinations).half_messages.add_half(
                mark,
                topic,
                queue,
                batch,
                key=None,
                headers=headers,
                tags=tags,
                subject="",
                client=client,
                address=address,
                destinations=destinations,
                protocol=rec.PROTOCOL_KAFKA,
                born_ms=born_ms,
                flags=flags | rec.FLAG_BATCH,
                record_count=record_count,
            )
            await self._after_half(appended, topic, wait_durable)
            return PublishResult(appended, destinations, queue, half=True)
        refused: list[Destination] = []
        if outcome is not None:
            headers = [*headers, (RESULT_HEADER, outcome[0].encode())]
            if not outcome[1]:
                refused.append((topic, queue))
        if self._many:
            return await cross_shard.publish_across(
                self,
                topic,
                queue,
                batch,
                destinations,
                refused,
                flags=flags | rec.FLAG_BATCH,
                record_count=record_count,
                deliver_at_ms=deliver_at_ms,
                fields={
                    "headers": headers,
                    "tags": tags,
                    "client": client,
                    "address": address,
                    "protocol": rec.PROTOCOL_KAFKA,
                    "born_ms": born_ms,
                },
                wait_durable=wait_durable,
            )
        appended = self.shard.store.append_batch(
            topic,
            queue,
            batch,
            record_count,
            born_ms=born_ms,
            client=client,
            address=address,
            flags=flags,
            destinations=destinations if len(destinations) > 1 else None,
            headers=headers,
            tags=tags,
            deliver_at_ms=deliver_at_ms,
        )
        await self._after_append(appended, destinations, topic, wait_durable)
        return PublishResult(appended, destinations, queue, refused)

    # -- publishing across shards (docs/cluster.md sections 2 and 6) ------------------------

    def _local_ack_queue(self, destination: Destination) -> AckQueue | None:
        shard = self.shards.local(self.shards.queue_number(*destination))
        return None if shard is None else shard.ack_queues.get(destination)

    def _txn_elsewhere(self, txn_id: str) -> int | None:
        """The number of the transaction ``txn_id``'s shard when another node serves it (its
        half messages and decisions go there: :meth:`_publish_at_txn_owner`), else None."""
        if not self._many or self.remote_txn is None:
            return None
        number = self.shards.placements.place(placement.PLACE_TXN, txn_id)
        return None if self.shards.local(number) is not None else number

    async def _publish_at_txn_owner(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        fields: RecordFields,
        *,
        half: bool,
    ) -> PublishResult:
        """Hand a half message or a decision to the owner of its transaction's shard
        (``RemoteTransactions``) and wait until it is durable there: ShardUnavailable when it
        was not stored (the gateway refuses the publish). Its durable mark is then this node's
        next, which nothing else holds up."""
        assert self.remote_txn is not None
        stored = await self.remote_txn.publish(shard, topic, queue, body, fields)
        offset = -1 if half else stored.offset
        result = PublishResult(
            Appended(-1, -1, [(topic, queue, offset)]), [(topic, queue)], queue, stored.refused
        )
        result.half = half
        result.sequence = self.marks.next()
        return result

    def _half_shard(self, mark: HalfMark, destinations: Sequence[Destination]) -> Shard:
        """The shard that keeps a half message of the transaction ``mark``: its transaction's
        (section 10). A commit there indexes the half with a LINK in that shard's log, so a
        half whose destinations sit in other shards is refused for now (the commit across
        shards of section 10 is step 7's)."""
        if not self._many:
            return self.shard
        shard = self.shards.for_transaction(mark.txn_id)
        elsewhere = [d for d in destinations if self.shards.queue_number(*d) != shard.number]
        if elsewhere:
            raise TopicError(
                "invalid_txn",
                f"transaction {mark.txn_id!r} is kept in shard {shard.number}, and "
                f"{elsewhere[0]} is in another: a transaction across shards is not supported yet",
            )
        return shard

    async def _apply_outcome_batch(self, batch: bytes | memoryview) -> tuple[str, bool]:
        """``HalfMessages.apply_batch`` over many shards: each outcome record applied by the
        shard of the transaction it names."""
        if batch_is_control(batch):
            return "", True
        results: list[str] = []
        ok = True
        for inner in unpack_batch(batch):
            txn_id = outcome_txn_id(inner.headers, inner_subject(inner.key, inner.headers), None)
            shard = self.shards.for_transaction(txn_id)
            result, applied = await shard.half_messages.apply(txn_id, inner.value)
            results.append(result)
            ok = ok and applied
        return "; ".join(results), ok

    def copy_elsewhere(
        self,
        shard: int,
        message: Message,
        destinations: list[Destination],
        headers: list[tuple[str, bytes]],
    ) -> list[Destination]:
        """``destinations`` of a dead letter in shard ``shard`` that a LINK there can index;
        the others get a copy (core/broker/cross_shard.py)."""
        if not self._many:
            return destinations
        return cross_shard.copy_elsewhere(self, shard, message, destinations, headers)

    def batch_destinations(
        self, topic: str, queue: int, batch: bytes | memoryview
    ) -> tuple[list[Destination], list[tuple[str, bytes]]]:
        """Route each record of a Kafka batch by its subject (``x-braid-routing-key`` header,
        else its key): the batch's destinations (its own queue first) and, when they differ per
        record, the ``x-braid-batch-select`` header saying which records each one takes. The
        batch is decoded only when the topic has bindings or route hooks; it is stored once."""
        own = (topic, queue)
        if not self.bindings.has_source(topic) and not self._hooks_may_route(topic):
            return [own], []
        if batch_is_control(batch):
            return [own], []
        records = unpack_batch(batch)
        taken: dict[Destination, list[int]] = {}
        for inner in records:
            subject = inner_subject(inner.key, inner.headers)
            routing_headers = (
                {name: value.decode("utf-8", "replace") for name, value in inner.headers}
                if inner.headers
                else None
            )
            destinations, _ = self.prepare_destinations(
                topic, queue, subject, routing_headers, key=inner.key, protocol=rec.PROTOCOL_KAFKA
            )
            for destination in destinations[1:]:
                taken.setdefault(destination, []).append(inner.offset_delta)
        select = {
            selection_key(*destination): deltas
            for destination, deltas in taken.items()
            if len(deltas) < len(records)
        }
        headers = [(BATCH_SELECT_HEADER, json.dumps(select).encode())] if select else []
        return [own, *taken], headers

    # -- long polling ----------------------------------------------------------------------

    async def wait_for_records(self, keys: Sequence[Destination], timeout_s: float) -> bool:
        """Long poll: True when any of ``keys`` got a new entry before ``timeout_s``."""
        if not self._many:
            return await self.shard.wait_for_records(keys, timeout_s)
        by_shard: dict[int, list[Destination]] = {}
        for key in keys:
            number = self.shards.queue_number(*key)
            if self.shards.local(number) is not None:
                by_shard.setdefault(number, []).append(key)
        if len(by_shard) <= 1:
            for number, local_keys in by_shard.items():
                return await self.shards[number].wait_for_records(local_keys, timeout_s)
            return False
        waits = [
            asyncio.ensure_future(self.shards[number].wait_for_records(local_keys, timeout_s))
            for number, local_keys in by_shard.items()
        ]
        try:
            for finished in asyncio.as_completed(waits):
                if await finished:
                    return True
            return False
        finally:
            for wait in waits:
                wait.cancel()

    # -- flow control ----------------------------------------------------------------------

    def check_flow(self) -> None:
        self.flow.check_memory()
        limit = self.config.backlog_high_watermark
        if limit is None:
            return
        behind = any(
            q.consumers and q.message_count() > limit
            for shard in self.shards
            for q in shard.ack_queues.values()
        )
        self.flow.set_pressure("backlog", behind)
