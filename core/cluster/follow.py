"""MetadataFollower: a cluster node's in-memory registries follow the definitions other nodes
change (docs/cluster.md section 4 "Caching", step 6 of section 15).

Each registry loads its kind from the metadata at start (the topic registry, the binding
table, the Node's queue definitions, the security and limits stores) and afterwards changes
through its own node's calls only. The follower watches
:meth:`~core.cluster.split.SplitMetadata.watch` and hands every change another node made to the
registry of its kind, through that registry's ``apply_remote(key, value)`` (queue definitions:
the Node's ``on_queue(key, value)``). Changes this node made are skipped
(:meth:`~core.cluster.split.SplitMetadata.made_here`): its own call applied them already.

What a registry is given is the key's value in the store *now*, not the value the change
carried: the store's cache can be ahead of the watch (it installs versions before the watch
yields them, and this node's own change of the same key may have come after), and the current
value is what the registry must end with. So a registry's ``apply_remote`` must be idempotent:
given a key's value, make the entry that, as loading it at start would. When the watch reports
a gap (:class:`~core.cluster.metadata.MetadataGap`: the cluster store reloaded instead of
replaying), every followed key is given again, and the keys that disappeared are given None;
for that the follower keeps the set of keys of each kind it follows.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from core.cluster.metadata import (
    KIND_BINDING,
    KIND_LIMIT,
    KIND_QUEUE,
    KIND_SECURITY,
    KIND_TOPIC,
    MetadataGap,
)
from core.cluster.split import SplitMetadata

log = logging.getLogger(__name__)


class FollowsRemote(Protocol):
    """A registry that takes a change another node made: ``value`` is the key's value in the
    store (None: deleted). Idempotent (module docstring)."""

    def apply_remote(self, key: str, value: bytes | None) -> object: ...


class QueueDefinitions(Protocol):
    """The Node's queue definitions (kind ``queue``, key ``topic\\0queue``): make the ack
    queue ``value`` defines (None: close it), as loading it at start would; idempotent. May
    return an awaitable, which the follower awaits before the next change."""

    def on_queue(self, key: str, value: bytes | None) -> Awaitable[None] | None: ...


Apply = Callable[[str, bytes | None], object]


class MetadataFollower:
    def __init__(
        self,
        metadata: SplitMetadata,
        *,
        topics: FollowsRemote | None = None,
        bindings: FollowsRemote | None = None,
        queues: QueueDefinitions | None = None,
        security: FollowsRemote | None = None,
        limits: FollowsRemote | None = None,
        from_version: int | None = None,
    ) -> None:
        """Follow ``metadata`` into the registries given. ``from_version``: the version the
        registries were loaded at (default: ``metadata``'s now; an earlier one only gives
        some changes again, which the registries take idempotently)."""
        self.metadata = metadata
        targets: dict[str, Apply | None] = {
            KIND_TOPIC: topics.apply_remote if topics is not None else None,
            KIND_BINDING: bindings.apply_remote if bindings is not None else None,
            KIND_QUEUE: queues.on_queue if queues is not None else None,
            KIND_SECURITY: security.apply_remote if security is not None else None,
            KIND_LIMIT: limits.apply_remote if limits is not None else None,
        }
        self._targets = {kind: apply for kind, apply in targets.items() if apply is not None}
        # The keys of each followed kind the store held, as of the last change seen: what a
        # reload after a gap compares with to find the deleted ones.
        self._keys = {kind: {key for key, _ in metadata.items(kind)} for kind in self._targets}
        self.version = metadata.version if from_version is None else from_version
        self.applied = 0  # other nodes' changes given to a registry (a metric, and for tests)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="braid-metadata-follower"
            )

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                async for entry in self.metadata.watch(self.version):
                    change = entry.change
                    if change.kind in self._targets:
                        if self.metadata.made_here(entry.version):
                            self._note(change.kind, change.key, change.value)
                        else:
                            await self._give(change.kind, change.key)
                    self.version = entry.version
                return
            except MetadataGap:
                self.version = self.metadata.version
                log.warning("metadata watch lost changes: giving every definition again")
                await self._reload()

    def _note(self, kind: str, key: str, value: bytes | None) -> None:
        if value is None:
            self._keys[kind].discard(key)
        else:
            self._keys[kind].add(key)

    async def _give(self, kind: str, key: str) -> None:
        """Give the registry of ``kind`` the current value of ``key``."""
        value = self.metadata.get(kind, key)
        self._note(kind, key, value)
        try:
            result = self._targets[kind](key, value)
            if inspect.isawaitable(result):
                await result
        except Exception:  # one entry a registry cannot take must not stop the others
            log.exception("could not apply another node's %s %r", kind, key)
        self.applied += 1

    async def _reload(self) -> None:
        for kind in self._targets:
            current = {key for key, _ in self.metadata.items(kind)}
            for key in sorted(self._keys[kind] - current):
                await self._give(kind, key)
            for key in sorted(current):
                await self._give(kind, key)
