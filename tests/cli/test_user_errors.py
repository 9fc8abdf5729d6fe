"""Errors a user meets, said plainly (issue 17, item 23): a Kafka client (or anything else that
is not MQTT) on the MQTT port is logged with its peer address and what it looks like; a mistyped
key inside a user entry of the config file is named; a brand-new data directory does not log
``clean_shutdown=False``; the [mqtt] section's keys are checked like the others."""

from __future__ import annotations

import dataclasses
import re
import socket
import struct
import time

import pytest
from confluent_kafka.admin import AdminClient

from braid.config import MQTT_SETTINGS, MQTT_SHARED_SUBSCRIPTION_STRATEGIES
from gateway.mqtt.options import SHARED_SUBSCRIPTION_STRATEGIES, MqttOptions
from tests.braid_process import BraidProcess

from .conftest import run_braid

# A Kafka ApiVersions v3 request, as librdkafka sends first: size, api key 18, version 3,
# correlation id 1, client id "probe", then the v3 body (client software name and version).
_BODY = struct.pack(">hhih", 18, 3, 1, 5) + b"probe" + b"\x00" + b"\x06braid\x021\x00"
KAFKA_API_VERSIONS = struct.pack(">i", len(_BODY)) + _BODY


def _wait_for_log(braid: BraidProcess, text: str) -> str:
    """The broker's stderr once it holds ``text`` (polled with a deadline)."""
    deadline = time.monotonic() + 10
    log = braid.stderr()
    while text not in log and time.monotonic() < deadline:
        time.sleep(0.05)
        log = braid.stderr()
    return log


def test_kafka_bytes_on_the_mqtt_port_are_logged_with_the_peer(tmp_path):
    with BraidProcess(tmp_path, listeners=("mqtt",)) as braid:
        with socket.create_connection(("127.0.0.1", braid.mqtt_port)) as sock:
            host, port = sock.getsockname()
            peer = f"{host}:{port}"
            sock.sendall(KAFKA_API_VERSIONS)
            assert sock.recv(100) == b""  # closed, nothing written back
        log = _wait_for_log(braid, peer)
        lines = [line for line in log.splitlines() if peer in line]
        assert lines, log[-2000:]
        assert "a Kafka client (ApiVersions v3 request)" in lines[0], lines


def test_a_real_kafka_client_on_the_mqtt_port_is_logged(tmp_path):
    with BraidProcess(tmp_path, listeners=("mqtt",)) as braid:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{braid.mqtt_port}", "log_level": 0})
        with pytest.raises(Exception):  # noqa: B017, PT011 (librdkafka's own errors)
            admin.list_topics(timeout=3)
        log = _wait_for_log(braid, "a Kafka client")
        assert "mqtt (connecting) from 127.0.0.1:" in log, log[-2000:]
        assert "a Kafka client" in log


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[amqp.users.app]\npasword = "x"\n', "[amqp] users.app pasword: unknown key"),
        ('[amqp.users.app]\npassword = "x"\nvhost = ["/"]\n', "users.app vhost: unknown key"),
        ('[amqp.users.app]\nvhosts = ["/"]\n', "users.app: password missing"),
        ("[mqtt]\nreceive_maximum = 0\n", "[mqtt] receive_maximum: must be 1..65535"),
        ("[mqtt]\nmax_keep_alive = 10\n", "[mqtt] max_keep_alive: unknown key"),
        ('[mqtt]\nshared_subscription_strategy = "rr"\n', "one of round_robin, random"),
    ],
)
def test_config_errors_name_the_key(tmp_path, content, message):
    config = tmp_path / "braid.toml"
    config.write_text(content)
    result = run_braid(
        "serve", "--config", str(config), "--data-dir", str(tmp_path / "data"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_mqtt_settings_are_the_gateway_options():
    """The [mqtt] keys are MqttOptions fields (which hold the defaults), and the strategy names
    are the gateway's."""
    fields = {field.name for field in dataclasses.fields(MqttOptions)}
    assert set(MQTT_SETTINGS) <= fields
    assert MQTT_SHARED_SUBSCRIPTION_STRATEGIES == SHARED_SUBSCRIPTION_STRATEGIES


def test_a_new_data_dir_does_not_log_an_unclean_shutdown(tmp_path):
    braid = BraidProcess(tmp_path, listeners=("mqtt",))
    with braid:
        pass
    assert "clean_shutdown=False" not in braid.stderr()
    # The line is still there when there was something to recover: a crash after a write.
    braid.start()
    with socket.create_connection(("127.0.0.1", braid.mqtt_port)) as sock:
        from gateway.mqtt.codec import Connect, Publish, encode

        sock.sendall(encode(Connect("c", 5, True, 60), 5) + encode(Publish("t", b"x", 0), 5))
        assert sock.recv(100)  # CONNACK: the publish is read in the same batch
    braid.kill9()
    braid.start()
    braid.stop()
    assert "clean_shutdown=False" in braid.stderr()


def test_the_mqtt_section_is_documented_with_its_defaults():
    import tomllib
    from pathlib import Path

    from braid import config

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for key in MQTT_SETTINGS:
        assert f"| `{key}` |" in text, key
    example = re.search(r"```toml\n(.*?)```", text, re.DOTALL)
    assert example
    settings = config.settings_from_mapping(tomllib.loads(example[1]), "docs")
    assert set(settings.mqtt_options) == set(MQTT_SETTINGS)
    assert MqttOptions(**settings.mqtt_options) == MqttOptions()  # type: ignore[arg-type]
