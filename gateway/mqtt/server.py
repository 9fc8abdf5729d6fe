"""The MQTT listener: a thin ``asyncio.Protocol`` per connection around the sans-IO codec and the
``Connection`` state machine (``session.py``), built on the Broker API (``core/api/``).
``MQTTServer(api, websocket=True)`` serves MQTT over WebSocket instead (``websocket.py`` frames
the same bytes).

I/O batching (ARCHITECTURE.md): every packet of a read is decoded and handled before yielding;
what the connection writes during one loop iteration goes out in one ``transport.write``
(``_flush``, scheduled once per iteration). A handler that has to wait (a publish while flow
control blocks publishers) holds the following packets of that connection, in order, and
reading pauses until it is done.

Reading pauses (``pause_reading(reason)``) while any reason holds: the transport's write buffer
is above its high-water mark (``pause_writing``: a client not reading what we send does not get
to send more), a handler is waiting, flow control blocks publishers, or a subscriber this
connection publishes to cannot take more. It resumes when the last reason goes.

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
import socket
from collections import deque
from collections.abc import Awaitable
from dataclasses import replace
from ssl import SSLContext
from typing import Any, Final, cast

from core.api import BrokerAPI
from gateway.mqtt.decoder import MqttDecoder
from gateway.mqtt.errors import MqttProtocolError
from gateway.mqtt.hub import MqttHub, MqttOptions
from gateway.mqtt.packets import Packet, Publish
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.session import Connection, State
from gateway.mqtt.sniff import SNIFF_BYTES, describe_first_bytes

log = logging.getLogger(__name__)

# Keep Alive is enforced at one and a half times its value [MQTT-3.1.2-22].
KEEP_ALIVE_FACTOR: Final = 1.5
# Write buffer high/low water marks (asyncio's defaults are 64 KiB / 16 KiB): a subscriber takes
# bursts of 1 MiB before it counts as congested.
WRITE_HIGH_WATER: Final = 1 << 20
WRITE_LOW_WATER: Final = 256 << 10
# The listen backlog: 10,000 clients connecting at once should not be refused (Mosquitto: 100,
# EMQX: 1024; the kernel caps it at net.core.somaxconn).
LISTEN_BACKLOG: Final = 4096
# A TLS client that has not finished its handshake by then is dropped (braid/tls.py's value).
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0

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


def certificate_common_name(certificate: Any) -> str | None:
    """The common name of a verified client certificate (``ssl``'s ``getpeercert()`` form), or
    None: the user name with ``use_identity_as_username``."""
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class MqttProtocol(asyncio.Protocol):
    """One MQTT connection's transport side (also the ``Link`` of its state machine)."""

    def __init__(self, server: MQTTServer) -> None:
        self.server = server
        self.loop = server.loop
        self.metrics = server._metrics
        self.decoder = MqttDecoder(max_packet_size=server.hub.options.max_packet_size)
        self.connection = Connection(server.hub, self, self.metrics)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.backlog: deque[Packet] = deque()
        self.busy = False
        self.pause_reasons: set[str] = set()
        self.last_received = 0.0
        self.keep_alive_limit = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        # The connection's first bytes, to say what they look like if they are not MQTT.
        self.first_bytes = b""

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        connection = self.connection
        if isinstance(peer, tuple) and len(peer) >= 2:
            connection.context = replace(connection.context, peer=f"{peer[0]}:{peer[1]}")
        if transport.get_extra_info("ssl_object") is not None:  # MQTTS, or WSS below us
            connection.tls = True
            connection.certificate_user = certificate_common_name(
                transport.get_extra_info("peercert")
            )
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(AttributeError, NotImplementedError):
            transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        self.server.connections.add(self)
        self.metrics["connections_opened"] += 1
        self.last_received = self.loop.time()
        self.timer = self.loop.call_later(
            self.server.hub.options.connect_timeout_s, self._connect_timeout
        )

    def data_received(self, data: bytes) -> None:
        self.last_received = self.loop.time()
        self.metrics["bytes_received"] += len(data)
        if not self.first_bytes:
            self.first_bytes = data[:SNIFF_BYTES]
        self.decoder.feed(data)
        if not self.busy:
            self._process()

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server.connections.discard(self)
        self.metrics["connections_closed"] += 1
        self.backlog.clear()
        self.out.clear()
        try:
            self.connection.connection_lost()
        except Exception:
            log.exception("mqtt: closing %r failed", self.connection)

    def pause_writing(self) -> None:
        self.connection.on_writing_paused(True)
        self.pause_reading("writing")

    def resume_writing(self) -> None:
        self.resume_reading("writing")
        self.connection.on_writing_paused(False)

    # -- packets -----------------------------------------------------------------------------

    def _process(self) -> None:
        """Handle every decoded packet, in order, until one has to wait or none are left."""
        connection = self.connection
        backlog = self.backlog
        try:
            while True:
                if not backlog:
                    if self.closed:
                        return
                    packets = self.decoder.read_packets()
                    if not packets:
                        break
                    self.metrics["packets_received"] += len(packets)
                    backlog.extend(packets)
                connected = connection.state is State.CONNECTED
                while backlog:
                    packet = backlog.popleft()
                    if connected and type(packet) is Publish:  # the hot path, table skipped
                        waiting = connection._on_publish(packet)
                    else:
                        waiting = connection.handle(packet)
                        connected = connection.state is State.CONNECTED
                    if waiting is not None:
                        self._wait(waiting)
                        return
        except MqttProtocolError as error:
            backlog.clear()
            detail = ""
            if connection.state is State.AWAIT_CONNECT:  # not an MQTT client at all, often
                detail = f" (its first bytes look like {describe_first_bytes(self.first_bytes)})"
            connection.protocol_error(error, detail)
        except Exception as error:
            backlog.clear()
            self.metrics["handler_errors"] += 1
            log.exception("mqtt %s: handler failed", connection.client_id or "(connecting)")
            connection.close_with(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, str(error))
            self.close()
            return
        connection.end_of_batch()

    def _wait(self, waiting: Awaitable[None]) -> None:
        self.busy = True
        self.pause_reading("busy")
        self.server.hub.spawn(self._resume_after(waiting))

    async def _resume_after(self, waiting: Awaitable[None]) -> None:
        try:
            await waiting
        except MqttProtocolError as error:
            self.backlog.clear()
            self.connection.protocol_error(error)
        except Exception as error:
            self.backlog.clear()
            self.metrics["handler_errors"] += 1
            log.exception("mqtt %s: handler failed", self.connection.client_id)
            self.connection.close_with(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, str(error))
            self.close()
        finally:
            self.busy = False
            self.resume_reading("busy")
        if not self.closed:
            self._process()

    # -- Link: what the state machine calls ----------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        transport = self.transport
        if not out or transport is None or self.closed or transport.is_closing():
            out.clear()  # after close(): nothing more goes out
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.metrics["bytes_sent"] += len(data)
        transport.write(data)

    def close(self) -> None:
        """Flush what was written, then close."""
        if self.transport is None or self.transport.is_closing():
            return
        self._flush()
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self, reason: str) -> None:
        if not self.pause_reasons and self.transport is not None and not self.closed:
            with contextlib.suppress(RuntimeError):
                self.transport.pause_reading()
        self.pause_reasons.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.pause_reasons:
            return
        self.pause_reasons.discard(reason)
        if not self.pause_reasons and self.transport is not None and not self.closed:
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()

    def start_keep_alive(self, seconds: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.keep_alive_limit = seconds * KEEP_ALIVE_FACTOR
        self.timer = self.loop.call_at(
            self.last_received + self.keep_alive_limit, self._check_keep_alive
        )

    def _check_keep_alive(self) -> None:
        self.timer = None
        if self.closed:
            return
        due = self.last_received + self.keep_alive_limit
        now = self.loop.time()
        if now < due:
            self.timer = self.loop.call_at(due, self._check_keep_alive)
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
        self, api: BrokerAPI, *, websocket: bool = False, options: MqttOptions | None = None
    ) -> None:
        self.api = api
        self.websocket = websocket
        self.options = options
        self.connections: set[MqttProtocol] = set()
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

    async def start(self, host: str, port: int, ssl: SSLContext | None = None) -> None:
        """Listen on ``host:port``; with ``ssl``, MQTTS (or WSS) on its own, without a plain
        listener (the context is the process's one TLS context, reloaded in place)."""
        self._loop = asyncio.get_running_loop()
        self._hub = MqttHub.acquire(self.api, self.options)
        factory: Any
        if self.websocket:
            from gateway.mqtt.websocket import WebSocketProtocol

            def factory() -> asyncio.Protocol:
                return WebSocketProtocol(MqttProtocol(self))
        else:

            def factory() -> asyncio.Protocol:
                return MqttProtocol(self)

        try:
            self._server = await self._loop.create_server(
                factory,
                host,
                port,
                backlog=LISTEN_BACKLOG,
                reuse_address=True,
                ssl=ssl,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl is not None else None,
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
