"""The ``Admin`` calls the HTTP API gathers from every node (docs/cluster.md section 9).

Each node registers its answers to the calls named here on its :class:`NodeService`
(:func:`register_admin_calls`); a node answering an HTTP request for the whole cluster asks every
known node through :class:`ClusterGather`: in parallel, each call bounded by ``rpc_timeout_ms``,
this node's own answer taken from its handler directly (no call to itself over gRPC). A node that
does not answer (no lease, unreachable, too slow, a failing handler) is listed in
:attr:`Gathered.missing` with the reason; a gather never raises for one node's failure, so the
HTTP answer is served from the nodes that did answer.

Known nodes are those with a live lease, those recorded as a shard's owner, and those an earlier
gather of this process saw: a node that died stays listed (missing) instead of vanishing from
``braid_cluster_node_up``. What each call answers is the caller's business (braid/cluster_http.py
builds the handlers and merges the answers); here a call is a name and JSON objects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from core.cluster.membership import node_order
from core.cluster.redis_metadata import NodeInfo, ShardOwner
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.server import NodeService
from core.errors import ShardUnavailable

log = logging.getLogger(__name__)

# The calls a node answers for the cluster-wide HTTP API.
ADMIN_METRICS: Final = "metrics"  # {"families": [family JSON, ...]}: its /metrics families
ADMIN_OVERVIEW: Final = "overview"  # its counts and listeners for /api/overview
ADMIN_QUEUES: Final = "queues"  # {"queues": [queue JSON, ...]}: /api/queues as it sees them
ADMIN_CONNECTIONS: Final = "connections"  # {"connections": [...]}: its own client connections
ADMIN_NODE: Final = "node"  # its /api/nodes entry (RabbitMQ's node object)
# {"name", "reason", "user"} -> {"closed": bool}: close one of its connections
ADMIN_CONNECTION_CLOSE: Final = "connection_close"
ADMIN_CHANNELS: Final = "channels"  # {"channels": [...]}: its own connections' channels
# {"consumers": [...], "channels": [{"vhost", "queue", "tag", "details"}]}: the consumers its
# queues hold, and the channel_details of the consumers its own channels hold
ADMIN_CONSUMERS: Final = "consumers"
# {"topic", "count", "requeue"} -> {"found": bool, "messages": [...]}: the management API's
# browse (POST /api/queues/{vhost}/{name}/get) of a queue, made by its owner.
ADMIN_QUEUE_BROWSE: Final = "queue_browse"
ADMIN_CALLS: Final = (
    ADMIN_METRICS,
    ADMIN_OVERVIEW,
    ADMIN_QUEUES,
    ADMIN_CONNECTIONS,
    ADMIN_NODE,
    ADMIN_CHANNELS,
    ADMIN_CONSUMERS,
    ADMIN_CONNECTION_CLOSE,
    ADMIN_QUEUE_BROWSE,
)

# Why a known node has no part in a gathered answer.
MISSING_NO_LEASE: Final = "no live lease"
MISSING_NO_ADDRESS: Final = "no gRPC address registered"

AdminCall = Callable[[JsonObject], Awaitable[JsonObject]]
# Calls a peer's Admin: (gRPC address, call name, arguments) -> its reply. RpcClient.admin.
PeerAdmin = Callable[[str, str, JsonObject], Awaitable[JsonObject]]


class NodeDirectory(Protocol):
    """Where the nodes are: :class:`~core.cluster.redis_metadata.RedisMetadata` is one."""

    async def live_nodes(self) -> Mapping[str, NodeInfo]: ...

    async def shard_owners(self) -> Mapping[int, ShardOwner]: ...


def register_admin_calls(service: NodeService, calls: Mapping[str, AdminCall]) -> None:
    """Answer each ``Admin(name)`` of ``calls`` on this node's gRPC service."""
    for name, call in calls.items():
        service.register(name, call)


@dataclass(frozen=True, slots=True)
class Gathered:
    """One call's answers from the cluster: ``answers`` by node id (this node's included when
    its handler worked), ``missing`` node id -> why it has no answer, and ``owners`` shard ->
    owner node id as recorded when the call was made (shards without an owner left out)."""

    answers: dict[str, JsonObject]
    missing: dict[str, str]
    owners: dict[int, str] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        """Every known node, answered or not, in node order."""
        return sorted({*self.answers, *self.missing}, key=node_order)


class ClusterGather:
    """Calls one named ``Admin`` on every known node at once (module docstring).

    ``local`` answers this node's calls (the same handlers it registers for its peers);
    ``peer_admin`` calls a peer (``RpcClient.admin``); ``timeout_s`` bounds each node's answer
    and the reads of ``directory``, whose last good answer stands in when Redis cannot be read.
    """

    def __init__(
        self,
        directory: NodeDirectory,
        peer_admin: PeerAdmin,
        node_id: str,
        local: Mapping[str, AdminCall],
        *,
        timeout_s: float,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("the gather timeout must be positive")
        self._directory = directory
        self._peer_admin = peer_admin
        self.node_id = node_id
        self._local = dict(local)
        self.timeout_s = timeout_s
        self._seen: set[str] = {node_id}
        self._live: dict[str, str] = {}  # the last directory read: node id -> gRPC address
        self._owners: dict[int, str] = {}

    async def gather(self, name: str, args: JsonObject | None = None) -> Gathered:
        """Every known node's answer to ``Admin(name, args)``; never raises for a node."""
        live, owners = await self._read_directory()
        self._seen.update(live, owners.values())
        missing: dict[str, str] = {}
        calls: dict[str, Awaitable[JsonObject]] = {}
        for node in sorted(self._seen, key=node_order):
            if node == self.node_id:
                calls[node] = self._call_local(name, args or {})
            elif node not in live:
                missing[node] = MISSING_NO_LEASE
            elif not live[node]:
                missing[node] = MISSING_NO_ADDRESS
            else:
                calls[node] = self._call_peer(live[node], name, args or {})
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        answers: dict[str, JsonObject] = {}
        for node, result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # cancelled: the HTTP request went away
                missing[node] = _why(result)
                log.warning("cluster admin call %r on node %s failed: %s", name, node, result)
            else:
                answers[node] = result
        return Gathered(answers, missing, dict(owners))

    async def call_owner(self, shard: int, name: str, args: JsonObject) -> JsonObject | None:
        """``Admin(name, args)`` on the owner of ``shard``, or None when this node owns it
        (the caller acts here). :class:`ShardUnavailable` when the shard has no owner or the
        owner does not answer."""
        _live, owners = await self._read_directory()
        owner = owners.get(shard)
        if owner == self.node_id:
            return None
        if owner is None:
            raise ShardUnavailable(shard, reason="no owner recorded")
        try:
            return await self.call_node(owner, name, args)
        except Exception as error:
            raise ShardUnavailable(shard, reason=f"node {owner}: {_why(error)}") from error

    async def call_node(self, node: str, name: str, args: JsonObject) -> JsonObject:
        """``Admin(name, args)`` on ``node`` (this node's own handler for itself); raises
        what the call raised, :class:`LookupError` for a node that is not live."""
        if node == self.node_id:
            return await self._call_local(name, args)
        live, _owners = await self._read_directory()
        address = live.get(node)
        if not address:
            raise LookupError(f"node {node} is not live")
        try:
            return await self._call_peer(address, name, args)
        except Exception as error:
            log.warning("cluster admin call %r on node %s failed: %s", name, node, error)
            raise

    async def _read_directory(self) -> tuple[dict[str, str], dict[int, str]]:
        """Live nodes (id -> gRPC address) and shard owners, or the last ones read when the
        directory cannot be read now."""
        try:
            async with asyncio.timeout(self.timeout_s):
                live = await self._directory.live_nodes()
                owners = await self._directory.shard_owners()
        except Exception as error:  # Redis down or slow: answer from what was last known
            log.warning("cluster directory not read (%s): using the last nodes known", error)
            return dict(self._live), dict(self._owners)
        self._live = {node: info.fields.get("grpc", "") for node, info in live.items()}
        self._owners = {
            shard: record.owner for shard, record in owners.items() if record.owner is not None
        }
        return dict(self._live), dict(self._owners)

    async def _call_local(self, name: str, args: JsonObject) -> JsonObject:
        call = self._local.get(name)
        if call is None:
            raise LookupError(f"this node has no admin call {name!r}")
        return await call(args)

    async def _call_peer(self, address: str, name: str, args: JsonObject) -> JsonObject:
        # The client's own deadline is rpc_timeout_ms too; this one also covers connecting.
        async with asyncio.timeout(self.timeout_s):
            return await self._peer_admin(address, name, args)


def _why(error: Exception) -> str:
    if isinstance(error, TimeoutError):
        return "no answer in time"
    return f"{type(error).__name__}: {error}"
