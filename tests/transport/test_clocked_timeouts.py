"""The gateways' timeouts on an injected ManualClock: the AMQP handshake (heartbeats:
tests/amqp/test_server.py), MQTT Keep Alive and CONNECT, the WebSocket handshake deadline, and a
close that a peer never reads. The listeners run in
process over real sockets with real frames; only time is moved by hand, so nothing sleeps and
no assertion bounds how long anything took."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.api import BrokerAPI, ManualClock
from core.broker import Node
from core.log import LogConfig, LogStore
from gateway.amqp.server import AMQPServer
from gateway.mqtt.codec import Connect, Disconnect, MqttDecoder, encode
from gateway.mqtt.hub import MqttOptions
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.server import MQTTServer
from tests.transport.sockets import DEADLINE_S, small_window_socket, until


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[BrokerAPI]:
    store = LogStore(LogConfig(tmp_path / "data", durability="async"))
    await store.start()
    broker = Node(store)
    await broker.start()
    yield BrokerAPI(broker)
    await broker.close()
    await store.aclose()


async def eof(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes."""
    return await asyncio.wait_for(reader.read(), DEADLINE_S)


async def test_amqp_handshake_timeout_on_the_clock(api: BrokerAPI) -> None:
    clock = ManualClock()
    server = AMQPServer(api, clock=clock)
    await server.start("127.0.0.1", 0)
    try:
        assert server.address is not None
        reader, writer = await asyncio.open_connection(*server.address)
        await until(lambda: len(server.connections) == 1, "the connection")
        clock.advance(9_999)  # (HANDSHAKE_TIMEOUT_S is 10 s, RabbitMQ's handshake_timeout)
        await asyncio.sleep(0.01)
        assert len(server.connections) == 1
        clock.advance(1)
        assert await eof(reader) == b""
        writer.close()
    finally:
        await server.close()


async def test_mqtt_keep_alive_expires_on_the_clock(api: BrokerAPI) -> None:
    clock = ManualClock()
    server = MQTTServer(api, clock=clock)
    await server.start("127.0.0.1", 0)
    try:
        assert server.address is not None
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(encode(Connect("keepalive-client", 5, keep_alive=10), 5))
        decoder = MqttDecoder(5)
        while not decoder.feed(await asyncio.wait_for(reader.read(4096), DEADLINE_S)):
            pass  # until the CONNACK
        # [MQTT-3.1.2-22]: one and a half times the Keep Alive without a packet.
        clock.advance(14_999)
        await asyncio.sleep(0)
        assert server.gauges()["connections"] == 1
        clock.advance(1)
        (disconnect,) = decoder.feed(await eof(reader))
        assert isinstance(disconnect, Disconnect)
        assert disconnect.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
        assert server.metrics["keep_alive_timeouts"] == 1
        writer.close()
    finally:
        await server.close()


async def test_mqtt_connect_timeout_on_the_clock(api: BrokerAPI) -> None:
    clock = ManualClock()
    server = MQTTServer(api, clock=clock, options=MqttOptions(connect_timeout_s=3.0))
    await server.start("127.0.0.1", 0)
    try:
        assert server.address is not None
        reader, writer = await asyncio.open_connection(*server.address)
        await until(lambda: server.gauges()["connections"] == 1, "the connection")
        clock.advance(3_000)
        assert await eof(reader) == b""
        assert server.metrics["connect_timeouts"] == 1
        writer.close()
    finally:
        await server.close()


async def test_websocket_handshake_deadline_on_the_clock(api: BrokerAPI) -> None:
    clock = ManualClock()
    server = MQTTServer(
        api, websocket=True, clock=clock, options=MqttOptions(connect_timeout_s=2.0)
    )
    await server.start("127.0.0.1", 0)
    try:
        assert server.address is not None
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"GET /mqtt HTTP/1.1\r\n")  # and nothing more
        await writer.drain()
        await asyncio.sleep(0.01)
        clock.advance(2_000)
        assert await eof(reader) == b""
        writer.close()
    finally:
        await server.close()


async def test_a_closed_mqtt_connection_whose_peer_never_reads_is_aborted(
    api: BrokerAPI,
) -> None:
    """A connection closed (a protocol error, a take-over, shutdown) while megabytes wait for
    a peer that reads nothing is aborted after the close timeout instead of staying open."""
    clock = ManualClock()
    server = MQTTServer(api, clock=clock)
    await server.start("127.0.0.1", 0)
    assert server.address is not None
    sock = small_window_socket(server.address)
    try:
        sock.sendall(encode(Connect("stuck", 5, keep_alive=0), 5))
        await until(lambda: server.gauges()["connections"] == 1, "the connection")
        (protocol,) = server.connections
        for _ in range(64):  # 64 MiB queued for a peer that takes nothing
            protocol.write(b"\x00" * (1 << 20))
        protocol.close()
        await asyncio.sleep(0.01)
        assert server.connections == {protocol}  # still there: closing waits for the peer
        clock.advance(protocol.limits.close_timeout_s * 1000)
        await until(lambda: not server.connections, "the connection to be aborted")
    finally:
        sock.close()
        await server.close()
