"""What every resource handler shares: who may see what (RabbitMQ's ``rabbit_mgmt_util``
rules), the HTTP user's :class:`ClientContext`, and the listings of AMQP objects read from the
core (topics with their ``amqp`` config, ack queue counts, bindings)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, TypeVar

from aiohttp import web

from braid.web.auth import REQUEST_TAGS, REQUEST_USER, not_authorized, peer_of
from braid.web.rabbit.common import (
    LISTENER_PROTOCOLS,
    Json,
    ManagementSources,
    node_name,
    not_found,
    refusal_response,
    vhost_of_topic,
)
from braid.web.rabbit.shapes import (
    QueueRates,
    binding_json,
    consumer_channel_json,
    exchange_json,
    queue_json,
)
from core.api import (
    EXCHANGE_QUEUE,
    PROTOCOL_INTERNAL,
    BrowsedMessage,
    ClientContext,
    ManagementRefusal,
    QueueStats,
    TopicInfo,
)
from core.security import SecurityService
from core.security.model import TAG_ADMINISTRATOR, TAG_MONITORING
from gateway.amqp.vhost import CONFIG_KEY, QUEUE_TOPIC_PREFIX

T = TypeVar("T")


class QueueOwners(Protocol):
    """Where the queues of a cluster's other nodes are read (braid/cluster_http.py)."""

    async def browse_on_owner(
        self, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage] | None:
        """The records a browse of ``topic`` took, done by its owner in one call; None when
        this node owns it (browse here). :class:`ShardUnavailable` when the owner does not
        answer; an empty list when it has no such queue."""
        ...


# On a cluster node's application, where browses of queues other nodes own go (set by
# braid/cluster_http.py); absent on a single node.
QUEUE_OWNERS: Final = web.AppKey("queue_owners", QueueOwners)


class ResourceBase:
    """The state and helpers of :class:`~braid.web.rabbit.routes.RabbitResources`."""

    def __init__(self, security: SecurityService, sources: ManagementSources) -> None:
        self.security = security
        self.sources = sources
        self.api = sources.api
        self.rates = QueueRates()

    # -- who may see what ------------------------------------------------------------------

    @staticmethod
    def _tags(request: web.Request) -> tuple[str, ...]:
        tags: tuple[str, ...] = request[REQUEST_TAGS]
        return tags

    def _sees_all(self, request: web.Request) -> bool:
        tags = self._tags(request)
        return TAG_ADMINISTRATOR in tags or TAG_MONITORING in tags

    def visible_vhosts(self, request: web.Request) -> list[str]:
        if self._sees_all(request):
            return list(self.security.vhosts)
        user: str = request[REQUEST_USER]
        return [v for v in self.security.vhosts if self.security.store.permission(v, user)]

    def _check_vhost(self, request: web.Request, vhost: str) -> None:
        if vhost not in self.security.vhosts:
            raise not_found()
        if TAG_ADMINISTRATOR in self._tags(request):
            return
        user: str = request[REQUEST_USER]
        if self.security.store.permission(vhost, user) is None:
            raise not_authorized("Not management user")  # RabbitMQ: no access to the vhost

    def _require(self, request: web.Request, tag: str) -> None:
        tags = self._tags(request)
        if tag in tags or TAG_ADMINISTRATOR in tags:
            return
        raise not_authorized(f"Not {tag} user")

    def context(self, request: web.Request, vhost: str = "/") -> ClientContext:
        return ClientContext(
            PROTOCOL_INTERNAL,
            vhost=vhost,
            user=request[REQUEST_USER],
            peer=peer_of(request),
            connection_id="http",
            client_id="management",
        )

    # -- reading the AMQP objects from the core --------------------------------------------

    def _amqp_objects(self, context: ClientContext, kind: str) -> list[tuple[str, TopicInfo]]:
        """``(vhost, topic)`` of every AMQP object of ``kind`` (exchange, queue)."""
        found: list[tuple[str, TopicInfo]] = []
        for info in self.api.topics_snapshot(context):
            config = info.config.get(CONFIG_KEY)
            if isinstance(config, dict) and config.get("object") == kind:
                found.append((vhost_of_topic(info.name)[0], info))
        return found

    def queue_json(self, context: ClientContext, vhost: str, info: TopicInfo) -> Json:
        config: Json = info.config[CONFIG_KEY]
        stats = self.api.queue_info(context, info.name) or QueueStats(0, 0, 0)
        name = str(config.get("name", vhost_of_topic(info.name)[1][len(QUEUE_TOPIC_PREFIX) :]))
        return queue_json(vhost, name, config, stats, self.rates.of(info.name, stats))

    def exchanges_of(self, context: ClientContext, vhosts: list[str]) -> list[Json]:
        default = {"type": "direct", "durable": True}
        found = [exchange_json(v, "", default) for v in vhosts]
        for vhost, info in self._amqp_objects(context, "exchange"):
            if vhost in vhosts:
                name = vhost_of_topic(info.name)[1]
                found.append(exchange_json(vhost, name, info.config[CONFIG_KEY]))
        return sorted(found, key=lambda e: (e["vhost"], e["name"]))

    def queues_of(self, context: ClientContext, vhosts: list[str]) -> list[Json]:
        found = [
            self.queue_json(context, vhost, info)
            for vhost, info in self._amqp_objects(context, "queue")
            if vhost in vhosts
        ]
        return sorted(found, key=lambda q: (q["vhost"], q["name"]))

    def _queue_names(self, context: ClientContext) -> dict[str, tuple[str, str]]:
        """Queue topic -> (vhost, queue name)."""
        names: dict[str, tuple[str, str]] = {}
        for vhost, info in self._amqp_objects(context, "queue"):
            config = info.config[CONFIG_KEY]
            rest = vhost_of_topic(info.name)[1]
            names[info.name] = (vhost, str(config.get("name", rest[len(QUEUE_TOPIC_PREFIX) :])))
        return names

    def bindings_of(
        self, context: ClientContext, vhosts: list[str], *, with_default: bool = True
    ) -> list[Json]:
        queues = self._queue_names(context)
        found: list[Json] = []
        if with_default:  # RabbitMQ lists the default exchange's implicit binding per queue
            for vhost, name in sorted(queues.values()):
                if vhost in vhosts:
                    found.append(binding_json(vhost, "", name, "queue", name, {}))
        for binding in self.api.all_bindings(context):
            vhost, source = vhost_of_topic(binding.source)
            if vhost not in vhosts:
                continue
            if binding.destination_queue == EXCHANGE_QUEUE:
                destination, kind = vhost_of_topic(binding.destination)[1], "exchange"
            elif binding.destination in queues:
                destination, kind = queues[binding.destination][1], "queue"
            else:
                continue  # an MQTT session queue or a Kafka-side destination: not AMQP's
            found.append(
                binding_json(vhost, source, destination, kind, binding.pattern, binding.arguments)
            )
        return found

    def listeners_json(self) -> list[Json]:
        found: list[Json] = []
        for slot, server in self.sources.listeners.items():
            address = getattr(server, "address", None)
            if address is None:
                continue
            found.append(
                {
                    "node": node_name(),
                    "protocol": LISTENER_PROTOCOLS.get(slot, slot),
                    "ip_address": str(address[0]),
                    "port": int(address[1]),
                    "socket_opts": _socket_options(slot, address),
                }
            )
        return found

    def consumer_channels(self, context: ClientContext) -> dict[tuple[str, str], Json]:
        """(queue topic, consumer tag) -> the ``channel_details`` of the consumer's channel."""
        found: dict[tuple[str, str], Json] = {}
        for details in self.api.list_connections(context):
            for channel in details.channels:
                for key in channel.consumers:
                    found[key] = consumer_channel_json(details, channel)
        return found

    # -- changes, through the listener that owns the objects -------------------------------

    @staticmethod
    def managed(action: Callable[[], T]) -> T:
        """Run a ``manage_*`` call; its refusal becomes RabbitMQ's HTTP answer."""
        try:
            return action()
        except ManagementRefusal as refusal:
            raise refusal_response(refusal) from None

    @staticmethod
    async def managed_change(change: Awaitable[T]) -> T:
        """Await a ``manage_*`` change; its refusal becomes RabbitMQ's HTTP answer."""
        try:
            return await change
        except ManagementRefusal as refusal:
            raise refusal_response(refusal) from None

    async def _bind(
        self,
        context: ClientContext,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: Mapping[str, Any],
        *,
        unbind: bool,
    ) -> None:
        await self.managed_change(
            self.api.manage_bind(
                context,
                source,
                destination_type,
                destination,
                routing_key,
                arguments,
                unbind=unbind,
            )
        )

    @staticmethod
    def _allow(request: web.Request, methods: set[str]) -> None:
        if request.method == "HEAD" and "GET" in methods:
            return
        if request.method not in methods:
            raise web.HTTPMethodNotAllowed(request.method, sorted(methods))


def _socket_options(slot: str, address: tuple[str, int]) -> Json:
    """A listener's ``socket_opts`` as RabbitMQ shows them: the HTTP ones' address and
    Cowboy's options, the others' TCP options (the asyncio listeners' backlog; Nagle off)."""
    if slot in ("http", "https"):
        return {"cowboy_opts": {"sendfile": False}, "ip": str(address[0]), "port": int(address[1])}
    return {"backlog": 1024, "nodelay": True, "linger": [True, 0], "exit_on_close": False}
