"""The ``Connection`` / ``Session`` state machines without sockets: packets in, bytes out through
a fake link (uvicorn's ``MockTransport`` idea), on a real log and broker in a temp directory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from core.api import BrokerAPI
from core.broker import Node
from core.log import LogConfig, LogStore
from gateway.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProtocolError,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from gateway.mqtt.hub import MqttHub, MqttOptions
from gateway.mqtt.session import Connection, State


class FakeLink:
    """Records what the state machine writes and asks of its transport."""

    def __init__(self, version: int = 5) -> None:
        self.decoder = MqttDecoder(version)
        self.written: list[Packet] = []  # decoded, not yet taken by ``packets``
        self.closed = False
        self.paused: set[str] = set()
        self.keep_alive: int | None = None

    def write(self, data: bytes) -> None:
        self.written += self.decoder.feed(data)

    def packets(self) -> list[Packet]:
        packets, self.written = self.written, []
        return packets

    def close(self) -> None:
        self.closed = True

    def pause_reading(self, reason: str) -> None:
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        self.paused.discard(reason)

    def start_keep_alive(self, seconds: int) -> None:
        self.keep_alive = seconds


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[MqttHub]:
    store = LogStore(LogConfig(tmp_path / "data", durability="async"))
    await store.start()
    broker = Node(store)
    await broker.start()
    hub = MqttHub.acquire(BrokerAPI(broker), MqttOptions())
    yield hub
    hub.release()
    await broker.close()
    await store.aclose()


class Peer:
    def __init__(self, hub: MqttHub, version: int = 5) -> None:
        self.link = FakeLink(version)
        self.metrics: dict[str, int] = {}
        self.connection = Connection(hub, self.link, _Counter())
        self.version = version

    def send(self, packet: Packet) -> None:
        assert self.connection.handle(packet) is None
        self.connection.end_of_batch()

    def got(self) -> list[Packet]:
        return self.link.packets()


class _Counter(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return 0


def connected(hub: MqttHub, client_id: str, version: int = 5, **kwargs: object) -> Peer:
    peer = Peer(hub, version)
    peer.send(Connect(client_id, version, **kwargs))  # type: ignore[arg-type]
    (connack,) = peer.got()
    assert isinstance(connack, Connack)
    assert connack.reason_code == 0
    return peer


@pytest.fixture
def peers(hub: MqttHub) -> Iterator[tuple[Peer, Peer]]:
    sub = connected(hub, "sub")
    pub = connected(hub, "pub")
    sub.send(Subscribe(1, (Subscription("t/#", 2),)))
    assert sub.got() == [Suback(1, (2,))]
    return sub, pub


async def test_connack_and_keep_alive(hub: MqttHub) -> None:
    peer = Peer(hub)
    peer.send(Connect("k", 5, True, 30, properties=Properties(receive_maximum=5)))
    (connack,) = peer.got()
    assert isinstance(connack, Connack)
    assert connack.properties.maximum_packet_size == 1 << 20
    assert peer.link.keep_alive == 30
    assert peer.connection.send_quota == 5
    peer.send(Pingreq())
    assert peer.got() == [Pingresp()]


async def test_qos2_outbound_flow(peers: tuple[Peer, Peer]) -> None:
    sub, pub = peers
    pub.send(Publish("t/x", b"two", 2, packet_id=9))
    assert pub.got() == [Pubrec(9)]
    (delivered,) = sub.got()
    assert isinstance(delivered, Publish)
    assert (delivered.qos, delivered.payload) == (2, b"two")
    packet_id = delivered.packet_id
    assert packet_id is not None
    sub.send(Pubrec(packet_id))
    assert sub.got() == [Pubrel(packet_id)]
    session = sub.connection.session
    assert session is not None
    assert session.inflight[packet_id].released
    sub.send(Pubcomp(packet_id))
    assert not session.inflight
    pub.send(Pubrel(9))
    assert pub.got() == [Pubcomp(9)]


async def test_receive_maximum_window(hub: MqttHub) -> None:
    sub = connected(hub, "w", properties=Properties(receive_maximum=1))
    pub = connected(hub, "p")
    sub.send(Subscribe(1, (Subscription("t", 1),)))
    sub.got()
    for payload in (b"1", b"2", b"3"):
        pub.send(Publish("t", payload, 1, packet_id=int(payload)))
    first = sub.got()
    assert [p.payload for p in first] == [b"1"]  # type: ignore[union-attr]
    assert isinstance(first[0], Publish)
    sub.send(Puback(first[0].packet_id or 0))
    second = sub.got()
    assert [p.payload for p in second] == [b"2"]  # type: ignore[union-attr]


async def test_takeover_sends_0x8e_and_keeps_a_persistent_session(hub: MqttHub) -> None:
    old = connected(
        hub, "same", clean_start=False, properties=Properties(session_expiry_interval=60)
    )
    old.send(Subscribe(1, (Subscription("t/+", 1),)))
    old.got()
    new = Peer(hub)
    new.send(Connect("same", 5, False, properties=Properties(session_expiry_interval=60)))
    assert old.got() == [Disconnect(0x8E, Properties(reason_string="session taken over"))]
    assert old.link.closed
    assert old.connection.state is State.CLOSED
    (connack,) = new.got()
    assert isinstance(connack, Connack)
    assert connack.session_present
    new.send(Unsubscribe(2, ("t/+", "t/none")))
    assert new.got() == [Unsuback(2, (0x00, 0x11))]


async def test_protocol_errors(hub: MqttHub) -> None:
    peer = connected(hub, "e")
    with pytest.raises(MqttProtocolError) as caught:
        peer.connection.handle(Suback(1, (0,)))  # a server's packet
    assert caught.value.reason_code == 0x82
    with pytest.raises(MqttProtocolError) as caught:
        peer.connection.handle(Disconnect(properties=Properties(session_expiry_interval=5)))
    assert caught.value.reason_code == 0x82  # [MQTT-3.14.2-2]
    peer.connection.protocol_error(caught.value)
    assert isinstance(peer.got()[-1], Disconnect)
    assert peer.link.closed


async def test_will_published_on_abnormal_close(hub: MqttHub, peers: tuple[Peer, Peer]) -> None:
    sub, _ = peers
    dying = connected(hub, "dying", will=Will("t/will", b"bye", 1))
    dying.connection.connection_lost()
    (will,) = sub.got()
    assert isinstance(will, Publish)
    assert (will.topic, will.payload) == ("t/will", b"bye")
    polite = connected(hub, "polite", will=Will("t/will", b"never", 1))
    polite.send(Disconnect())
    polite.connection.connection_lost()
    assert sub.got() == []
