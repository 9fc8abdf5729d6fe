"""MetadataStore: the only way the core reads and changes cluster-wide definitions
(docs/cluster.md section 4).

A definition is a ``(kind, key) -> value`` entry: ``value`` is the bytes of its JSON (a topic's
queue count and config, a binding, a queue's arguments, a user, a limit, ...). Every change goes
through :meth:`MetadataStore.apply`, which applies a list of :class:`Change` at once and returns
the store's new *version*: versions are dense and grow by one per applied call, so a reader that
has seen version ``v`` can :meth:`~MetadataStore.watch` from ``v`` and miss nothing.

Implementations: :class:`core.cluster.local.LocalMetadata` (the single node: the DurableTables
``__meta``/``__security``/``__limits`` of its log, unchanged on disk) and, with issue 22's step
4, a Redis one. Lookups on hot paths (publish routing) never call this interface: the owners
(topic registry, binding table, security and limits stores) keep in-memory dicts built from
:meth:`~MetadataStore.items` at start and updated by what they apply. Leases, shard claims and id
blocks join the interface with the Redis implementation (section 15 step 4).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

# Kinds of definitions (Redis ``def:<kind>`` hashes in section 4). The single node's on-disk
# table and key prefix of each is core/cluster/local.py's layout.
KIND_TOPIC: Final = "topic"  # topic name -> {"queues": N, "config": {...}}
KIND_BINDING: Final = "binding"  # JSON identity -> {"source", "kind", "pattern", ...}
KIND_QUEUE: Final = "queue"  # "topic\0queue" -> an ack queue's {"topic", "queue", "config"}
# Dead-letter queue -> a redrive's intent. Shard state rather than a definition: its crash
# safety needs it in the same log as the redrive's LINKs (core/deadletter/redrive.py), so the
# Shard of step 2 keeps it when metadata moves to Redis.
KIND_REDRIVE: Final = "redrive"
KIND_SETTING: Final = "setting"  # a gateway's small durable settings (Kafka tag filters, ...)
KIND_SECURITY: Final = "security"  # JSON array key (core/security/store.py) -> JSON
KIND_LIMIT: Final = "limit"  # JSON ["user"|"vhost", name] -> {"max-connections": N, ...}


@dataclass(frozen=True, slots=True)
class Change:
    """Set ``key`` of ``kind`` to ``value``; a ``None`` value deletes it."""

    kind: str
    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Versioned:
    """A change as :meth:`MetadataStore.watch` yields it: the version that applied it."""

    version: int
    change: Change


class MetadataConflict(Exception):
    """An :meth:`MetadataStore.apply` whose ``expect`` did not hold: nothing was applied.
    ``kind`` and ``key`` name the first entry that differed (AMQP answers a conflicting
    declare with 406 PRECONDITION_FAILED, as RabbitMQ)."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"metadata {kind} {key!r} is not what the change expected")
        self.kind = kind
        self.key = key


class MetadataGap(Exception):
    """:meth:`MetadataStore.watch` cannot replay from the version asked: the changes after it
    are no longer kept. The watcher reloads with :meth:`MetadataStore.items` (section 4's
    "trimmed past it, reload everything")."""


# ``expect`` of apply: (kind, key) -> the value it must have now (None: it must be absent).
Expectation = Mapping[tuple[str, str], bytes | None]


class MetadataStore(Protocol):
    @property
    def version(self) -> int:
        """The version of the last applied change (0: none since the store was opened)."""
        ...

    def get(self, kind: str, key: str) -> bytes | None:
        """The value of ``key``, None when absent."""
        ...

    def items(self, kind: str) -> Iterator[tuple[str, bytes]]:
        """Every ``(key, value)`` of ``kind`` (a snapshot: applying while iterating is safe)."""
        ...

    async def apply(self, changes: Sequence[Change], *, expect: Expectation | None = None) -> int:
        """Apply ``changes`` in order, all or none (:class:`MetadataConflict` when ``expect``
        does not hold); returns the new version. Changes that change nothing (deleting an
        absent key) are left out; when none is left the version stays. Awaitable because a
        cluster's store answers over the network (a Redis round trip); the single node's
        completes without suspending, so its callers run it eagerly
        (core/broker/eager.py) and pay no loop turn."""
        ...

    async def wait_durable(self, version: int) -> None:
        """Return once every change up to ``version`` survives a crash."""
        ...

    def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        """Every change after ``from_version``, in order, then each new one as it is applied
        (:class:`MetadataGap` when those after ``from_version`` are no longer kept)."""
        ...


# Changes a ChangeBacklog keeps for watch(). Small: nothing on a node watches its own store from
# far back (a watcher further behind reloads: MetadataGap), and each kept change holds its value.
WATCH_BACKLOG: Final = 1024


class ChangeBacklog:
    """The version counter and the last :data:`WATCH_BACKLOG` changes of a store that keeps its
    history in memory (:class:`~core.cluster.local.LocalMetadata`,
    :class:`~core.cluster.split.SplitMetadata`), and their :meth:`MetadataStore.watch`."""

    def __init__(self) -> None:
        self.version = 0
        self._backlog: deque[Versioned] = deque()
        self._dropped_through = 0  # the newest version of which a change left the backlog
        self._waiters: list[asyncio.Future[None]] = []

    def record(self, changes: Sequence[Change]) -> int:
        """``changes`` applied as one new version (none: the version stays); wakes watchers."""
        if not changes:
            return self.version
        self.version += 1
        for change in changes:
            self._backlog.append(Versioned(self.version, change))
        while len(self._backlog) > WATCH_BACKLOG:
            self._dropped_through = self._backlog.popleft().version
        self._wake()
        return self.version

    def lose(self) -> int:
        """A new version whose changes are not known (the store under it reloaded instead of
        replaying): every watcher from before it gets :class:`MetadataGap`."""
        self.version += 1
        self._backlog.clear()
        self._dropped_through = self.version
        self._wake()
        return self.version

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        seen = from_version
        while True:
            if seen < self._dropped_through:
                raise MetadataGap(f"changes after version {seen} are no longer kept")
            pending = [entry for entry in self._backlog if entry.version > seen]
            if not pending:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            for entry in pending:
                seen = entry.version
                yield entry
