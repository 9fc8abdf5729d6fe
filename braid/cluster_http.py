"""The HTTP API and ``/metrics`` of a cluster node answer for the whole cluster (docs/cluster.md
section 9, docs/management.md "On a cluster"), from the ``Admin`` calls of
core/cluster/admin_calls.py.

- :func:`node_admin_calls`: what this node answers its peers: ``metrics`` (its families, as
  braid/metrics.py serialises them), and with the management API's listings (:class:`NodeListings`
  over braid/web/rabbit's resources) ``queues``, ``connections``, ``channels``, ``consumers``,
  ``overview`` and ``node`` (its /api/nodes entry), and ``queue_browse`` (a browse of a queue it
  owns, for ``POST /api/queues/{vhost}/{name}/get`` through another node).
- :class:`ClusterHttp`: gathers one call from every node and merges the answers: ``/metrics``
  as one family per name with a ``node`` label on every sample, plus
  ``braid_cluster_node_up{node}`` (1: a live node that answered; 0: a known node that did not)
  and ``braid_shard_owner{shard,node}``; the queue listing with each queue's stats from its
  shard's owner; every node's connections and channels, each with its ``node``; every consumer
  as its queue's owner holds it, with the ``channel_details`` of the node its channel is on;
  every known node, ``running`` false for one that did not answer.
- :func:`start_cluster_http`: once per cluster node, when its gRPC service exists: registers
  the calls of a :class:`NodeAdmin` (pointed at each new broker by :meth:`NodeAdmin.attach`, as
  a fenced node serves again) and returns the :class:`ClusterHttp` the listeners use.
- :func:`enable_cluster_http`: the hook ``braid serve`` calls on a cluster node's application
  before it starts: a middleware that answers ``GET /metrics``, ``/api/overview`` (this node's
  id as ``node``, the cluster id as ``cluster_name``), ``/api/nodes[/{id}]``,
  ``/api/queues[/{vhost}[/{name}]]``, ``/api/connections``, ``/api/channels[/{name}]`` and
  ``/api/consumers[/{vhost}]``, ``/api/vhosts/{vhost}/connections|channels`` and
  ``/api/connections/{name}[/channels]`` of a connection to another node (DELETE: closed by
  its node) for the cluster; a ``/api/definitions`` export's ``cluster_name`` is the cluster
  id. The local handler runs first (its access
  checks, its 401 and 404 stand), then its body is replaced by the merged one. It also gives
  the application the :data:`~braid.web.rabbit.base.QUEUE_OWNERS` its browses of other nodes'
  queues go to. ``/health`` stays this node's. A single node never calls the hook, so its
  answers stay byte for byte what they were.

What needs no merge: exchanges, bindings and definitions are the cluster's on every node (their
definitions are in Redis); a purge of another node's queue goes to its owner through the Broker
API (``purge_queue``), a delete through the AMQP listener's ``manage_delete_queue``.

A node is named by its id in the ``node`` label and in the listings' ``node`` field, so a
queue's or connection's node and its series on ``/metrics`` read the same.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web

from braid import metrics
from braid.web.auth import REQUEST_TAGS, REQUEST_USER, not_authorized
from braid.web.prometheus import DashboardMetrics
from braid.web.rabbit import RabbitResources
from braid.web.rabbit.base import QUEUE_OWNERS
from braid.web.rabbit.common import not_found, unavailable, vhost_of_topic
from braid.web.rabbit.connections import CLOSE_REASON_HEADER, DEFAULT_CLOSE_REASON
from braid.web.rabbit.shapes import channel_json, connection_json
from core.api import INTERNAL_CONTEXT, BrowsedMessage, ShardUnavailable
from core.cluster.admin_calls import (
    ADMIN_CHANNELS,
    ADMIN_CONNECTION_CLOSE,
    ADMIN_CONNECTIONS,
    ADMIN_CONSUMERS,
    ADMIN_METRICS,
    ADMIN_NODE,
    ADMIN_OVERVIEW,
    ADMIN_QUEUE_BROWSE,
    ADMIN_QUEUES,
    AdminCall,
    ClusterGather,
    Gathered,
    register_admin_calls,
)
from core.cluster.placement import PLACE_QUEUE, queue_key, queue_shard
from core.cluster.redis_metadata import PLACE_PREFIX, RedisMetadata
from core.cluster.rpc.client import RpcClient
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.server import NodeService
from core.security.model import TAG_ADMINISTRATOR, TAG_MONITORING
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX

log = logging.getLogger(__name__)

Json = dict[str, Any]
# The families of this node's /metrics: the registry's and the scrape's extra ones.
LocalFamilies = Callable[[], Iterable[metrics.Family]]
# (vhost, queue name) -> the shard holding the queue (its recorded placement, else the rule).
QueueShard = Callable[[str, str], int]

NODE_UP: Final = "braid_cluster_node_up"
SHARD_OWNER: Final = "braid_shard_owner"
# A queue's fields that only its owner knows; a queue whose owner did not answer is listed
# without them and with state "down", as RabbitMQ lists a queue whose node is down.
OWNER_STATS: Final = frozenset(
    {
        "messages",
        "messages_details",
        "messages_ready",
        "messages_ready_details",
        "messages_unacknowledged",
        "messages_unacknowledged_details",
        "consumers",
        "consumer_utilisation",
        "consumer_capacity",
        "message_stats",
        "memory",
    }
)
QUEUE_DOWN: Final = "down"


class NodeListings:
    """This node's part of the management listings, in the management API's own shapes
    (braid/web/rabbit builds them; every vhost, as the ``monitoring`` tag sees them)."""

    def __init__(self, resources: RabbitResources) -> None:
        self.resources = resources

    def queues(self) -> list[Json]:
        vhosts = list(self.resources.security.vhosts)
        return self.resources.queues_of(INTERNAL_CONTEXT, vhosts)

    def connections(self) -> list[Json]:
        api = self.resources.api
        return [connection_json(details) for details in api.list_connections(INTERNAL_CONTEXT)]

    def channels(self) -> list[Json]:
        api = self.resources.api
        return [
            channel_json(details, channel)
            for details in api.list_connections(INTERNAL_CONTEXT)
            for channel in details.channels
        ]

    def consumers(self) -> Json:
        resources = self.resources
        held = resources.consumers_of(INTERNAL_CONTEXT, list(resources.security.vhosts))
        channels: list[Json] = []
        for (topic, tag), details in resources.consumer_channels(INTERNAL_CONTEXT).items():
            vhost, name = vhost_of_topic(topic)
            queue = name.removeprefix(QUEUE_TOPIC_PREFIX)
            channels.append({"vhost": vhost, "queue": queue, "tag": tag, "details": details})
        return {"consumers": held, "channels": channels}

    def overview(self) -> Json:
        api = self.resources.api
        connections = api.list_connections(INTERNAL_CONTEXT)
        return {
            "connections": len(connections),
            "channels": sum(len(details.channels) for details in connections),
            "consumers": len(api.all_consumers(INTERNAL_CONTEXT)),
            "listeners": self.resources.listeners_json(),
        }


def node_admin_calls(
    families: LocalFamilies, listings: NodeListings | None = None
) -> dict[str, AdminCall]:
    """The ``Admin`` handlers over one registry and listings, fixed (:class:`NodeAdmin` for a
    node whose broker changes)."""
    admin = NodeAdmin()
    admin.attach(families, listings)
    return admin.calls()


class NodeAdmin:
    """This node's ``Admin`` answers over the broker it serves now: :meth:`calls` are
    registered once (a gRPC service takes each name once), :meth:`attach` points them at each
    new registry and listings (a fenced node serves again on a new broker). Until the first
    attach, and on a node without the management API, the listings are empty."""

    def __init__(self) -> None:
        self._families: LocalFamilies = list
        self._listings: NodeListings | None = None

    def attach(self, families: LocalFamilies, listings: NodeListings | None = None) -> None:
        self._families = families
        self._listings = listings

    def calls(self) -> dict[str, AdminCall]:
        async def metrics_call(_args: JsonObject) -> JsonObject:
            return {"families": [metrics.family_to_json(f) for f in self._families()]}

        async def queues_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {"queues": [] if listings is None else listings.queues()}

        async def connections_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {"connections": [] if listings is None else listings.connections()}

        async def overview_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {} if listings is None else listings.overview()

        async def channels_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {"channels": [] if listings is None else listings.channels()}

        async def consumers_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {"consumers": []} if listings is None else listings.consumers()

        async def connection_close_call(args: JsonObject) -> JsonObject:
            listings = self._listings
            if listings is None:
                return {"closed": False}
            # Logged by the Broker API with the HTTP user who asked through another node.
            context = dataclasses.replace(INTERNAL_CONTEXT, user=str(args.get("user", "")))
            api = listings.resources.api
            return {"closed": api.close_connection(context, str(args["name"]), str(args["reason"]))}

        async def node_call(_args: JsonObject) -> JsonObject:
            listings = self._listings
            return {} if listings is None else listings.resources.node_json()

        async def queue_browse_call(args: JsonObject) -> JsonObject:
            listings = self._listings
            if listings is None:
                return {"found": False}
            taken = await listings.resources.api.browse_queue(
                INTERNAL_CONTEXT,
                str(args["topic"]),
                int(args["count"]),
                requeue=bool(args["requeue"]),
            )
            if taken is None:
                return {"found": False}
            return {"found": True, "messages": [browsed_to_json(message) for message in taken]}

        return {
            ADMIN_METRICS: metrics_call,
            ADMIN_QUEUES: queues_call,
            ADMIN_CONNECTIONS: connections_call,
            ADMIN_OVERVIEW: overview_call,
            ADMIN_NODE: node_call,
            ADMIN_CONNECTION_CLOSE: connection_close_call,
            ADMIN_CHANNELS: channels_call,
            ADMIN_CONSUMERS: consumers_call,
            ADMIN_QUEUE_BROWSE: queue_browse_call,
        }


def browsed_to_json(message: BrowsedMessage) -> Json:
    """A browsed record as an ``Admin`` answer carries it (bytes in base64)."""
    return {
        "topic": message.topic,
        "subject": message.subject,
        "headers": [[name, base64.b64encode(value).decode()] for name, value in message.headers],
        "body": base64.b64encode(message.body).decode(),
        "protocol": message.protocol,
        "client": message.client,
        "born_ms": message.born_ms,
        "store_ms": message.store_ms,
        "redelivered": message.redelivered,
        "offset": message.offset,
    }


def browsed_from_json(item: Json) -> BrowsedMessage:
    """:func:`browsed_to_json` read back (KeyError, ValueError for a malformed one)."""
    return BrowsedMessage(
        str(item["topic"]),
        str(item["subject"]),
        [(str(name), base64.b64decode(value)) for name, value in item["headers"]],
        base64.b64decode(item["body"]),
        int(item["protocol"]),
        str(item["client"]),
        int(item["born_ms"]),
        int(item["store_ms"]),
        bool(item["redelivered"]),
        int(item["offset"]),
    )


def local_families(
    registry: metrics.MetricsRegistry, resources: RabbitResources | None = None
) -> LocalFamilies:
    """What this node's own ``/metrics`` renders: the registry's families and, with the
    management API, the dashboards' (braid/web/prometheus.py, as braid/web's build_app adds)."""
    if resources is None:
        return registry.collect
    dashboards = DashboardMetrics(resources, resources.sources)
    return lambda: [*registry.collect(), *dashboards.aggregated()]


def placed_queue_shard(metadata: RedisMetadata) -> QueueShard:
    """A queue's shard: its recorded placement (``place:queue`` in the metadata cache), else
    the placement rule (docs/cluster.md section 3)."""

    def shard_of(vhost: str, name: str) -> int:
        recorded = metadata.get(PLACE_PREFIX + PLACE_QUEUE, queue_key(vhost, name))
        if recorded is not None:
            return int(recorded)
        return queue_shard(vhost, name, metadata.shards)

    return shard_of


def start_cluster_http(
    service: NodeService,
    metadata: RedisMetadata,
    client: RpcClient,
    node_id: int,
    *,
    timeout_s: float,
) -> tuple[NodeAdmin, ClusterHttp]:
    """Register this node's ``Admin`` answers on ``service`` and build the cluster-wide HTTP
    answers (``timeout_s``: ``rpc_timeout_ms``); :meth:`NodeAdmin.attach` the served broker's
    registry and listings next."""
    admin = NodeAdmin()
    calls = admin.calls()
    register_admin_calls(service, calls)
    gather = ClusterGather(metadata, client.admin, str(node_id), calls, timeout_s=timeout_s)
    return admin, ClusterHttp(gather, placed_queue_shard(metadata), metadata.cluster_id)


def _listed(answer: JsonObject, key: str) -> list[Json]:
    """``answer[key]``, a list of JSON objects (ValueError for a malformed answer)."""
    items = answer.get(key)
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError(f"the answer's {key!r} is not a list of objects")
    return items


class ClusterHttp:
    """The cluster-wide answers (module docstring), from ``gather``'s calls."""

    def __init__(
        self, gather: ClusterGather, queue_shard: QueueShard, cluster_name: str = ""
    ) -> None:
        self.gather = gather
        self.queue_shard = queue_shard
        self.cluster_name = cluster_name  # /api/overview's cluster_name: the cluster id

    @property
    def node_id(self) -> str:
        """This node's name in the answers (its id)."""
        return self.gather.node_id

    # -- /metrics --------------------------------------------------------------------------

    async def metrics_families(self) -> list[metrics.Family]:
        gathered = await self.gather.gather(ADMIN_METRICS)
        per_node: dict[str, list[metrics.Family]] = {}
        missing = dict(gathered.missing)
        for node, answer in gathered.answers.items():
            try:
                per_node[node] = [
                    metrics.family_from_json(item) for item in _listed(answer, "families")
                ]
            except ValueError as error:  # a node of another version, or a bug: not up
                log.warning("node %s answered metrics that do not parse: %s", node, error)
                missing[node] = str(error)
        families = metrics.merge_node_families(per_node)
        families.append(
            metrics.Family(
                NODE_UP,
                metrics.GAUGE,
                "1 for a cluster node that answered this scrape, 0 for a known one that did not.",
                [({"node": node}, 0 if node in missing else 1) for node in gathered.nodes],
            )
        )
        families.append(
            metrics.Family(
                SHARD_OWNER,
                metrics.GAUGE,
                "1 for each shard and the node that owns it, as recorded in the cluster metadata.",
                [
                    ({"shard": str(shard), "node": owner}, 1)
                    for shard, owner in sorted(gathered.owners.items())
                ],
            )
        )
        return families

    async def metrics_text(self) -> str:
        return metrics.render_families(await self.metrics_families())

    # -- listings --------------------------------------------------------------------------

    async def queues(self) -> list[Json]:
        """Every queue once, by (vhost, name): its owner's entry, with ``node``."""
        gathered = await self.gather.gather(ADMIN_QUEUES)
        by_node = self._lists(gathered, "queues")
        found: dict[tuple[str, str], Json] = {}
        for entries in by_node.values():
            for entry in entries:
                found.setdefault((str(entry.get("vhost")), str(entry.get("name"))), entry)
        merged: list[Json] = []
        for (vhost, name), first in sorted(found.items()):
            owner = gathered.owners.get(self.queue_shard(vhost, name))
            owned = self._entry_of(by_node.get(owner or ""), vhost, name)
            if owner is not None and owned is not None:
                merged.append({**owned, "node": owner})
            else:
                # Its owner did not answer (or has none now): the definition without the stats.
                down = {key: value for key, value in first.items() if key not in OWNER_STATS}
                merged.append({**down, "node": owner, "state": QUEUE_DOWN})
        return merged

    async def connections(self) -> list[Json]:
        """Every node's connections, each with its ``node``, by name."""
        return await self._every_nodes(ADMIN_CONNECTIONS, "connections")

    async def channels(self) -> list[Json]:
        """Every node's channels, each with its ``node``, by name."""
        return await self._every_nodes(ADMIN_CHANNELS, "channels")

    async def _every_nodes(self, call: str, key: str) -> list[Json]:
        """The ``key`` list of every node's answer to ``call``, each entry with its ``node``,
        by name."""
        gathered = await self.gather.gather(call)
        merged = [
            {**entry, "node": node}
            for node, entries in self._lists(gathered, key).items()
            for entry in entries
        ]
        return sorted(merged, key=lambda entry: str(entry.get("name")))

    async def consumers(self) -> list[Json]:
        """Every consumer, as the node holding its queue lists it, with the
        ``channel_details`` (``node``: the channel's) of the node whose channel it is."""
        gathered = await self.gather.gather(ADMIN_CONSUMERS)
        held = self._lists(gathered, "consumers")
        channels: dict[tuple[str, str, str], Json] = {}
        for node, entries in self._lists(gathered, "channels").items():
            for entry in entries:
                details = entry.get("details")
                if isinstance(details, dict):
                    key = (str(entry.get("vhost")), str(entry.get("queue")), str(entry.get("tag")))
                    channels[key] = {**details, "node": node}
        merged: list[Json] = []
        for entries in held.values():
            for entry in entries:
                queue = entry.get("queue")
                queue = queue if isinstance(queue, dict) else {}
                key = (
                    str(queue.get("vhost")),
                    str(queue.get("name")),
                    str(entry.get("consumer_tag")),
                )
                merged.append({**entry, "channel_details": channels.get(key, {})})
        return merged

    async def close_connection(self, node: str, name: str, reason: str, user: str) -> bool:
        """Close the connection ``name`` of ``node`` (its ``connection_close``); False when it
        has none now. :class:`ShardUnavailable` is not raised: a node that does not answer
        is a 503."""
        args: JsonObject = {"name": name, "reason": reason, "user": user}
        try:
            answer = await self.gather.call_node(node, ADMIN_CONNECTION_CLOSE, args)
        except Exception as error:
            log.warning("closing connection %r on node %s failed: %s", name, node, error)
            raise unavailable(f"node {node} did not close the connection: {error}") from None
        return bool(answer.get("closed"))

    async def nodes(self) -> list[Json]:
        """Every known node as /api/nodes lists one, named by its id: a node that answered
        with its own entry and ``running`` true, one that did not with ``running`` false (as
        RabbitMQ lists a stopped cluster member)."""
        gathered = await self.gather.gather(ADMIN_NODE)
        listed: list[Json] = []
        for node in gathered.nodes:
            answer = gathered.answers.get(node)
            if answer:
                listed.append({**answer, "name": node, "running": True})
            else:
                listed.append({"name": node, "type": "disc", "running": False})
        return listed

    async def overview_counts(self) -> tuple[Json, list[Json]]:
        """The nodes' connections, channels and consumers summed, and their listeners."""
        gathered = await self.gather.gather(ADMIN_OVERVIEW)
        totals = {"connections": 0, "channels": 0, "consumers": 0}
        listeners: list[Json] = []
        for node, answer in gathered.answers.items():
            for key in totals:
                count = answer.get(key)
                if isinstance(count, int):
                    totals[key] += count
            found = answer.get("listeners")
            if isinstance(found, list):
                listeners += [{**item, "node": node} for item in found if isinstance(item, dict)]
        return totals, listeners

    # -- one queue, on its owner -----------------------------------------------------------

    async def browse_on_owner(
        self, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage] | None:
        """A browse of the queue ``topic`` made by its shard's owner (braid/web/rabbit's
        ``QueueOwners``): None when this node owns it; [] when the owner has no such queue;
        :class:`ShardUnavailable` when it does not answer."""
        vhost, name = vhost_of_topic(topic)
        shard = self.queue_shard(vhost, name.removeprefix(QUEUE_TOPIC_PREFIX))
        args: JsonObject = {"topic": topic, "count": count, "requeue": requeue}
        answer = await self.gather.call_owner(shard, ADMIN_QUEUE_BROWSE, args)
        if answer is None:
            return None
        if not answer.get("found"):
            return []
        try:
            return [browsed_from_json(item) for item in _listed(answer, "messages")]
        except (KeyError, TypeError, ValueError) as error:
            reason = f"a browse answer that does not parse: {error}"
            raise ShardUnavailable(shard, reason=reason) from error

    @staticmethod
    def _lists(gathered: Gathered, key: str) -> dict[str, list[Json]]:
        lists: dict[str, list[Json]] = {}
        for node, answer in gathered.answers.items():
            try:
                lists[node] = _listed(answer, key)
            except ValueError as error:
                log.warning("node %s answered %s that do not parse: %s", node, key, error)
        return lists

    @staticmethod
    def _entry_of(entries: list[Json] | None, vhost: str, name: str) -> Json | None:
        for entry in entries or ():
            if entry.get("vhost") == vhost and entry.get("name") == name:
                return entry
        return None


# -- the hook ------------------------------------------------------------------------------


def _sees_all(request: web.Request) -> bool:
    tags = request.get(REQUEST_TAGS, ())
    return TAG_ADMINISTRATOR in tags or TAG_MONITORING in tags


def _api_segments(request: web.Request) -> list[str]:
    """The percent-decoded segments after ``/api/`` (``%2F``, the vhost ``/``, stays inside its
    segment), as braid/web/management.py reads them; empty for another path."""
    raw = request.raw_path.split("?", 1)[0]
    if not raw.startswith("/api/"):
        return []
    return [unquote(part) for part in raw[len("/api/") :].split("/")]


def _json_body(response: web.StreamResponse) -> Any:
    """The JSON a local handler answered, or None when it answered something else."""
    if not isinstance(response, web.Response) or response.status != 200:
        return None
    body = response.body
    if not isinstance(body, bytes | bytearray):
        return None
    return json.loads(body)


def _reply(payload: object) -> web.Response:
    return web.json_response(payload, headers={"Cache-Control": "no-store"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def enable_cluster_http(
    app: web.Application, cluster: ClusterHttp, resources: RabbitResources | None = None
) -> None:
    """Make ``app`` (braid/web's :func:`~braid.web.build_app`) answer for the cluster: call
    before the application starts. ``resources`` (the management API's, for who may see which
    vhost): without it only ``/metrics`` is the cluster's."""

    @web.middleware
    async def cluster_answers(request: web.Request, handler: Handler) -> web.StreamResponse:
        segments = _api_segments(request)
        if resources is not None and _names_one_connection(segments):
            try:
                return await handler(request)  # a connection to this node
            except web.HTTPNotFound:
                return await _other_nodes_connection(cluster, request, segments)
        if request.method != "GET":
            return await handler(request)
        if request.path == "/metrics":
            return web.Response(
                body=(await cluster.metrics_text()).encode(),
                headers={"Content-Type": metrics.CONTENT_TYPE, "Cache-Control": "no-store"},
            )
        if resources is None or not segments or segments[0] not in _API_PATHS:
            return await handler(request)
        if segments[0] in ("nodes", "channels") and len(segments) == 2:
            # This node knows only its own node and channels: its handler of the list checks
            # access, the cluster's list answers.
            local = await handler(request.clone(rel_url="/api/" + segments[0]))
        else:
            local = await handler(request)  # its access checks and errors stand
        if _json_body(local) is None:
            return local
        return await _API_PATHS[segments[0]](cluster, resources, request, segments, local)

    # Appended last: it runs inside the authentication middleware, which set the user.
    app.middlewares.append(cluster_answers)
    if resources is not None:
        app[QUEUE_OWNERS] = cluster  # browses of other nodes' queues go to the owner


def _names_one_connection(segments: list[str]) -> bool:
    """``/api/connections/{name}`` or ``/api/connections/{name}/channels``."""
    return (len(segments) == 2 and segments[0] == "connections") or (
        len(segments) == 3 and segments[0] == "connections" and segments[2] == "channels"
    )


async def _other_nodes_connection(
    cluster: ClusterHttp, request: web.Request, segments: list[str]
) -> web.StreamResponse:
    """``/api/connections/{name}[/channels]`` of a connection to another node (this node's
    handler did not find it): GET from the cluster's listing; DELETE closed by its node. As
    braid/web/rabbit/connections.py: a user sees its own, ``monitoring`` and ``administrator``
    all; a connection is closed by its own user or an ``administrator``."""
    name = segments[1]
    user = request.get(REQUEST_USER)
    found = [
        entry
        for entry in await cluster.connections()
        if entry.get("name") == name and (_sees_all(request) or entry.get("user") == user)
    ]
    if not found:
        raise not_found()
    connection = found[0]
    if len(segments) == 3:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET"])
        channels = [
            channel
            for channel in await cluster.channels()
            if channel.get("connection_details", {}).get("name") == name
        ]
        return _reply(channels)
    if request.method in ("GET", "HEAD"):
        return _reply(connection)
    if request.method != "DELETE":
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "DELETE"])
    if connection.get("user") != user and TAG_ADMINISTRATOR not in request.get(REQUEST_TAGS, ()):
        raise not_authorized("Not administrator user")
    reason = request.headers.get(CLOSE_REASON_HEADER) or DEFAULT_CLOSE_REASON
    if not await cluster.close_connection(str(connection.get("node")), name, reason, str(user)):
        raise not_found()
    return web.Response(status=204)


async def _queues_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    if len(segments) > 3:
        return local  # bindings, contents, get: the local answer
    vhosts = [segments[1]] if len(segments) > 1 else resources.visible_vhosts(request)
    queues = [queue for queue in await cluster.queues() if queue.get("vhost") in vhosts]
    if len(segments) == 3:
        name = segments[2]
        for queue in queues:
            if queue.get("name") == name:
                return _reply(queue)
        return local  # listed here, not gathered (a change in flight): this node's answer
    return _reply(queues)


async def _connections_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    if len(segments) != 1:
        return local  # one connection, its channels: this node's (its own connections)
    user = request.get(REQUEST_USER)
    sees_all = _sees_all(request)
    return _reply(
        [entry for entry in await cluster.connections() if sees_all or entry.get("user") == user]
    )


async def _overview_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    overview = _json_body(local)
    if len(segments) != 1 or not isinstance(overview, dict):
        return local
    vhosts = resources.visible_vhosts(request)
    queues = [queue for queue in await cluster.queues() if queue.get("vhost") in vhosts]
    totals, listeners = await cluster.overview_counts()
    ready = sum(int(queue.get("messages_ready", 0)) for queue in queues)
    unacked = sum(int(queue.get("messages_unacknowledged", 0)) for queue in queues)
    queue_totals = dict(overview.get("queue_totals", {}))
    queue_totals.update(
        messages=ready + unacked, messages_ready=ready, messages_unacknowledged=unacked
    )
    object_totals = dict(overview.get("object_totals", {}))
    object_totals.update(totals, queues=len(queues))
    contexts = [
        {**item, "node": cluster.node_id}
        for item in overview.get("contexts", [])
        if isinstance(item, dict)
    ]
    return _reply(
        {
            **overview,
            "cluster_name": cluster.cluster_name or overview.get("cluster_name"),
            "node": cluster.node_id,
            "contexts": contexts,
            "queue_totals": queue_totals,
            "object_totals": object_totals,
            "listeners": listeners,
        }
    )


async def _channels_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    user = request.get(REQUEST_USER)
    sees_all = _sees_all(request)
    channels = [
        entry for entry in await cluster.channels() if sees_all or entry.get("user") == user
    ]
    if len(segments) == 1:
        return _reply(channels)
    for channel in channels:
        if channel.get("name") == segments[1]:
            return _reply(channel)
    raise not_found()


async def _consumers_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    vhosts = [segments[1]] if len(segments) > 1 else resources.visible_vhosts(request)
    return _reply(
        [
            entry
            for entry in await cluster.consumers()
            if isinstance(entry.get("queue"), dict) and entry["queue"].get("vhost") in vhosts
        ]
    )


async def _vhosts_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    """``/api/vhosts/{vhost}/connections|channels``: every node's (the rest of ``/api/vhosts``
    is the same on every node)."""
    if len(segments) != 3 or segments[2] not in ("connections", "channels"):
        return local
    user = request.get(REQUEST_USER)
    sees_all = _sees_all(request)
    listed = await (cluster.connections() if segments[2] == "connections" else cluster.channels())
    return _reply(
        [
            entry
            for entry in listed
            if (sees_all or entry.get("user") == user) and entry.get("vhost") == segments[1]
        ]
    )


async def _definitions_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    """An export names the cluster as /api/overview does (the rest is the same on every node:
    the definitions are in Redis)."""
    document = _json_body(local)
    if not isinstance(document, dict) or not cluster.cluster_name:
        return local
    parameters = document.get("global_parameters")
    if not isinstance(parameters, list):
        return local
    named = [
        {**item, "value": cluster.cluster_name}
        if isinstance(item, dict) and item.get("name") == "cluster_name"
        else item
        for item in parameters
    ]
    return _reply({**document, "global_parameters": named})


async def _nodes_answer(
    cluster: ClusterHttp,
    resources: RabbitResources,
    request: web.Request,
    segments: list[str],
    local: web.StreamResponse,
) -> web.StreamResponse:
    nodes = await cluster.nodes()
    if len(segments) == 1:
        return _reply(nodes)
    for node in nodes:
        if node["name"] == segments[1]:
            return _reply(node)
    raise not_found()


ApiAnswer = Callable[
    [ClusterHttp, RabbitResources, web.Request, list[str], web.StreamResponse],
    Awaitable[web.StreamResponse],
]
_API_PATHS: Final[dict[str, ApiAnswer]] = {
    "queues": _queues_answer,
    "connections": _connections_answer,
    "overview": _overview_answer,
    "nodes": _nodes_answer,
    "channels": _channels_answer,
    "consumers": _consumers_answer,
    "vhosts": _vhosts_answer,
    "definitions": _definitions_answer,
}
