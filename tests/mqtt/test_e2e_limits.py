"""The server's limits on what a client may do, against a real ``braid serve`` configured in its
``[mqtt]`` section (issue 17, items 2 and 3):

- Receive Maximum on the way in: more unacknowledged QoS 1/2 PUBLISHes than the CONNACK
  announced is DISCONNECT 0x93 (5.0) or a closed connection (3.1.1), as Mosquitto does (its test
  ``03-publish-qos2-max-inflight-exceeded``, QoS 2 without PUBREL); a client that keeps to it
  (paho, or a raw one completing its exchanges) is never cut off;
- ``max_keepalive`` (Mosquitto's name): a 5.0 client asking for more, or for none, is told the
  limit (Server Keep Alive) and held to it; a 3.1.1 client asking for more is refused with
  CONNACK 0x02, as Mosquitto 2.0.14 and later.

Raw sockets where paho will not break the rules; paho for what a real client sees."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.mqtt.codec import (
    Connack,
    Disconnect,
    Properties,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
)
from gateway.mqtt.reason_codes import ReasonCode
from tests.braid_process import BraidProcess

from .clients import Paho, RawClient, assert_clean_log, unique

RECEIVE_MAXIMUM = 20
MAX_KEEPALIVE = 60


def _braid(path: Path, config: str) -> Iterator[BraidProcess]:
    config_file = path / "braid.toml"
    config_file.write_text(config)
    with BraidProcess(
        path, listeners=("mqtt",), extra_args=("--config", str(config_file))
    ) as process:
        yield process
    assert_clean_log(process)


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    yield from _braid(
        tmp_path_factory.mktemp("braid-limits"),
        f"[mqtt]\nreceive_maximum = {RECEIVE_MAXIMUM}\nmax_keepalive = {MAX_KEEPALIVE}\n",
    )


@pytest.fixture(scope="module")
def default_braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    yield from _braid(tmp_path_factory.mktemp("braid-defaults"), "")


def _qos2(topic: str, packet_id: int) -> Publish:
    return Publish(topic, b"m", 2, packet_id=packet_id)


# -- Receive Maximum ---------------------------------------------------------------------------


def test_connack_announces_receive_maximum(braid: BraidProcess) -> None:
    client = RawClient(braid.mqtt_port)
    connack = client.connect(unique("rm"))
    assert connack.properties.receive_maximum == RECEIVE_MAXIMUM
    client.disconnect()


@pytest.mark.parametrize("version", [4, 5])
def test_one_qos2_publish_over_receive_maximum_disconnects(
    braid: BraidProcess, version: int
) -> None:
    topic = unique("rmx")
    client = RawClient(braid.mqtt_port, version=version)
    client.connect(unique("rm"))
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):  # no PUBREL: each exchange stays open
        client.send(_qos2(topic, packet_id))
        assert client.recv() == Pubrec(packet_id)
    client.send(_qos2(topic, RECEIVE_MAXIMUM + 1))
    closing = client.closed_after()
    if version == 5:
        assert [type(p) for p in closing] == [Disconnect], closing
        disconnect = closing[0]
        assert isinstance(disconnect, Disconnect)
        assert disconnect.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    else:  # 3.1.1 has no DISCONNECT from the server: closed
        assert closing == []


def test_completed_exchanges_free_the_quota(braid: BraidProcess) -> None:
    topic = unique("rmf")
    client = RawClient(braid.mqtt_port)
    client.connect(unique("rm"))
    for round_number in range(3):  # 60 QoS 2 publishes, never more than 20 open
        first = round_number * RECEIVE_MAXIMUM + 1
        ids = range(first, first + RECEIVE_MAXIMUM)
        for packet_id in ids:
            client.send(_qos2(topic, packet_id))
        assert [client.recv() for _ in ids] == [Pubrec(i) for i in ids]
        for packet_id in ids:
            client.send(Pubrel(packet_id))
        assert [client.recv() for _ in ids] == [Pubcomp(i) for i in ids]
    client.disconnect()


def test_exchanges_of_an_earlier_connection_do_not_count(braid: BraidProcess) -> None:
    """The quota is per network connection [MQTT-4.9.0-1]: QoS 2 exchanges left open by the
    last connection of a session (PUBREL to come) take none of the new one's."""
    topic = unique("rmc")
    client_id = unique("rm")
    persistent = Properties(session_expiry_interval=600)
    first = RawClient(braid.mqtt_port)
    first.connect(client_id, properties=persistent)
    for packet_id in range(1, 16):
        first.send(_qos2(topic, packet_id))
        assert first.recv() == Pubrec(packet_id)
    first.close()
    second = RawClient(braid.mqtt_port)
    connack = second.connect(client_id, clean=False, properties=persistent)
    assert connack.session_present
    for packet_id in range(100, 100 + RECEIVE_MAXIMUM):
        second.send(_qos2(topic, packet_id))
        assert second.recv() == Pubrec(packet_id)
    for packet_id in range(1, 16):  # the old exchanges complete on the new connection
        second.send(Pubrel(packet_id))
        assert second.recv() == Pubcomp(packet_id)
    second.disconnect()


def test_paho_keeping_to_the_quota_is_never_cut_off(braid: BraidProcess) -> None:
    """paho publishes 200 QoS 1 and 200 QoS 2 messages without waiting (its own window:
    the announced Receive Maximum) and every one completes."""
    topic = unique("rmp")
    with Paho(braid.mqtt_port) as publisher:
        publisher.client.max_inflight_messages_set(RECEIVE_MAXIMUM)
        publisher.connect()
        infos = [
            publisher.client.publish(topic, str(i).encode(), qos)
            for qos in (1, 2)
            for i in range(200)
        ]
        for info in infos:
            info.wait_for_publish(10)
            assert info.is_published()
        assert not publisher.disconnected.is_set()


# -- max_keepalive -----------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "granted"), [(100, 60), (0, 60), (30, None), (60, None)])
def test_server_keep_alive_caps_a_v5_client(
    braid: BraidProcess, asked: int, granted: int | None
) -> None:
    with Paho(braid.mqtt_port) as client:
        reason, _, props = client.connect(keepalive=asked)
        assert reason == 0
        assert getattr(props, "ServerKeepAlive", None) == granted


@pytest.mark.parametrize(("asked", "accepted"), [(100, False), (0, False), (60, True)])
def test_a_v3_client_asking_for_more_is_refused(
    braid: BraidProcess, asked: int, accepted: bool
) -> None:
    client = RawClient(braid.mqtt_port, version=4)
    connack = client.connect(unique("ka"), keep_alive=asked)
    if accepted:
        assert connack.reason_code == 0
        client.disconnect()
    else:  # 0x02 Identifier rejected, then closed (Mosquitto's answer)
        assert connack == Connack(False, 0x02)
        assert client.closed_after() == []


def test_paho_v3_sees_identifier_rejected(braid: BraidProcess) -> None:
    client = Paho(braid.mqtt_port, version=4)
    reason, _, _ = client.connect(keepalive=MAX_KEEPALIVE + 1)
    # paho 2 reports 3.1.1's return code 2 under its 5.0 name (0x85)
    assert str(reason) == "Client identifier not valid"
    assert client.disconnected.wait(10)
    client.close()


def test_the_granted_keep_alive_is_enforced(tmp_path: Path) -> None:
    """max_keepalive 1: a 5.0 client that asked for 60 s and then stays silent is disconnected
    (0x8D Keep Alive timeout) after 1.5 s, not 90 s."""
    for braid in _braid(tmp_path, "[mqtt]\nmax_keepalive = 1\n"):
        client = RawClient(braid.mqtt_port)
        connack = client.connect(unique("ka"), keep_alive=60)
        assert connack.properties.server_keep_alive == 1
        packet = client.recv(timeout=30)
        assert isinstance(packet, Disconnect)
        assert packet.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT


def test_defaults(default_braid: BraidProcess) -> None:
    """By default (max_keepalive 65535, Receive Maximum 65535 not announced): a 5.0 client
    asking for no keep alive is told 65535; a 3.1.1 one is let in (options.py says why)."""
    v5 = RawClient(default_braid.mqtt_port)
    connack = v5.connect(unique("d5"), keep_alive=0)
    assert connack.properties.server_keep_alive == 65_535
    assert connack.properties.receive_maximum is None
    v5.disconnect()
    v3 = RawClient(default_braid.mqtt_port, version=4)
    assert v3.connect(unique("d3"), keep_alive=0).reason_code == 0
    v3.disconnect()
