"""The wills of this node's MQTT connections in Redis (docs/cluster.md section 4,
``mqtt:wills:<node>``): a hash of client id -> the will (the gateway's encoding), written at
CONNECT with a will and removed when the connection ends normally or the will is published,
so that when this node dies another can publish them (issue 23). The will itself is published
by this node like any publish (the fan-out takes it to other nodes' subscribers).

A node that stops cleanly drops its wills, as a node alone does on SIGTERM (its connections
end as a normal disconnect: no will published), and deletes the hash (:meth:`WillBook.aclose`).

A node that dies leaves its hash. A survivor that takes shards over then takes the hashes of
nodes whose lease is gone (:func:`take_orphaned`): one script reads and deletes a hash only
while ``lease:<node>`` is absent, so exactly one survivor gets each will and a node back in
time keeps its own; the taker publishes them (its MQTT gateway, after each will's delay).

Writes are background work done one at a time in the order asked, so a removal and a new
CONNECT's write of one client id end in the right state. A failed write is logged.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from redis.asyncio import Redis

from core.cluster.redis_metadata import _Keys

log = logging.getLogger(__name__)

# KEYS[1] mqtt:wills:<node>, KEYS[2] lease:<node> -> the hash as HGETALL gives it, deleted;
# an empty list while the node's lease lives (or nobody left wills there).
TAKE_ORPHANED: Final = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {} end
local wills = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return wills
"""


async def take_orphaned(redis: Redis, cluster_id: str, own_node: int) -> dict[str, bytes]:
    """Take the wills of every other node whose lease is gone (module docstring): client id
    -> will, each returned to one caller only, deleted from Redis."""
    keys = _Keys(cluster_id)
    pattern = keys.prefix + "mqtt:wills:*"
    take = redis.register_script(TAKE_ORPHANED)
    taken: dict[str, bytes] = {}
    async for raw in redis.scan_iter(match=pattern, count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        node = key.rsplit(":", 1)[1]
        if node == str(own_node):
            continue
        flat = await take(keys=[key, keys.lease(node)])
        for client_id, will in zip(flat[::2], flat[1::2], strict=True):
            taken[client_id.decode()] = bytes(will)
        if flat:
            log.warning(
                "mqtt cluster: took %d wills of node %s (its lease is gone)", len(flat) // 2, node
            )
    return taken


class WillBook:
    """``mqtt:wills:<node>`` of this node. ``redis`` is a client the caller owns."""

    def __init__(self, redis: Redis, cluster_id: str, node: int) -> None:
        self._redis = redis
        self._cluster_id = cluster_id
        self._node = node
        self.key = _Keys(cluster_id).prefix + f"mqtt:wills:{node}"
        self._writes: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def hold(self, client_id: str, will: bytes | None) -> None:
        """Keep ``will`` for ``client_id`` (None: remove it), in the background; nothing once
        closed (the hash is gone)."""
        if self._closed:
            return
        self._writes.put_nowait((client_id, will))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="braid-mqtt-cluster wills"
            )

    async def _write(self) -> None:
        while True:
            client_id, will = await self._writes.get()
            try:
                if will is None:
                    await self._redis.hdel(self.key, client_id)  # type: ignore[misc]
                else:
                    await self._redis.hset(self.key, client_id, will)  # type: ignore[misc]
            except Exception as error:  # logged: the will itself is still published here
                log.warning("mqtt cluster: will of %r not written: %s", client_id, error)
            finally:
                self._writes.task_done()

    async def take_orphaned(self) -> dict[str, bytes]:
        """The wills of dead nodes, taken for this node to publish (:func:`take_orphaned`)."""
        return await take_orphaned(self._redis, self._cluster_id, self._node)

    async def written(self) -> None:
        """Returns once every write asked for so far is done (or failed)."""
        await self._writes.join()

    async def aclose(self) -> None:
        """Stop the writer once the writes asked for are done (bounded), then delete this
        node's hash: the node stops, its connections' wills are not published (module
        docstring)."""
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._writes.join()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
        try:
            async with asyncio.timeout(2.0):
                await self._redis.delete(self.key)
        except Exception as error:
            log.warning("mqtt cluster: wills of this node not deleted: %r", error)
