"""Who owns which shard, as a cluster node's forwarding needs it (docs/cluster.md sections 6-7).

- :class:`ViewOwners`: :class:`~core.broker.remote.ShardOwners` for the node's
  :class:`~core.cluster.rpc.forward.Forwarder`, over the node's
  :class:`~core.cluster.kafka_view.MembershipView` (which reads the live nodes and the ownership
  table every heartbeat for its Kafka clients already: one reading of Redis serves both). A
  :meth:`ViewOwners.refresh` (after a ``NOT_OWNER`` answer or a broken stream) reads Redis again
  now; refreshes asked for meanwhile, for any shard, wait for that same reading.
- :class:`ServedShards`: :class:`~core.cluster.rpc.append.LocalShards` for the node's
  :class:`~core.cluster.rpc.append.AppendReceiver`: the shards this node serves, each with the
  epoch it owns it at, and which destinations refuse a new record (reject-publish).

Not thread-safe: the node's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from core.broker.remote import Destination, OwnerAddress
from core.cluster.rpc.append import ShardLog
from core.delivery.ackqueue import AckQueue


class OwnerTable(Protocol):
    """What :class:`ViewOwners` reads (:class:`~core.cluster.kafka_view.MembershipView`)."""

    def owner_address(self, shard: int) -> OwnerAddress | None: ...

    async def refresh(self) -> None: ...


class ViewOwners:
    """:class:`~core.broker.remote.ShardOwners` over ``view`` (module docstring)."""

    def __init__(self, view: OwnerTable) -> None:
        self._view = view
        self._reading: asyncio.Future[None] | None = None

    def owner_of(self, shard: int) -> OwnerAddress | None:
        return self._view.owner_address(shard)

    async def refresh(self, shard: int) -> OwnerAddress | None:
        reading = self._reading
        if reading is None:
            reading = self._reading = asyncio.ensure_future(self._view.refresh())
            reading.add_done_callback(self._done)
        # Shielded: one caller cancelled must not cancel the reading the others wait for.
        await asyncio.shield(reading)
        return self._view.owner_address(shard)

    def _done(self, reading: asyncio.Future[None]) -> None:
        if self._reading is reading:
            self._reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved: each waiter sees it raised


class ServedShard(Protocol):
    """What :class:`ServedShards` needs of a node's shard (core/broker/shard.py's Shard)."""

    @property
    def store(self) -> ShardLog: ...

    @property
    def ack_queues(self) -> Mapping[Destination, AckQueue]: ...


class ServedShards:
    """:class:`~core.cluster.rpc.append.LocalShards` over the node's shards: ``local(n)`` is
    shard ``n`` when this node serves it (``ShardSet.local``), ``epochs()`` the epoch this
    node owns each one at (``ClusterNode.owned``, read at each call: it changes only by a
    rejoin, which serves a new node)."""

    def __init__(
        self,
        local: Callable[[int], ServedShard | None],
        epochs: Callable[[], Mapping[int, int]],
    ) -> None:
        self._local = local
        self._epochs = epochs

    def shard(self, number: int) -> tuple[ShardLog, int] | None:
        served = self._local(number)
        epoch = self._epochs().get(number)
        # A closed store (the node drains or stops, or dropped it at a fence) is not served: a
        # record appended to it would land after its clean-close marker, unanswered (its
        # durability wait fails), and the origin's resend to the next owner would store it
        # twice.
        if served is None or epoch is None or getattr(served.store, "closed", False):
            return None
        return served.store, epoch

    def refused(self, shard: int, destinations: Sequence[Destination]) -> list[Destination]:
        served = self._local(shard)
        if served is None:
            return []
        ack_queues = served.ack_queues
        refused: list[Destination] = []
        for destination in destinations:
            queue = ack_queues.get(destination)
            if queue is not None and queue.would_overflow():
                refused.append(destination)
        return refused
