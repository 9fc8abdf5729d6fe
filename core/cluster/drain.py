"""Planned moves (issue 23 item 4): ``braid cluster drain NODE`` asks a node to hand its shards
over and stay up owning nothing (a standby), e.g. before a rolling restart.

The request is a key in the cluster's Redis, ``drain:<node>`` (the time asked, ms), set by the
command line (:func:`request_drain`). The node polls it every heartbeat (:class:`DrainWatch`:
one ``EXISTS`` on a client of its own) and, when it appears, leaves as a clean stop does: its
listeners close (clients reconnect elsewhere: Kafka clients refresh their metadata and find
the new leaders, AMQP clients get 320 CONNECTION_FORCED), every shard is closed after its last
fsync and marked closed at its epoch (the next owner opens it with no recovery to do), and its
lease is released. The other nodes see the lease gone and take the shards over by the
takeover plan, each at the recorded epoch + 1. Once no shard is recorded as the node's
(:func:`owned_by`), it deletes the key and joins again as a new incarnation: the shards have
live owners now, so it claims none and waits as a standby (it takes shards over when a node
dies, as any standby).

Needs ``[cluster] takeover`` on the other nodes (else nobody takes the shards: after
:data:`HANDOVER_WAIT_MS` the node joins again and claims its shards back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from redis.asyncio import Redis

from core.cluster.redis_metadata import _Keys

log = logging.getLogger(__name__)

# How long a draining node waits for the others to take its shards before it claims them back.
HANDOVER_WAIT_MS: Final = 60_000
HANDOVER_POLL_S: Final = 0.1


def drain_key(cluster_id: str, node: str) -> str:
    return _Keys(cluster_id).prefix + f"drain:{node}"


async def request_drain(redis: Redis, cluster_id: str, node: str) -> None:
    """Ask ``node`` to hand its shards over (it acts within a heartbeat)."""
    await redis.set(drain_key(cluster_id, node), str(int(time.time() * 1000)))


async def drain_requested(redis: Redis, cluster_id: str, node: str) -> bool:
    return bool(await redis.exists(drain_key(cluster_id, node)))


async def drain_done(redis: Redis, cluster_id: str, node: str) -> None:
    """The node handed its shards over (or gave up): the request is gone."""
    await redis.delete(drain_key(cluster_id, node))


async def owned_by(redis: Redis, cluster_id: str, shards: int, node: str) -> list[int]:
    """The shards whose record names ``node`` as owner."""
    keys = _Keys(cluster_id)
    async with redis.pipeline(transaction=False) as pipe:
        for shard in range(shards):
            pipe.hget(keys.shard(shard), "owner")
        owners = await pipe.execute()
    return [
        shard
        for shard, owner in enumerate(owners)
        if owner is not None and (owner.decode() if isinstance(owner, bytes) else owner) == node
    ]


async def wait_handed_over(
    redis: Redis, cluster_id: str, shards: int, node: str, wait_ms: int = HANDOVER_WAIT_MS
) -> list[int]:
    """Wait until no shard is recorded as ``node``'s (at most ``wait_ms``); the shards still
    recorded as its then (empty: all handed over)."""
    deadline = time.monotonic() + wait_ms / 1000
    while True:
        left = await owned_by(redis, cluster_id, shards, node)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(HANDOVER_POLL_S)


class DrainWatch:
    """Polls this node's ``drain:<node>`` every ``interval_ms``; calls ``on_request()`` when
    the key appears (once per appearance: again only after it was gone). ``redis`` is a client
    the caller owns."""

    def __init__(
        self,
        redis: Redis,
        cluster_id: str,
        node: str,
        interval_ms: int,
        on_request: Callable[[], None],
    ) -> None:
        self._redis = redis
        self._cluster_id = cluster_id
        self._node = node
        self._interval_s = interval_ms / 1000
        self._on_request = on_request
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._poll(), name=f"braid-drain-watch-{self._node}"
        )

    async def _poll(self) -> None:
        seen = False
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                asked = await drain_requested(self._redis, self._cluster_id, self._node)
            except Exception as error:  # Redis away: asked again at the next poll
                log.debug("drain request of node %s not read: %s", self._node, error)
                continue
            if asked and not seen:
                try:
                    self._on_request()
                except Exception:
                    log.exception("draining node %s failed to start", self._node)
            seen = asked

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
