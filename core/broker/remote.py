"""The seam between a node's publish path and shards owned by other nodes (docs/cluster.md
sections 6 and 7).

``core.broker`` must not import the gRPC layer (``core.cluster.rpc`` sits above it), so the
node holds a :class:`RemoteAppend` and :class:`ShardOwners`; ``core.cluster.rpc.forward``
implements them over ``Append`` streams and the ownership table in Redis.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from core.transactions.service import RecordFields

Destination = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OwnerAddress:
    """Who owns a shard now: the node id (an int, as Kafka's broker ids), the address of its
    gRPC server (``host:port``) and the epoch of its claim."""

    node: int
    rpc_address: str
    epoch: int


class ShardOwners(Protocol):
    """The ownership table as a node sees it (Redis ``shard:<n>`` hashes and live leases)."""

    def owner_of(self, shard: int) -> OwnerAddress | None:
        """The cached owner, or None when the shard has no live owner."""
        ...

    async def refresh(self, shard: int) -> OwnerAddress | None:
        """Read the owner again (after a NOT_OWNER answer or a broken stream)."""
        ...


class ForwardResult(NamedTuple):
    """A forwarded record, durable on its shard's owner: its offset in the record's own queue
    there (-1 for a copy, which is not indexed in it) and the destinations that refused it."""

    offset: int
    refused: list[Destination]


class RemoteAppend(Protocol):
    def forward(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        txn: str = "",
        record_count: int = 1,
        flags: int = 0,
    ) -> Awaitable[ForwardResult]:
        """Send one routed record to the owner of ``shard``, which indexes it in
        ``destinations`` (all in that shard). ``copy``: the shard is not the home of
        ``(topic, queue)`` (FLAG_COPY, so readers of the whole root count the record once).
        ``record_count`` and ``flags``: a Kafka batch's (``FLAG_BATCH``, its records' count).
        Called synchronously in publish order; records for one shard keep that order. The
        awaitable resolves once the record is durable there, or raises
        :class:`core.errors.ShardUnavailable` (no live owner, or it did not answer within
        ``unavailable_wait_ms``)."""
        ...
