"""MQTT limits (issue 21 item 1): ``[limits] max_mqtt_sessions`` (persistent sessions: CONNACK
0x97 Quota exceeded on 5.0, 0x03 Server unavailable on 3.1.1), ``max_subscriptions_per_client``
(EMQX's max_subscriptions: SUBACK 0x97 on 5.0, 0x80 on 3.1.1), and a record produced over Kafka
that is larger than an MQTT 5.0 subscriber's Maximum Packet Size: discarded for that client only
[MQTT-3.1.2-25]. paho-mqtt 5.0 and 3.1.1 and confluent-kafka against ``braid serve``."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from confluent_kafka import Producer
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.braid_process import BraidProcess
from tests.management.test_rabbit_api import GUEST

DEADLINE_S = 30
QUOTA_EXCEEDED = 0x97
# 3.1.1's CONNACK 3 (Server unavailable), as paho's VERSION2 callbacks report it.
SERVER_UNAVAILABLE_311 = 0x88
SUBACK_FAILURE_311 = 0x80


def configured(tmp_path: Path, text: str, listeners: tuple[str, ...]) -> BraidProcess:
    config = tmp_path / "braid.toml"
    config.write_text(text)
    return BraidProcess(tmp_path, listeners=listeners, extra_args=("--config", str(config)))


class Client:
    """A paho client, its CONNACK, its SUBACKs and the messages it got."""

    def __init__(
        self,
        braid: BraidProcess,
        client_id: str,
        *,
        protocol: int = mqtt.MQTTv5,
        expiry: int = 0,
        clean: bool = True,
        max_packet_size: int | None = None,
    ) -> None:
        self.acked = threading.Event()
        self.code: int | None = None
        self.reason_string: str | None = None
        self.session_present = False
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.messages: queue.Queue[bytes] = queue.Queue()
        v5 = protocol == mqtt.MQTTv5
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id,
            protocol=protocol,
            clean_session=None if v5 else clean,
        )
        self.client.username_pw_set(*GUEST)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        properties = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)
            if expiry:
                properties.SessionExpiryInterval = expiry
            if max_packet_size is not None:
                properties.MaximumPacketSize = max_packet_size
        self.client.connect(
            "127.0.0.1",
            braid.mqtt_port,
            keepalive=30,
            clean_start=clean if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=properties,
        )
        self.client.loop_start()
        assert self.acked.wait(DEADLINE_S)

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, properties: Any) -> None:
        if self.code is None:
            self.code = int(reason.value)
            self.session_present = bool(flags.session_present)
            self.reason_string = getattr(properties, "ReasonString", None)
            self.acked.set()

    def _on_subscribe(self, _c: Any, _u: Any, _mid: Any, codes: Any, _p: Any) -> None:
        self.subacks.put([int(code.value) for code in codes])

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        self.messages.put(bytes(message.payload))

    def subscribe(self, *filters: str) -> list[int]:
        self.client.subscribe([(each, 1) for each in filters])
        return self.subacks.get(timeout=DEADLINE_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_persistent_sessions_are_capped_clean_ones_are_not(tmp_path: Path) -> None:
    with configured(tmp_path, "[limits]\nmax_mqtt_sessions = 1\n", ("mqtt",)) as braid:
        kept = Client(braid, "kept", expiry=300, clean=False)
        assert kept.code == 0
        refused = Client(braid, "refused-5", expiry=300, clean=False)
        assert refused.code == QUOTA_EXCEEDED
        assert refused.reason_string == "persistent session limit (1) is reached"
        refused.client.loop_stop()
        refused311 = Client(braid, "refused-311", protocol=mqtt.MQTTv311, clean=False)
        assert refused311.code == SERVER_UNAVAILABLE_311
        refused311.client.loop_stop()
        # Clean sessions are not counted.
        clean5 = Client(braid, "clean-5")
        clean311 = Client(braid, "clean-311", protocol=mqtt.MQTTv311)
        assert (clean5.code, clean311.code) == (0, 0)
        # The session counts offline too, and its owner resumes it.
        kept.close()
        again = Client(braid, "kept", expiry=300, clean=False)
        assert (again.code, again.session_present) == (0, True)
        # Ended (Clean Start, no expiry), it leaves room for another.
        again.close()
        ended = Client(braid, "kept", clean=True)
        assert ended.code == 0
        ended.close()
        other = Client(braid, "other", protocol=mqtt.MQTTv311, clean=False)
        assert other.code == 0
        for client in (other, clean5, clean311):
            client.close()
    assert "persistent session limit (1) is reached" in braid.stderr()


def test_subscriptions_per_client_are_capped(tmp_path: Path) -> None:
    with configured(tmp_path, "[limits]\nmax_subscriptions_per_client = 2\n", ("mqtt",)) as braid:
        v5 = Client(braid, "subs-5")
        assert v5.subscribe("a", "b", "c") == [1, 1, QUOTA_EXCEEDED]
        # Replacing a subscription is not one more; unsubscribing makes room.
        assert v5.subscribe("a") == [1]
        v311 = Client(braid, "subs-311", protocol=mqtt.MQTTv311)
        assert v311.subscribe("x", "y", "z") == [1, 1, SUBACK_FAILURE_311]
        # The granted subscriptions deliver; another client is not limited by these.
        publisher = Client(braid, "publisher")
        publisher.client.publish("b", b"to b", qos=1).wait_for_publish(DEADLINE_S)
        assert v5.messages.get(timeout=DEADLINE_S) == b"to b"
        v5.client.unsubscribe("a")
        assert v5.subscribe("c") == [1]
        assert publisher.subscribe("a", "b") == [1, 1]
        for client in (v5, v311, publisher):
            client.close()
    assert "subscription limit (2) is reached" in braid.stderr()


def test_a_kafka_record_over_a_subscribers_maximum_packet_size_skips_that_client_only(
    tmp_path: Path,
) -> None:
    with BraidProcess(tmp_path, listeners=("mqtt", "kafka")) as braid:
        small = Client(braid, "small-packets", max_packet_size=1024)
        large = Client(braid, "any-packets")
        assert small.subscribe("sizes/#") == [1]
        assert large.subscribe("sizes/#") == [1]
        producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "log_level": 0})
        big = b"B" * 4096
        producer.produce("sizes", big)
        producer.produce("sizes", b"after")
        assert producer.flush(DEADLINE_S) == 0
        assert large.messages.get(timeout=DEADLINE_S) == big
        assert large.messages.get(timeout=DEADLINE_S) == b"after"
        # In order: had the big record been sent to the small client, it would come first.
        assert small.messages.get(timeout=DEADLINE_S) == b"after"
        assert small.messages.empty()
        small.close()
        large.close()
