"""Logins over TLS against a real ``braid serve`` (client certificates checked, ``--tls-ca
--tls-verify-peer``), with the real clients:

- a client certificate of another CA or an expired one is refused in the TLS handshake on every
  protocol (pika on AMQPS, paho on MQTTS and MQTT over secure WebSocket, confluent-kafka on
  Kafka SSL), and each refusal is an audit line with the peer and the reason (asyncio and uvloop
  report a failed handshake only in debug mode: braid/tls.py does the handshake itself); the
  broker serves the next client;
- the same on TLS-only listeners (``--amqp-port 0 --amqps-port N``, the same for MQTT, MQTT over
  WebSocket and Kafka) and on HTTPS, which listen through the same handshake (a plain ``ssl``
  client for HTTPS), each serving a client with a good certificate after the refusals;
- paho 3.1.1 and 5.0, over TCP and secure WebSocket, and aiomqtt log in with a password over TLS;
  a wrong password and an unknown user are CONNACK 0x04 / 0x86 and an audit line.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from confluent_kafka import KafkaError, Producer
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from tests.braid_process import BraidProcess, free_port
from tests.security.certs import CertificateAuthority, Issued
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
PASSWORD = uuid.uuid4().hex
TLS_PORTS = ("amqps", "mqtts", "mqtt-wss", "kafka-tls")
# The audit line's protocol= of each TLS listener.
PROTOCOLS = {
    "amqps": "amqp",
    "mqtts": "mqtt",
    "mqtt-wss": "mqtt",
    "kafka-tls": "kafka",
    "https": "http",
}


class Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = CertificateAuthority(directory, "login-test-ca")
        other = CertificateAuthority(directory / "other", "other-ca")
        self.server = self.ca.issue("localhost", server=True)
        self.alice = self.ca.issue("alice", server=False)
        self.wrong_ca = other.issue("alice", server=False)
        self.expired = self.ca.issue("alice", server=False, expired=True)


class TlsBraid(BraidProcess):
    tls_ports: dict[str, int]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsBraid]:
    ports = {name: free_port() for name in TLS_PORTS}
    args = (
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca.cert_path), "--tls-verify-peer", "--https-port", "0",
        *(item for name in TLS_PORTS for item in (f"--{name}-port", str(ports[name]))),
    )  # fmt: skip
    process = TlsBraid(tmp_path_factory.mktemp("tls-logins"), extra_args=args)
    process.tls_ports = ports
    with process:
        admin = Admin(process.http_port)
        admin.user("alice", PASSWORD)
        admin.permit("alice", configure=".*", write=".*", read=".*")
        yield process


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsBraid]:
    """Every protocol on its TLS port alone (the plain AMQP, MQTT, WebSocket and Kafka ports
    0), and HTTPS beside the plain HTTP port the test's admin calls use."""
    names = (*TLS_PORTS, "https")
    ports = {name: free_port() for name in names}
    args = (
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca.cert_path), "--tls-verify-peer",
        *(item for name in names for item in (f"--{name}-port", str(ports[name]))),
    )  # fmt: skip
    process = TlsBraid(tmp_path_factory.mktemp("tls-only"), listeners=("http",), extra_args=args)
    process.tls_ports = ports
    with process:
        assert (process.amqp_port, process.mqtt_port, process.kafka_port) == (0, 0, 0)
        admin = Admin(process.http_port)
        admin.user("alice", PASSWORD)
        admin.permit("alice", configure=".*", write=".*", read=".*")
        yield process


def client_context(pki: Pki, certificate: Issued | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if certificate is not None:
        context.load_cert_chain(str(certificate.cert), str(certificate.key))
    return context


def audit_lines(braid: BraidProcess, protocol: str, reason: str) -> int:
    pattern = re.compile(
        rf"login failed: protocol={protocol} peer='127\.0\.0\.1:\d+' user='' mechanism=TLS "
        rf"reason=tls_handshake \({re.escape(reason)}\)"
    )
    return len(pattern.findall(braid.stderr()))


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- certificates refused in the handshake, on every protocol ---------------------------------


def pika_refused(braid: TlsBraid, pki: Pki, certificate: Issued) -> None:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.tls_ports["amqps"],
        credentials=pika.PlainCredentials("alice", PASSWORD),
        ssl_options=pika.SSLOptions(client_context(pki, certificate), "localhost"),
        connection_attempts=1,
    )
    # pika raises what the socket said: the connection closed as the handshake ended.
    with pytest.raises((pika.exceptions.AMQPConnectionError, ConnectionError, ssl.SSLError)):
        pika.BlockingConnection(parameters)


def pika_serves(braid: TlsBraid, pki: Pki) -> None:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.tls_ports["amqps"],
        credentials=pika.PlainCredentials("alice", PASSWORD),
        ssl_options=pika.SSLOptions(client_context(pki, pki.alice), "localhost"),
    )
    connection = pika.BlockingConnection(parameters)
    connection.channel().queue_declare("tls-still-served")
    connection.close()


def paho_client(version: Any, transport: str, **options: Any) -> mqtt.Client:
    return mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"tls-{uuid.uuid4().hex[:8]}",
        protocol=version,
        transport=transport,  # type: ignore[arg-type]
        **options,
    )


def paho_connack(
    braid: TlsBraid,
    pki: Pki,
    listener: str,
    *,
    version: int = mqtt.MQTTv5,
    certificate: Issued | None = None,
    user: str | None = None,
    password: str | None = None,
) -> ReasonCode | None:
    """The CONNACK's reason code; None when the connection was closed before any CONNACK."""
    transport = "websockets" if listener == "mqtt-wss" else "tcp"
    client = paho_client(version, transport)
    client.tls_set_context(client_context(pki, certificate))
    if user is not None:
        client.username_pw_set(user, password)
    answered: list[ReasonCode] = []
    done = threading.Event()

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: ReasonCode, _p: Any) -> None:
        answered.append(reason)
        done.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *_args: done.set()
    try:
        client.connect("127.0.0.1", braid.tls_ports[listener])
    except (ssl.SSLError, OSError):
        return None
    client.loop_start()
    try:
        assert done.wait(DEADLINE_S), "neither CONNACK nor a closed connection"
        return answered[0] if answered else None
    finally:
        client.disconnect()
        client.loop_stop()


def confluent_refused(braid: TlsBraid, pki: Pki, certificate: Issued) -> None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{braid.tls_ports['kafka-tls']}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca.cert_path),
            "ssl.certificate.location": str(certificate.cert),
            "ssl.key.location": str(certificate.key),
            "error_cb": errors.append,
        }
    )
    deadline = time.monotonic() + DEADLINE_S
    while not errors:
        assert time.monotonic() < deadline, "no error reported"
        producer.poll(0.1)
    assert errors[0].code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT), errors


REFUSED = {
    "wrong CA": "unable to get local issuer certificate",
    "expired": "certificate has expired",
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("listener", TLS_PORTS)
def test_a_refused_certificate_is_an_audit_line_on_every_protocol(
    braid: TlsBraid, pki: Pki, listener: str, case: str
) -> None:
    certificate = pki.wrong_ca if case == "wrong CA" else pki.expired
    protocol = {"amqps": "amqp", "mqtts": "mqtt", "mqtt-wss": "mqtt", "kafka-tls": "kafka"}
    before = audit_lines(braid, protocol[listener], REFUSED[case])
    if listener == "amqps":
        pika_refused(braid, pki, certificate)
    elif listener == "kafka-tls":
        confluent_refused(braid, pki, certificate)
    else:
        assert paho_connack(braid, pki, listener, certificate=certificate) is None
    wait_for(
        lambda: audit_lines(braid, protocol[listener], REFUSED[case]) > before,
        f"the audit line of the {case} certificate on {listener}",
    )
    # The broker and other clients are unaffected.
    if listener == "amqps":
        pika_serves(braid, pki)
    else:
        assert paho_connack(braid, pki, "mqtts", certificate=pki.alice) == 0


def confluent_serves(braid: TlsBraid, pki: Pki) -> None:
    delivered: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{braid.tls_ports['kafka-tls']}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca.cert_path),
            "ssl.certificate.location": str(pki.alice.cert),
            "ssl.key.location": str(pki.alice.key),
            "message.timeout.ms": int(DEADLINE_S * 1000),
        }
    )
    producer.produce(
        "tls-only-still-served", b"served", on_delivery=lambda e, _m: delivered.append(e)
    )
    assert producer.flush(DEADLINE_S) == 0
    assert delivered == [None]


def https_get(braid: TlsBraid, pki: Pki, certificate: Issued | None) -> bytes:
    """GET /health over HTTPS with a plain ``ssl`` client: the response, or b"" when the
    server ended the connection (a refused certificate: TLS 1.3 reports it on the first read)."""
    context = client_context(pki, certificate)
    with socket.create_connection(("127.0.0.1", braid.tls_ports["https"]), DEADLINE_S) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                chunks = []
                while chunk := tls.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks)
        except (ssl.SSLError, ConnectionError):
            return b""


def refuse(braid: TlsBraid, pki: Pki, listener: str, certificate: Issued) -> None:
    if listener == "amqps":
        pika_refused(braid, pki, certificate)
    elif listener == "kafka-tls":
        confluent_refused(braid, pki, certificate)
    elif listener == "https":
        assert https_get(braid, pki, certificate) == b""
    else:
        assert paho_connack(braid, pki, listener, certificate=certificate) is None


def serve(braid: TlsBraid, pki: Pki, listener: str) -> None:
    if listener == "amqps":
        pika_serves(braid, pki)
    elif listener == "kafka-tls":
        confluent_serves(braid, pki)
    elif listener == "https":
        assert https_get(braid, pki, pki.alice).startswith(b"HTTP/1.1 200")
    else:
        assert paho_connack(braid, pki, listener, certificate=pki.alice) == 0


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("listener", [*TLS_PORTS, "https"])
def test_tls_only_listeners_and_https_audit_a_refused_certificate(
    tls_only: TlsBraid, pki: Pki, listener: str, case: str
) -> None:
    certificate = pki.wrong_ca if case == "wrong CA" else pki.expired
    before = audit_lines(tls_only, PROTOCOLS[listener], REFUSED[case])
    refuse(tls_only, pki, listener, certificate)
    wait_for(
        lambda: audit_lines(tls_only, PROTOCOLS[listener], REFUSED[case]) > before,
        f"the audit line of the {case} certificate on the TLS-only {listener}",
    )
    serve(tls_only, pki, listener)


# -- MQTT over TLS with a password ------------------------------------------------------------


@pytest.mark.parametrize("listener", ["mqtts", "mqtt-wss"])
@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_paho_password_logins_over_tls(
    braid: TlsBraid, pki: Pki, listener: str, version: int
) -> None:
    login = {"listener": listener, "version": version}
    assert paho_connack(braid, pki, **login, user="alice", password=PASSWORD) == 0  # type: ignore[arg-type]
    wrong = paho_connack(braid, pki, **login, user="alice", password="not-hers")  # type: ignore[arg-type]
    unknown = paho_connack(braid, pki, **login, user="nobody", password=PASSWORD)  # type: ignore[arg-type]
    # 3.1.1: return code 4, "bad user name or password"; paho reports it as 0x86 too.
    assert wrong is not None
    assert unknown is not None
    assert (
        wrong.value == 0x86
        if version == mqtt.MQTTv5
        else wrong.getName() == "Bad user name or password"
    )
    assert unknown.value == wrong.value
    assert "protocol=mqtt peer='127.0.0.1:" in braid.stderr()
    assert "user='nobody'" in braid.stderr()


async def test_aiomqtt_password_over_tls(braid: TlsBraid, pki: Pki) -> None:
    topic = f"tls/{uuid.uuid4().hex[:8]}"
    async with aiomqtt.Client(
        "127.0.0.1",
        braid.tls_ports["mqtts"],
        username="alice",
        password=PASSWORD,
        tls_context=client_context(pki),
        protocol=aiomqtt.ProtocolVersion.V5,
    ) as client:
        await client.subscribe(topic, qos=1)
        await client.publish(topic, b"over tls", qos=1)
        async for message in client.messages:
            assert message.payload == b"over tls"
            break
    with pytest.raises(aiomqtt.MqttCodeError) as refused:
        async with aiomqtt.Client(
            "127.0.0.1",
            braid.tls_ports["mqtts"],
            username="alice",
            password="not-hers",
            tls_context=client_context(pki),
            protocol=aiomqtt.ProtocolVersion.V5,
        ):
            pass
    assert refused.value.rc == 0x86
