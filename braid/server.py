"""``braid serve``: assemble the broker process and run it until SIGINT or SIGTERM.

Start order: take the data-directory lock, open (and recover) the :class:`~core.log.LogStore`,
start its background tasks (flush, checkpoint, retention), build the broker's
:class:`~core.broker.Node` on it (its one shard over the store; the Broker API gateways talk to
is built over it) and start its tasks, start the listeners of
:data:`LISTENERS` (the protocol gateways and the HTTP operations endpoint), then print exactly
one ready line to stdout::

    braid ready: data=./data amqp=- mqtt=- mqtt-ws=- kafka=- http=127.0.0.1:8080

Each listener shows ``host:port`` once it accepts connections, ``-`` when it is off (port 0) or
not implemented yet. Nothing else is written to stdout; logs go to stderr.

SIGHUP reloads the TLS certificate, key and CA file (braid/tls.py) without dropping connections.

Stop order (on SIGINT/SIGTERM): stop accepting (listeners closed, newest first), close the broker
(writes its pending ack state), flush and close the store (which writes the ``clean_shutdown``
marker), release the lock, exit 0.

This module is the only one that imports the gateways (ARCHITECTURE.md: the process that
assembles the listeners is the only place that knows all three).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from braid import version
from braid.config import LOCK_FILE, MAX_PORT, ServerSettings, default_amqp_users
from braid.dirlock import DirectoryLocked, lock_directory
from braid.metrics import (
    COUNTER,
    GAUGE,
    Collector,
    Family,
    MetricsRegistry,
    process_collector,
    store_collector,
)
from braid.tls import Listen, TlsConfigError, TlsContext, TlsListener, tls_listen
from braid.web import HealthCheck, WebServer, build_app
from braid.web.rabbit import ManagementSources
from braid.web.server import ResponseCounter
from core.api import BrokerAPI
from core.api.limits import attach_limits
from core.broker import Node
from core.cluster import layout as cluster_layout
from core.cluster.split import SplitMetadata
from core.limits import LimitsService, LimitsStore
from core.log import LogConfig, LogStore, StoreFenced, names
from core.security import SecurityService
from core.security.store import SecurityStore

if TYPE_CHECKING:  # imported when a cluster node starts: redis and grpc cost a single node
    from aiohttp import web
    from redis.asyncio import Redis

    from braid.cluster_http import ClusterHttp, NodeAdmin
    from core.cluster import node_runner
    from core.cluster.drain import DrainWatch

log = logging.getLogger(__name__)

# How long a stop that interrupted the start may take to close what the start opened.
STOP_WHILE_STARTING_S = 10.0

NOT_LISTENING = "-"
# The listen backlog of the HTTP port when a supervised worker binds it itself (aiohttp's
# TCPSite default, which the single node keeps).
HTTP_BACKLOG = 128
# A supervised worker's own Kafka ports (docs/cluster.md section 9): named so in the ready line.
KAFKA_WORKER_LISTENER = "kafka-worker"
KAFKA_TLS_WORKER_LISTENER = "kafka-tls-worker"
# Help texts of Node.metrics counters (exported as braid_broker_<key>_total).
BROKER_METRICS = {
    "retried": "Unconsumed records re-queued for another attempt after a retry delay.",
    "dead_lettered": "Unconsumed records moved (linked) to a dead-letter topic.",
    "dropped": "Unconsumed records dropped: no dead-letter topic, or a dead-letter cycle.",
}


class Listener(Protocol):
    """What a listener factory returns: a started server."""

    @property
    def address(self) -> tuple[str, int] | None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ServerContext:
    """What a listener factory gets to build its server from."""

    settings: ServerSettings
    broker: Node  # the core itself: for braid's own metrics and health, never a gateway
    api: BrokerAPI  # the Broker API (core/api/): the only thing a gateway talks to
    metrics: MetricsRegistry  # register(...) / register_counters(...) the listener's metrics
    health: HealthCheck
    # The user store, logins and access decisions (the gateways reach it through the API).
    security: SecurityService | None = None
    # The one server TLS context every TLS listener shares; None without a certificate.
    tls: TlsContext | None = None
    # The gateway servers started so far, by slot name: a TLS listener serves its plain
    # listener's connections (braid/tls.py).
    started: dict[str, Any] = field(default_factory=dict)
    # Responses of the HTTP and HTTPS listeners, by status code.
    http_responses: ResponseCounter = field(default_factory=ResponseCounter)
    # A supervised worker (`--workers N`, docs/cluster.md section 9): every listener's port is
    # shared by the workers, so each binds it with SO_REUSEPORT and the kernel spreads the
    # accepted connections over them.
    reuse_port: bool = False
    # A cluster node's HTTP answers for the whole cluster (braid/cluster_http.py): the HTTP
    # and HTTPS listeners' applications are given them; None on a single node.
    cluster_http: ClusterHttp | None = None


ListenerFactory = Callable[[ServerContext, str, int], Awaitable[Listener]]


@dataclass(frozen=True)
class ListenerSlot:
    name: str  # as shown in the ready line and logs
    port_setting: str  # attribute of ListenerSettings holding its port (0: off)
    factory: ListenerFactory | None  # None: not implemented yet
    tls: bool = False  # on only when a TLS certificate is configured


class StartupError(Exception):
    """The server could not start; the message says what and where."""


class _WorkerPort:
    """A supervised worker's own Kafka port: more connections for the Kafka gateway that the
    shared port's listener started (which owns and closes them), so closing this one only
    stops accepting."""

    def __init__(self, server: asyncio.Server) -> None:
        self._server: asyncio.Server | None = server

    @property
    def address(self) -> tuple[str, int] | None:
        server = self._server
        if server is None or not server.sockets:
            return None
        sockname = server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()


def raise_descriptor_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (issue 21 item 3: the broker kept the
    soft 1,024 of most shells while its hard limit allowed far more), as Kafka's and RabbitMQ's
    start scripts have the operator do; logged. What the log and the connections may use of it
    is decided from the raised limit (core/log/openfiles.py, core/broker/flow.py)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.info("file descriptor limit: %s", "unlimited" if soft < 0 else soft)
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as error:
        log.warning("cannot raise the file descriptor limit from %d to %d: %s", soft, hard, error)
        return
    log.info(
        "file descriptor limit raised from %d to %s (the hard limit)",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
    )


def lock_holder_pid(data_dir: Path) -> str:
    """The pid the broker holding ``data_dir`` wrote into ``braid.lock`` ("?" if unknown)."""
    try:
        return (data_dir / LOCK_FILE).read_text()[:32].strip() or "?"
    except OSError:
        return "?"


def _plain_listen(context: ServerContext, backlog: int) -> Listen | None:
    """How a plain (not TLS) listener binds: None (the gateway's own ``create_server``) on a
    single node; with SO_REUSEPORT as well for a supervised worker, whose port other workers
    bind too."""
    if not context.reuse_port:
        return None

    async def listen(
        protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
    ) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(
            protocol_factory,
            host,
            port,
            reuse_address=True,
            reuse_port=True,
            backlog=backlog,
        )

    return listen


def _sources(context: ServerContext) -> ManagementSources:
    """What the management API reads: the Broker API and the listeners as they start."""
    return ManagementSources(context.api, context.started)


def _cluster_app(context: ServerContext, app: web.Application) -> None:
    """A cluster node's application answers /metrics and the listings for the cluster."""
    if context.cluster_http is None:
        return
    from braid.cluster_http import enable_cluster_http
    from braid.web.rabbit import RabbitResources

    security = context.security
    resources = None if security is None else RabbitResources(security, _sources(context))
    enable_cluster_http(app, context.cluster_http, resources)


async def _start_http(context: ServerContext, host: str, port: int) -> Listener:
    app = build_app(context.health, context.metrics, context.security, sources=_sources(context))
    _cluster_app(context, app)
    server = WebServer(app, context.http_responses)
    await server.start(host, port, listen=_plain_listen(context, HTTP_BACKLOG))
    return server


async def _start_https(context: ServerContext, host: str, port: int) -> Listener:
    assert context.tls is not None
    app = build_app(context.health, context.metrics, context.security, sources=_sources(context))
    _cluster_app(context, app)
    server = WebServer(app, context.http_responses)
    await server.start(
        host, port, listen=tls_listen(context.tls, "http", reuse_port=context.reuse_port)
    )
    return server


def _tls_of(
    plain: str, factory: Callable[[Any], Callable[[], asyncio.BaseProtocol]]
) -> ListenerFactory:
    """A TLS listener that serves the connections of the started plain listener ``plain``
    (its gateway server), made by ``factory(gateway server)``."""

    async def start(context: ServerContext, host: str, port: int) -> Listener:
        assert context.tls is not None
        gateway = context.started.get(plain)
        if gateway is None:
            raise StartupError(
                f"the TLS listener of {plain} needs the {plain} listener on (its port is 0); "
                "a TLS-only gateway is not supported yet"
            )
        # protocol=: the audit line of a failed handshake (mqtt-ws is MQTT too).
        listener = TlsListener(
            factory(gateway),
            context.tls,
            protocol=plain.split("-")[0],
            reuse_port=context.reuse_port,
        )
        await listener.start(host, port)
        return listener

    return start


def _amqp_connections(server: Any) -> Callable[[], asyncio.BaseProtocol]:
    from gateway.amqp.server import AmqpConnection

    return lambda: AmqpConnection(server)


def _mqtt_connections(server: Any) -> Callable[[], asyncio.BaseProtocol]:
    from gateway.mqtt.server import MqttProtocol

    return lambda: MqttProtocol(server)


def _mqtt_ws_connections(server: Any) -> Callable[[], asyncio.BaseProtocol]:
    from gateway.mqtt.server import MqttProtocol
    from gateway.mqtt.websocket import WebSocketProtocol

    return lambda: WebSocketProtocol(MqttProtocol(server))


def _kafka_connections(server: Any) -> Callable[[], asyncio.BaseProtocol]:
    from gateway.kafka.server import KafkaConnection

    return lambda: KafkaConnection(server, server.context)


async def _start_mqtt(context: ServerContext, host: str, port: int) -> Listener:
    from gateway.mqtt.options import MqttOptions
    from gateway.mqtt.server import LISTEN_BACKLOG, MQTTServer

    # The TCP and WebSocket listeners share one hub (made with the first one's options: the same).
    options = MqttOptions(**context.settings.mqtt_options)  # type: ignore[arg-type]
    server = MQTTServer(context.api, options=options)
    context.metrics.register_counters("braid_mqtt_", lambda: server.metrics)
    await server.start(host, port, _plain_listen(context, LISTEN_BACKLOG))
    return server


async def _start_mqtt_ws(context: ServerContext, host: str, port: int) -> Listener:
    from gateway.mqtt.options import MqttOptions
    from gateway.mqtt.server import LISTEN_BACKLOG, MQTTServer

    options = MqttOptions(**context.settings.mqtt_options)  # type: ignore[arg-type]
    server = MQTTServer(context.api, websocket=True, options=options)
    context.metrics.register_counters("braid_mqtt_ws_", lambda: server.metrics)
    await server.start(host, port, _plain_listen(context, LISTEN_BACKLOG))
    return server


def _mqtt_tls(plain: str, websocket: bool) -> ListenerFactory:
    """MQTTS (or MQTT over secure WebSocket): the connections of the plain listener ``plain``
    when it is on, else a gateway server of its own on the TLS port alone."""
    connections = _mqtt_ws_connections if websocket else _mqtt_connections
    beside_plain = _tls_of(plain, connections)

    async def start(context: ServerContext, host: str, port: int) -> Listener:
        from gateway.mqtt.options import MqttOptions
        from gateway.mqtt.server import MQTTServer

        assert context.tls is not None
        if plain in context.started:
            return await beside_plain(context, host, port)
        options = MqttOptions(**context.settings.mqtt_options)  # type: ignore[arg-type]
        server = MQTTServer(context.api, websocket=websocket, options=options)
        prefix = "braid_mqtt_wss_" if websocket else "braid_mqtts_"
        context.metrics.register_counters(prefix, lambda: server.metrics)
        listen = tls_listen(context.tls, "mqtt", reuse_port=context.reuse_port)
        await server.start(host, port, listen=listen)
        return server

    return start


async def _start_amqp(context: ServerContext, host: str, port: int) -> Listener:
    from gateway.amqp.server import LISTEN_BACKLOG

    listen = _plain_listen(context, LISTEN_BACKLOG)
    return await _start_amqp_server(context, host, port, listen, tls=False)


def _amqp_tls(context: ServerContext, host: str, port: int) -> Awaitable[Listener]:
    """AMQPS: the plain listener's connections when it is on, else an AMQP server of its own
    on the TLS port alone (``--amqp-port 0``)."""
    if "amqp" in context.started:
        return _tls_of("amqp", _amqp_connections)(context, host, port)
    assert context.tls is not None
    listen = tls_listen(context.tls, "amqp", reuse_port=context.reuse_port)
    return _start_amqp_server(context, host, port, listen, tls=True)


async def _start_amqp_server(
    context: ServerContext, host: str, port: int, listen: Listen | None, *, tls: bool
) -> Listener:
    from gateway.amqp.server import AMQPServer
    from gateway.amqp.session import SessionSettings

    # [amqp] vhosts; users log in through the user store, which BraidServer.start gave the
    # config file's [amqp.users].
    settings = SessionSettings(vhosts=context.settings.amqp.vhosts)
    # A gateway talks to core only through the Broker API.
    server = AMQPServer(context.api, settings)
    prefix = "braid_amqps_" if tls else "braid_amqp_"
    context.metrics.register_counters(prefix, lambda: server.metrics)
    await server.start(host, port, listen)
    return server


async def _start_kafka(context: ServerContext, host: str, port: int) -> Listener:
    from gateway.kafka.server import LISTEN_BACKLOG

    return await _start_kafka_server(context, host, port, _plain_listen(context, LISTEN_BACKLOG))


def _kafka_tls(context: ServerContext, host: str, port: int) -> Awaitable[Listener]:
    """Kafka over TLS: the plain listener's connections when it is on, else a Kafka server of
    its own on the TLS port alone (``--kafka-port 0``)."""
    if "kafka" in context.started:
        return _tls_of("kafka", _kafka_connections)(context, host, port)
    assert context.tls is not None
    listen = tls_listen(context.tls, "kafka", reuse_port=context.reuse_port)
    return _start_kafka_server(context, host, port, listen)


async def _start_kafka_server(
    context: ServerContext, host: str, port: int, listen: Listen | None
) -> Listener:
    from gateway.kafka.server import KafkaServer
    from gateway.kafka.tagfilters import group_tag_filters

    broker = context.broker
    listeners = context.settings.listeners
    # [kafka.group_tag_filters]; admin clients' settings (in __meta) override them.
    group_tag_filters(context.api).configure(context.settings.kafka_group_tag_filters)
    server = KafkaServer(
        context.api,
        # None advertises the address each client connected to.
        advertised_host=listeners.kafka_advertised_host,
        advertised_port=listeners.kafka_advertised_port,
        auto_create_topics=broker.config.auto_create_topics,
        num_partitions=broker.config.num_partitions,
    )
    context.metrics.register_counters("braid_kafka_", lambda: server.metrics)
    await server.start(host, port, listen)
    return server


# =================================================================================================
# LISTENERS: every front end of the broker, in start order (closed in reverse order).
#
# Register a protocol gateway by replacing its ``None`` with a factory that imports the gateway
# lazily (this module is the only one allowed to import gateway packages), e.g.:
#
#     async def _start_amqp(context: ServerContext, host: str, port: int) -> Listener:
#         from gateway.amqp.server import AMQPServer
#
#         server = AMQPServer(context.broker)  # a gateway talks to core only through the Broker
#         context.metrics.register_counters("braid_amqp_", lambda: server.metrics)
#         await server.start(host, port)
#         return server
#
# Gateways come first so that, when the ready line prints, every protocol is accepting.
# =================================================================================================
LISTENERS: tuple[ListenerSlot, ...] = (
    ListenerSlot("amqp", "amqp_port", _start_amqp),  # gateway/amqp: AMQP 0-9-1
    ListenerSlot("mqtt", "mqtt_port", _start_mqtt),  # gateway/mqtt: MQTT 3.1.1 / 5.0 over TCP
    ListenerSlot("mqtt-ws", "mqtt_ws_port", _start_mqtt_ws),  # gateway/mqtt: MQTT over WebSocket
    ListenerSlot("kafka", "kafka_port", _start_kafka),  # gateway/kafka
    ListenerSlot("http", "http_port", _start_http),  # braid/web/: /health, /metrics, /api
    # TLS listeners (braid/tls.py): on when [tls] has a certificate; each serves its plain
    # listener's gateway, so they start after them.
    ListenerSlot("amqps", "amqps_port", _amqp_tls, tls=True),
    ListenerSlot("mqtts", "mqtts_port", _mqtt_tls("mqtt", websocket=False), tls=True),
    ListenerSlot("mqtt-wss", "mqtt_wss_port", _mqtt_tls("mqtt-ws", websocket=True), tls=True),
    ListenerSlot("kafka-tls", "kafka_tls_port", _kafka_tls, tls=True),
    ListenerSlot("https", "https_port", _start_https, tls=True),
)


def broker_collector(broker: Node) -> Collector:
    def collect() -> list[Family]:
        return [
            Family(
                "braid_broker_flow_blocked",
                GAUGE,
                "1 while flow control slows publishers (memory or backlog pressure), else 0.",
                1 if broker.flow.blocked else 0,
            ),
            Family(
                "braid_disk_alarm",
                GAUGE,
                "1 while free space on the log's volume is below disk_free_limit_bytes.",
                1 if broker.shards.home.store.disk_space.alarm else 0,
            ),
            Family(
                "braid_disk_free_bytes",
                GAUGE,
                "Bytes free on the log's volume at the last check.",
                broker.shards.home.store.disk_space.free_bytes,
            ),
            Family(
                "braid_broker_ack_queues",
                GAUGE,
                "Ack queues (AMQP queues, MQTT session queues) the broker holds open.",
                len(broker.ack_queues()),
            ),
            Family(
                "braid_transactions_pending",
                GAUGE,
                "Open transactions (half messages neither committed nor rolled back).",
                sum(shard.transactions.metrics["pending"] for shard in broker.shards),
            ),
            Family(
                "braid_timers_pending",
                GAUGE,
                "Delayed records (and delayed retries) waiting for their time.",
                sum(shard.timers.pending_count() for shard in broker.shards),
            ),
        ]

    return collect


def security_collector(security: SecurityService) -> Collector:
    def collect() -> list[Family]:
        return [
            Family(
                "braid_login_failures_total",
                COUNTER,
                "Failed logins on every protocol (each is an audit line).",
                security.audit.login_failures,
            ),
            Family(
                "braid_access_denied_total",
                COUNTER,
                "Operations refused by the authorizer.",
                security.audit.denials,
            ),
            Family(
                "braid_login_attempts_delayed_total",
                COUNTER,
                "Login attempts made to wait by the slow-down after failures from their host.",
                security.throttle.delayed,
            ),
            Family(
                "braid_login_attempts_refused_total",
                COUNTER,
                "Login attempts refused unchecked: their host's slow-down queue was too long.",
                security.throttle.refused,
            ),
            Family(
                "braid_users",
                GAUGE,
                "Users in the user store.",
                len(security.store.users()),
            ),
        ]

    return collect


def format_address(address: tuple[str, int] | None) -> str:
    if address is None:
        return NOT_LISTENING
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BraidServer:
    """The broker process: the log store, the broker's Node on it, and the listeners.
    ``await start()``, then ``await stop()``."""

    def __init__(
        self, settings: ServerSettings, listeners: Sequence[ListenerSlot] = LISTENERS
    ) -> None:
        self.settings = settings
        self.slots = tuple(listeners)
        self.metrics = MetricsRegistry()
        self.store: LogStore | None = None
        self.broker: Node | None = None
        self.listeners: dict[str, Listener] = {}
        self.stopping = False
        self._lock_fd: int | None = None
        self.security: SecurityService | None = None
        self.tls: TlsContext | None = None
        # A cluster node's place in its cluster (None on a single node), the epoch at which it
        # serves its shard (None: a standby), and the rejoin after a fence while it runs.
        self.cluster_node: node_runner.ClusterNode | None = None
        self.shard_epoch: int | None = None
        # A cluster node's shards beyond the lowest (self.store), by number (docs/cluster.md
        # section 6: a node serving many local shards).
        self.more_stores: list[tuple[int, LogStore]] = []
        self.shard_number = 0
        self._fence_task: asyncio.Task[None] | None = None
        # Shards taken over from dead nodes (issue 23), opened and served one at a time.
        self._taking: set[asyncio.Task[None]] = set()
        self._take_lock = asyncio.Lock()
        # `braid cluster drain` (core/cluster/drain.py): the watch of this node's request, what
        # closes its Redis client, and the handover under way.
        self._drain_watch: DrainWatch | None = None
        self._drain_redis: tuple[Redis, Callable[[], Awaitable[None]]] | None = None
        self._draining: asyncio.Task[None] | None = None
        # A cluster node's broker joined to the other nodes' shards (one per serving), and
        # its cluster-wide HTTP answers (registered once per process: gRPC takes each Admin
        # call once; attached to each new broker).
        self.serving: node_runner.ClusterServing | None = None
        self._cluster_admin: NodeAdmin | None = None
        self._cluster_http: ClusterHttp | None = None
        # Set when the node could not serve again after a fence: the process exits 1.
        self.fatal = False

    # -- start -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and start every listener; on failure undo what started and raise
        :class:`StartupError`. A cluster node (``--cluster``) joins its cluster first and
        serves only when it owns the root's shard (:meth:`_start_cluster_node`)."""
        try:
            raise_descriptor_limit()
            if self.settings.cluster.enabled:
                await self._start_cluster_node()
                return
            self._lock_data_dir()
            self._refuse_cluster_root()
            self.store = self._open_store(self.settings.log_config())
            await self._serve(self.store, None)
        except BaseException:
            await self.stop()
            raise

    async def _serve(self, store: LogStore, metadata: SplitMetadata | None) -> None:
        """Build the broker on the open ``store`` (with a cluster node's ``metadata``) and start
        its listeners."""
        await store.start()
        for _, more in self.more_stores:
            await more.start()
        self.metrics = MetricsRegistry()  # a new one each time a cluster node serves again
        node = self.cluster_node if metadata is not None else None
        # A cluster node serves its shards of the root's (docs/cluster.md section 6); the
        # metadata version its registries are loaded at, which the follower starts from.
        shards = [(self.shard_number, store), *self.more_stores] if node is not None else store
        loaded_version = metadata.version if metadata is not None else None
        self.broker = broker = Node(
            shards,
            self.settings.broker_config(),
            metadata=metadata,
            shard_count=node.layout.shards if node is not None else None,
        )
        shard = broker.shard  # the node's one shard, over store (cluster.md section 6)
        # The disk alarm (core/log/diskspace.py) is one of flow control's reasons.
        broker.flow.watch_disk(store.disk_space)
        await broker.start()
        self.metrics.register("log", store_collector(store))
        self.metrics.register_counters("braid_broker_", lambda: broker.metrics, BROKER_METRICS)
        self.metrics.register("broker", broker_collector(broker))
        transactions = shard.transactions
        self.metrics.register_counters(
            "braid_transactions_",
            lambda: {k: v for k, v in transactions.metrics.items() if k != "pending"},
        )
        self.metrics.register_counters("braid_half_messages_", lambda: shard.half_messages.metrics)
        self.metrics.register_counters("braid_timers_", lambda: shard.timers.metrics)
        self.metrics.register("process", process_collector)
        if metadata is not None:
            # The cluster's store answers over the network: its first-boot user is made by an
            # awaited open (the single node's completes at once inside SecurityService).
            await SecurityStore.open(broker.metadata)
        self.security = security = SecurityService(
            broker.metadata, self.settings.auth, vhosts=self.settings.amqp.vhosts
        )
        self.metrics.register("security", security_collector(security))
        config_users = self.settings.amqp.users
        if config_users != default_amqp_users():
            # One user store: the users a config file names act on every protocol.
            await security.import_config_users(
                {name: (user.password, user.vhosts) for name, user in config_users.items()}
            )
        if self.settings.tls.enabled and self.tls is None:
            try:
                self.tls = TlsContext(self.settings.tls)
            except TlsConfigError as error:
                raise StartupError(str(error)) from None
        api = BrokerAPI(broker, security)
        # [limits] and RabbitMQ's user and vhost limits (__limits), for every protocol.
        limits = LimitsStore(broker.metadata)
        attach_limits(api, LimitsService(limits, self.settings.limits))
        if node is not None:
            await self._join_shards(node, broker, api, security, limits, loaded_version)
        # The listeners as they start (the management API lists them, on this node and for
        # the cluster's overview).
        started: dict[str, Any] = {}
        context = ServerContext(
            self.settings,
            broker,
            api,
            self.metrics,
            self.health,
            security=security,
            tls=self.tls,
            reuse_port=self.settings.cluster.supervised,
            started=started,
            cluster_http=self._attach_cluster_http(node, security, api, started),
        )
        self.metrics.register("http", context.http_responses.collect_metrics)
        for slot in self.slots:
            await self._start_listener(slot, context)
        if self.settings.cluster.supervised:
            await self._start_worker_ports(context)

    async def _join_shards(
        self,
        node: node_runner.ClusterNode,
        broker: Node,
        api: BrokerAPI,
        security: SecurityService,
        limits: LimitsStore,
        loaded_version: int | None,
    ) -> None:
        """Join the broker over this node's shards to the others' (forwarding, Append and
        Consume for its shards, the Kafka view, the metadata follower: ClusterServing)."""
        from core.cluster.node_runner import ClusterServing

        self.serving = serving = ClusterServing(
            node, broker, security=security.store, limits=limits, from_version=loaded_version
        )
        try:
            view = await serving.start()
        except (OSError, ValueError) as error:
            raise StartupError(f"cannot read the cluster's owners: {error}") from None
        except Exception as error:  # redis-py's errors are not OSErrors
            raise StartupError(f"cannot read the cluster's owners: {error!r}") from None
        api.set_cluster_view(view)
        api.set_remote_queues(serving.remote_queues)
        api.set_mqtt_cluster(serving.mqtt)
        api.set_remote_retained(serving.remote_retained)
        api.set_producer_ids(serving.producer_ids)
        api.set_txn_markers(serving.txn_markers)

    def _attach_cluster_http(
        self,
        node: node_runner.ClusterNode | None,
        security: SecurityService,
        api: BrokerAPI,
        started: dict[str, Any],
    ) -> ClusterHttp | None:
        """A cluster node's cluster-wide HTTP answers (docs/cluster.md section 9): the Admin
        calls registered once, pointed at this broker's registry and listings."""
        if node is None or node.service is None or node.rpc_client is None:
            return None
        from braid.cluster_http import NodeListings, local_families, start_cluster_http
        from braid.web.rabbit import RabbitResources

        assert node.metadata is not None
        if self._cluster_admin is None:
            self._cluster_admin, self._cluster_http = start_cluster_http(
                node.service,
                node.metadata,
                node.rpc_client,
                node.node_id,
                timeout_s=node.settings.rpc_timeout_ms / 1000,
            )
            # A queue's shard as this node places it: its topic's queue 0 (core/broker/
            # shards.py), where the listings' own rule would hash vhost and name.
            self._cluster_http.queue_shard = self._queue_shard
        resources = RabbitResources(security, ManagementSources(api, started))
        self._cluster_admin.attach(local_families(self.metrics, resources), NodeListings(resources))
        return self._cluster_http

    def _queue_shard(self, vhost: str, name: str) -> int:
        """The shard of the AMQP queue ``name`` of ``vhost`` (its topic's queue 0)."""
        from core.cluster.placement import partition_shard
        from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX, topic_prefix

        topic = topic_prefix(vhost) + QUEUE_TOPIC_PREFIX + name
        broker = self.broker
        if broker is not None:
            return broker.shards.queue_number(topic, 0)
        node = self.cluster_node
        return partition_shard(topic, 0, node.layout.shards if node is not None else 1)

    def worker_kafka_ports(self) -> tuple[int, int]:
        """A supervised worker's own Kafka ports, plain and TLS (0: none): the bases plus its
        node id, where the Kafka listener (and TLS) is on at all."""
        cluster = self.settings.cluster
        if not cluster.supervised or cluster.node_id is None:
            return 0, 0
        options = cluster.settings()
        listeners = self.settings.listeners
        plain = tls = 0
        if options.kafka_worker_port_base and listeners.kafka_port:
            plain = options.kafka_worker_port_base + cluster.node_id
        if (
            options.kafka_worker_tls_port_base
            and listeners.kafka_tls_port
            and self.settings.tls.enabled
        ):
            tls = options.kafka_worker_tls_port_base + cluster.node_id
        for port in (plain, tls):
            if port > MAX_PORT:
                raise StartupError(
                    f"worker {cluster.node_id}'s own Kafka port {port} is past {MAX_PORT}: "
                    "lower --kafka-worker-port-base (or --kafka-tls-worker-port-base)"
                )
        return plain, tls

    async def _start_worker_ports(self, context: ServerContext) -> None:
        """A supervised worker's own Kafka port (and its TLS twin), which Metadata advertises:
        the shared bootstrap port lands a client on any worker, this one on this worker. They
        serve the Kafka gateway the shared port's listener started."""
        plain, tls = self.worker_kafka_ports()
        gateway = context.started.get("kafka") or context.started.get("kafka-tls")
        if gateway is None:
            return
        host = self.settings.listeners.host
        loop = asyncio.get_running_loop()
        if plain:
            from gateway.kafka.server import LISTEN_BACKLOG

            try:
                server = await loop.create_server(
                    _kafka_connections(gateway),
                    host,
                    plain,
                    reuse_address=True,
                    backlog=LISTEN_BACKLOG,
                )
            except OSError as error:
                raise StartupError(
                    f"cannot listen for {KAFKA_WORKER_LISTENER} on {host}:{plain}: {error}"
                ) from None
            self.listeners[KAFKA_WORKER_LISTENER] = _WorkerPort(server)
            log.info("%s listening on %s:%d", KAFKA_WORKER_LISTENER, host, plain)
        if tls and context.tls is not None:
            listener = TlsListener(_kafka_connections(gateway), context.tls, protocol="kafka")
            try:
                await listener.start(host, tls)
            except OSError as error:
                raise StartupError(
                    f"cannot listen for {KAFKA_TLS_WORKER_LISTENER} on {host}:{tls}: {error}"
                ) from None
            self.listeners[KAFKA_TLS_WORKER_LISTENER] = listener
            log.info("%s listening on %s:%d", KAFKA_TLS_WORKER_LISTENER, host, tls)

    # -- a cluster node ----------------------------------------------------------------------

    async def _start_cluster_node(self, *, formed: bool = False) -> None:
        """Join the cluster of the data root (docs/cluster.md): refused on a directory that is
        not a root of one shard; the owner of its shard serves it, any other node waits as a
        standby without listeners. ``formed``: joining again after a drain (no formation
        wait)."""
        from redis import exceptions as redis_errors

        from core.cluster import node_runner
        from core.cluster.membership import FormationTimeout
        from core.cluster.redis_metadata import LeaseHeld

        cluster = self.settings.cluster
        assert cluster.url is not None
        assert cluster.node_id is not None
        data_dir = Path(self.settings.data_dir)
        try:
            root = node_runner.open_root(data_dir)
        except node_runner.NodeRefused as error:
            raise StartupError(str(error)) from None
        listeners = self.settings.listeners
        worker_kafka_port, _worker_kafka_tls_port = self.worker_kafka_ports()
        if worker_kafka_port:
            # Kafka clients (and the other nodes) are told this worker's own port: the shared
            # one may land them on another worker.
            listeners = dataclasses.replace(listeners, kafka_advertised_port=worker_kafka_port)
            self.settings = dataclasses.replace(self.settings, listeners=listeners)
        self.cluster_node = node = node_runner.ClusterNode(
            root,
            cluster.url,
            cluster.node_id,
            cluster.settings(),
            listen_host=listeners.host,
            advertised_host=cluster.advertised_host,
            kafka_port=listeners.kafka_advertised_port or listeners.kafka_port,
            secret=cluster.secret,
            max_message_size=self.settings.limits.max_message_size,
            on_fenced=self._on_fenced,
            on_taken=self._on_taken,
        )
        if listeners.kafka_advertised_host is None:
            # Kafka clients are told the node's advertised host, as other nodes are.
            self.settings = dataclasses.replace(
                self.settings,
                listeners=dataclasses.replace(listeners, kafka_advertised_host=node.host),
            )
        log.info(
            "braid %s: node %d of cluster %s (%s), data root %s",
            version(),
            cluster.node_id,
            root.cluster_id,
            cluster.url,
            root.root,
        )
        try:
            epoch = await node.join(formed=formed)
        except (OSError, ValueError, redis_errors.RedisError) as error:
            raise StartupError(f"cannot join the cluster at {cluster.url}: {error}") from None
        except (FormationTimeout, LeaseHeld) as error:
            raise StartupError(f"node {cluster.node_id}: {error}") from None
        if epoch is not None:
            await self._serve_shard(epoch)
        if self._drain_watch is None:
            from core.cluster.drain import DrainWatch
            from core.cluster.redis_metadata import _client as redis_client

            redis, closers = redis_client(cluster.url, cluster.settings().metadata_wait_ms, None)
            self._drain_redis = (redis, closers.run)
            self._drain_watch = DrainWatch(
                redis,
                root.cluster_id,
                str(cluster.node_id),
                cluster.settings().heartbeat_ms,
                self._on_drain_requested,
            )
            self._drain_watch.start()

    def _on_drain_requested(self) -> None:
        if self.stopping or self._draining is not None or self.cluster_node is None:
            return
        self._draining = asyncio.get_running_loop().create_task(self._drain(), name="braid-drain")

    async def _drain(self) -> None:
        """Hand every owned shard over and stay up as a standby (core/cluster/drain.py)."""
        from core.cluster.drain import drain_done, wait_handed_over

        assert self._drain_redis is not None
        redis = self._drain_redis[0]
        try:
            async with self._take_lock:
                node = self.cluster_node
                if node is None or self.stopping:
                    return
                cluster_id, shards = node.layout.cluster_id, node.layout.shards
                owned = sorted(node.owned)
                log.warning("draining: handing shards %s over, then a standby", owned)
                await self._drop_serving(fenced=False)
                self.cluster_node = None
                await node.stop()  # closed markers at each epoch, the lease released
            left = await wait_handed_over(redis, cluster_id, shards, str(node.node_id))
            if left:
                log.warning("draining: shards %s not taken by another node: joining again", left)
            else:
                log.warning("draining: shards %s handed over: joining again as a standby", owned)
            with contextlib.suppress(Exception):
                await drain_done(redis, cluster_id, str(node.node_id))
            if not self.stopping:
                await self._start_cluster_node(formed=True)
        except Exception:
            log.exception("draining failed: stopping")
            self.fatal = True
            signal.raise_signal(signal.SIGTERM)
        finally:
            self._draining = None

    async def _serve_shard(self, epoch: int) -> None:
        """Open the owned shards (each with its storage fence; ``epoch``: the lowest one's)
        and serve them."""
        node = self.cluster_node
        assert node is not None
        try:
            # Recovery in a thread: the loop keeps renewing the lease meanwhile (a recovery
            # longer than lease_ms on the loop would fence the node, again at each rejoin).
            stores, metadata = await asyncio.to_thread(node.open_shards, self.settings.log_config())
        except (OSError, ValueError, KeyError) as error:
            raise StartupError(f"cannot open the owned shards: {error}") from None
        (self.shard_number, store), *self.more_stores = stores
        self.store = store
        self.shard_epoch = epoch
        for number, opened in stores:
            log.info(
                "shard %d open at epoch %d: write position %d, %d records replayed",
                number,
                node.owned.get(number, epoch),
                opened.commitlog.write_position,
                opened.recovery.replayed_records,
            )
        await node.copy_adopted_definitions(metadata.local)
        await self._serve(store, metadata)

    def _on_taken(self, shard: int, epoch: int) -> None:
        """Membership took ``shard`` over at ``epoch`` (issue 23): recover and serve it."""
        if self.stopping:
            return
        task = asyncio.get_running_loop().create_task(
            self._take_shard(shard, epoch), name=f"braid-take-{shard}"
        )
        self._taking.add(task)
        task.add_done_callback(self._taking.discard)

    async def _take_shard(self, shard: int, epoch: int) -> None:
        """Open the taken shard (recovery in a worker thread, as at start) and add it to the
        running broker; a standby serves from scratch."""
        async with self._take_lock:
            node = self.cluster_node
            if node is None or self.stopping or self._fence_task is not None:
                return
            if node.owned.get(shard) != epoch:
                return  # fenced or claimed again since
            broker = self.broker
            try:
                if broker is None:
                    await self._serve_shard(epoch)  # a standby: every shard it owns now
                    log.warning("took over shard %d at epoch %d: serving", shard, epoch)
                    self._adopt_orphans()
                    return
                if broker.shards.local(shard) is not None:
                    return
                store = await asyncio.to_thread(
                    node.open_taken_shard, self.settings.log_config(), shard, epoch
                )
                if self.broker is not broker or node.owned.get(shard) != epoch or self.stopping:
                    store.abandon()
                    return
                self.more_stores.append((shard, store))
                await store.start()
                await broker.add_shard(shard, store)
            except Exception:
                log.exception("serving shard %d taken over at epoch %d failed", shard, epoch)
                return
            serving = self.serving
            if serving is not None:
                # Kafka Metadata names this node leader now, not at the view's next heartbeat.
                with contextlib.suppress(Exception):
                    await serving.view.refresh()
            self._adopt_orphans()
            log.warning(
                "took over shard %d at epoch %d: write position %d, %d records replayed",
                shard,
                epoch,
                store.commitlog.write_position,
                store.recovery.replayed_records,
            )

    def _on_fenced(self, reason: str) -> None:
        """Membership lost the lease (section 11): drop what this node serves without writing,
        then rejoin and serve again what it owns then."""
        if self.stopping or self._fence_task is not None:
            return
        log.warning("fenced (%s): closing connections, dropping the shard, rejoining", reason)
        self._fence_task = asyncio.get_running_loop().create_task(
            self._recover_from_fence(), name="braid-fenced"
        )

    async def _recover_from_fence(self) -> None:
        try:
            # The lock is held through the rejoin: shards its takeover claims meanwhile are
            # added by _take_shard after the owned ones are served, not dropped (it ignores a
            # take while a fence is handled, and the served set was read before the claims).
            async with self._take_lock:
                await self._drop_serving(fenced=True)
                node = self.cluster_node
                if node is None or self.stopping:
                    return
                epoch = await node.rejoin()
                if epoch is not None and not self.stopping:
                    await self._serve_shard(epoch)
        except Exception:
            log.exception("serving again after a fence failed: stopping")
            self.fatal = True
            signal.raise_signal(signal.SIGTERM)
        finally:
            self._fence_task = None

    def _adopt_orphans(self) -> None:
        """A shard was taken over, so a node died: publish its MQTT wills (one survivor takes
        them) and drop it from the $share groups (core/cluster/mqtt_cluster.py)."""
        serving = self.serving
        if serving is not None and serving.mqtt is not None:
            serving.mqtt.adopt_orphans()

    def _lock_data_dir(self) -> None:
        """Take the data directory for this process (braid/dirlock.py says why the lock is on
        the directory itself). ``braid.lock`` still holds the pid, for the message a second
        broker prints and for ``braid log stat``; Kafka locks a ``.lock`` file as we did.
        """
        data_dir = Path(self.settings.data_dir)
        try:
            fd = lock_directory(data_dir)
        except DirectoryLocked:
            raise StartupError(
                f"data dir {data_dir} is in use by another braid process "
                f"(pid {lock_holder_pid(data_dir)}; the directory itself is locked)"
            ) from None
        except OSError as error:
            raise StartupError(f"cannot use data dir {data_dir}: {error}") from None
        self._lock_fd = fd
        try:
            (data_dir / LOCK_FILE).write_text(f"{os.getpid()}\n")
        except OSError as error:  # the pid is for messages only: the lock is held already
            log.warning("cannot write %s: %s", data_dir / LOCK_FILE, error)

    def _refuse_cluster_root(self) -> None:
        """A cluster's data root is served by its nodes, each opening the shards it owns; opened
        as one single-node directory it would start an empty log beside the shards and hide
        their data (docs/cluster.md section 2: no silent conversion). Checked under the lock, so
        a `braid cluster init` cannot turn the directory into a root after the check."""
        data_dir = Path(self.settings.data_dir)
        if cluster_layout.detect(data_dir) == "root":
            raise StartupError(
                f"data dir {data_dir} is a cluster data root ({cluster_layout.CLUSTER_FILE}), "
                "not a single-node data directory: start its nodes with --workers N or "
                "--cluster URL"
            )

    def _open_store(self, config: LogConfig) -> LogStore:
        log.debug("settings: %s; log config: %s", self.settings, config)
        log.info(
            "braid %s: opening %s (segment size %d, durability %s)",
            version(),
            config.data_dir,
            config.segment_size,
            config.durability,
        )
        existed = (config.data_dir / names.LOG_META_FILE).exists()
        try:
            store = LogStore(config)
        except (OSError, ValueError, KeyError) as error:
            raise StartupError(f"cannot open data dir {config.data_dir}: {error}") from error
        report = store.recovery
        if not existed:
            state = "new log"
        elif report.clean_shutdown:
            state = "clean shutdown"
        else:
            state = "unclean shutdown"
        log.info(
            "log open (%s): %d queues, write position %d, %d records replayed",
            state,
            len(store.queues(include_system=True)),
            store.commitlog.write_position,
            report.replayed_records,
        )
        return store

    async def _start_listener(self, slot: ListenerSlot, context: ServerContext) -> None:
        port = getattr(self.settings.listeners, slot.port_setting)
        if port == 0:
            log.info("%s listener off (port 0)", slot.name)
            return
        if slot.factory is None:
            log.info("%s listener not implemented yet (port %d unused)", slot.name, port)
            return
        if slot.tls and context.tls is None:
            log.info("%s listener off (no TLS certificate: --tls-cert)", slot.name)
            return
        host = self.settings.listeners.host
        try:
            listener = await slot.factory(context, host, port)
        except OSError as error:
            raise StartupError(f"cannot listen for {slot.name} on {host}:{port}: {error}") from None
        self.listeners[slot.name] = listener
        context.started[slot.name] = listener
        log.info("%s listening on %s", slot.name, format_address(listener.address))

    # -- state -----------------------------------------------------------------------------

    def address_of(self, name: str) -> tuple[str, int] | None:
        listener = self.listeners.get(name)
        return listener.address if listener is not None else None

    def ready_line(self) -> str:
        parts = [f"data={self.settings.data_dir}"]
        parts += [
            f"{slot.name}={format_address(self.address_of(slot.name))}"
            for slot in self.slots
            if not slot.tls or self.tls is not None  # TLS listeners shown when configured
        ]
        parts += [
            f"{name}={format_address(self.address_of(name))}"
            for name in (KAFKA_WORKER_LISTENER, KAFKA_TLS_WORKER_LISTENER)
            if name in self.listeners
        ]
        node = self.cluster_node
        if node is not None:
            # A standby (it owns no shard) shows none, and every listener "-".
            owned = ",".join(str(shard) for shard in sorted(node.owned)) or "none"
            parts += [f"node={node.node_id}", f"shards={owned}"]
        return "braid ready: " + " ".join(parts)

    def health(self) -> tuple[bool, dict[str, object]]:
        store = self.store
        ok = store is not None and not store.closed and not self.stopping
        details: dict[str, object] = {
            "version": version(),
            "data_dir": self.settings.data_dir,
            "listeners": {
                slot.name: (
                    format_address(self.address_of(slot.name))
                    if slot.name in self.listeners
                    else None
                )
                for slot in self.slots
            },
        }
        if not ok:
            details["reason"] = "stopping" if self.stopping else "log store closed"
        if store is not None and not store.closed:
            space = store.disk_space
            # Still "ok" under the disk alarm: consumers are served; publishers wait (RabbitMQ's
            # alarms are listed apart from its liveness as well).
            details["alarms"] = ["disk"] if space.alarm else []
            details["disk"] = {
                "free_bytes": space.free_bytes,
                "limit_bytes": space.limit_bytes,
                "alarm": space.alarm,
            }
            details["log"] = {
                # Issue 21 item 6: damaged records met by reads, and what the background
                # check of sealed segments after an unclean start found (and how far it is).
                "corrupt_reads": store.corrupt_reads,
                "corrupt_frames_found": len(store.verification.corrupt),
                "verification": store.verification.state,
                "write_position": store.commitlog.write_position,
                "flushed_position": store.commitlog.flushed_position,
                "segments": len(store.commitlog.segments),
                "queues": len(store.queues(include_system=True)),
            }
        return ok, details

    # -- stop ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop accepting, then flush and close the store (a cluster node: then leave the
        cluster, its closed marker written). Safe to call more than once."""
        self.stopping = True
        fence_task, self._fence_task = self._fence_task, None
        if fence_task is not None and fence_task is not asyncio.current_task():
            fence_task.cancel()
            await asyncio.gather(fence_task, return_exceptions=True)
        draining, self._draining = self._draining, None
        if draining is not None and draining is not asyncio.current_task():
            draining.cancel()
            await asyncio.gather(draining, return_exceptions=True)
        watch, self._drain_watch = self._drain_watch, None
        if watch is not None:
            await watch.aclose()
        drain_redis, self._drain_redis = self._drain_redis, None
        if drain_redis is not None:
            with contextlib.suppress(Exception):
                await drain_redis[1]()
        async with self._take_lock:  # a shard being taken over is added, or abandoned, first
            await self._drop_serving(fenced=False)
        node, self.cluster_node = self.cluster_node, None
        if node is not None:
            await node.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _drop_serving(self, *, fenced: bool) -> None:
        """Close the listeners (clients get AMQP 320 CONNECTION_FORCED, MQTT 5 0x8B, Kafka a
        closed socket), the broker and the store. ``fenced``: a newer owner may exist, so
        the store is abandoned first and nothing more is written to the shard."""
        store = self.store
        if fenced and store is not None:
            store.abandon()
            for _, more in self.more_stores:
                more.abandon()
        serving, self.serving = self.serving, None
        if serving is not None:
            # No more Append or Consume for these shards; forwards still out fail.
            try:
                await serving.stop()
            except Exception:
                log.exception("leaving the other nodes' shards failed")
        for name in reversed(list(self.listeners)):
            listener = self.listeners.pop(name)
            try:
                await listener.close()
            except Exception:
                log.exception("closing the %s listener failed", name)
        broker, self.broker = self.broker, None
        if broker is not None:
            try:
                await broker.close()
            except StoreFenced as error:
                log.warning("the broker closed without writing its state: %s", error)
            except Exception:
                log.exception("closing the broker failed")  # the store is still closed below
        store, self.store = self.store, None
        more_stores, self.more_stores = self.more_stores, []
        for _, more in more_stores:
            await more.aclose()
        if store is not None:
            await store.aclose()
            log.info("log closed at write position %d", store.commitlog.write_position)


async def serve(settings: ServerSettings) -> int:
    """Run until SIGINT or SIGTERM; returns the process exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(signum: signal.Signals) -> None:
        if received:
            log.warning("%s: already stopping", signum.name)
            return
        received.append(signum.name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)

    server = BraidServer(settings)

    def on_hangup() -> None:
        # SIGHUP: load the TLS certificate again (open connections keep theirs).
        if server.tls is not None:
            server.tls.reload()
        else:
            log.info("SIGHUP: no TLS certificate to reload")

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    # SIGTERM/SIGINT while starting stops the start: a cluster node can wait long in it (the
    # formation wait for expect_nodes, a claim, a recovery), and a supervisor stopping its
    # workers must not wait out that (a worker waiting for a peer that had just exited kept
    # `braid serve --workers` from stopping for its full 60 s stop timeout).
    starting = asyncio.ensure_future(server.start())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not starting.done():
        log.info("%s received while starting: stopping", received[0])
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.stop(), STOP_WHILE_STARTING_S)
        return 0
    try:
        starting.result()
    except StartupError as error:
        log.error("%s", error)
        return 1
    except Exception:
        log.exception("startup failed")
        return 1
    # Everything loaded at start-up (modules, classes, the recovered state: ~57,000 objects)
    # lives as long as the process: freezing it keeps the garbage collector's full passes
    # from scanning it again each time (a full pass over it took ~18 ms here, a stall of
    # every connection at once).
    gc.collect()
    gc.freeze()
    if not stop.is_set():
        try:
            print(server.ready_line(), flush=True)
        except OSError as error:  # nobody reads stdout any more: keep serving
            log.warning("cannot write the ready line: %s", error)
        await stop.wait()
    log.info("%s received: stopping", received[0])
    try:
        await server.stop()
    except Exception:
        log.exception("shutdown failed")
        return 1
    log.info("stopped")
    return 1 if server.fatal else 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (ARCHITECTURE.md), asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run(settings: ServerSettings) -> int:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        code = runner.run(serve(settings))
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    return code
