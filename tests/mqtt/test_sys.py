"""``$SYS/broker/...`` against a real ``braid serve`` with paho (3.1.1 and 5.0): the values
Mosquitto publishes are there at once for a new subscriber (retained), move after traffic, are
not matched by ``#`` [MQTT-4.7.2-1], cannot be published by a client (5.0 PUBACK 0x87), need
read permission on ``$SYS`` (SUBACK 0x80/0x87 without it), and are off with ``sys_interval =
0``. The interval is 0.2 s here so that updates come quickly."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.reasoncodes import ReasonCode

from tests.braid_process import BraidProcess
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
VERSIONS = [pytest.param(mqtt.MQTTv311, id="3.1.1"), pytest.param(mqtt.MQTTv5, id="5.0")]
# Every topic the tree has (Mosquitto's names).
TREE = (
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/clients/disconnected",
    "$SYS/broker/clients/total",
    "$SYS/broker/clients/maximum",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/publish/messages/received",
    "$SYS/broker/publish/messages/sent",
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/bytes/received",
    "$SYS/broker/bytes/sent",
    "$SYS/broker/subscriptions/count",
    "$SYS/broker/retained messages/count",
)


def wait_for(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Client:
    """A paho client on its own thread, with what it received (topic, payload, retain)."""

    def __init__(
        self, port: int, version: int, user: str | None = None, password: str | None = None
    ) -> None:
        self.paho = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"sys-{uuid.uuid4().hex[:10]}",
            protocol=version,
        )
        if user is not None:
            self.paho.username_pw_set(user, password)
        self.connected = threading.Event()
        self.lock = threading.Lock()
        self.messages: list[tuple[str, bytes, bool]] = []
        self.subacks: dict[int, list[ReasonCode]] = {}
        self.pubacks: dict[int, ReasonCode] = {}
        self.paho.on_connect = lambda *_args: self.connected.set()
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = lambda _c, _u, mid, codes, _p: self.subacks.__setitem__(mid, codes)
        self.paho.on_publish = lambda _c, _u, mid, code, _p: self.pubacks.__setitem__(mid, code)
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        assert self.connected.wait(DEADLINE_S)

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((message.topic, message.payload, bool(message.retain)))

    def subscribe(self, topic_filter: str) -> int:
        _, mid = self.paho.subscribe(topic_filter, qos=0)
        wait_for(lambda: mid in self.subacks, f"the SUBACK of {topic_filter}")
        return int(self.subacks[mid][0].value)

    def publish(self, topic: str, payload: bytes) -> int:
        """Publish at QoS 1; the PUBACK's reason code (3.1.1: always 0)."""
        info = self.paho.publish(topic, payload, qos=1)
        wait_for(lambda: info.mid in self.pubacks, "a PUBACK")
        return int(self.pubacks[info.mid].value)

    def received(self, topic: str) -> list[bytes]:
        with self.lock:
            return [payload for name, payload, _ in self.messages if name == topic]

    def last(self, topic: str) -> bytes | None:
        values = self.received(topic)
        return values[-1] if values else None

    def topics(self) -> set[str]:
        with self.lock:
            return {name for name, _, _ in self.messages}

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def number(payload: bytes | None) -> int:
    assert payload is not None
    return int(payload.split()[0])  # "12 seconds" for the uptime


def start_braid(path: Path, interval: float) -> BraidProcess:
    config = path / "braid.toml"
    config.write_text(f"[mqtt]\nsys_interval = {interval}\n")
    return BraidProcess(
        path, listeners=("mqtt", "http"), extra_args=("--config", str(config))
    ).start()


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    process = start_braid(tmp_path_factory.mktemp("mqtt-sys"), 0.2)
    yield process
    process.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_subscriber_gets_the_tree_at_once_and_it_moves(braid: BraidProcess, version: int) -> None:
    watcher = Client(braid.mqtt_port, version)
    try:
        assert watcher.subscribe("$SYS/#") == 0
        wait_for(lambda: set(TREE) <= watcher.topics(), "every $SYS topic")
        # The first values came as retained messages, after the SUBACK [MQTT-3.3.1-9].
        with watcher.lock:
            first = {name: retain for name, _, retain in reversed(watcher.messages)}
        assert all(first[name] for name in TREE), first
        assert (watcher.last("$SYS/broker/version") or b"").startswith(b"braidmq version ")
        assert number(watcher.last("$SYS/broker/clients/connected")) >= 1
        received = number(watcher.last("$SYS/broker/publish/messages/received"))
        bytes_in = number(watcher.last("$SYS/broker/bytes/received"))
        uptime = len(watcher.received("$SYS/broker/uptime"))

        publisher = Client(braid.mqtt_port, mqtt.MQTTv5)
        for index in range(5):
            assert publisher.publish(f"app/sys/{index}", b"x" * 100) == 0
        wait_for(
            lambda: number(watcher.last("$SYS/broker/publish/messages/received")) >= received + 5,
            "publish/messages/received to count the 5 publishes",
        )
        wait_for(
            lambda: number(watcher.last("$SYS/broker/bytes/received")) >= bytes_in + 500,
            "bytes/received to count their bytes",
        )
        # The uptime is published at every interval, changed or not.
        wait_for(lambda: len(watcher.received("$SYS/broker/uptime")) >= uptime + 2, "uptime")
        publisher.close()
    finally:
        watcher.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_hash_does_not_match_sys_topics(braid: BraidProcess, version: int) -> None:
    everything = Client(braid.mqtt_port, version)
    watcher = Client(braid.mqtt_port, mqtt.MQTTv5)
    try:
        assert everything.subscribe("#") == 0
        assert everything.subscribe("+/broker/uptime") == 0
        assert watcher.subscribe("$SYS/broker/uptime") == 0
        seen = len(watcher.received("$SYS/broker/uptime"))
        # Two more updates reached the $SYS subscriber while '#' was subscribed.
        wait_for(lambda: len(watcher.received("$SYS/broker/uptime")) >= seen + 2, "updates")
        assert watcher.publish("app/marker", b"m") == 0
        wait_for(lambda: everything.received("app/marker"), "the marker through '#'")
        assert not [topic for topic in everything.topics() if topic.startswith("$")]
    finally:
        everything.close()
        watcher.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_client_cannot_publish_into_sys(braid: BraidProcess, version: int) -> None:
    watcher = Client(braid.mqtt_port, mqtt.MQTTv5)
    forger = Client(braid.mqtt_port, version)
    try:
        assert watcher.subscribe("$SYS/broker/version") == 0
        wait_for(lambda: watcher.received("$SYS/broker/version"), "the version")
        code = forger.publish("$SYS/broker/version", b"forged")
        assert code == (0x87 if version == mqtt.MQTTv5 else 0)  # 3.1.1: acknowledged, dropped
        assert forger.subscribe("$SYS/broker/version") == 0  # its retained value: the real one
        wait_for(lambda: forger.received("$SYS/broker/version"), "the version")
        assert b"forged" not in watcher.received("$SYS/broker/version")
        assert forger.received("$SYS/broker/version")[-1].startswith(b"braidmq version ")
        assert "$SYS is the broker's" in braid.stderr()
    finally:
        watcher.close()
        forger.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_user_without_read_on_sys_is_refused(braid: BraidProcess, version: int) -> None:
    admin = Admin(braid.http_port)
    admin.user("nosys", "pw")
    admin.permit("nosys", configure=".*", write=".*", read="^app$")
    client = Client(braid.mqtt_port, version, "nosys", "pw")
    try:
        refused = 0x80 if version == mqtt.MQTTv311 else 0x87
        assert client.subscribe("$SYS/#") == refused
        assert client.subscribe("$SYS/broker/uptime") == refused
        assert client.subscribe("app/#") == 0  # the marker's way in
        other = Client(braid.mqtt_port, mqtt.MQTTv5)
        assert other.publish("app/after", b"m") == 0
        other.close()
        wait_for(lambda: client.received("app/after"), "the marker")
        assert not [topic for topic in client.topics() if topic.startswith("$")]
    finally:
        client.close()
    admin.permit("nosys", configure=".*", write=".*", read="^(app|\\$SYS)$")
    client = Client(braid.mqtt_port, version, "nosys", "pw")
    try:
        assert client.subscribe("$SYS/#") == 0
        wait_for(lambda: client.received("$SYS/broker/uptime"), "the uptime")
    finally:
        client.close()


def test_sys_interval_0_turns_the_tree_off(tmp_path: Path) -> None:
    braid = start_braid(tmp_path, 0)
    try:
        client = Client(braid.mqtt_port, mqtt.MQTTv5)
        assert client.subscribe("$SYS/#") == 0
        assert client.subscribe("app/#") == 0
        assert client.publish("app/marker", b"m") == 0
        wait_for(lambda: client.received("app/marker"), "the marker")
        # Retained values would have come right after the SUBACK, before the marker.
        assert not [topic for topic in client.topics() if topic.startswith("$")]
        client.close()
    finally:
        braid.stop()
