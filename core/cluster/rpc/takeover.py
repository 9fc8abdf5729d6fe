"""``TakeOverSession``: an MQTT client id reconnecting to another node (docs/cluster.md section 8).

At CONNECT the new node registers the client id (core/cluster/mqtt_sessions.py), which bumps
its ``gen`` and names the node that held it. If that was another live process,
:meth:`SessionTakeover.connect` calls it: ``TakeOverSession(client_id, gen, new_node)``. The
old node's :class:`TakeOverHandler` runs the gateway's ``close_session`` callback (given at
construction): it closes the old connection (MQTT 5 ``DISCONNECT 0x8E Session taken over``,
3.1.1: closed), nacks the session's in-flight deliveries back to its queue, saves the session
state, and answers whether it found a connection (it closes only one older than ``gen``, so a
late request cannot close a newer connection). Then the new node attaches to the session and
sends CONNACK.

When the old node does not answer (``takeover_timeout_ms``, section 13) or cannot be reached,
its lease decides: gone, or held by another incarnation (the process that had the connection
is dead, so it can no longer deliver), and the new node proceeds; still held, and
:class:`SessionTakeoverFailed` is raised, a :class:`~core.errors.ShardUnavailable` the gateway
answers with CONNACK ``0x88 Server unavailable`` / 3.1.1 return code 3, and the client retries.
A record left by a process that is no longer alive is not called at all. A connection of this
same process is closed through the same callback, without a call.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from grpc import aio

from core.cluster.mqtt_sessions import SessionOwner, SessionRegistry
from core.cluster.placement import session_shard
from core.cluster.redis_metadata import RedisMetadata
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.errors import ShardUnavailable

log = logging.getLogger(__name__)

# The gateway's hook on the old node: (client id, the new connection's gen, the new node) ->
# whether a connection older than that gen was found (and closed, its in-flight deliveries
# nacked, its session state saved) before this returns.
CloseSession = Callable[[str, int, int], Awaitable[bool]]


class SessionTakeoverFailed(ShardUnavailable):
    """The node holding the client id's connection did not give it up, and its lease holds:
    CONNACK 0x88 / return code 3, retriable. ``shard`` is the session's (section 3), ``owner``
    the node that holds the connection."""

    def __init__(self, client_id: str, shard: int, node: int, reason: str) -> None:
        super().__init__(shard, node, f"session {client_id!r} not taken over: {reason}")
        self.client_id = client_id


class TakeOverHandler:
    """The old node's side: ``service.take_over_session = handler.take_over_session``."""

    def __init__(self, close_session: CloseSession) -> None:
        self._close_session = close_session

    async def take_over_session(
        self, request: pb.TakeOver, context: aio.ServicerContext
    ) -> pb.TakenOver:
        found = await self._close_session(request.client_id, request.gen, request.new_node)
        return pb.TakenOver(found=found)


class Peers(Protocol):
    """Where the other nodes are, and whether they live."""

    async def address_of(self, node: int) -> str | None:
        """The node's gRPC address (``host:port``), None if it has none registered."""
        ...

    async def lease_holder(self, node: int) -> int | None:
        """The incarnation holding the node's lease, None if it has none."""
        ...


class MetadataPeers:
    """:class:`Peers` from Redis: ``node:<id>``'s ``grpc`` field and ``lease:<id>``."""

    def __init__(self, metadata: RedisMetadata) -> None:
        self._metadata = metadata

    async def address_of(self, node: int) -> str | None:
        info = (await self._metadata.live_nodes()).get(str(node))
        return None if info is None else info.fields.get("grpc") or None

    async def lease_holder(self, node: int) -> int | None:
        return await self._metadata.lease_holder(str(node))


@dataclass(frozen=True, slots=True)
class Connected:
    """A CONNECT's place in the cluster: its ``gen``, the connection it replaced (if any) and
    whether that connection was found and closed (False: there was none, or its process is
    gone)."""

    gen: int
    previous: SessionOwner | None
    found: bool


class SessionTakeover:
    """The new node's side: register the client id, then take it from where it was."""

    def __init__(
        self,
        registry: SessionRegistry,
        client: RpcClient,
        peers: Peers,
        *,
        node: int,
        incarnation: int,
        shards: int,
        takeover_timeout_ms: int,
        close_local: CloseSession,
    ) -> None:
        if takeover_timeout_ms <= 0:
            raise ValueError("takeover_timeout_ms must be positive")
        self._registry = registry
        self._client = client
        self._peers = peers
        self.node = node
        self.incarnation = incarnation
        self._shards = shards
        self._timeout_s = takeover_timeout_ms / 1000
        self._close_local = close_local

    async def connect(self, client_id: str) -> Connected:
        """Register ``client_id`` on this node and close its connection elsewhere; raises
        :class:`SessionTakeoverFailed` when the old node holds on to it (the registration is
        undone then, so the client's retry is taken from the old node again)."""
        registration = await self._registry.register(client_id, self.node, self.incarnation)
        previous = registration.previous
        if previous is None:
            return Connected(registration.gen, None, found=False)
        try:
            found = await self.take_over(client_id, registration.gen, previous)
        except SessionTakeoverFailed:
            # The old connection runs on: the record must name it, for the client's retry.
            await self._registry.restore(client_id, registration.gen, previous)
            raise
        return Connected(registration.gen, previous, found)

    async def take_over(self, client_id: str, gen: int, previous: SessionOwner) -> bool:
        """Have the connection recorded in ``previous`` closed for the connection ``gen`` of
        this node; True if one was found."""
        if previous.node == self.node:
            if previous.incarnation != self.incarnation:
                return False  # a previous process of this node: its connections died with it
            return await self._close_local(client_id, gen, self.node)
        if not await self._lives(previous):
            return False
        address = await self._peers.address_of(previous.node)
        if address is None:
            raise self._failed(client_id, previous, "its node has no gRPC address")
        request = pb.TakeOver(client_id=client_id, gen=gen, new_node=self.node)
        try:
            reply = await self._client.unary(
                address, lambda stub: stub.TakeOverSession(request, timeout=self._timeout_s)
            )
        except (PeerUnavailable, aio.AioRpcError) as error:
            if not await self._lives(previous):
                log.info(
                    "session %r: node %d did not answer (%s) and its process is gone; "
                    "taking the session over",
                    client_id,
                    previous.node,
                    error,
                )
                return False
            raise self._failed(client_id, previous, str(error)) from error
        return bool(reply.found)

    async def _lives(self, owner: SessionOwner) -> bool:
        """Whether the process that registered ``owner`` still holds its node's lease."""
        return await self._peers.lease_holder(owner.node) == owner.incarnation

    def _failed(self, client_id: str, owner: SessionOwner, why: str) -> SessionTakeoverFailed:
        shard = session_shard(client_id, self._shards)
        return SessionTakeoverFailed(
            client_id, shard, owner.node, f"node {owner.node} holds it and lives: {why}"
        )
