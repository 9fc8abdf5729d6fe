"""MQTT logins and permissions against a real ``braid serve``, with paho (3.1.1 and 5.0):
user names and passwords from the user store (CONNACK 0x04/0x86 bad credentials, 0x05/0x87 not
authorized), anonymous clients per ``[auth] anonymous``, the client certificate's CN as the user
name on a TLS-only MQTTS listener, and every MQTT row of the mapping table with and without its
permission: PUBLISH (5.0 PUBACK 0x87; 3.1.1 acknowledged and dropped, or closed), the will
(checked at CONNECT), SUBSCRIBE (SUBACK 0x80/0x87) and per-record delivery through a filter
whose first level is a wildcard (retained messages too). Users and permissions are made through
the HTTP API, as an operator would, and a change applies to the open connection at once."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.reasoncodes import ReasonCode

from core.security.mapping import MQTT, OPERATION_LIST, READ, WRITE
from tests.braid_process import BraidProcess, free_port
from tests.security.certs import CertificateAuthority
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
MQTT_ROWS = [rule for rule in OPERATION_LIST if rule.protocol == MQTT]


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Client:
    """A paho client run on its own thread, with what it saw."""

    def __init__(
        self,
        port: int,
        version: int,
        user: str | None = None,
        password: str | None = None,
        will: tuple[str, bytes] | None = None,
        tls: Any = None,
        transport: str = "tcp",
    ) -> None:
        self.version = version
        self.paho = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"sec-{uuid.uuid4().hex[:10]}",
            protocol=version,
            transport=transport,  # type: ignore[arg-type]
        )
        if user is not None:
            self.paho.username_pw_set(user, password)
        if will is not None:
            self.paho.will_set(will[0], will[1], qos=1)
        if tls is not None:
            self.paho.tls_set_context(tls)
        self.connack: ReasonCode | None = None
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.messages: list[tuple[str, bytes]] = []
        self.subacks: dict[int, list[ReasonCode]] = {}
        self.pubacks: dict[int, ReasonCode] = {}
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = lambda *_args: self.disconnected.set()
        self.paho.on_message = lambda _c, _u, m: self.messages.append((m.topic, m.payload))
        self.paho.on_subscribe = self._on_subscribe
        self.paho.on_publish = self._on_publish
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        assert self.connected.wait(DEADLINE_S) or self.disconnected.wait(DEADLINE_S)

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: ReasonCode, _p: Any) -> None:
        self.connack = reason
        self.connected.set()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, reasons: list[ReasonCode], _p: Any) -> None:
        self.subacks[mid] = reasons

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: ReasonCode, _p: Any) -> None:
        self.pubacks[mid] = reason

    @property
    def refused_with(self) -> int:
        """The CONNACK code as the 5.0 reason code paho reports (it maps 3.1.1's 0x04 to 0x86
        and 0x05 to 0x87)."""
        assert self.connack is not None
        return int(self.connack.value)

    def subscribe(self, topic_filter: str) -> int:
        _, mid = self.paho.subscribe(topic_filter, qos=1)
        wait_for(lambda: mid in self.subacks, f"the SUBACK of {topic_filter}")
        return int(self.subacks[mid][0].value)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int:
        """Publish at QoS 1; the PUBACK's reason code (3.1.1: always 0)."""
        info = self.paho.publish(topic, payload, qos=1, retain=retain)
        wait_for(lambda: info.mid in self.pubacks or self.disconnected.is_set(), "a PUBACK")
        if info.mid not in self.pubacks:
            return -1  # the connection was closed instead
        return int(self.pubacks[info.mid].value)

    def received(self, topic: str) -> list[bytes]:
        return [payload for name, payload in self.messages if name == topic]

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with BraidProcess(tmp_path_factory.mktemp("mqtt-sec"), listeners=("mqtt", "http")) as process:
        yield process


@pytest.fixture(scope="module")
def admin(braid: BraidProcess) -> Admin:
    return Admin(braid.http_port)


VERSIONS = [pytest.param(mqtt.MQTTv311, id="3.1.1"), pytest.param(mqtt.MQTTv5, id="5.0")]


# -- logins ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_logins_against_the_user_store(braid: BraidProcess, admin: Admin, version: int) -> None:
    admin.user("carol", "c-pass")
    admin.permit("carol", write=".*", read=".*")
    for user, password, expected in (
        ("carol", "c-pass", 0),
        ("guest", "guest", 0),  # the default user, from loopback
        (None, None, 0),  # anonymous from loopback ([auth] anonymous = "loopback")
        ("carol", "wrong", 0x86),  # 3.1.1: 0x04
        ("nobody", "c-pass", 0x86),
    ):
        client = Client(braid.mqtt_port, version, user, password)
        try:
            assert client.refused_with == expected, (user, password)
        finally:
            client.close()
    assert "login failed: protocol=mqtt" in braid.stderr()
    assert "c-pass" not in braid.stderr()
    assert "wrong" not in braid.stderr()


# -- the mapping table, row by row -------------------------------------------------------------


def exercise(braid: BraidProcess, operation: str, user: str, version: int) -> bool:
    """Do ``operation`` (an MQTT row of the mapping table) as ``user`` on exchange ``x.<id>``
    and say whether the broker let it through, as paho sees it."""
    exchange = unique("x.")
    topic = f"{exchange}/a/b"
    if operation == "PUBLISH":
        watcher = Client(braid.mqtt_port, mqtt.MQTTv5, "guest", "guest")
        assert watcher.subscribe(f"{exchange}/#") == 1
        client = Client(braid.mqtt_port, version, user, "pw")
        code = client.publish(topic, b"p")
        marker = f"{exchange}/marker"  # stored after the first one (acknowledged before)
        guest = Client(braid.mqtt_port, mqtt.MQTTv5, "guest", "guest")
        assert guest.publish(marker, b"m") == 0
        guest.close()
        wait_for(lambda: watcher.received(marker), "the marker")
        arrived = bool(watcher.received(topic))
        watcher.close()
        client.close()
        if version == mqtt.MQTTv5:
            assert (code == 0) == arrived
            assert code in (0, 0x87)
        else:
            assert code == 0  # acknowledged and dropped, as Mosquitto
        return arrived
    if operation == "will":
        client = Client(braid.mqtt_port, version, user, "pw", will=(topic, b"gone"))
        accepted = client.refused_with == 0
        if not accepted:
            assert client.refused_with == 0x87  # 3.1.1: 0x05
        client.close()
        return accepted
    if operation == "SUBSCRIBE":
        client = Client(braid.mqtt_port, version, user, "pw")
        code = client.subscribe(f"{exchange}/+/b")
        client.close()
        assert code in (1, 0x80 if version == mqtt.MQTTv311 else 0x87)
        return code == 1
    assert operation == "deliver"
    client = Client(braid.mqtt_port, version, user, "pw")
    assert client.subscribe("+/a/b") == 1  # first level a wildcard: checked per record
    publisher = Client(braid.mqtt_port, mqtt.MQTTv5, "guest", "guest")
    assert publisher.publish(topic, b"d") == 0
    marker = f"{unique('mark.')}/a/b"
    assert publisher.publish(marker, b"m") == 0
    wait_for(lambda: client.received(marker), "the marker")
    arrived = bool(client.received(topic))
    publisher.close()
    client.close()
    return arrived


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rule", MQTT_ROWS, ids=[rule.operation for rule in MQTT_ROWS])
def test_every_mqtt_row_of_the_mapping_table(
    braid: BraidProcess, admin: Admin, rule: Any, version: int
) -> None:
    user = unique("row")
    admin.user(user, "pw")
    needed = rule.permission
    assert needed in (WRITE, READ)
    other = READ if needed == WRITE else WRITE
    # The deliver row's marker (mark.*) is readable either way: it tells "nothing came".
    admin.permit(user, **{needed: "^(x|mark)\\.", other: "^other\\."})
    assert exercise(braid, rule.operation, user, version), f"{rule.name} with {needed}"
    admin.permit(user, **{needed: "^(other|mark)\\.", other: "^x\\."})
    assert not exercise(braid, rule.operation, user, version), f"{rule.name} without {needed}"
    assert f"operation='{rule.name}'" in braid.stderr()


# -- topic permissions, retained messages, changes at once -------------------------------------


def test_topic_permissions_apply_to_the_routing_key(braid: BraidProcess, admin: Admin) -> None:
    user = unique("tp")
    admin.user(user, "pw")
    admin.permit(user, write=".*", read=".*")
    admin.topic_permit(user, "sensors", write="^{username}\\.", read=".*")
    client = Client(braid.mqtt_port, mqtt.MQTTv5, user, "pw")
    try:
        assert client.publish(f"sensors/{user}/t", b"mine") == 0
        assert client.publish("sensors/someone/t", b"theirs") == 0x87
        assert client.publish("elsewhere/any", b"no topic permission there") == 0
    finally:
        client.close()


def test_retained_messages_are_checked_per_record(braid: BraidProcess, admin: Admin) -> None:
    user = unique("ret")
    admin.user(user, "pw")
    admin.permit(user, read="^open\\.")
    mine, theirs = f"{unique('open.')}/r", f"{unique('closed.')}/r"
    publisher = Client(braid.mqtt_port, mqtt.MQTTv5, "guest", "guest")
    assert publisher.publish(theirs, b"hidden", retain=True) == 0
    assert publisher.publish(mine, b"shown", retain=True) == 0
    publisher.close()
    client = Client(braid.mqtt_port, mqtt.MQTTv311, user, "pw")
    try:
        assert client.subscribe("+/r") == 1
        wait_for(lambda: client.received(mine), "the readable retained message")
        marker = f"{unique('open.')}/r"  # live, after the retained ones were handed out
        publisher = Client(braid.mqtt_port, mqtt.MQTTv5, "guest", "guest")
        assert publisher.publish(marker, b"m") == 0
        publisher.close()
        wait_for(lambda: client.received(marker), "the marker")
        assert client.received(theirs) == []
        assert client.subscribe(theirs) == 0x80  # and not by its own name either
    finally:
        client.close()


def test_a_revoked_permission_applies_to_the_open_connection(
    braid: BraidProcess, admin: Admin
) -> None:
    user = unique("rev")
    admin.user(user, "pw")
    admin.permit(user, write=".*")
    client = Client(braid.mqtt_port, mqtt.MQTTv5, user, "pw")
    try:
        topic = f"{unique('t.')}/x"
        assert client.publish(topic, b"1") == 0
        admin.permit(user, write="^nothing$")
        assert client.publish(topic, b"2") == 0x87
        admin.permit(user, write=".*")
        assert client.publish(topic, b"3") == 0
    finally:
        client.close()


# -- a stricter broker: no anonymous clients, denied 3.1.1 publishes close, TLS identities --------


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("mqtt-strict")
    ca = CertificateAuthority(directory / "pki", "mqtt-ca")
    server = ca.issue("localhost", server=True)
    config = Path(directory / "braid.toml")
    config.write_text(
        '[auth]\nanonymous = "never"\nmqtt_denied_publish = "disconnect"\n'
        "[mqtt]\nuse_identity_as_username = true\n"
    )
    mqtts, wss = free_port(), free_port()
    args = (
        "--config", str(config), "--tls-cert", str(server.cert), "--tls-key", str(server.key),
        "--tls-ca", str(ca.cert_path), "--tls-verify-peer", "--mqtts-port", str(mqtts),
        "--mqtt-wss-port", str(wss), "--amqps-port", "0", "--kafka-tls-port", "0",
        "--https-port", "0",
    )  # fmt: skip
    with BraidProcess(directory, listeners=("mqtt", "http"), extra_args=args) as process:
        process.mqtts_port = mqtts  # type: ignore[attr-defined]
        process.mqtt_wss_port = wss  # type: ignore[attr-defined]
        process.ca = ca  # type: ignore[attr-defined]
        yield process


@pytest.mark.parametrize("version", VERSIONS)
def test_anonymous_never(strict: BraidProcess, version: int) -> None:
    client = Client(strict.mqtt_port, version)
    try:
        assert client.refused_with == 0x87  # 3.1.1: 0x05
    finally:
        client.close()


def test_a_denied_311_publish_closes_when_configured(strict: BraidProcess) -> None:
    admin = Admin(strict.http_port)
    admin.user("dave", "pw")
    admin.permit("dave", write="^dave\\.")
    client = Client(strict.mqtt_port, mqtt.MQTTv311, "dave", "pw")
    try:
        assert client.publish("dave.t/x", b"ok") == 0
        assert client.publish("eve.t/x", b"no") == -1
        assert client.disconnected.wait(DEADLINE_S)
    finally:
        client.close()


def test_the_certificate_names_the_user(strict: BraidProcess, tmp_path: Path) -> None:
    import ssl

    admin = Admin(strict.http_port)
    admin.user("erin", "unused")
    admin.permit("erin", write="^erin\\.", read=".*")
    ca: CertificateAuthority = strict.ca  # type: ignore[attr-defined]

    def context(common_name: str) -> ssl.SSLContext:
        issued = ca.issue(common_name, server=False)
        tls = ssl.create_default_context(cafile=str(ca.cert_path))
        tls.load_cert_chain(str(issued.cert), str(issued.key))
        return tls

    port = strict.mqtts_port  # type: ignore[attr-defined]
    client = Client(port, mqtt.MQTTv5, "mallory", "whatever", tls=context("erin"))
    try:
        assert client.refused_with == 0  # the CONNECT's user name and password are not used
        assert client.publish("erin.t/x", b"as erin") == 0
        assert client.publish("mallory.t/x", b"not erin's") == 0x87
    finally:
        client.close()
    stranger = Client(port, mqtt.MQTTv5, "erin", "unused", tls=context("stranger"))
    try:
        assert stranger.refused_with == 0x86  # no such user
    finally:
        stranger.close()
    # MQTT over secure WebSocket with its plain WebSocket listener off: a gateway of its own.
    wss = strict.mqtt_wss_port  # type: ignore[attr-defined]
    over_wss = Client(wss, mqtt.MQTTv311, tls=context("erin"), transport="websockets")
    try:
        assert over_wss.refused_with == 0
        assert over_wss.subscribe("erin.t/#") == 1
    finally:
        over_wss.close()
