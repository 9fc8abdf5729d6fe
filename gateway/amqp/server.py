"""The AMQP 0-9-1 listener: a thin ``asyncio.Protocol`` per connection around a ``Session``.

The transport only moves bytes: every read goes to the session, which parses every frame in it
before returning; whatever the session writes during one loop iteration (replies, deliveries
from the queues' pumps, confirms) leaves in ONE ``transport.write`` at the end of the iteration.
Reading pauses while the session waits for the broker (a flow-blocked publish, a tx.commit) and
while the transport's write buffer is above its high-water mark (a client that does not read
its deliveries or replies does not get to send more).

The outgoing bound (issue 21 item 4): ``[limits] max_outgoing_buffer_bytes`` lowers that mark
where it is smaller (``GatewayTransport.bound_outgoing``); deliveries to the connection's
consumers stop above it and resume when it drains, direct reply-to replies to it are dropped
and counted meanwhile (session.py), and a connection that stays above it for
``stalled_client_timeout_s`` is aborted with a log line (gateway/transport.py).

``AMQPServer(api, settings)``, over the Broker API (``core.api.BrokerAPI``): one ``VirtualHost``
per name in ``settings.vhosts`` (a vhost's exchanges, queues and bindings are loaded from the
log at ``start``);
``await start(host, port)``, ``address``, ``metrics``, ``await close()``
(clients get Connection.Close 320 CONNECTION_FORCED, as from a RabbitMQ node shutting down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from core.api import PROTOCOL_AMQP, BrokerAPI, ClientContext, Clock, LoopClock
from gateway.amqp.channel import AMQP_TX_GROUP
from gateway.amqp.constants import CONNECTION_FORCED
from gateway.amqp.management import VhostAdministrator
from gateway.amqp.session import Session, SessionSettings
from gateway.amqp.vhost import DEFAULT_VHOST, VirtualHost, check_vhost_name
from gateway.transport import GatewayTransport, TransportLimits

log = logging.getLogger(__name__)

__all__ = ["METRIC_NAMES", "AMQPServer", "AmqpConnection"]

# Transport write-buffer marks: above the high one, stop reading the client (uvicorn's flow
# control); resume below the low one. 4 MiB: a consumer takes bursts of deliveries of a few
# thousand messages before it counts as slow.
TRANSPORT_LIMITS: Final = TransportLimits(
    write_high_water=4 * 1024 * 1024, write_low_water=1024 * 1024
)
# asyncio's listen backlog is 100; RabbitMQ's tcp_listen_options backlog is 128.
LISTEN_BACKLOG: Final = 1024
# On close, how long clients get to answer Connection.Close before their sockets are dropped.
SHUTDOWN_GRACE_S: Final = 1.0
SHUTDOWN_TEXT: Final = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"

METRIC_NAMES: Final = (
    "connections_opened",
    "connections_closed",
    "channels_opened",
    "channels_closed",
    "published",
    "delivered",
    "confirms",
    "returned",
    "channel_errors",
    "connection_errors",
    "logins_refused",
    "bytes_received",
    "bytes_sent",
    "stalled_disconnects",  # clients over the outgoing bound past stalled_client_timeout_s
    "replies_dropped",  # direct reply-to replies to a client over the outgoing bound
)


class AmqpConnection(GatewayTransport):
    """Bytes in to the session; the rest is the shared transport (``gateway/transport.py``)."""

    def __init__(self, server: AMQPServer) -> None:
        super().__init__(server.limits, server.clock, server.metrics)
        self.server = server
        self.session: Session | None = None
        self.incomplete_timeout_s = server.incomplete_request_timeout_s
        if server.outgoing_limits is not None:
            self.bound_outgoing(*server.outgoing_limits)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)
        self.session = Session(
            self,
            self.server.api,
            self.server.vhosts,
            self.server.settings,
            self.server.metrics,
            blocked=self.server.blocked_reason,
            outgoing_bound=self.limits.write_high_water,
        )
        if not self.server.api.may_accept_connection():  # near the descriptor limit
            self.abort()

    def received(self, data: bytes) -> None:
        self.server.metrics["bytes_received"] += len(data)
        session = self.session
        assert session is not None
        decoder = session.decoder
        before = decoder.buffered
        session.data_received(data)
        after = decoder.buffered
        self.track_incomplete(after, after < before + len(data))

    def eof_received(self) -> bool:
        return False  # close the transport

    # The outgoing bound: the session stops and resumes its consumers' deliveries.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.session is not None:
            self.session.stop_deliveries()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._drained()

    def flush(self) -> None:
        super().flush()
        self._drained()

    def _drained(self) -> None:
        session = self.session
        transport = self.transport
        if session is not None and transport is not None and not self.closed:
            session.outgoing_drained(transport.get_write_buffer_size(), self.writing_paused)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.connection_gone(self)
        # The session refers back to this connection (its io, its bound write): dropped here,
        # the two (and a half-received message body) are freed by reference counting as the
        # transport lets go of us, not whenever the cyclic collector next runs (issue 21 item 5).
        session, self.session = self.session, None
        if session is not None:
            session.connection_lost()


class AMQPServer:
    """The AMQP 0-9-1 listener over the Broker API (:class:`~core.api.BrokerAPI`), with the
    virtual hosts of ``settings.vhosts`` (ValueError for a name that cannot be one)."""

    def __init__(
        self,
        api: BrokerAPI,
        settings: SessionSettings | None = None,
        *,
        limits: TransportLimits = TRANSPORT_LIMITS,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        self.settings = settings or SessionSettings()
        self.limits = limits
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.vhosts: dict[str, VirtualHost] = {
            name: VirtualHost(api, check_vhost_name(name)) for name in self.settings.vhosts
        }
        # Who acts when the listener acts on its own (rolling back what a stop left open).
        self.context = ClientContext(PROTOCOL_AMQP, connection_id="amqp-listener")
        self.metrics: dict[str, int] = dict.fromkeys(METRIC_NAMES, 0)
        self.connections: set[AmqpConnection] = set()
        # [limits] incomplete_request_timeout_s (a frame partly received), read at start.
        self.incomplete_request_timeout_s: float | None = None
        # [limits] max_outgoing_buffer_bytes and stalled_client_timeout_s, read at start.
        self.outgoing_limits: tuple[int, float] | None = None
        self._server: asyncio.AbstractServer | None = None
        self._all_closed: asyncio.Event | None = None  # set when the last connection goes

    def connection_gone(self, connection: AmqpConnection) -> None:
        self.connections.discard(connection)
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    @property
    def vhost(self) -> VirtualHost:
        """The vhost "/" (KeyError when it is not configured)."""
        return self.vhosts[DEFAULT_VHOST]

    async def start(
        self,
        host: str,
        port: int,
        listen: Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]
        | None = None,
    ) -> None:
        """Listen on ``host:port``, by ``listen(protocol factory, host, port)`` when given:
        AMQPS alone (no plain listener beside it) listens through braid/tls.py, which audits
        failed handshakes."""
        if self.settings.users is not None:
            # Users the settings name (tests, a program embedding the listener) log in through
            # the one user store like every other: brought into it first.
            await self.api.import_users(
                self.context, self.settings.users_to_import(), self.settings.vhosts
            )
        for vhost in self.vhosts.values():
            await vhost.start()
            # The management API changes this vhost's objects through it (management.py).
            self.api.register_object_administrator(
                self.context, vhost.name, VhostAdministrator(vhost)
            )
        # AMQP transactions left open by a stop or crash died with their channels.
        for pending in self.api.open_transactions():
            if pending.producer_group == AMQP_TX_GROUP:
                await self.api.roll_back_transaction(self.context, pending.transaction_id)
        self.incomplete_request_timeout_s = self.api.incomplete_request_limits(self.context)[1]
        self.outgoing_limits = self.api.outgoing_buffer_limits(self.context)
        self.api.add_flow_listener(self._flow_changed)
        loop = asyncio.get_running_loop()
        try:
            if listen is not None:
                self._server = await listen(lambda: AmqpConnection(self), host, port)
            else:
                self._server = await loop.create_server(
                    lambda: AmqpConnection(self),
                    host,
                    port,
                    reuse_address=True,
                    backlog=LISTEN_BACKLOG,
                )
        except BaseException:
            self.api.remove_flow_listener(self._flow_changed)
            for vhost in self.vhosts.values():
                vhost.close()
            raise

    @property
    def address(self) -> tuple[str, int] | None:
        server = self._server
        if server is None or not server.sockets:  # type: ignore[attr-defined]
            return None
        sockname = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        return str(sockname[0]), int(sockname[1])

    def blocked_reason(self) -> str | None:
        return self.api.publishing_blocked_reason()

    def _flow_changed(self, blocked: bool, reason: str) -> None:
        for connection in list(self.connections):
            if connection.session is not None:
                connection.session.flow_changed(blocked, reason)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            if connection.session is not None:
                connection.session.close_by_server(CONNECTION_FORCED, SHUTDOWN_TEXT)
        if self.connections:
            self._all_closed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), SHUTDOWN_GRACE_S)
        for connection in list(self.connections):
            connection.abort()
        self.api.remove_flow_listener(self._flow_changed)
        for vhost in self.vhosts.values():
            self.api.unregister_object_administrator(self.context, vhost.name)
            vhost.close()
        if server is not None:
            await server.wait_closed()
