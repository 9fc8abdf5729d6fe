"""Which nodes have members of each MQTT ``$share`` group (docs/cluster.md section 8, MQTT):
the group's durable queue lives in one shard and every node with members attaches its own
consumer, so a node whose last member leaves may delete the queue only when no other node has
members (else it would take the queue from under them).

Keys (one cluster's, beside ``mqtt:routes:<node>``):

  ``mqtt:share:<group queue name>``  set: the nodes with at least one member of that group.

A node adds itself when its first member joins (before it reads the queue) and removes itself
when its last one leaves; the removal answers, in one script, whether any node is left. A node
that stops cleanly removes itself from every group it joined (:meth:`ShareMembers.leave_all`;
a persistent member's group is joined again when its session is restored at the next start).
A node that dies keeps its entry until the survivor that takes its wills removes it from every
group (:func:`forget_dead`, issue 23).

Not thread-safe: one event loop.
"""

from __future__ import annotations

from typing import Final

from redis.asyncio import Redis

from core.cluster.redis_metadata import _Keys

# KEYS[1] mqtt:share:<name>; ARGV[1] the node -> how many nodes are left with members.
LEAVE: Final = """
redis.call('SREM', KEYS[1], ARGV[1])
return redis.call('SCARD', KEYS[1])
"""


async def forget_dead(redis: Redis, cluster_id: str) -> int:
    """Remove every node whose lease is gone (dead) from every group; how many entries went."""
    keys = _Keys(cluster_id)
    alive: dict[str, bool] = {}
    removed = 0
    async for raw in redis.scan_iter(match=keys.prefix + "mqtt:share:*", count=1000):
        for member in await redis.smembers(raw):  # type: ignore[misc]
            node = member.decode() if isinstance(member, bytes) else str(member)
            if node not in alive:
                alive[node] = bool(await redis.exists(keys.lease(node)))
            if not alive[node]:
                removed += int(await redis.srem(raw, node))  # type: ignore[misc]
    return removed


class ShareMembers:
    """This node's entries in the cluster's ``mqtt:share:<name>`` sets (module docstring).
    ``redis`` is a client the caller owns."""

    def __init__(self, redis: Redis, cluster_id: str, node: int) -> None:
        self._redis = redis
        self._cluster_id = cluster_id
        self._prefix = _Keys(cluster_id).prefix + "mqtt:share:"
        self._node = str(node)
        self._leave = redis.register_script(LEAVE)
        self._joined: set[str] = set()  # the groups this node is written down for

    async def joined(self, name: str) -> None:
        """This node has members of the group whose queue is ``name``."""
        self._joined.add(name)
        await self._redis.sadd(self._prefix + name, self._node)  # type: ignore[misc]

    async def left(self, name: str) -> bool:
        """This node has no member of the group left; True when no node has any (the caller
        deletes the group's queue)."""
        self._joined.discard(name)
        remaining = await self._leave(keys=[self._prefix + name], args=[self._node])
        return int(remaining) == 0

    async def forget_dead(self) -> int:
        """Remove the nodes whose lease is gone from every group (:func:`forget_dead`)."""
        return await forget_dead(self._redis, self._cluster_id)

    async def leave_all(self) -> None:
        """This node stops: it is no longer written down for any group (the groups' queues
        stay; a node whose last member leaves later deletes one as :meth:`left` says)."""
        joined, self._joined = self._joined, set()
        if joined:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name in joined:
                    pipe.srem(self._prefix + name, self._node)
                await pipe.execute()

    async def elsewhere(self, name: str) -> bool:
        """Whether another node has members of the group (a restarting node keeps the group's
        queue of its shard for them)."""
        nodes = await self._redis.smembers(self._prefix + name)  # type: ignore[misc]
        mine = {self._node, self._node.encode()}  # (a client may decode responses or not)
        return any(node not in mine for node in nodes)
