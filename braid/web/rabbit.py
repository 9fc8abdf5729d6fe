"""The RabbitMQ management API's resources, with RabbitMQ 3.10's JSON shapes (issue 19 item 1):
what ``rabbitmqadmin``, the Terraform/Ansible modules and people's scripts call.

==========================================================  ===================================
``GET /api/overview``, ``/api/nodes[/{node}]``               the node, listeners, totals
``GET /api/exchanges[/{vhost}[/{name}]]``                    exchanges; PUT declares, DELETE
                                                             deletes (``?if-unused=true``)
``POST /api/exchanges/{vhost}/{name}/publish``               publish (``amq.default``: the
                                                             default exchange)
``GET /api/exchanges/{vhost}/{name}/bindings/source|destination``
``GET /api/queues[/{vhost}[/{name}]]``                       queues with messages,
                                                             messages_ready, _unacknowledged,
                                                             consumers, rates; PUT, DELETE
``DELETE /api/queues/{vhost}/{name}/contents``               purge
``POST /api/queues/{vhost}/{name}/get``                      browse (``ackmode``
                                                             ``ack_requeue_true`` keeps them)
``GET /api/queues/{vhost}/{name}/bindings``
``GET /api/bindings[/{vhost}]``; ``GET|POST /api/bindings/{vhost}/e/{src}/{q|e}/{dst}``;
``GET|DELETE .../{props}``                                   bindings
``GET /api/consumers[/{vhost}]``                             consumers of queues
``GET|POST /api/definitions``, ``/api/definitions/{vhost}``  export / import
``GET /api/health/checks/...``                               alarms, local-alarms,
                                                             port-listener, protocol-listener,
                                                             virtual-hosts, node-is-*-critical,
                                                             certificate-expiration
``GET /api/aliveness-test/{vhost}``                          declare, publish, get, in the vhost
==========================================================  ===================================

Who may do what, as RabbitMQ's ``rabbit_mgmt_util``: every management user reads the overview,
health checks and, for the vhosts it has a permission in, exchanges, queues, bindings and
consumers (``monitoring`` and ``administrator``: every vhost; ``/api/nodes``: ``monitoring``);
declaring, deleting, purging, publishing and getting need access to the vhost; definitions need
``administrator``.

The AMQP objects are read from the core (``core/api/management.py``: topics with their
``amqp`` config, ack queue counts, bindings), and changed through the running AMQP listener's
own virtual hosts (``gateway/amqp/vhost.py``), so that a queue declared here is the queue AMQP
clients see at once, with the same equivalence checks and error texts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from braid.web.auth import REQUEST_TAGS, REQUEST_USER, not_authorized, peer_of
from core.api import (
    EXCHANGE_QUEUE,
    PROTOCOL_INTERNAL,
    BrokerAPI,
    ClientContext,
    QueueStats,
    TopicError,
    TopicInfo,
)
from core.security import SecurityError, SecurityService
from core.security.model import (
    TAG_ADMINISTRATOR,
    TAG_MONITORING,
    TopicPermission,
    VhostPermission,
)
from core.security.passwords import PasswordHash, PasswordHashError
from gateway.amqp.errors import AmqpChannelError, AmqpError
from gateway.amqp.messages import PROPERTIES_HEADER, publish_info
from gateway.amqp.properties import decode_properties, encode_properties
from gateway.amqp.vhost import (
    BUILTIN_EXCHANGES,
    CONFIG_KEY,
    QUEUE_TOPIC_PREFIX,
    VHOST_TOPIC_PREFIX,
    VirtualHost,
)

log = logging.getLogger(__name__)

# What the management API reports itself as (rabbitmqadmin and the Terraform provider read
# the version; 3.10.x is the release whose shapes these are).
RABBIT_COMPAT_VERSION: Final = "3.10.0"
PRODUCT_NAME: Final = "BraidMQ"
DEFAULT_EXCHANGE_ALIAS: Final = "amq.default"  # the default exchange's name in URLs
ALIVENESS_QUEUE: Final = "aliveness-test"
# Slot names of braid serve's listeners -> RabbitMQ's protocol names in /api/overview.
LISTENER_PROTOCOLS: Final = {
    "amqp": "amqp",
    "amqps": "amqp/ssl",
    "mqtt": "mqtt",
    "mqtts": "mqtt/ssl",
    "mqtt-ws": "http/web-mqtt",
    "mqtt-wss": "https/web-mqtt",
    "kafka": "kafka",
    "kafka-tls": "kafka/ssl",
    "http": "http",
    "https": "https",
}
EXCHANGE_TYPE_DESCRIPTIONS: Final = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    ("x-delayed-message", "Delayed Message Exchange."),
)
GET_ACKMODES: Final = {
    "ack_requeue_true": True,
    "reject_requeue_true": True,
    "ack_requeue_false": False,
    "reject_requeue_false": False,
}

Json = dict[str, Any]


def json_response(payload: object, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, headers={"Cache-Control": "no-store"})


def not_found(reason: str = "Not Found") -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text=json.dumps({"error": "Object Not Found", "reason": reason}),
        content_type="application/json",
    )


def bad_request(reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": "bad_request", "reason": reason}),
        content_type="application/json",
    )


def unavailable(reason: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(
        text=json.dumps({"error": "service_unavailable", "reason": reason}),
        content_type="application/json",
    )


def node_name() -> str:
    return f"braid@{socket.gethostname()}"


def rate(value: float) -> Json:
    return {"rate": round(value, 1)}


def vhost_of_topic(topic: str) -> tuple[str, str]:
    """``(vhost, name in that vhost)`` of a topic (docs/amqp.md's names)."""
    if topic.startswith(VHOST_TOPIC_PREFIX):
        vhost, _, rest = topic[len(VHOST_TOPIC_PREFIX) :].partition(".")
        return vhost, rest
    return "/", topic


def topic_of(vhost: str, name: str) -> str:
    return name if vhost == "/" else f"{VHOST_TOPIC_PREFIX}{vhost}.{name}"


def properties_key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """RabbitMQ's ``properties_key`` of a binding: ``~`` for an empty key without arguments,
    the escaped routing key, or the key and a hash of the arguments."""
    if not arguments:
        return quote(routing_key, safe="") if routing_key else "~"
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).digest()
    tail = base64.urlsafe_b64encode(digest[:8]).decode().rstrip("=")
    return f"{quote(routing_key, safe='')}~{tail}"


@dataclass
class QueueRates:
    """The last count seen per queue, for ``messages_details.rate`` (messages per second
    between two polls, as RabbitMQ's ``basic`` rates mode computes from its samples)."""

    samples: dict[str, tuple[float, int, int, int]] = field(default_factory=dict)

    def of(self, topic: str, stats: QueueStats) -> tuple[float, float, float]:
        now = time.monotonic()
        total = stats.ready + stats.unacked
        previous = self.samples.get(topic)
        self.samples[topic] = (now, total, stats.ready, stats.unacked)
        if previous is None or now <= previous[0]:
            return 0.0, 0.0, 0.0
        elapsed = now - previous[0]
        return (
            (total - previous[1]) / elapsed,
            (stats.ready - previous[2]) / elapsed,
            (stats.unacked - previous[3]) / elapsed,
        )


@dataclass(frozen=True)
class ManagementSources:
    """What the management API reads besides the user store: the Broker API and the started
    listeners (by slot name; filled in as ``braid serve`` starts them)."""

    api: BrokerAPI
    listeners: Mapping[str, Any]
    started_monotonic: float = field(default_factory=time.monotonic)

    def amqp_vhosts(self) -> Mapping[str, VirtualHost]:
        server = self.listeners.get("amqp")
        vhosts = getattr(server, "vhosts", None)
        if not isinstance(vhosts, dict):
            raise unavailable("the AMQP listener is not running")
        return vhosts

    def connection_count(self) -> int:
        count = 0
        for name, server in self.listeners.items():
            if name in ("http", "https"):
                continue
            connections = getattr(server, "connections", None)
            if isinstance(connections, set | dict | list):
                count += len(connections)
        return count


class RabbitResources:
    """The handlers; :meth:`route` picks one by the path's segments."""

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
        total_rate, ready_rate, unacked_rate = self.rates.of(info.name, stats)
        name = str(config.get("name", vhost_of_topic(info.name)[1][len(QUEUE_TOPIC_PREFIX) :]))
        return {
            "name": name,
            "vhost": vhost,
            "durable": bool(config.get("durable")),
            "auto_delete": bool(config.get("auto_delete")),
            "exclusive": bool(config.get("exclusive")),
            "arguments": dict(config.get("arguments") or {}),
            "node": node_name(),
            "type": "classic",
            "state": "running",
            "policy": None,
            "operator_policy": None,
            "effective_policy_definition": {},
            "exclusive_consumer_tag": None,
            "single_active_consumer_tag": None,
            "consumers": stats.consumers,
            "consumer_utilisation": None,
            "messages": stats.ready + stats.unacked,
            "messages_details": rate(total_rate),
            "messages_ready": stats.ready,
            "messages_ready_details": rate(ready_rate),
            "messages_unacknowledged": stats.unacked,
            "messages_unacknowledged_details": rate(unacked_rate),
        }

    @staticmethod
    def exchange_json(vhost: str, name: str, config: Mapping[str, Any]) -> Json:
        return {
            "name": name,
            "vhost": vhost,
            "type": str(config.get("type", "topic")),
            "durable": bool(config.get("durable", True)),
            "auto_delete": bool(config.get("auto_delete")),
            "internal": bool(config.get("internal")),
            "arguments": dict(config.get("arguments") or {}),
            "user_who_performed_action": "rmq-internal",
        }

    def exchanges_of(self, context: ClientContext, vhosts: list[str]) -> list[Json]:
        default = {"type": "direct", "durable": True}
        found = [self.exchange_json(v, "", default) for v in vhosts]
        for vhost, info in self._amqp_objects(context, "exchange"):
            if vhost in vhosts:
                name = vhost_of_topic(info.name)[1]
                found.append(self.exchange_json(vhost, name, info.config[CONFIG_KEY]))
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
                    found.append(self._binding_json(vhost, "", name, "queue", name, {}))
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
                self._binding_json(
                    vhost, source, destination, kind, binding.pattern, binding.arguments
                )
            )
        return found

    @staticmethod
    def _binding_json(
        vhost: str,
        source: str,
        destination: str,
        destination_type: str,
        routing_key: str,
        arguments: Mapping[str, Any],
    ) -> Json:
        return {
            "source": source,
            "vhost": vhost,
            "destination": destination,
            "destination_type": destination_type,
            "routing_key": routing_key,
            "arguments": dict(arguments),
            "properties_key": properties_key(routing_key, arguments),
        }

    # -- overview and nodes ----------------------------------------------------------------

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
                    "socket_opts": {},
                }
            )
        return found

    async def overview(self, request: web.Request, _segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        vhosts = self.visible_vhosts(request)
        queues = self.queues_of(context, vhosts)
        consumers = [c for c in self.api.all_consumers(context)]
        ready = sum(q["messages_ready"] for q in queues)
        unacked = sum(q["messages_unacknowledged"] for q in queues)
        http = [listener for listener in self.listeners_json() if "http" in listener["protocol"]]
        return json_response(
            {
                "management_version": RABBIT_COMPAT_VERSION,
                "rates_mode": "basic",
                "exchange_types": self._exchange_types(),
                "product_version": _braid_version(),
                "product_name": PRODUCT_NAME,
                "rabbitmq_version": RABBIT_COMPAT_VERSION,
                "cluster_name": node_name(),
                "erlang_version": platform.python_version(),
                "erlang_full_version": f"Python {platform.python_version()}",
                "disable_stats": False,
                "enable_queue_totals": False,
                "message_stats": {},
                "churn_rates": {},
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_details": rate(0.0),
                    "messages_ready": ready,
                    "messages_ready_details": rate(0.0),
                    "messages_unacknowledged": unacked,
                    "messages_unacknowledged_details": rate(0.0),
                },
                "object_totals": {
                    "channels": 0,
                    "connections": self.sources.connection_count(),
                    "consumers": len(consumers),
                    "exchanges": len(self.exchanges_of(context, vhosts)),
                    "queues": len(queues),
                },
                "statistics_db_event_queue": 0,
                "node": node_name(),
                "listeners": self.listeners_json(),
                "contexts": [
                    {
                        "node": node_name(),
                        "description": "RabbitMQ Management",
                        "path": "/",
                        "port": str(listener["port"]),
                    }
                    for listener in http
                ],
            }
        )

    @staticmethod
    def _exchange_types() -> list[Json]:
        return [
            {"name": name, "description": description, "enabled": True}
            for name, description in EXCHANGE_TYPE_DESCRIPTIONS
        ]

    def node_json(self) -> Json:
        uptime_ms = int((time.monotonic() - self.sources.started_monotonic) * 1000)
        disk = shutil.disk_usage(".")
        rss = rss_bytes()
        try:
            fd_used = len(os.listdir("/proc/self/fd"))
        except OSError:
            fd_used = 0
        import resource

        fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return {
            "name": node_name(),
            "type": "disc",
            "running": True,
            "being_drained": False,
            "uptime": uptime_ms,
            "os_pid": str(os.getpid()),
            "processors": os.cpu_count() or 1,
            "run_queue": 0,
            "mem_used": rss,
            "mem_limit": 0,
            "mem_alarm": False,
            "disk_free": disk.free,
            "disk_free_limit": 0,
            "disk_free_alarm": False,
            "fd_used": fd_used,
            "fd_total": fd_total,
            "sockets_used": self.sources.connection_count(),
            "sockets_total": fd_total,
            "proc_used": 1,
            "proc_total": 1,
            "partitions": [],
            "applications": [],
            "exchange_types": self._exchange_types(),
            "rates_mode": "basic",
            "net_ticktime": 60,
            "enabled_plugins": ["rabbitmq_management"],
        }

    async def nodes(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._require(request, TAG_MONITORING)
        if len(segments) == 1:
            return json_response([self.node_json()])
        if segments[1] != node_name():
            raise not_found()
        return json_response(self.node_json())

    # -- exchanges -------------------------------------------------------------------------

    async def exchanges(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            return json_response(self.exchanges_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            return json_response(self.exchanges_of(context, [vhost]))
        name = "" if segments[2] == DEFAULT_EXCHANGE_ALIAS else segments[2]
        if len(segments) == 3:
            return await self._exchange(request, vhost, name)
        if len(segments) == 4 and segments[3] == "publish" and request.method == "POST":
            return await self._publish(request, vhost, name)
        if (
            len(segments) == 5
            and segments[3] == "bindings"
            and segments[4]
            in (
                "source",
                "destination",
            )
        ):
            self._allow(request, {"GET"})
            key = segments[4]
            kind_ok = (
                (lambda b: True)
                if key == "source"
                else (lambda b: b["destination_type"] == "exchange")
            )
            return json_response(
                [b for b in self.bindings_of(context, [vhost]) if b[key] == name and kind_ok(b)]
            )
        raise not_found()

    async def _exchange(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        context = self.context(request, vhost)
        if request.method in ("GET", "HEAD"):
            for exchange in self.exchanges_of(context, [vhost]):
                if exchange["name"] == name:
                    return json_response(exchange)
            raise not_found()
        amqp_vhost = self._amqp_vhost(vhost)
        if request.method == "DELETE":
            if amqp_vhost.find_exchange(context, name) is None:
                raise not_found()
            if_unused = request.query.get("if-unused") == "true"
            self._amqp(lambda: amqp_vhost.delete_exchange(context, name, if_unused=if_unused))
            return web.Response(status=204)
        body = await read_json(request)
        ex_type = body.get("type", "direct")
        arguments = body.get("arguments") or {}
        if not isinstance(ex_type, str) or not isinstance(arguments, dict):
            raise bad_request("type must be a string and arguments an object")
        existed = amqp_vhost.find_exchange(context, name) is not None
        self._amqp(
            lambda: amqp_vhost.declare_exchange(
                context,
                name,
                ex_type,
                passive=False,
                durable=bool(body.get("durable", True)),
                auto_delete=bool(body.get("auto_delete", False)),
                internal=bool(body.get("internal", False)),
                arguments=arguments,
            )
        )
        return web.Response(status=204 if existed else 201)

    async def _publish(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        context = self.context(request, vhost)
        body = await read_json(request)
        routing_key = body.get("routing_key", "")
        payload = body.get("payload", "")
        encoding = body.get("payload_encoding", "string")
        properties = body.get("properties") or {}
        if not isinstance(routing_key, str) or not isinstance(payload, str):
            raise bad_request("routing_key and payload must be strings")
        if not isinstance(properties, dict):
            raise bad_request("properties must be an object")
        if encoding == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except ValueError:
                raise bad_request("payload is not base64") from None
        elif encoding == "string":
            data = payload.encode()
        else:
            raise bad_request(f"payload_encoding must be string or base64, not {encoding!r}")
        try:
            info = publish_info(encode_properties(properties))
        except (AmqpError, TypeError, ValueError, KeyError) as error:
            raise bad_request(f"invalid properties: {error}") from None
        amqp_vhost = self._amqp_vhost(vhost)
        if name == "":
            queue = amqp_vhost.find_queue(routing_key)
            if queue is None:
                return json_response({"routed": False})
            topic = queue.topic
        else:
            exchange = amqp_vhost.find_exchange(context, name)
            if exchange is None:
                raise not_found()
            topic = exchange.topic
        try:
            publication = self.api.publish(
                context,
                topic,
                data,
                subject=routing_key,
                headers=info.headers,
                routing_headers=info.table,
                address=peer_of(request),
                create_topic=False,
            )
            outcome = await publication
        except TopicError as error:
            raise bad_request(str(error)) from None
        routed = any(self.api.has_ack_queue(d) for d in outcome.delivered_to)
        return json_response({"routed": routed})

    # -- queues ----------------------------------------------------------------------------

    async def queues(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            return json_response(self.queues_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            return json_response(self.queues_of(context, [vhost]))
        name = segments[2]
        if len(segments) == 3:
            return await self._queue(request, vhost, name)
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + name)
        if self.api.queue_info(context, topic) is None:
            raise not_found()
        if segments[3:] == ["contents"]:
            self._allow(request, {"DELETE"})
            purged = self.api.purge_queue(self.context(request, vhost), topic)
            log.info(
                "management: %s purged %s records of queue %r in vhost %r",
                request[REQUEST_USER],
                purged,
                name,
                vhost,
            )
            return web.Response(status=204)
        if segments[3:] == ["get"]:
            self._allow(request, {"POST"})
            return await self._get(request, vhost, name, topic)
        if segments[3:] == ["bindings"]:
            self._allow(request, {"GET"})
            return json_response(
                [
                    b
                    for b in self.bindings_of(context, [vhost])
                    if b["destination"] == name and b["destination_type"] == "queue"
                ]
            )
        raise not_found()

    async def _queue(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        context = self.context(request, vhost)
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + name)
        if request.method in ("GET", "HEAD"):
            for queue in self.queues_of(context, [vhost]):
                if queue["name"] == name:
                    return json_response(queue)
            raise not_found()
        amqp_vhost = self._amqp_vhost(vhost)
        if request.method == "DELETE":
            if amqp_vhost.find_queue(name) is None:
                raise not_found()
            if_unused = request.query.get("if-unused") == "true"
            if_empty = request.query.get("if-empty") == "true"
            self._amqp(
                lambda: amqp_vhost.delete_queue(None, name, if_unused=if_unused, if_empty=if_empty)
            )
            self.rates.samples.pop(topic, None)
            return web.Response(status=204)
        body = await read_json(request)
        arguments = body.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise bad_request("arguments must be an object")
        existed = amqp_vhost.find_queue(name) is not None
        self._amqp(
            lambda: amqp_vhost.declare_queue(
                context,
                None,
                name,
                passive=False,
                durable=bool(body.get("durable", True)),
                exclusive=False,
                auto_delete=bool(body.get("auto_delete", False)),
                arguments=arguments,
            )
        )
        return web.Response(status=204 if existed else 201)

    async def _get(
        self, request: web.Request, vhost: str, name: str, topic: str
    ) -> web.StreamResponse:
        body = await read_json(request)
        # rabbitmqadmin sends numbers as strings ("count": "1"); RabbitMQ takes both.
        count = _integer(body.get("count", 1))
        if count is None or count < 1:
            raise bad_request("count must be a positive integer")
        if "ackmode" in body:
            if body["ackmode"] not in GET_ACKMODES:
                raise bad_request(f"ackmode must be one of {', '.join(GET_ACKMODES)}")
            requeue = GET_ACKMODES[body["ackmode"]]
        else:  # rabbitmqadmin v1 and RabbitMQ before 3.7 send "requeue"
            requeue = bool(body.get("requeue", True))
        encoding = body.get("encoding", "auto")
        truncate = _integer(body.get("truncate"))
        context = self.context(request, vhost)
        before = (self.api.queue_info(context, topic) or QueueStats(0, 0, 0)).ready
        browsed = self.api.browse_queue(context, topic, count, requeue=requeue) or []
        answers: list[Json] = []
        for index, message in enumerate(browsed):
            payload = message.body
            if truncate is not None and truncate >= 0:
                payload = payload[:truncate]
            text: str | None = None
            if encoding != "base64":
                try:
                    text = payload.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            exchange = vhost_of_topic(message.topic)[1]
            if exchange.startswith(QUEUE_TOPIC_PREFIX):
                exchange = ""
            answers.append(
                {
                    "payload_bytes": len(message.body),
                    "redelivered": message.redelivered,
                    "exchange": exchange,
                    "routing_key": message.subject,
                    # What was still ready behind this one when it was taken.
                    "message_count": max(before - index - 1, 0),
                    "properties": properties_json(message.headers),
                    "payload": text if text is not None else base64.b64encode(payload).decode(),
                    "payload_encoding": "string" if text is not None else "base64",
                }
            )
        return json_response(answers)

    # -- bindings --------------------------------------------------------------------------

    async def bindings(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            self._allow(request, {"GET"})
            return json_response(self.bindings_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            self._allow(request, {"GET"})
            return json_response(self.bindings_of(context, [vhost]))
        if len(segments) not in (6, 7) or segments[2] != "e" or segments[4] not in ("q", "e"):
            raise not_found()
        source, destination = segments[3], segments[5]
        destination_type = "queue" if segments[4] == "q" else "exchange"
        matching = [
            b
            for b in self.bindings_of(context, [vhost], with_default=False)
            if b["source"] == source
            and b["destination"] == destination
            and b["destination_type"] == destination_type
        ]
        amqp_context = self.context(request, vhost)
        if len(segments) == 6:
            self._allow(request, {"GET", "POST"})
            if request.method in ("GET", "HEAD"):
                return json_response(matching)
            body = await read_json(request)
            routing_key = body.get("routing_key", "")
            arguments = body.get("arguments") or {}
            if not isinstance(routing_key, str) or not isinstance(arguments, dict):
                raise bad_request("routing_key must be a string and arguments an object")
            self._bind(
                amqp_context,
                vhost,
                source,
                destination_type,
                destination,
                routing_key,
                arguments,
                unbind=False,
            )
            location = (
                f"/api/bindings/{quote(vhost, safe='')}/e/{quote(source, safe='')}/"
                f"{segments[4]}/{quote(destination, safe='')}/"
                f"{properties_key(routing_key, arguments)}"
            )
            return web.Response(status=201, headers={"Location": location})
        self._allow(request, {"GET", "DELETE"})
        props = segments[6]
        found = [b for b in matching if b["properties_key"] in (props, quote(props, safe=""))]
        if not found:
            raise not_found()
        if request.method in ("GET", "HEAD"):
            return json_response(found[0])
        binding = found[0]
        self._bind(
            amqp_context,
            vhost,
            source,
            destination_type,
            destination,
            binding["routing_key"],
            binding["arguments"],
            unbind=True,
        )
        return web.Response(status=204)

    def _bind(
        self,
        context: ClientContext,
        vhost: str,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: Mapping[str, Any],
        *,
        unbind: bool,
    ) -> None:
        amqp_vhost = self._amqp_vhost(vhost)
        if destination_type == "queue":
            self._amqp(
                lambda: amqp_vhost.bind_queue(
                    context, None, destination, source, routing_key, arguments, unbind=unbind
                )
            )
        else:
            self._amqp(
                lambda: amqp_vhost.bind_exchange(
                    context, destination, source, routing_key, arguments, unbind=unbind
                )
            )

    # -- consumers -------------------------------------------------------------------------

    async def consumers(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        context = self.context(request)
        if len(segments) == 2:
            self._check_vhost(request, segments[1])
            vhosts = [segments[1]]
        else:
            vhosts = self.visible_vhosts(request)
        queues = self._queue_names(context)
        found: list[Json] = []
        for consumer in self.api.all_consumers(context):
            owner = queues.get(consumer.queue_topic)
            if owner is None or owner[0] not in vhosts:
                continue
            found.append(
                {
                    "consumer_tag": consumer.tag,
                    "queue": {"name": owner[1], "vhost": owner[0]},
                    "ack_required": consumer.ack_required,
                    "prefetch_count": consumer.prefetch,
                    "exclusive": False,
                    "active": True,
                    "activity_status": "up",
                    "arguments": {},
                    "consumer_timeout": None,
                    "channel_details": {},
                }
            )
        return json_response(found)

    # -- definitions -----------------------------------------------------------------------

    async def definitions(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET", "POST"})
        self._require(request, TAG_ADMINISTRATOR)
        if len(segments) > 2:
            raise not_found()
        only = segments[1] if len(segments) == 2 else None
        if only is not None:
            self._check_vhost(request, only)
        if request.method == "POST":
            body = await read_json(request)
            await self.import_definitions(request, body, only)
            return web.Response(status=204)
        return json_response(self.export_definitions(request, only))

    def export_definitions(self, request: web.Request, only: str | None) -> Json:
        context = self.context(request)
        vhosts = [only] if only is not None else list(self.security.vhosts)
        store = self.security.store
        builtin = {name for name, _type in BUILTIN_EXCHANGES}
        exchanges = [
            {
                key: e[key]
                for key in (
                    "name",
                    "vhost",
                    "type",
                    "durable",
                    "auto_delete",
                    "internal",
                    "arguments",
                )
            }
            for e in self.exchanges_of(context, vhosts)
            if e["name"] and e["name"] not in builtin
        ]
        queues = [
            {key: q[key] for key in ("name", "vhost", "durable", "auto_delete", "arguments")}
            for q in self.queues_of(context, vhosts)
            if not q["exclusive"]
        ]
        bindings = [
            {
                key: b[key]
                for key in (
                    "source",
                    "vhost",
                    "destination",
                    "destination_type",
                    "routing_key",
                    "arguments",
                )
            }
            for b in self.bindings_of(context, vhosts, with_default=False)
        ]
        if only is not None:  # RabbitMQ's per-vhost export has no users or vhosts
            for item in (*exchanges, *queues, *bindings):
                item.pop("vhost", None)
            return {
                "rabbit_version": RABBIT_COMPAT_VERSION,
                "rabbitmq_version": RABBIT_COMPAT_VERSION,
                "product_name": PRODUCT_NAME,
                "product_version": _braid_version(),
                "parameters": [],
                "policies": [],
                "queues": queues,
                "exchanges": exchanges,
                "bindings": bindings,
            }
        return {
            "rabbit_version": RABBIT_COMPAT_VERSION,
            "rabbitmq_version": RABBIT_COMPAT_VERSION,
            "product_name": PRODUCT_NAME,
            "product_version": _braid_version(),
            "users": [
                {
                    "name": user.name,
                    "password_hash": user.password.value,
                    "hashing_algorithm": user.password.algorithm,
                    "tags": list(user.tags),
                    "limits": {},
                }
                for user in store.users()
            ],
            "vhosts": [{"name": vhost, "limits": [], "metadata": {}} for vhost in vhosts],
            "permissions": [
                {"user": user, "vhost": vhost, **permission.to_json()}
                for vhost, user, permission in store.permissions()
            ],
            "topic_permissions": [
                {"user": user, "vhost": vhost, **permission.to_json()}
                for vhost, user, permission in store.topic_permissions()
            ],
            "parameters": [],
            "global_parameters": [],
            "policies": [],
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }

    async def import_definitions(self, request: web.Request, body: Json, only: str | None) -> None:
        """Users, permissions, topic permissions, exchanges, queues and bindings, in that order
        (RabbitMQ's rabbit_definitions). Vhosts must be configured ones: a vhost the document
        names that ``braid serve`` has not is refused before anything changes."""
        known = set(self.security.vhosts)

        def items(key: str) -> list[Json]:
            value = body.get(key) or []
            if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
                raise bad_request(f"{key} must be a list of objects")
            if only is not None:
                value = [{**item, "vhost": only} for item in value]
            return value

        for key in ("permissions", "topic_permissions", "queues", "exchanges", "bindings"):
            for item in items(key):
                if item.get("vhost") not in known:
                    raise bad_request(
                        f"vhost {item.get('vhost')!r} of {key} is not configured "
                        f"(vhosts: {', '.join(sorted(known))})"
                    )
        for vhost_item in items("vhosts") if only is None else []:
            if vhost_item.get("name") not in known:
                raise bad_request(f"vhost {vhost_item.get('name')!r} is not configured")
        try:
            for user in items("users") if only is None else []:
                tags = user.get("tags", [])
                algorithm = str(user.get("hashing_algorithm") or "rabbit_password_hashing_sha256")
                await self.security.put_user(
                    str(user["name"]),
                    password_hash=PasswordHash(algorithm, str(user.get("password_hash", ""))),
                    tags=tags if isinstance(tags, list | str) else "",
                )
            for item in items("permissions"):
                await self.security.set_permission(
                    str(item["vhost"]), str(item["user"]), VhostPermission.from_json(item)
                )
            for item in items("topic_permissions"):
                await self.security.set_topic_permission(
                    str(item["vhost"]), str(item["user"]), TopicPermission.from_json(item)
                )
        except (KeyError, PasswordHashError) as error:
            raise bad_request(f"invalid definitions: {error}") from None
        except SecurityError as error:
            raise bad_request(str(error)) from None
        for item in items("exchanges"):
            self._import_exchange(request, item)
        for item in items("queues"):
            self._import_queue(request, item)
        for item in items("bindings"):
            vhost = str(item["vhost"])
            self._bind(
                self.context(request, vhost),
                vhost,
                str(item["source"]),
                str(item.get("destination_type", "queue")),
                str(item["destination"]),
                str(item.get("routing_key", "")),
                dict(item.get("arguments") or {}),
                unbind=False,
            )
        log.info("management: %s imported definitions", request[REQUEST_USER])

    def _import_exchange(self, request: web.Request, item: Json) -> None:
        vhost = str(item["vhost"])
        context = self.context(request, vhost)
        amqp_vhost = self._amqp_vhost(vhost)
        self._amqp(
            lambda: amqp_vhost.declare_exchange(
                context,
                str(item["name"]),
                str(item.get("type", "direct")),
                passive=False,
                durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)),
                internal=bool(item.get("internal", False)),
                arguments=dict(item.get("arguments") or {}),
            )
        )

    def _import_queue(self, request: web.Request, item: Json) -> None:
        vhost = str(item["vhost"])
        context = self.context(request, vhost)
        amqp_vhost = self._amqp_vhost(vhost)
        self._amqp(
            lambda: amqp_vhost.declare_queue(
                context,
                None,
                str(item["name"]),
                passive=False,
                durable=bool(item.get("durable", True)),
                exclusive=False,
                auto_delete=bool(item.get("auto_delete", False)),
                arguments=dict(item.get("arguments") or {}),
            )
        )

    # -- health ----------------------------------------------------------------------------

    async def health(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        if len(segments) < 3 or segments[1] != "checks":
            raise not_found()
        check, arguments = segments[2], segments[3:]
        if check in ("alarms", "local-alarms"):
            reason = self.api.publishing_blocked_reason()
            if reason:
                return json_response(
                    {
                        "status": "failed",
                        "reason": f"resource alarm in effect: {reason}",
                        "alarms": [{"node": node_name(), "resource": reason}],
                    },
                    503,
                )
            return json_response({"status": "ok"})
        if check == "port-listener" and len(arguments) == 1:
            ports = {listener["port"] for listener in self.listeners_json()}
            if arguments[0].isdigit() and int(arguments[0]) in ports:
                return json_response({"status": "ok", "port": int(arguments[0])})
            return json_response(
                {
                    "status": "failed",
                    "reason": f"No active listener on port {arguments[0]}",
                    "missing": arguments[0],
                    "ports": sorted(ports),
                },
                503,
            )
        if check == "protocol-listener" and len(arguments) == 1:
            protocols = {listener["protocol"] for listener in self.listeners_json()}
            wanted = arguments[0].lower()
            if wanted in protocols:
                return json_response({"status": "ok", "protocols": sorted(protocols)})
            return json_response(
                {
                    "status": "failed",
                    "reason": f"No active listener for protocol {arguments[0]}",
                    "missing": arguments[0],
                    "protocols": sorted(protocols),
                },
                503,
            )
        if check == "virtual-hosts" and not arguments:
            return json_response({"status": "ok"})
        if check in ("node-is-quorum-critical", "node-is-mirror-sync-critical") and not arguments:
            return json_response({"status": "ok"})  # one node: nothing depends on it elsewhere
        if check == "certificate-expiration" and len(arguments) == 2:
            return json_response({"status": "ok"})
        raise not_found()

    async def aliveness(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        if len(segments) != 2:
            raise not_found()
        vhost = segments[1]
        self._check_vhost(request, vhost)
        context = self.context(request, vhost)
        amqp_vhost = self._amqp_vhost(vhost)
        self._amqp(
            lambda: amqp_vhost.declare_queue(
                context,
                None,
                ALIVENESS_QUEUE,
                passive=False,
                durable=False,
                exclusive=False,
                auto_delete=False,
                arguments={},
            )
        )
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + ALIVENESS_QUEUE)
        self.api.purge_queue(context, topic)
        await self.api.publish(
            context, topic, b"test_message", subject=ALIVENESS_QUEUE, create_topic=False
        )
        got = self.api.browse_queue(context, topic, 1, requeue=False) or []
        if not got or got[0].body != b"test_message":
            return json_response({"status": "failed", "reason": "no message came back"}, 503)
        return json_response({"status": "ok"})

    # -- helpers ---------------------------------------------------------------------------

    def _amqp_vhost(self, vhost: str) -> VirtualHost:
        vhosts = self.sources.amqp_vhosts()
        found = vhosts.get(vhost)
        if found is None:
            raise not_found()
        return found

    @staticmethod
    def _amqp(action: Callable[[], object]) -> None:
        """Run a change through the AMQP vhost; its channel errors become 400 (RabbitMQ's
        management API answers a 406 precondition with 400 and the same text)."""
        try:
            action()
        except AmqpChannelError as error:
            text = str(error.reply_text)
            if error.reply_code == 404:
                raise not_found(text) from None
            raise bad_request(text) from None

    @staticmethod
    def _allow(request: web.Request, methods: set[str]) -> None:
        if request.method == "HEAD" and "GET" in methods:
            return
        if request.method not in methods:
            raise web.HTTPMethodNotAllowed(request.method, sorted(methods))


ROUTES: Final[dict[str, Callable[[RabbitResources, web.Request, list[str]], Any]]] = {
    "overview": RabbitResources.overview,
    "nodes": RabbitResources.nodes,
    "exchanges": RabbitResources.exchanges,
    "queues": RabbitResources.queues,
    "bindings": RabbitResources.bindings,
    "consumers": RabbitResources.consumers,
    "definitions": RabbitResources.definitions,
    "health": RabbitResources.health,
    "aliveness-test": RabbitResources.aliveness,
}


async def read_json(request: web.Request) -> Json:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("the body is not JSON") from None
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def properties_json(headers: list[tuple[str, bytes]]) -> Json:
    """A stored AMQP record's properties as RabbitMQ's ``/get`` shows them; a record another
    protocol published has none (its headers are under ``headers``)."""
    for name, value in headers:
        if name == PROPERTIES_HEADER:
            try:
                decoded = decode_properties(value)
            except Exception:  # a record whose properties cannot be decoded is shown bare
                return {}
            return {key: _jsonable(item) for key, item in dict(decoded).items() if item is not None}
    shown = {
        name: value.decode("utf-8", "replace")
        for name, value in headers
        if not name.startswith("x-braid-")
    }
    return {"headers": shown} if shown else {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def _integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _braid_version() -> str:
    try:
        from importlib.metadata import version

        return version("braidmq")
    except Exception:  # not installed as a package (a checkout)
        return "0.0.0"
