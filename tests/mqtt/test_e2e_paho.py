"""paho-mqtt (3.1.1 and 5.0) against a real ``braid serve``: QoS 0/1/2, wildcards and
``$``-topics, retained messages, wills, persistent sessions, shared subscriptions, 5.0 options
and properties, message expiry, delayed publish, session takeover, client id assignment."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from tests.braid_process import BraidProcess

from .clients import Paho, assert_clean_log, paho_properties, unique

VERSIONS = (4, 5)


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path: Path = tmp_path_factory.mktemp("braid-paho")
    with BraidProcess(path, listeners=("mqtt", "mqtt-ws")) as process:
        yield process
    assert_clean_log(process)


@pytest.fixture
def port(braid: BraidProcess) -> int:
    return braid.mqtt_port


def code_value(code: object) -> int:
    return int(code.value) if isinstance(code, PahoReasonCode) else int(code)  # type: ignore[call-overload]


# -- QoS round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_round_trip(port: int, version: int, qos: int) -> None:
    topic = f"{unique('rt')}/a/b"
    with Paho(port, version=version) as sub, Paho(port, version=version) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 2)
        payloads = [f"m{i}".encode() for i in range(20)] + [b"", bytes(range(256)) * 40]
        for payload in payloads:
            pub.publish(topic, payload, qos)
        got = sub.get_all(len(payloads))
        assert [m.payload for m in got] == payloads
        assert {m.qos for m in got} == {qos}
        assert {m.topic for m in got} == {topic}
        assert not any(m.retain or m.dup for m in got)


@pytest.mark.parametrize("version", VERSIONS)
def test_subscription_qos_caps_delivery(port: int, version: int) -> None:
    topic = unique("cap")
    with Paho(port, version=version) as sub, Paho(port, version=version) as pub:
        sub.connect()
        pub.connect()
        granted = sub.subscribe(topic, 1)
        assert [code_value(c) for c in granted] == [1]
        pub.publish(topic, b"two", 2)
        pub.publish(topic, b"zero", 0)
        first, second = sub.get_all(2)
        assert (first.payload, first.qos) == (b"two", 1)
        assert (second.payload, second.qos) == (b"zero", 0)


@pytest.mark.parametrize("qos", [1, 2])
def test_order_per_topic_many_messages(port: int, qos: int) -> None:
    # [MQTT-4.6.0-6]: in order per topic and QoS (paho hands a QoS 2 message over on PUBREL, so
    # mixing QoS levels reorders them in the client, not in the broker).
    topic = unique("order")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 2)
        infos = [pub.client.publish(topic, str(i).encode(), qos) for i in range(1000)]
        for info in infos:
            info.wait_for_publish(10)
        got = sub.get_all(1000)
        assert [int(m.payload) for m in got] == list(range(1000))
        sub.nothing(0.3)  # exactly once


def test_wildcards_and_dollar_topics(port: int) -> None:
    base = unique("w")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(f"{base}/+/temp", 1)
        sub.subscribe(f"+/{base}", 1)
        pub.publish(f"{base}/kitchen/temp", b"1")
        pub.publish(f"{base}/kitchen/humidity", b"no")
        pub.publish(f"{base}/a/b/temp", b"no")
        pub.publish(f"x/{base}", b"2")
        pub.publish(f"$x/{base}", b"no: '+' does not match a $ level first [MQTT-4.7.2-1]")
        got = sorted(m.payload for m in sub.get_all(2))
        assert got == [b"1", b"2"]
        sub.nothing()
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe("#", 0)
        sub.subscribe(f"$y{base}/#", 0)
        pub.publish(f"$y{base}/status", b"dollar")
        pub.publish(f"{base}/everything", b"hash")
        got = {m.payload for m in sub.get_all(2, timeout=5)}
        assert got == {b"dollar", b"hash"}


def test_parent_level_and_empty_levels(port: int) -> None:
    base = unique("p")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(f"{base}/#", 1)  # matches the parent level too [MQTT-4.7.1-2]
        sub.subscribe(f"{base}2/+", 1)  # one (empty) level
        sub.subscribe(f"/{base}/x", 1)  # an empty first level
        for topic in (base, f"{base}/a", f"{base}2/", f"/{base}/x", f"{base}2", f"{base}2/a/b"):
            pub.publish(topic, topic.encode())
        got = sorted(m.topic for m in sub.get_all(4))
        assert got == sorted([base, f"{base}/a", f"{base}2/", f"/{base}/x"])
        sub.nothing()


# -- retained ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_messages(port: int, version: int) -> None:
    base = unique("ret")
    with Paho(port, version=version) as pub:
        pub.connect()
        pub.publish(f"{base}/a", b"A", 1, retain=True)
        pub.publish(f"{base}/b", b"B", 0, retain=True)
        pub.publish(f"{base}/b", b"B2", 1, retain=True)  # replaces
        with Paho(port, version=version) as sub:
            sub.connect()
            sub.subscribe(f"{base}/#", 1)
            got = {m.topic: (m.payload, m.retain, m.qos) for m in sub.get_all(2)}
            assert got == {f"{base}/a": (b"A", True, 1), f"{base}/b": (b"B2", True, 1)}
            pub.publish(f"{base}/a", b"live", 1, retain=True)
            live = sub.get()
            assert (live.payload, live.retain) == (b"live", False)  # [MQTT-3.3.1-12]
            pub.publish(f"{base}/a", b"", 1, retain=True)  # clears, still delivered
            assert sub.get().payload == b""
        with Paho(port, version=version) as sub:
            sub.connect()
            sub.subscribe(f"{base}/#", 1)
            only = sub.get()
            assert (only.topic, only.payload) == (f"{base}/b", b"B2")
            sub.nothing()


def test_retain_handling_and_retain_as_published(port: int) -> None:
    base = unique("rh")
    with Paho(port) as pub, Paho(port) as sub:
        pub.connect()
        sub.connect()
        pub.publish(f"{base}/x", b"kept", 1, retain=True)
        sub.subscribe(f"{base}/#", 1, retain_handling=2)  # never send retained
        sub.nothing()
        sub.subscribe(f"{base}/+", 1, retain_handling=1)  # only for a new subscription
        assert sub.get().payload == b"kept"
        sub.subscribe(f"{base}/+", 1, retain_handling=1)  # existing: nothing
        sub.nothing()
    with Paho(port) as pub, Paho(port) as sub:
        pub.connect()
        sub.connect()
        sub.subscribe(f"{base}/rap", 1, retain_as_published=True, retain_handling=2)
        pub.publish(f"{base}/rap", b"r", 1, retain=True)
        assert sub.get().retain  # kept as published


# -- wills -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_will_on_abnormal_disconnect_only(port: int, version: int) -> None:
    topic = unique("will")
    with Paho(port, version=version) as watcher:
        watcher.connect()
        watcher.subscribe(topic, 1)
        normal = Paho(port, version=version, will=(topic, b"normal", 1, False))
        normal.connect()
        normal.close()
        watcher.nothing()
        dying = Paho(port, version=version, will=(topic, b"gone", 1, False))
        dying.connect()
        dying.drop()
        message = watcher.get()
        assert (message.topic, message.payload, message.qos) == (topic, b"gone", 1)


def test_will_delay_and_cancel(port: int) -> None:
    topic = unique("wd")
    with Paho(port) as watcher:
        watcher.connect()
        watcher.subscribe(topic, 1)
        props = paho_properties(PacketTypes.WILLMESSAGE, WillDelayInterval=2)
        client_id = unique("wdc")
        first = Paho(
            port, client_id=client_id, will=(topic, b"late", 1, False), will_properties=props
        )
        first.connect(expiry=60)
        first.drop()
        watcher.nothing(1.0)  # delayed
        assert watcher.get(timeout=4).payload == b"late"
        # Back before the delay: no will [MQTT-3.1.3-9].
        second = Paho(
            port,
            client_id=client_id,
            clean=False,
            will=(topic, b"never", 1, False),
            will_properties=props,
        )
        second.connect(expiry=60)
        second.drop()
        time.sleep(0.5)
        third = Paho(port, client_id=client_id, clean=False)
        third.connect(expiry=60)
        watcher.nothing(2.5)
        third.close()


def test_will_retained(port: int) -> None:
    topic = unique("wr")
    dying = Paho(port, version=4, will=(topic, b"offline", 1, True))
    dying.connect()
    dying.drop()
    time.sleep(0.3)
    with Paho(port, version=4) as late:
        late.connect()
        late.subscribe(topic, 1)
        message = late.get()
        assert (message.payload, message.retain) == (b"offline", True)


# -- persistent sessions -----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_across_reconnect(port: int, version: int) -> None:
    topic = unique("ps")
    client_id = unique("psc")
    expiry = 300 if version == 5 else None
    sub = Paho(port, client_id=client_id, version=version, clean=False)
    _, present, _ = sub.connect(expiry=expiry)
    assert not present
    sub.subscribe(topic, 2)
    sub.close()
    with Paho(port, version=version) as pub:
        pub.connect()
        for i in range(5):
            pub.publish(topic, f"q{i % 3}-{i}".encode(), i % 3)
    again = Paho(port, client_id=client_id, version=version, clean=False)
    _reason, present, _ = again.connect(expiry=expiry)
    assert present
    got = again.get_all(5)
    # (paho hands QoS 2 messages over on PUBREL: compare without the order across QoS levels)
    assert sorted((m.payload, m.qos) for m in got) == sorted(
        (f"q{i % 3}-{i}".encode(), i % 3) for i in range(5)
    )
    again.nothing()
    again.close()
    # Clean start / clean session ends it.
    fresh = Paho(port, client_id=client_id, version=version, clean=True)
    _, present, _ = fresh.connect()
    assert not present
    fresh.close()


def test_unacknowledged_messages_are_resent_with_dup(port: int) -> None:
    topic = unique("dup")
    client_id = unique("dupc")
    sub = Paho(port, client_id=client_id, version=4, clean=False)
    sub.connect()
    sub.subscribe(topic, 1)
    # Stop acknowledging: PUBACKs are sent by paho's loop, so stop the loop and drop the socket
    # once the message is on its way.
    sub.client.loop_stop()
    with Paho(port, version=4) as pub:
        pub.connect()
        pub.publish(topic, b"again", 1)
    time.sleep(0.3)
    sock = sub.client.socket()
    assert sock is not None
    sock.close()
    again = Paho(port, client_id=client_id, version=4, clean=False)
    _, present, _ = again.connect()
    assert present
    message = again.get()
    assert (message.payload, message.dup) == (b"again", True)
    again.close()


def test_session_expiry(port: int) -> None:
    client_id = unique("exp")
    first = Paho(port, client_id=client_id, clean=False)
    first.connect(expiry=1)
    first.subscribe(unique("x"), 1)
    first.close()
    time.sleep(2.0)
    second = Paho(port, client_id=client_id, clean=False)
    _, present, _ = second.connect(expiry=1)
    assert not present
    second.close()


def test_session_taken_over(port: int) -> None:
    client_id = unique("take")
    first = Paho(port, client_id=client_id)
    first.connect()
    second = Paho(port, client_id=client_id)
    second.connect()
    assert first.disconnected.wait(5)
    assert code_value(first.disconnect_reason) == 0x8E
    second.close()
    first.client.loop_stop()


def test_client_id_assignment(port: int) -> None:
    v5 = Paho(port, client_id="")
    reason, _, props = v5.connect()
    assert code_value(reason) == 0
    assert props.AssignedClientIdentifier.startswith("braid-")
    v5.close()
    v3 = Paho(port, client_id="", version=4, clean=True)
    reason, _, _ = v3.connect()
    assert code_value(reason) == 0
    v3.close()


# -- shared subscriptions ----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_shared_subscription_load_balanced(port: int, version: int) -> None:
    base = unique("sh")
    members = [Paho(port, version=version) for _ in range(3)]
    for member in members:
        member.connect()
        member.subscribe(f"$share/g1/{base}/#", 1)
    with Paho(port, version=version) as plain, Paho(port, version=version) as pub:
        plain.connect()
        plain.subscribe(f"{base}/#", 1)
        pub.connect()
        for i in range(60):
            pub.publish(f"{base}/{i % 4}", str(i).encode(), 1)
        assert sorted(int(m.payload) for m in plain.get_all(60)) == list(range(60))
        received: list[int] = []
        counts = []
        deadline = time.monotonic() + 10
        while len(received) < 60 and time.monotonic() < deadline:
            time.sleep(0.1)
            counts = [member.messages.qsize() for member in members]
            if sum(counts) >= 60:
                break
        for member in members:
            while not member.messages.empty():
                received.append(int(member.get().payload))
        assert sorted(received) == list(range(60))  # each once, to one member
        assert all(count > 0 for count in counts), counts
    for member in members:
        member.close()


# -- 5.0 options and properties ----------------------------------------------------------------


def test_no_local(port: int) -> None:
    topic = unique("nl")
    with Paho(port) as client, Paho(port) as other:
        client.connect()
        other.connect()
        client.subscribe(topic, 1, no_local=True)
        client.publish(topic, b"mine")
        client.nothing()
        other.publish(topic, b"theirs")
        assert client.get().payload == b"theirs"


def test_subscription_identifiers(port: int) -> None:
    base = unique("sid")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(
            f"{base}/#",
            1,
            properties=paho_properties(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7),
        )
        sub.subscribe(
            f"{base}/+",
            1,
            properties=paho_properties(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9),
        )
        pub.publish(f"{base}/x", b"both")
        message = sub.get()
        assert sorted(message.properties.SubscriptionIdentifier) == [7, 9]
        sub.nothing()  # one copy for overlapping subscriptions


def test_properties_round_trip(port: int) -> None:
    topic = unique("props")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 1)
        props = paho_properties(
            PacketTypes.PUBLISH,
            UserProperty=[("device", "d1"), ("unit", "°C"), ("device", "again")],
            ContentType="application/json",
            ResponseTopic=f"{topic}/reply",
            CorrelationData=b"\x00\x01corr",
            PayloadFormatIndicator=1,
        )
        pub.publish(topic, b'{"t": 21.5}', 1, properties=props)
        message = sub.get()
        got = message.properties
        assert got.UserProperty == [("device", "d1"), ("unit", "°C"), ("device", "again")]
        assert got.ContentType == "application/json"
        assert got.ResponseTopic == f"{topic}/reply"
        assert got.CorrelationData == b"\x00\x01corr"
        assert got.PayloadFormatIndicator == 1


def test_payload_format_invalid_is_refused(port: int) -> None:
    topic = unique("pfi")
    with Paho(port) as pub:
        pub.connect()
        info = pub.client.publish(
            topic,
            b"\xff\xfe",
            1,
            properties=paho_properties(PacketTypes.PUBLISH, PayloadFormatIndicator=1),
        )
        info.wait_for_publish(5)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS


def test_message_expiry(port: int) -> None:
    topic = unique("mx")
    client_id = unique("mxc")
    sub = Paho(port, client_id=client_id, clean=False)
    sub.connect(expiry=300)
    sub.subscribe(topic, 1)
    sub.close()
    with Paho(port) as pub:
        pub.connect()
        pub.publish(
            topic,
            b"short",
            1,
            properties=paho_properties(PacketTypes.PUBLISH, MessageExpiryInterval=1),
        )
        pub.publish(
            topic,
            b"long",
            1,
            properties=paho_properties(PacketTypes.PUBLISH, MessageExpiryInterval=100),
        )
    time.sleep(2.1)
    again = Paho(port, client_id=client_id, clean=False)
    again.connect(expiry=300)
    message = again.get()
    assert message.payload == b"long"
    assert 95 <= message.properties.MessageExpiryInterval <= 100  # what is left [MQTT-3.3.2-6]
    again.nothing()
    again.close()


def test_unsubscribe(port: int) -> None:
    topic = unique("un")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 1)
        codes = sub.unsubscribe(topic)
        assert [code_value(c) for c in codes] == [0]
        codes = sub.unsubscribe(topic)
        assert [code_value(c) for c in codes] == [0x11]
        pub.publish(topic, b"x")
        sub.nothing()


# -- delayed publish ---------------------------------------------------------------------------


def test_delayed_publish_is_held(port: int) -> None:
    topic = unique("delay")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 1)
        pub.publish(f"$delayed/2/{topic}", b"later", 1)
        sub.nothing(1.0)


def test_delayed_publish_is_delivered(port: int) -> None:
    topic = unique("delay")
    client_id = unique("delayc")
    with Paho(port) as sub, Paho(port) as pub:
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 1)
        persistent = Paho(port, client_id=client_id, clean=False)
        persistent.connect(expiry=60)
        persistent.subscribe(topic, 1)
        started = time.monotonic()
        pub.publish(f"$delayed/1/{topic}", b"later", 1)
        message = sub.get(timeout=6)
        assert message.topic == topic
        assert message.payload == b"later"
        assert time.monotonic() - started >= 0.9
        assert persistent.get(timeout=6).payload == b"later"
        persistent.close()
