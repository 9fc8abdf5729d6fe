"""SplitMetadata: a cluster node's :class:`~core.cluster.metadata.MetadataStore`, the
cluster-wide definitions in the cluster's store and the shard-local kinds in the shard's own log
(docs/cluster.md sections 3 and 4).

Cluster-wide (Redis on a cluster: every node sees them): topics, bindings, queue definitions,
security, limits. Shard-local (:data:`SHARD_LOCAL_KINDS`, the shard's ``__meta`` as on a single
node): redrive intents, whose crash safety needs them in the same log as the redrive's LINKs
(core/deadletter/redrive.py), and the gateways' small settings (Kafka producer-id blocks,
transactional ids, group tag filters), which live with the shard that serves them.

Versions are this object's own, dense: one per shard-local apply that changed something, and
one per version of the cluster's store, its own applies and other nodes' alike, in the order
that store applied them (a task follows the cluster store's watch from the version it had when
this object was made). :meth:`SplitMetadata.watch` yields all of them once each, and
:meth:`SplitMetadata.made_here` tells this node's changes from other nodes' (what
core/cluster/follow.py applies to the registries, step 6 of section 15). An apply of a cluster
kind returns once that task has recorded it, so its version is the one watchers see. When the
cluster store cannot replay (it reloaded: a trimmed stream, a failover), this object records a
version without changes and every watch open across it raises
:class:`~core.cluster.metadata.MetadataGap`. Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Final, Protocol, runtime_checkable

from core.cluster.local import LocalMetadata
from core.cluster.metadata import (
    KIND_REDRIVE,
    KIND_SETTING,
    WATCH_BACKLOG,
    Change,
    ChangeBacklog,
    Expectation,
    MetadataGap,
    MetadataStore,
    Versioned,
)

SHARD_LOCAL_KINDS: Final = frozenset({KIND_REDRIVE, KIND_SETTING})
RETRY_S: Final = 0.5  # after a failed read of the cluster store's changes (a lost connection)

log = logging.getLogger(__name__)


@runtime_checkable
class _TellsOwnChanges(Protocol):
    """A cluster store that knows which of its versions its own applies made
    (:meth:`core.cluster.redis_metadata.RedisMetadata.made_here`). One that does not is
    written by nobody else, so all of its versions are this node's."""

    def made_here(self, version: int) -> bool: ...


class SplitMetadata:
    def __init__(self, cluster: MetadataStore, local: LocalMetadata) -> None:
        self.cluster = cluster
        self.local = local
        self._changes = ChangeBacklog()
        # This object's versions made by this node (the last WATCH_BACKLOG: a watcher further
        # behind gets MetadataGap anyway).
        self._own: deque[int] = deque()
        self._own_set: set[int] = set()
        # The cluster store's version this object has recorded through (the follow task).
        self._cluster_seen = cluster.version
        self._group: list[Versioned] = []  # the cluster version being recorded
        self._flush_scheduled = False
        self._follow_task: asyncio.Task[None] | None = None
        self._recorded: list[asyncio.Future[None]] = []  # applies waiting for the task

    async def aclose(self) -> None:
        """Stop following the cluster store (it also stops when that store closes)."""
        task, self._follow_task = self._follow_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wake_recorded()

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
        if store is self.local:
            before = store.version
            after = await store.apply(changes, expect=expect)
            if after == before:
                return self._changes.version  # nothing changed (deleting absent keys)
            return self._mark_own(self._changes.record(changes))
        self._start_following()
        after = await store.apply(changes, expect=expect)
        # Its version is the one the follow task records for it (or the one it has
        # recorded through, when nothing changed).
        while self._cluster_seen < after and not self._follow_stopped():
            waiter = asyncio.get_running_loop().create_future()
            self._recorded.append(waiter)
            await waiter
        return self._changes.version

    async def wait_durable(self, version: int) -> None:
        """Every change so far durable in both stores (which covers ``version``)."""
        if version <= 0:
            return
        await self.local.wait_durable(self.local.version)
        await self.cluster.wait_durable(self.cluster.version)

    def made_here(self, version: int) -> bool:
        """Whether this node's apply made ``version`` (False for other nodes' changes, and
        for versions too old to tell)."""
        return version in self._own_set

    async def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        """Every change after ``from_version``, this node's and other nodes', in version
        order, then each new one (module docstring)."""
        self._start_following()
        async for entry in self._changes.watch(from_version):
            yield entry

    # -- following the cluster store --------------------------------------------------------

    def _mark_own(self, version: int) -> int:
        self._own.append(version)
        self._own_set.add(version)
        while len(self._own) > WATCH_BACKLOG:
            self._own_set.discard(self._own.popleft())
        return version

    def _start_following(self) -> None:
        if self._follow_task is None:
            self._follow_task = asyncio.get_running_loop().create_task(
                self._follow(), name="braid-split-metadata"
            )

    def _follow_stopped(self) -> bool:
        return self._follow_task is None or self._follow_task.done()

    async def _follow(self) -> None:
        """Record every version of the cluster store as one of this object's, in order."""
        try:
            while True:
                try:
                    async for entry in self.cluster.watch(self._cluster_seen):
                        if self._group and self._group[0].version != entry.version:
                            self._flush()
                        self._group.append(entry)
                        if not self._flush_scheduled:
                            # The rest of a version comes in this same step: record it whole
                            # once the watch suspends.
                            self._flush_scheduled = True
                            asyncio.get_running_loop().call_soon(self._flush)
                    return  # the cluster store closed
                except MetadataGap:
                    self._flush()
                    self._cluster_seen = self.cluster.version  # reloaded: start again there
                    self._changes.lose()
                    self._wake_recorded()
                except Exception:  # a read of the store's history failed: try again
                    self._flush()
                    log.exception("following the cluster's metadata failed; again in %s s", RETRY_S)
                    await asyncio.sleep(RETRY_S)
        finally:
            self._wake_recorded()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._group:
            return
        group, self._group = self._group, []
        cluster_version = group[0].version
        version = self._changes.record([entry.change for entry in group])
        made_here = self.cluster.made_here if isinstance(self.cluster, _TellsOwnChanges) else None
        if made_here is None or made_here(cluster_version):
            self._mark_own(version)
        self._cluster_seen = cluster_version
        self._wake_recorded()

    def _wake_recorded(self) -> None:
        waiters, self._recorded = self._recorded, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
