"""ShardSet: shard number -> the :class:`~core.broker.shard.Shard` that serves it on this node
(docs/cluster.md sections 3 and 6), and :class:`DurableMarks`: when what a publish wrote to
several shards is durable.

A node serves some of its cluster's ``count`` shards (all of them when it is the only node).
The lookups name what is being placed (a queue, a consumer group, a session, a transaction);
with one shard (a single node, a root of one shard) every lookup answers it at no cost. With
several, a lookup resolves the thing's shard by :class:`~core.cluster.placement.Placements`
(the recorded placement, else the rule of its kind) and answers the local shard, or raises
:class:`~core.errors.ShardUnavailable` for a shard this node does not serve (step 6 of section
15 plugs shards of other nodes in behind :meth:`ShardSet.local`).

Kinds: a destination ``(topic, queue)`` (a Kafka partition, an AMQP queue, an MQTT session's or
``$share`` group's queue: the core sees them all as queues of topics) is placed by the
partition rule ``(h(topic) + queue) % S``; consumer groups, MQTT session states and
transactions by the hash of their id. Section 3 places an AMQP queue by ``vhost\\0name`` and a
session queue by its client id; the core does not know the gateways' names, so here they are
placed as the topic queues they are (the records, written at creation, keep every node in
agreement whatever the rule).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from core.broker.remote import ForwardResult
from core.cluster import placement
from core.errors import ShardUnavailable

if TYPE_CHECKING:  # (annotations only: shard.py does not import this module)
    from core.broker.shard import Shard

# Destinations whose shard is remembered (a dict lookup on the publish path instead of a hash
# of the topic name); cleared whole when full, as the log store's head caches are.
CACHED_PLACEMENTS = 65536


class ShardSet:
    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        count: int | None = None,
        placements: placement.Placements | None = None,
    ) -> None:
        """``shards``: the local shards, each with its ``number``; ``count``: how many shards
        the cluster has (default: as many as given, numbered 0..n-1); ``placements``: the
        recorded placements (default: none recorded, the rules)."""
        count = len(shards) if count is None else count
        numbers = [shard.number for shard in shards]
        if (
            not shards
            or len(set(numbers)) != len(numbers)
            or not all(0 <= number < count for number in numbers)
        ):
            raise ValueError(f"local shards must be distinct numbers in 0..{count - 1}: {numbers}")
        self.count = count
        self.placements = placements or placement.Placements(count)
        if self.placements.shards != count:
            raise ValueError(f"placements over {self.placements.shards} shards, not {count}")
        self._local: dict[int, Shard] = {shard.number: shard for shard in shards}
        self._shards = tuple(sorted(shards, key=lambda shard: shard.number))
        # One shard: every lookup is it (the single node's publish path never looks up).
        self.single = count == 1
        # What has no placement yet (the log's settings and directory, the live feed, the
        # retained messages) is the lowest local shard's; section 3 gives retained slots
        # shards of their own.
        self.home = self._shards[0]
        self._queue_numbers: dict[tuple[str, int], int] = {}

    def __getitem__(self, number: int) -> Shard:
        """The local shard ``number``; :class:`ShardUnavailable` when this node does not
        serve it."""
        shard = self._local.get(number)
        if shard is None:
            raise ShardUnavailable(number, reason="not served by this node")
        return shard

    def add(self, shard: Shard) -> None:
        """Serve ``shard`` from now on (taken over from a node that died, issue 23). The home
        shard stays the one the node started with: its metadata and live feed are over it."""
        number = shard.number
        if not 0 <= number < self.count or number in self._local:
            raise ValueError(f"shard {number} is served already or not in 0..{self.count - 1}")
        self._local[number] = shard
        self._shards = tuple(sorted((*self._shards, shard), key=lambda s: s.number))

    def local(self, number: int) -> Shard | None:
        """The local shard ``number``, or None when another node serves it."""
        return self._local.get(number)

    def __iter__(self) -> Iterator[Shard]:
        """The shards this node serves, by number."""
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    # -- placement (section 3) -------------------------------------------------------------

    def queue_number(self, topic: str, queue: int) -> int:
        """The shard number of ``(topic, queue)``, local or not."""
        if self.single:
            return self.home.number
        key = (topic, queue)
        number = self._queue_numbers.get(key)
        if number is None:
            if len(self._queue_numbers) >= CACHED_PLACEMENTS:
                self._queue_numbers.clear()
            number = self._queue_numbers[key] = self.placements.place(
                placement.PLACE_PARTITION, placement.partition_key(topic, queue)
            )
        return number

    def record_queue(self, topic: str, queue: int, number: int) -> None:
        """``(topic, queue)`` was placed in shard ``number`` (its record applied)."""
        self.placements.record(
            placement.PLACE_PARTITION, placement.partition_key(topic, queue), number
        )
        self._queue_numbers.pop((topic, queue), None)

    def forget_queue(self, topic: str, queue: int) -> None:
        """``(topic, queue)`` was deleted: its placement goes with it."""
        self.placements.forget(placement.PLACE_PARTITION, placement.partition_key(topic, queue))
        self._queue_numbers.pop((topic, queue), None)

    def _placed(self, kind: str, name: str) -> Shard:
        if self.single:
            return self.home
        return self[self.placements.place(kind, name)]

    def for_queue(self, topic: str, queue: int) -> Shard:
        """The shard of ``(topic, queue)``: a Kafka partition, an AMQP queue, an MQTT session's
        or ``$share`` group's queue."""
        if self.single:
            return self.home
        return self[self.queue_number(topic, queue)]

    def for_group(self, group_id: str) -> Shard:
        """The shard of a Kafka consumer group (its coordinator and committed offsets)."""
        return self._placed(placement.PLACE_GROUP, group_id)

    def for_session(self, client_id: str) -> Shard:
        """The shard of an MQTT client's persistent session state."""
        return self._placed(placement.PLACE_SESSION, client_id)

    def for_transaction(self, transaction_id: str) -> Shard:
        """The shard of a transaction's half messages and their commit or rollback."""
        return self._placed(placement.PLACE_TXN, transaction_id)


class DurableMarks:
    """Durable marks across the shards of a node (docs/cluster.md section 6).

    With one shard a mark is a position in its log and the store waits for it (this class is
    not on that path). With several, a publish stores a record in each local shard its
    destinations sit in and forwards it to the others' owners, so no one position says when
    it is durable: its mark is then :meth:`next`, a node-local sequence number that only
    grows, and :meth:`wait` makes durable everything every local shard holds when it is called
    (which covers every record stored before: a mark is handed out after its appends) and
    waits for the forwards of every publish up to the mark. A mark from another source (a
    metadata change's position in the lowest shard's log) is covered the same way, so a
    gateway's ``max`` of marks stays right.

    A forward that failed (:class:`~core.errors.ShardUnavailable`) fails the wait for its own
    mark; an earlier one does not fail a later publish's wait (its own publisher was told).
    """

    def __init__(self, shards: ShardSet) -> None:
        self._shards = shards
        self._sequence = 0
        # sequence -> the forwards of that publish still in flight (every node-local mark up
        # to the sequence waits for them)
        self._forwards: dict[int, list[asyncio.Future[ForwardResult]]] = {}

    def next(self) -> int:
        self._sequence += 1
        return self._sequence

    def add_forwards(self, mark: int, forwards: list[asyncio.Future[ForwardResult]]) -> None:
        """``forwards`` (futures of the remote appends of the publish ``mark``) in flight."""
        self._forwards[mark] = forwards
        remaining = [len(forwards)]

        def done(_: asyncio.Future[ForwardResult]) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                self._forwards.pop(mark, None)

        for future in forwards:
            future.add_done_callback(done)

    def is_durable(self, mark: int, topic: str | None = None) -> bool:
        """Whether :meth:`wait` would return at once."""
        for shard in self._shards:
            store = shard.store
            log = store.commitlog
            if log.flushed_position < log.write_position and (
                topic is None or store.is_sync(topic)
            ):
                return False
        return not any(sequence <= mark for sequence in self._forwards)

    async def wait(self, mark: int, topic: str | None = None) -> None:
        """Everything stored so far in the local shards, and every forward of the publishes up
        to ``mark``, durable at ``topic``'s durability (class docstring)."""
        for shard in self._shards:
            store = shard.store
            await store.wait_durable(store.commitlog.write_position, topic)
        for sequence, forwards in list(self._forwards.items()):
            if sequence < mark:
                await asyncio.gather(*forwards, return_exceptions=True)
            elif sequence == mark:
                await asyncio.gather(*forwards)
