"""The AMQP 0-9-1 listener: a thin ``asyncio.Protocol`` per connection around a ``Session``.

The transport only moves bytes: every read goes to the session, which parses every frame in it
before returning; whatever the session writes during one loop iteration (replies, deliveries
from the queues' pumps, confirms) leaves in ONE ``transport.write`` at the end of the iteration.
Reading pauses while the session waits for the broker (a flow-blocked publish, a tx.commit) and
while the transport's write buffer is above ``WRITE_BUFFER_HIGH`` (a client that does not read
its deliveries or replies does not get to send more).

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
from typing import Final, cast

from core.api import PROTOCOL_AMQP, BrokerAPI, ClientContext
from gateway.amqp.channel import AMQP_TX_GROUP
from gateway.amqp.constants import CONNECTION_FORCED
from gateway.amqp.session import Session, SessionSettings
from gateway.amqp.vhost import DEFAULT_VHOST, VirtualHost, check_vhost_name

log = logging.getLogger(__name__)

__all__ = ["METRIC_NAMES", "AMQPServer", "AmqpConnection"]

# Transport write-buffer marks: above HIGH, stop reading the client (uvicorn's flow control);
# resume below LOW.
WRITE_BUFFER_HIGH: Final = 4 * 1024 * 1024
WRITE_BUFFER_LOW: Final = 1024 * 1024
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
)


class AmqpConnection(asyncio.Protocol):
    """Bytes in to the session, bytes out coalesced per loop iteration."""

    def __init__(self, server: AMQPServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.peer = "?"
        self.last_write = self.loop.time()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._reading = False  # inside data_received: the read's end flushes
        self._paused_by_session = False
        self._paused_by_writes = False
        self._reading_paused = False
        self._closed = False

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            self.peer = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.server.connections.add(self)
        self.session = Session(
            self,
            self.server.api,
            self.server.vhosts,
            self.server.settings,
            self.server.metrics,
            blocked=self.server.blocked_reason,
        )

    def data_received(self, data: bytes) -> None:
        self.server.metrics["bytes_received"] += len(data)
        assert self.session is not None
        # What this read makes the session write (replies, confirms, the deliveries its acks
        # free) leaves in one write at the end of the read, not one loop iteration later.
        self._reading = True
        try:
            self.session.data_received(data)
        finally:
            self._reading = False
        if self._out and not self._flush_scheduled:
            self._flush()

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._out.clear()
        self.server.connection_gone(self)
        if self.session is not None:
            self.session.connection_lost()

    def pause_writing(self) -> None:
        self._paused_by_writes = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_by_writes = False
        self._update_reading()

    # -- SessionIO ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closed:
            return
        self._out.append(data)
        if not self._flush_scheduled and not self._reading:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out or self._closed or self.transport is None:
            out.clear()
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.transport.write(data)
        self.last_write = self.loop.time()
        self.server.metrics["bytes_sent"] += len(data)

    def close(self) -> None:
        if self._closed:
            return
        self._flush()
        self._closed = True
        if self.transport is not None:
            self.transport.close()  # sends what is buffered first

    def abort(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        self._paused_by_session = True
        self._update_reading()

    def resume_reading(self) -> None:
        self._paused_by_session = False
        self._update_reading()

    def _update_reading(self) -> None:
        pause = self._paused_by_session or self._paused_by_writes
        if pause == self._reading_paused or self.transport is None or self._closed:
            return
        self._reading_paused = pause
        with contextlib.suppress(RuntimeError):  # the transport is closing
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()


class AMQPServer:
    """The AMQP 0-9-1 listener over the Broker API (:class:`~core.api.BrokerAPI`), with the
    virtual hosts of ``settings.vhosts`` (ValueError for a name that cannot be one)."""

    def __init__(self, api: BrokerAPI, settings: SessionSettings | None = None) -> None:
        self.api = api
        self.settings = settings or SessionSettings()
        self.vhosts: dict[str, VirtualHost] = {
            name: VirtualHost(api, check_vhost_name(name)) for name in self.settings.vhosts
        }
        # Who acts when the listener acts on its own (rolling back what a stop left open).
        self.context = ClientContext(PROTOCOL_AMQP, connection_id="amqp-listener")
        self.metrics: dict[str, int] = dict.fromkeys(METRIC_NAMES, 0)
        self.connections: set[AmqpConnection] = set()
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

    async def start(self, host: str, port: int) -> None:
        for vhost in self.vhosts.values():
            vhost.start()
        # AMQP transactions left open by a stop or crash died with their channels.
        for pending in self.api.open_transactions():
            if pending.producer_group == AMQP_TX_GROUP:
                await self.api.roll_back_transaction(self.context, pending.transaction_id)
        self.api.add_flow_listener(self._flow_changed)
        loop = asyncio.get_running_loop()
        try:
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
            vhost.close()
        if server is not None:
            await server.wait_closed()
