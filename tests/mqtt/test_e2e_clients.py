"""aiomqtt (3.1.1 and 5.0) and amqtt's client against a real ``braid serve``, over TCP and over
WebSocket (``/mqtt``, subprotocol ``mqtt``), with paho over WebSocket too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiomqtt
import pytest
from amqtt.client import MQTTClient

from tests.braid_process import BraidProcess

from .clients import Paho, assert_clean_log, unique

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(
        tmp_path_factory.mktemp("braid-clients"), listeners=("mqtt", "mqtt-ws")
    ) as process:
        yield process
    assert_clean_log(process)


def aiomqtt_client(
    braid: BraidProcess, version: aiomqtt.ProtocolVersion, *, ws: bool = False
) -> aiomqtt.Client:
    if ws:
        return aiomqtt.Client(
            "127.0.0.1",
            braid.mqtt_ws_port,
            identifier=unique("aio-ws-"),
            protocol=version,
            transport="websockets",
            websocket_path="/mqtt",
        )
    return aiomqtt.Client("127.0.0.1", braid.mqtt_port, identifier=unique("aio-"), protocol=version)


async def receive(client: aiomqtt.Client, count: int) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []

    async def collect() -> None:
        async for message in client.messages:
            got.append(message)
            if len(got) == count:
                return

    await asyncio.wait_for(collect(), TIMEOUT)
    return got


@pytest.mark.parametrize("version", [aiomqtt.ProtocolVersion.V311, aiomqtt.ProtocolVersion.V5])
@pytest.mark.parametrize("ws", [False, True], ids=["tcp", "websocket"])
async def test_aiomqtt_round_trips(
    braid: BraidProcess, version: aiomqtt.ProtocolVersion, ws: bool
) -> None:
    topic = f"{unique('aio')}/x"
    async with (
        aiomqtt_client(braid, version, ws=ws) as sub,
        aiomqtt_client(braid, version, ws=not ws) as pub,
    ):
        await sub.subscribe(topic, qos=2)
        for qos in (0, 1, 2):
            await pub.publish(topic, f"qos{qos}".encode(), qos=qos)
        got = await receive(sub, 3)
        assert [(m.payload, m.qos) for m in got] == [(b"qos0", 0), (b"qos1", 1), (b"qos2", 2)]
        assert all(str(m.topic) == topic for m in got)


async def test_aiomqtt_retained_over_websocket(braid: BraidProcess) -> None:
    topic = unique("aio-ret")
    async with aiomqtt_client(braid, aiomqtt.ProtocolVersion.V5) as pub:
        await pub.publish(topic, b"kept", qos=1, retain=True)
    async with aiomqtt_client(braid, aiomqtt.ProtocolVersion.V5, ws=True) as sub:
        await sub.subscribe(topic, qos=1)
        (message,) = await receive(sub, 1)
        assert (message.payload, message.retain) == (b"kept", True)


async def test_amqtt_client_round_trips(braid: BraidProcess) -> None:
    topic = f"{unique('amqtt')}/y"
    sub = MQTTClient(client_id=unique("amqtt-sub"))
    pub = MQTTClient(client_id=unique("amqtt-pub"))
    await sub.connect(f"mqtt://127.0.0.1:{braid.mqtt_port}/")
    await pub.connect(f"mqtt://127.0.0.1:{braid.mqtt_port}/")
    try:
        await sub.subscribe([(topic, 2)])
        for qos in (0, 1, 2):
            await pub.publish(topic, f"amqtt{qos}".encode(), qos=qos)
        got = []
        for _ in range(3):
            message = await sub.deliver_message(timeout_duration=TIMEOUT)
            assert message is not None
            got.append((bytes(message.data), message.qos))
        assert got == [(b"amqtt0", 0), (b"amqtt1", 1), (b"amqtt2", 2)]
    finally:
        await pub.disconnect()
        await sub.disconnect()


async def test_amqtt_client_over_websocket(braid: BraidProcess) -> None:
    topic = unique("amqtt-ws")
    sub = MQTTClient(client_id=unique("amqtt-ws"))
    await sub.connect(f"ws://127.0.0.1:{braid.mqtt_ws_port}/mqtt")
    try:
        await sub.subscribe([(topic, 1)])
        with Paho(braid.mqtt_port) as pub:
            pub.connect()
            pub.publish(topic, b"to ws", 1)
        message = await sub.deliver_message(timeout_duration=TIMEOUT)
        assert message is not None
        assert bytes(message.data) == b"to ws"
    finally:
        await sub.disconnect()


@pytest.mark.parametrize("version", [4, 5])
def test_paho_over_websocket_shares_sessions_with_tcp(braid: BraidProcess, version: int) -> None:
    topic = unique("pws")
    client_id = unique("pwsc")
    expiry = 60 if version == 5 else None
    ws = Paho(
        braid.mqtt_ws_port,
        client_id=client_id,
        version=version,
        clean=False,
        transport="websockets",
    )
    ws.connect(expiry=expiry)
    ws.subscribe(topic, 1)
    ws.close()
    with Paho(braid.mqtt_ws_port, version=version, transport="websockets") as pub:
        pub.connect()
        pub.publish(topic, b"queued", 1)
    tcp = Paho(braid.mqtt_port, client_id=client_id, version=version, clean=False)
    _, present, _ = tcp.connect(expiry=expiry)
    assert present  # the same session, over the other transport
    assert tcp.get().payload == b"queued"
    tcp.close()
