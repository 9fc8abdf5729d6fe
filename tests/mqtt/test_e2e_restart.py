"""Persistent sessions and retained messages across a broker restart (SIGTERM) and a crash
(SIGKILL): subscriptions, queued QoS 1/2 messages and retained messages are in the log."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.braid_process import BraidProcess

from .clients import Paho, assert_clean_log, unique


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(
        tmp_path_factory.mktemp("braid-restart"), listeners=("mqtt", "mqtt-ws")
    ) as process:
        yield process
    assert_clean_log(process)


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill-9"])
def test_sessions_and_retained_survive(braid: BraidProcess, crash: bool) -> None:
    base = unique("rs")
    v3_id, v5_id, shared_id = unique("v3"), unique("v5"), unique("sh")
    v3 = Paho(braid.mqtt_port, client_id=v3_id, version=4, clean=False)
    v3.connect()
    v3.subscribe(f"{base}/#", 2)
    v3.close()
    v5 = Paho(braid.mqtt_port, client_id=v5_id, clean=False)
    v5.connect(expiry=3600)
    v5.subscribe(f"{base}/+/x", 1)
    v5.close()
    member = Paho(braid.mqtt_port, client_id=shared_id, clean=False)
    member.connect(expiry=3600)
    member.subscribe(f"$share/grp/{base}/#", 1)
    member.close()
    with Paho(braid.mqtt_port) as pub:
        pub.connect()
        pub.publish(f"{base}/a/x", b"one", 1)
        pub.publish(f"{base}/b/x", b"two", 2)
        pub.publish(f"{base}/c", b"three", 1)
        pub.publish(f"{base}/kept", b"retained", 1, retain=True)
    if crash:
        braid.kill9()
        braid.start()
    else:
        braid.restart()
    v3 = Paho(braid.mqtt_port, client_id=v3_id, version=4, clean=False)
    _, present, _ = v3.connect()
    assert present
    assert sorted(m.payload for m in v3.get_all(4)) == [b"one", b"retained", b"three", b"two"]
    v5 = Paho(braid.mqtt_port, client_id=v5_id, clean=False)
    _, present, _ = v5.connect(expiry=3600)
    assert present
    assert sorted(m.payload for m in v5.get_all(2)) == [b"one", b"two"]
    member = Paho(braid.mqtt_port, client_id=shared_id, clean=False)
    _, present, _ = member.connect(expiry=3600)
    assert present
    assert sorted(m.payload for m in member.get_all(4)) == [b"one", b"retained", b"three", b"two"]
    # The subscriptions are still there for new messages, and nothing came twice.
    with Paho(braid.mqtt_port) as pub:
        pub.connect()
        pub.publish(f"{base}/d/x", b"after", 1)
    for client in (v3, v5, member):
        assert client.get().payload == b"after"
        client.nothing(0.2)
        client.close()
    with Paho(braid.mqtt_port) as late:
        late.connect()
        late.subscribe(f"{base}/kept", 1)
        message = late.get()
        assert (message.payload, message.retain) == (b"retained", True)


def test_unacknowledged_delivery_comes_again_after_restart(braid: BraidProcess) -> None:
    topic = unique("ua")
    client_id = unique("uac")
    sub = Paho(braid.mqtt_port, client_id=client_id, version=4, clean=False)
    sub.connect()
    sub.subscribe(topic, 1)
    sub.client.loop_stop()  # receives nothing more, acknowledges nothing
    with Paho(braid.mqtt_port, version=4) as pub:
        pub.connect()
        pub.publish(topic, b"owed", 1)
    braid.restart()
    again = Paho(braid.mqtt_port, client_id=client_id, version=4, clean=False)
    _, present, _ = again.connect()
    assert present
    message = again.get()
    assert message.payload == b"owed"
    again.nothing(0.3)
    again.close()


def test_delayed_publish_survives_a_restart(braid: BraidProcess) -> None:
    topic = unique("dl")
    client_id = unique("dlc")
    sub = Paho(braid.mqtt_port, client_id=client_id, clean=False)
    sub.connect(expiry=600)
    sub.subscribe(topic, 1)
    sub.close()
    with Paho(braid.mqtt_port) as pub:
        pub.connect()
        pub.publish(f"$delayed/2/{topic}", b"after the restart", 1)
    braid.restart()
    again = Paho(braid.mqtt_port, client_id=client_id, clean=False)
    _, present, _ = again.connect(expiry=600)
    assert present
    assert again.get(timeout=8).payload == b"after the restart"
    again.nothing(0.3)
    again.close()
