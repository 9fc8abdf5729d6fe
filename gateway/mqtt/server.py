"""The MQTT listener: a thin ``asyncio.Protocol`` per connection around the sans-IO codec and the
``Connection`` state machine (``session.py``), built on the Broker API (``core/api/``).
``MQTTServer(api, websocket=True)`` serves MQTT over WebSocket instead (``websocket.py`` frames
the same bytes).

I/O batching (ARCHITECTURE.md): every packet of a read is decoded and handled before yielding;
what the connection writes during one loop iteration goes out in one ``transport.write``
(``_flush``, scheduled once per iteration). A handler that has to wait (a publish while flow
control blocks publishers) holds the following packets of that connection, in order, and
reading pauses until it is done.

Reading pauses (``pause_reading(reason)``, ``gateway/transport.py``) while any reason holds:
the transport's write buffer is above its high-water mark (``pause_writing``: a client not
reading what we send does not get to send more), a handler is waiting, flow control blocks
publishers, or a subscriber this connection publishes to cannot take more. It resumes when the
last reason goes.

Keep Alive: nothing received for 1.5 times the Keep Alive closes the connection (5.0: after
DISCONNECT 0x8D) [MQTT-3.1.2-22]; one timer per connection, re-armed lazily. A connection that
sends no CONNECT within ``connect_timeout_s`` is closed.

Errors: bytes that break the protocol close that connection, after a DISCONNECT (or CONNACK)
with the reason code where the version allows; nothing else is affected. A handler that raises
anything else is a bug: logged with its traceback, and the connection is closed (0x83).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Final

from core.api import PROTOCOL_MQTT, BrokerAPI, ClientContext, Clock, LoopClock, Timer
from gateway.mqtt.decoder import MqttDecoder
from gateway.mqtt.errors import MqttProtocolError
from gateway.mqtt.hub import MqttHub, MqttOptions
from gateway.mqtt.packets import Packet, Publish
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.session import Connection, State
from gateway.mqtt.sniff import SNIFF_BYTES, describe_first_bytes
from gateway.mqtt.websocket import WebSocketProtocol
from gateway.transport import READING_BUSY, GatewayTransport, TransportLimits, peer_certificate_cn

log = logging.getLogger(__name__)

# Keep Alive is enforced at one and a half times its value [MQTT-3.1.2-22].
KEEP_ALIVE_FACTOR: Final = 1.5
# Write buffer high/low water marks (asyncio's defaults are 64 KiB / 16 KiB): a subscriber takes
# bursts of 1 MiB before it counts as congested.
TRANSPORT_LIMITS: Final = TransportLimits(write_high_water=1 << 20, write_low_water=256 << 10)
# The listen backlog: 10,000 clients connecting at once should not be refused (Mosquitto: 100,
# EMQX: 1024; the kernel caps it at net.core.somaxconn).
LISTEN_BACKLOG: Final = 4096

METRICS: Final = (
    "connections_opened",
    "connections_closed",
    "connects",
    "connects_refused",
    "bytes_received",
    "bytes_sent",
    "packets_received",
    "publishes_received",
    "publishes_sent",
    "publishes_denied",
    "publishes_refused_disk_alarm",
    "subscribes",
    "duplicates",
    "messages_dropped",
    "messages_expired",
    "messages_too_large",
    "protocol_errors",
    "keep_alive_timeouts",
    "connect_timeouts",
    "sessions_taken_over",
    "handler_errors",
)


class MqttProtocol(GatewayTransport):
    """One MQTT connection's transport side (also the ``Link`` of its state machine); the
    buffering, read pausing, parking and closing are ``gateway/transport.py``'s."""

    # The publishes of a read reach subscribers through call_soon; their writes and this
    # connection's replies leave together at the end of the iteration.
    FLUSH_AFTER_READ = False

    def __init__(self, server: MQTTServer) -> None:
        super().__init__(server.limits, server.clock, server._metrics)
        self.server = server
        self.metrics = server._metrics
        options = server.hub.options
        self.max_packet_size = options.max_packet_size
        self.connect_timeout_s = options.connect_timeout_s
        self.decoder = MqttDecoder(max_packet_size=self.max_packet_size)
        self.incomplete_timeout_s = server.incomplete_request_timeout_s
        self.connection = Connection(server.hub, self, self.metrics)
        self.last_received_ms = 0.0
        self.keep_alive_limit_ms = 0.0
        self.timer: Timer | None = None
        # The connection's first bytes, to say what they look like if they are not MQTT.
        self.first_bytes = b""

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        connection = self.connection
        if isinstance(peer, tuple) and len(peer) >= 2:
            connection.context = replace(connection.context, peer=f"{peer[0]}:{peer[1]}")
        if transport.get_extra_info("ssl_object") is not None:  # MQTTS, or WSS below us
            connection.tls = True
            connection.certificate_user = peer_certificate_cn(transport)
        self.server.connections.add(self)
        self.metrics["connections_opened"] += 1
        self.last_received_ms = self.clock.now_ms()
        self.timer = self.clock.call_later(self.connect_timeout_s * 1000, self._connect_timeout)

    def received(self, data: bytes) -> None:
        self.last_received_ms = self.clock.now_ms()
        self.metrics["bytes_received"] += len(data)
        if not self.first_bytes:
            self.first_bytes = data[:SNIFF_BYTES]
        decoder = self.decoder
        before = decoder.buffered
        try:
            packets = decoder.feed(data)
        except MqttProtocolError:
            packets = []  # (kept in ``decoder.error``: handled after the packets before it)
        if packets:
            self.metrics["packets_received"] += len(packets)
        if self.park_more(packets):
            # A handler waits (reading is paused, and the partial-request clock with it): these
            # come after the parked ones.
            return
        self._process(packets, 0)
        after = decoder.buffered
        self.track_incomplete(after, after < before + len(data))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server.connections.discard(self)
        self.metrics["connections_closed"] += 1
        try:
            self.connection.connection_lost()
        except Exception:
            log.exception("mqtt: closing %r failed", self.connection)

    def pause_writing(self) -> None:
        self.connection.on_writing_paused(True)
        super().pause_writing()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.connection.on_writing_paused(False)

    # -- packets -----------------------------------------------------------------------------

    def _process(self, packets: list[Packet], start: int) -> None:
        """Handle ``packets[start:]`` in order until one has to wait (the rest are parked)
        or none are left; then the protocol error the decoder found after them, if any."""
        connection = self.connection
        if self.closed:
            return
        try:
            connected = connection.state is State.CONNECTED
            count = len(packets)
            i = start
            while i < count:
                packet = packets[i]
                i += 1
                if connected and type(packet) is Publish:  # the hot path, table skipped
                    waiting = connection._on_publish(packet)
                else:
                    waiting = connection.handle(packet)
                    connected = connection.state is State.CONNECTED
                if waiting is not None:
                    self.park(packets, i)
                    self.wait_for(waiting, self._resume, self._handler_failed)
                    return
            error = self.decoder.error
            if error is not None:
                raise error
        except MqttProtocolError as error:
            detail = ""
            if connection.state is State.AWAIT_CONNECT:  # not an MQTT client at all, often
                detail = f" (its first bytes look like {describe_first_bytes(self.first_bytes)})"
            connection.protocol_error(error, detail)
        except Exception as error:
            self._handler_failed(error)
            return
        connection.end_of_batch()

    def _resume(self) -> None:
        parked = self.take_parked()
        self.resume_reading(READING_BUSY)
        if self.closed:
            return
        if parked is None:
            self._process([], 0)
        else:
            self._process(*parked)

    def _handler_failed(self, error: BaseException) -> None:
        self.take_parked()  # the packets after a failed one are not handled
        connection = self.connection
        if isinstance(error, MqttProtocolError):
            connection.protocol_error(error)
            return
        self.metrics["handler_errors"] += 1
        log.error("mqtt %s: handler failed", connection.client_id or "(connecting)", exc_info=error)
        connection.close_with(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, str(error))
        self.close()

    # -- Link: what the state machine calls (write, close, pause_reading and resume_reading
    # are the transport's) ----------------------------------------------------------------

    def start_keep_alive(self, seconds: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.keep_alive_limit_ms = seconds * KEEP_ALIVE_FACTOR * 1000
        self._arm_keep_alive()

    def _arm_keep_alive(self) -> None:
        clock = self.clock
        due_ms = self.last_received_ms + self.keep_alive_limit_ms
        self.timer = clock.call_later(due_ms - clock.now_ms(), self._check_keep_alive)

    def _check_keep_alive(self) -> None:
        """Re-armed lazily: a read moves ``last_received_ms`` only; the timer, when it fires
        early, waits for the rest."""
        self.timer = None
        if self.closed:
            return
        if self.clock.now_ms() < self.last_received_ms + self.keep_alive_limit_ms:
            self._arm_keep_alive()
            return
        self.connection.keep_alive_expired()
        self.close()

    def _connect_timeout(self) -> None:
        self.timer = None
        if self.connection.state is State.AWAIT_CONNECT and not self.closed:
            self.metrics["connect_timeouts"] += 1
            self.abort()


class MQTTServer:
    """MQTT 3.1.1 / 5.0 over TCP (or over WebSocket with ``websocket=True``).

    ``await start(host, port)``; ``address``; ``await close()``; ``metrics``. Every server built
    on one :class:`BrokerAPI` shares its sessions (``MqttHub``)."""

    def __init__(
        self,
        api: BrokerAPI,
        *,
        websocket: bool = False,
        options: MqttOptions | None = None,
        limits: TransportLimits = TRANSPORT_LIMITS,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        self.limits = limits
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.websocket = websocket
        self.options = options
        self.connections: set[MqttProtocol] = set()
        # [limits] incomplete_request_timeout_s, read at start (issue 21 item 5).
        self.incomplete_request_timeout_s: float | None = None
        self._metrics: dict[str, int] = dict.fromkeys(METRICS, 0)
        self._server: asyncio.Server | None = None
        self._hub: MqttHub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def hub(self) -> MqttHub:
        if self._hub is None:
            raise RuntimeError("MQTTServer not started")
        return self._hub

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("MQTTServer not started")
        return self._loop

    @property
    def metrics(self) -> dict[str, int]:
        """Counters of this listener's connections; the TCP listener adds the hub's (sessions
        expired, wills, retained, delayed: shared by the broker's MQTT listeners, counted once).
        """
        if self._hub is None or self.websocket:
            return dict(self._metrics)
        return {**self._metrics, **self._hub.metrics}

    def gauges(self) -> dict[str, int]:
        """Current connections of this listener, sessions and retained messages of the hub."""
        gauges = {"connections": len(self.connections)}
        if self._hub is not None:
            gauges["sessions"] = len(self._hub.sessions)
            gauges["retained_messages"] = len(self._hub.retained)
        return gauges

    async def start(
        self,
        host: str,
        port: int,
        listen: Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]
        | None = None,
    ) -> None:
        """Listen on ``host:port``, by ``listen(protocol factory, host, port)`` when given:
        MQTTS (or WSS) on its own, without a plain listener, listens through braid/tls.py, which
        audits failed handshakes."""
        self._loop = asyncio.get_running_loop()
        self._hub = MqttHub.acquire(self.api, self.options)
        self.incomplete_request_timeout_s = self.api.incomplete_request_limits(
            ClientContext(PROTOCOL_MQTT, connection_id="mqtt-listener")
        )[1]
        factory: Any
        if self.websocket:

            def factory() -> asyncio.Protocol:
                return WebSocketProtocol(MqttProtocol(self))
        else:

            def factory() -> asyncio.Protocol:
                return MqttProtocol(self)

        try:
            if listen is not None:
                self._server = await listen(factory, host, port)
            else:
                self._server = await self._loop.create_server(
                    factory, host, port, backlog=LISTEN_BACKLOG, reuse_address=True
                )
        except BaseException:
            self._hub.release()
            self._hub = None
            raise

    @property
    def address(self) -> tuple[str, int] | None:
        if self._server is None or not self._server.sockets:
            return None
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for protocol in list(self.connections):
            connection = protocol.connection
            if connection.state is State.CONNECTED:
                connection.normal_disconnect = True  # no Will for our own shutdown
                connection.server_shutting_down()
            protocol.close()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        if self._hub is not None:
            self._hub.release()
            self._hub = None
