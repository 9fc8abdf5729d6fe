"""TLS on every listener against a real ``braid serve``, with the real clients: pika (AMQPS),
paho (MQTTS and MQTT over secure WebSocket), confluent-kafka (security.protocol=SSL), HTTPS;
a client that trusts another CA is refused, client certificates (verify_peer,
fail_if_no_peer_cert) are checked, and SIGHUP reloads the certificate without dropping
connections."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
import time
import urllib.request
import uuid

import paho.mqtt.client as mqtt
import pika
import pytest
from confluent_kafka import Consumer, Producer

from tests.braid_process import BraidProcess, free_port
from tests.security.certs import CertificateAuthority

DEADLINE_S = 30.0
TLS_LISTENERS = ("amqps", "mqtts", "mqtt-wss", "kafka-tls", "https")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(directory, "braid-test-ca")
    other = CertificateAuthority(directory / "other", "other-ca")
    return {
        "ca": ca,
        "other": other,
        "server": ca.issue("localhost", server=True),
        "alice": ca.issue("alice", server=False),
        "mallory": other.issue("mallory", server=False),
        "expired": ca.issue("old", server=False, expired=True),
    }


def tls_braid(path, pki, *extra: str, server=None) -> BraidProcess:
    server = server or pki["server"]
    ports = {name: free_port() for name in TLS_LISTENERS}
    args = (
        "--tls-cert", str(server.cert), "--tls-key", str(server.key),
        "--amqps-port", str(ports["amqps"]), "--mqtts-port", str(ports["mqtts"]),
        "--mqtt-wss-port", str(ports["mqtt-wss"]), "--kafka-tls-port", str(ports["kafka-tls"]),
        "--https-port", str(ports["https"]), *extra,
    )  # fmt: skip
    process = BraidProcess(path, extra_args=args)
    process.tls_ports = ports
    return process


@pytest.fixture(scope="module")
def braid(tmp_path_factory, pki):
    with tls_braid(tmp_path_factory.mktemp("tls"), pki) as process:
        yield process


def client_context(pki, ca="ca", cert=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki[ca].cert_path))
    if cert is not None:
        context.load_cert_chain(str(pki[cert].cert), str(pki[cert].key))
    return context


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_ready_line_shows_every_tls_listener(braid):
    for name in TLS_LISTENERS:
        assert f" {name}=127.0.0.1:{braid.tls_ports[name]}" in braid.ready_line


def test_amqps_with_pika(braid, pki):
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.tls_ports["amqps"],
        credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(client_context(pki), "localhost"),
    )
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"over tls")
    deadline = time.monotonic() + DEADLINE_S
    body = None
    while body is None and time.monotonic() < deadline:
        _method, _properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"over tls"
    connection.close()


def test_amqps_refused_by_a_client_trusting_another_ca(braid, pki):
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.tls_ports["amqps"],
        ssl_options=pika.SSLOptions(client_context(pki, ca="other"), "localhost"),
        connection_attempts=1,
    )
    with pytest.raises((ssl.SSLCertVerificationError, pika.exceptions.AMQPConnectionError)):
        pika.BlockingConnection(parameters)
    assert (
        urllib.request.urlopen(  # the broker and other clients are unaffected
            f"https://127.0.0.1:{braid.tls_ports['https']}/health",
            context=client_context(pki),
            timeout=10,
        ).status
        == 200
    )


@pytest.mark.parametrize(
    ("listener", "transport", "version"),
    [
        ("mqtts", "tcp", mqtt.MQTTv311),
        ("mqtts", "tcp", mqtt.MQTTv5),
        ("mqtt-wss", "websockets", mqtt.MQTTv311),
    ],
)
def test_mqtts_with_paho(braid, pki, listener, transport, version):
    received: list[bytes] = []
    subscribed = threading.Event()
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"tls-{uuid.uuid4().hex[:8]}",
        protocol=version,
        transport=transport,
    )
    client.tls_set(ca_certs=str(pki["ca"].cert_path))
    client.on_message = lambda _c, _u, message: received.append(message.payload)
    client.on_subscribe = lambda *_args: subscribed.set()
    client.connect("127.0.0.1", braid.tls_ports[listener])
    client.loop_start()
    try:
        topic = f"tls/{uuid.uuid4().hex[:8]}"
        client.subscribe(topic, qos=1)
        assert subscribed.wait(DEADLINE_S)
        client.publish(topic, b"secret reading", qos=1).wait_for_publish(DEADLINE_S)
        wait_for(lambda: received, "the MQTT message over TLS")
        assert received == [b"secret reading"]
    finally:
        client.loop_stop()
        client.disconnect()


def test_kafka_ssl_with_confluent_kafka(braid, pki):
    common = {
        "bootstrap.servers": f"127.0.0.1:{braid.tls_ports['kafka-tls']}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki["ca"].cert_path),
    }
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    producer = Producer(common)
    producer.produce(topic, b"over kafka tls", key=b"k")
    assert producer.flush(DEADLINE_S) == 0
    consumer = Consumer(
        {**common, "group.id": topic, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + DEADLINE_S
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error():
                message = None
        assert message is not None
        assert message.value() == b"over kafka tls"
    finally:
        consumer.close()


def test_https(braid, pki):
    base = f"https://127.0.0.1:{braid.tls_ports['https']}"
    with urllib.request.urlopen(base + "/health", context=client_context(pki), timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"
    request = urllib.request.Request(
        base + "/api/whoami", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    )
    with urllib.request.urlopen(request, context=client_context(pki), timeout=10) as response:
        assert json.loads(response.read())["name"] == "guest"


def tls_handshake(port: int, context: ssl.SSLContext) -> dict | None:
    """Connect, shake hands, send one AMQP protocol header: the server's certificate once the
    broker answers (connection.start), None when it closes the connection instead or the
    handshake fails (TLS 1.3 refuses a client certificate after the client's side of the
    handshake is done: the refusal arrives as an alert at the first read)."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            if not sock.recv(7):
                return None
            return sock.getpeercert()
    except (ssl.SSLError, ConnectionError):
        return None


def test_client_certificates_are_required_and_checked(tmp_path, pki):
    ca = str(pki["ca"].cert_path)
    with tls_braid(
        tmp_path, pki, "--tls-ca", ca, "--tls-verify-peer", "--tls-fail-if-no-peer-cert"
    ) as braid:
        port = braid.tls_ports["amqps"]
        assert tls_handshake(port, client_context(pki, cert="alice"))
        for refused in (None, "mallory", "expired"):  # none, wrong CA, expired
            assert tls_handshake(port, client_context(pki, cert=refused)) is None, refused
        assert tls_handshake(port, client_context(pki, cert="alice"))  # still serving


def test_sighup_reloads_the_certificate_without_dropping_connections(tmp_path, pki):
    first = pki["ca"].issue("localhost", server=True)
    second = pki["ca"].issue("localhost", server=True)
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "server.pem", live / "server.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    served = type(first)(cert, key)
    with tls_braid(tmp_path, pki, server=served) as braid:
        port = braid.tls_ports["amqps"]
        context = client_context(pki)
        before = tls_handshake(port, context)["serialNumber"]
        parameters = pika.ConnectionParameters(
            "127.0.0.1", port, ssl_options=pika.SSLOptions(context, "localhost")
        )
        connection = pika.BlockingConnection(parameters)  # opened before the reload
        cert.write_bytes(second.cert.read_bytes())
        key.write_bytes(second.key.read_bytes())
        braid.process.send_signal(signal.SIGHUP)
        wait_for(lambda: "TLS certificate reloaded" in braid.stderr(), "the reload")
        after = tls_handshake(port, context)["serialNumber"]
        assert after != before
        channel = connection.channel()  # the old connection still works
        channel.queue_declare("after-reload")
        connection.close()
