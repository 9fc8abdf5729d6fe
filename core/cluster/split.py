"""SplitMetadata: a cluster node's :class:`~core.cluster.metadata.MetadataStore`, the
cluster-wide definitions in the cluster's store and the shard-local kinds in the shard's own log
(docs/cluster.md sections 3 and 4).

Cluster-wide (Redis on a cluster: every node sees them): topics, bindings, queue definitions,
security, limits. Shard-local (:data:`SHARD_LOCAL_KINDS`, the shard's ``__meta`` as on a single
node): redrive intents, whose crash safety needs them in the same log as the redrive's LINKs
(core/deadletter/redrive.py), and the gateways' small settings (Kafka producer-id blocks,
transactional ids, group tag filters), which live with the shard that serves them.

Versions count the applies through this object that changed something, as
:class:`~core.cluster.local.LocalMetadata` does, and :meth:`SplitMetadata.watch` replays those;
changes other nodes make to the cluster store reach this node through that store's own watch
(what a node that follows other nodes' declares uses, step 6 of section 15), not through this
one. Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Final

from core.cluster.local import LocalMetadata
from core.cluster.metadata import (
    KIND_REDRIVE,
    KIND_SETTING,
    Change,
    ChangeBacklog,
    Expectation,
    MetadataStore,
    Versioned,
)

SHARD_LOCAL_KINDS: Final = frozenset({KIND_REDRIVE, KIND_SETTING})


class SplitMetadata:
    def __init__(self, cluster: MetadataStore, local: LocalMetadata) -> None:
        self.cluster = cluster
        self.local = local
        self._changes = ChangeBacklog()

    def store_of(self, kind: str) -> MetadataStore:
        """Where ``kind`` lives: the shard's log for :data:`SHARD_LOCAL_KINDS`, else the
        cluster's store."""
        return self.local if kind in SHARD_LOCAL_KINDS else self.cluster

    # -- reading ---------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._changes.version

    @property
    def durable_mark(self) -> int:
        """The shard log's position after its last metadata change (a Broker API durable
        mark). A change to the cluster's store is durable when its apply returns (Redis with
        ``WAIT`` where it has replicas), so only the shard-local ones have a position to wait
        for."""
        return self.local.durable_mark

    def get(self, kind: str, key: str) -> bytes | None:
        return self.store_of(kind).get(kind, key)

    def items(self, kind: str) -> Iterator[tuple[str, bytes]]:
        return self.store_of(kind).items(kind)

    # -- changes ---------------------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, expect: Expectation | None = None) -> int:
        """Apply ``changes`` in the one store that holds their kinds (all or none, as that
        store applies them); a call mixing shard-local and cluster-wide kinds is refused with
        ``ValueError``: two stores cannot apply it atomically, and no caller needs it."""
        kinds = [change.kind for change in changes] + [kind for kind, _ in (expect or {})]
        if not kinds:
            return self._changes.version
        stores = {id(self.store_of(kind)): self.store_of(kind) for kind in kinds}
        if len(stores) > 1:
            raise ValueError(
                f"one apply changes shard-local kinds ({', '.join(sorted(SHARD_LOCAL_KINDS))}) "
                f"or cluster-wide ones, not both: {sorted(set(kinds))}"
            )
        (store,) = stores.values()
        before = store.version
        after = await store.apply(changes, expect=expect)
        if after == before:
            return self._changes.version  # nothing changed (deleting absent keys)
        return self._changes.record(changes)

    async def wait_durable(self, version: int) -> None:
        """Every change so far durable in both stores (which covers ``version``)."""
        if version <= 0:
            return
        await self.local.wait_durable(self.local.version)
        await self.cluster.wait_durable(self.cluster.version)

    def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        """The changes applied through this object after ``from_version`` (module
        docstring: not other nodes')."""
        return self._changes.watch(from_version)
