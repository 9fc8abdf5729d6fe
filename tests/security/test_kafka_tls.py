"""Kafka over TLS with every client against a real ``braid serve``: SASL_SSL with PLAIN and
SCRAM-SHA-256/512, and SSL with a client certificate whose CN is the principal (``User:CN``),
with confluent-kafka, aiokafka, kafka-python and kcat. A wrong password, an unknown user, a
certificate from another CA and an expired certificate are each refused as the client reports
it, and the broker goes on serving the others. A TLS-only Kafka listener (``--kafka-port 0``)
works, and Metadata advertises the TLS listener to clients on it."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from tests.braid_process import BraidProcess, free_ports
from tests.security.certs import CertificateAuthority, Issued
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
PASSWORD = uuid.uuid4().hex
# alice may use alice.* (topics and groups); her certificate's CN is her name.
ALICE = {"configure": r"^alice\.", "write": r"^alice\.", "read": r"^alice\."}
# The other TLS listeners stay off: only Kafka's is under test.
OTHER_TLS_OFF = ("--amqps-port", "0", "--mqtts-port", "0", "--mqtt-wss-port", "0")
OTHER_TLS_OFF += ("--https-port", "0")


class Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = CertificateAuthority(directory, "kafka-test-ca")
        other = CertificateAuthority(directory / "other", "other-ca")
        self.server = self.ca.issue("localhost", server=True)
        self.alice = self.ca.issue("alice", server=False)
        self.stranger = self.ca.issue("stranger", server=False)  # no such user
        self.wrong_ca = other.issue("alice", server=False)
        self.expired = self.ca.issue("alice", server=False, expired=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


class TlsBraid(BraidProcess):
    tls_port: int

    @property
    def tls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.tls_port}"


def tls_braid(path: Path, pki: Pki, *, plain: bool = True, extra: tuple[str, ...] = ()) -> TlsBraid:
    kafka, http, tls = free_ports(3)
    args = (
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
        "--tls-ca", str(pki.ca.cert_path), "--tls-verify-peer",
        "--kafka-tls-port", str(tls), *OTHER_TLS_OFF, *extra,
    )  # fmt: skip
    process = TlsBraid(path, listeners=("kafka", "http"), extra_args=args)
    process.ports.update(kafka=kafka if plain else 0, http=http)
    process.tls_port = tls
    return process


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsBraid]:
    with tls_braid(tmp_path_factory.mktemp("kafka-tls"), pki) as process:
        admin = Admin(process.http_port)
        admin.user("alice", PASSWORD)
        admin.permit("alice", **ALICE)
        yield process


def unique(prefix: str = "alice.") -> str:
    return prefix + uuid.uuid4().hex[:8]


# -- confluent-kafka (librdkafka) ------------------------------------------------------------


def confluent_sasl(
    braid: TlsBraid, pki: Pki, mechanism: str, user: str = "alice", password: str = PASSWORD
) -> dict[str, Any]:
    return {
        "bootstrap.servers": braid.tls_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca.cert_path),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def confluent_ssl(braid: TlsBraid, pki: Pki, certificate: Issued) -> dict[str, Any]:
    return {
        "bootstrap.servers": braid.tls_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.cert_path),
        "ssl.certificate.location": str(certificate.cert),
        "ssl.key.location": str(certificate.key),
    }


def confluent_produce(config: dict[str, Any], topic: str, value: bytes) -> KafkaError | None:
    """Produce one record; the delivery report's error (None: stored)."""
    reports: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": int(DEADLINE_S * 1000)})
    producer.produce(topic, value, on_delivery=lambda error, _message: reports.append(error))
    producer.flush(DEADLINE_S)
    assert reports, "no delivery report"
    return reports[0]


def confluent_consume_one(config: dict[str, Any], topic: str) -> bytes:
    consumer = Consumer(
        {
            **config,
            "group.id": unique(),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                value: bytes = message.value()
                return value
        raise AssertionError(f"nothing consumed from {topic}")
    finally:
        consumer.close()


class Lines(logging.Handler):
    """The messages of a logger (librdkafka's log through confluent-kafka's ``logger``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def confluent_refusal(config: dict[str, Any], *, logged: bool = False) -> tuple[KafkaError, str]:
    """The first error a producer reports (error_cb, served by poll) on a refused login, and
    (``logged``: once there is one) what librdkafka logged as the connection failed."""
    errors: list[KafkaError] = []
    lines = Lines()
    logger = logging.getLogger(f"librdkafka.{uuid.uuid4().hex}")
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    producer = Producer({**config, "error_cb": errors.append, "logger": logger})
    deadline = time.monotonic() + DEADLINE_S
    while not errors or (logged and not any(line.startswith("FAIL") for line in lines.lines)):
        assert time.monotonic() < deadline, f"no error reported: {errors}"
        producer.poll(0.1)
    return errors[0], "\n".join(lines.lines)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_sasl_ssl(braid: TlsBraid, pki: Pki, mechanism: str) -> None:
    config = confluent_sasl(braid, pki, mechanism)
    topic = unique()
    assert confluent_produce(config, topic, mechanism.encode()) is None
    assert confluent_consume_one(config, topic) == mechanism.encode()


def test_confluent_client_certificate_cn_is_the_principal(braid: TlsBraid, pki: Pki) -> None:
    config = confluent_ssl(braid, pki, pki.alice)
    topic, refused = unique(), unique("bob.")
    assert confluent_produce(config, topic, b"by certificate") is None
    assert confluent_consume_one(config, topic) == b"by certificate"
    error = confluent_produce(config, refused, b"not hers")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert f"user='alice' operation='kafka Metadata' vhost='/' resource='exchange {refused}'" in (
        braid.stderr()
    )


# -- aiokafka ----------------------------------------------------------------------------------


def aiokafka_sasl(
    braid: TlsBraid, pki: Pki, mechanism: str, user: str, password: str
) -> dict[str, Any]:
    return {
        "bootstrap_servers": braid.tls_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(pki.ca.cert_path)),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def aiokafka_ssl(braid: TlsBraid, pki: Pki, certificate: Issued) -> dict[str, Any]:
    context = create_ssl_context(
        cafile=str(pki.ca.cert_path), certfile=str(certificate.cert), keyfile=str(certificate.key)
    )
    return {
        "bootstrap_servers": braid.tls_bootstrap,
        "security_protocol": "SSL",
        "ssl_context": context,
    }


async def aiokafka_round_trip(options: dict[str, Any], topic: str, value: bytes) -> bytes:
    producer = AIOKafkaProducer(**options)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, group_id=unique(), auto_offset_reset="earliest", **options)
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), DEADLINE_S)
        received: bytes = record.value
        return received
    finally:
        await consumer.stop()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_aiokafka_sasl_ssl(braid: TlsBraid, pki: Pki, mechanism: str) -> None:
    options = aiokafka_sasl(braid, pki, mechanism, "alice", PASSWORD)
    assert await aiokafka_round_trip(options, unique(), b"aiokafka") == b"aiokafka"


async def test_aiokafka_client_certificate(braid: TlsBraid, pki: Pki) -> None:
    options = aiokafka_ssl(braid, pki, pki.alice)
    assert await aiokafka_round_trip(options, unique(), b"aiokafka mtls") == b"aiokafka mtls"


# -- kafka-python --------------------------------------------------------------------------------


def kafka_python_sasl(
    braid: TlsBraid, pki: Pki, mechanism: str, user: str, password: str
) -> dict[str, Any]:
    return {
        "bootstrap_servers": braid.tls_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(pki.ca.cert_path),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
        "request_timeout_ms": int(DEADLINE_S * 1000),
    }


def kafka_python_ssl(braid: TlsBraid, pki: Pki, certificate: Issued) -> dict[str, Any]:
    return {
        "bootstrap_servers": braid.tls_bootstrap,
        "security_protocol": "SSL",
        "ssl_cafile": str(pki.ca.cert_path),
        "ssl_certfile": str(certificate.cert),
        "ssl_keyfile": str(certificate.key),
        "request_timeout_ms": int(DEADLINE_S * 1000),
    }


def kafka_python_round_trip(options: dict[str, Any], topic: str, value: bytes) -> bytes:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(**options)
    try:
        producer.send(topic, value).get(DEADLINE_S)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        topic,
        group_id=unique(),
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(DEADLINE_S * 1000),
        **options,
    )
    try:
        for record in consumer:
            received: bytes = record.value
            return received
        raise AssertionError(f"nothing consumed from {topic}")
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_sasl_ssl(braid: TlsBraid, pki: Pki, mechanism: str) -> None:
    options = kafka_python_sasl(braid, pki, mechanism, "alice", PASSWORD)
    assert kafka_python_round_trip(options, unique(), b"kafka-python") == b"kafka-python"


def test_kafka_python_client_certificate(braid: TlsBraid, pki: Pki) -> None:
    options = kafka_python_ssl(braid, pki, pki.alice)
    assert kafka_python_round_trip(options, unique(), b"kp mtls") == b"kp mtls"


# -- kcat ----------------------------------------------------------------------------------------


def kcat_options(braid: TlsBraid, pki: Pki, user: str, password: str) -> list[str]:
    return [
        "kcat", "-b", braid.tls_bootstrap,
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
        "-X", f"sasl.username={user}", "-X", f"sasl.password={password}",
        "-X", f"ssl.ca.location={pki.ca.cert_path}",
    ]  # fmt: skip


def kcat(arguments: list[str], given: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(arguments, input=given, capture_output=True, timeout=DEADLINE_S * 2)


def test_kcat_sasl_ssl_scram_sha_512(braid: TlsBraid, pki: Pki) -> None:
    topic = unique()
    options = kcat_options(braid, pki, "alice", PASSWORD)
    produced = kcat([*options, "-P", "-t", topic], b"one\ntwo\n")
    assert produced.returncode == 0, produced.stderr
    consumed = kcat([*options, "-C", "-t", topic, "-o", "beginning", "-c", "2", "-e"])
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.split() == [b"one", b"two"]


def kcat_ssl_options(braid: TlsBraid, pki: Pki, certificate: Issued) -> list[str]:
    return [
        "kcat", "-b", braid.tls_bootstrap, "-X", "security.protocol=SSL",
        "-X", f"ssl.ca.location={pki.ca.cert_path}",
        "-X", f"ssl.certificate.location={certificate.cert}",
        "-X", f"ssl.key.location={certificate.key}",
    ]  # fmt: skip


def test_kcat_with_a_client_certificate(braid: TlsBraid, pki: Pki) -> None:
    topic = unique()
    options = kcat_ssl_options(braid, pki, pki.alice)
    produced = kcat([*options, "-P", "-t", topic], b"by kcat\n")
    assert produced.returncode == 0, produced.stderr
    consumed = kcat([*options, "-C", "-t", topic, "-o", "beginning", "-c", "1", "-e"])
    assert consumed.stdout.strip() == b"by kcat", consumed.stderr


# -- refusals ----------------------------------------------------------------------------------


REFUSALS = ("wrong password", "unknown user", "wrong CA", "expired")


def refused_credentials(case: str, pki: Pki) -> tuple[str, str, Issued | None]:
    """(user, password, client certificate) for a refusal case."""
    if case == "wrong password":
        return "alice", "not-her-password", None
    if case == "unknown user":
        return "nobody", PASSWORD, None
    return "alice", PASSWORD, pki.wrong_ca if case == "wrong CA" else pki.expired


def assert_still_serving(braid: TlsBraid, pki: Pki) -> None:
    """The broker and other clients are unaffected."""
    config = confluent_sasl(braid, pki, "SCRAM-SHA-512")
    assert confluent_produce(config, unique(), b"still here") is None


# A client certificate the broker refuses: TLS 1.3 finishes the client's side of the handshake
# before the server has checked its certificate, so the clients see the connection closed (the
# server's alert, "unknown ca" or "certificate expired", is not read), as against Kafka.
CLOSED_BY_THE_BROKER = ("closed by peer", "reset by peer", "unexpected eof while reading")


@pytest.mark.parametrize("case", REFUSALS)
def test_confluent_refusals(braid: TlsBraid, pki: Pki, case: str) -> None:
    user, password, certificate = refused_credentials(case, pki)
    if certificate is None:
        error, _ = confluent_refusal(confluent_sasl(braid, pki, "SCRAM-SHA-512", user, password))
        assert error.code() == KafkaError._AUTHENTICATION, error
        assert "invalid credentials" in error.str()
        assert "login failed: protocol=kafka peer='127.0.0.1:" in braid.stderr()
        assert f"user='{user}' mechanism=SCRAM-SHA-512" in braid.stderr()
    else:
        error, logged = confluent_refusal(confluent_ssl(braid, pki, certificate), logged=True)
        assert error.code() == KafkaError._ALL_BROKERS_DOWN, error
        assert any(words in logged for words in CLOSED_BY_THE_BROKER), logged
    assert_still_serving(braid, pki)


@pytest.mark.parametrize("case", REFUSALS)
async def test_aiokafka_refusals(
    braid: TlsBraid, pki: Pki, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    user, password, certificate = refused_credentials(case, pki)
    if certificate is None:
        options = aiokafka_sasl(braid, pki, "SCRAM-SHA-512", user, password)
    else:
        options = aiokafka_ssl(braid, pki, certificate)
    producer = AIOKafkaProducer(**options)
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    # aiokafka logs why the bootstrap connection failed, then raises "Unable to bootstrap".
    reasons = " ".join(record.getMessage() for record in caplog.records)
    if certificate is None:
        assert "SaslAuthenticationFailed" in reasons, reasons
        assert "invalid credentials" in reasons, reasons
    else:
        assert "closed" in reasons, reasons
    assert_still_serving(braid, pki)


@pytest.mark.parametrize("case", REFUSALS)
def test_kafka_python_refusals(
    braid: TlsBraid, pki: Pki, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    user, password, certificate = refused_credentials(case, pki)
    if certificate is None:
        options = kafka_python_sasl(braid, pki, "SCRAM-SHA-512", user, password)
    else:
        options = kafka_python_ssl(braid, pki, certificate)
    # kafka-python 3 retries a refused bootstrap connection until its bootstrap timeout (30 s
    # by default), then raises; the refusal itself is in its log. The refusal comes at once
    # (kcat logs it within 0.5 s): a short timeout, the test's time is spent waiting it out.
    options["request_timeout_ms"] = 2000
    options["bootstrap_timeout_ms"] = 2000
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError):
        KafkaProducer(**options)
    reasons = " ".join(record.getMessage() for record in caplog.records)
    if certificate is None:
        assert "SaslAuthenticationFailedError" in reasons, reasons
        assert "invalid credentials" in reasons, reasons
    else:
        assert "socket disconnected" in reasons, reasons
    assert_still_serving(braid, pki)


@pytest.mark.parametrize("case", REFUSALS)
def test_kcat_refusals(braid: TlsBraid, pki: Pki, case: str) -> None:
    user, password, certificate = refused_credentials(case, pki)
    if certificate is None:
        options = kcat_options(braid, pki, user, password)
    else:
        options = kcat_ssl_options(braid, pki, certificate)
    if certificate is None:
        reason = kcat_stderr_until([*options, "-L", "-m", "10"], sasl_refused)
        assert sasl_refused(reason), reason
    else:
        reason = kcat_stderr_until([*options, "-L", "-m", "10"], closed_by_the_broker)
        assert closed_by_the_broker(reason), reason
    assert_still_serving(braid, pki)


def sasl_refused(reason: str) -> bool:
    return "SASL authentication error" in reason and "invalid credentials" in reason


def closed_by_the_broker(reason: str) -> bool:
    return any(words in reason for words in CLOSED_BY_THE_BROKER)


def kcat_stderr_until(arguments: list[str], reported: Callable[[str], bool]) -> str:
    """kcat's stderr up to the line where ``reported`` holds, or all of it when kcat ends first.

    librdkafka does not treat a refused login as fatal: kcat logs the refusal at once, then
    retries until its ``-m`` metadata timeout (10 s) and exits 1. The refusal is what the test
    checks, so kcat is stopped as soon as it has logged it."""
    with subprocess.Popen(
        arguments, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as process:
        assert process.stderr is not None
        logged = ""
        for line in process.stderr:
            logged += line.decode(errors="replace")
            if reported(logged):
                break
        process.kill()
    return logged


def test_a_certificate_of_an_unknown_user_is_disconnected(braid: TlsBraid, pki: Pki) -> None:
    """The CN names no user of the store: no principal, so the connection is closed at the first
    request after ApiVersions (as a Kafka SASL listener drops a client that skips the login)."""
    error, _ = confluent_refusal(confluent_ssl(braid, pki, pki.stranger))
    assert error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN), error
    assert "user='stranger'" in braid.stderr()
    assert_still_serving(braid, pki)


# -- a TLS-only listener, and what Metadata advertises ------------------------------------------


def test_tls_only_listener_advertises_itself(tmp_path: Path, pki: Pki) -> None:
    plain_port = free_ports(1)[0]  # advertised for the plain listener, which is off
    with tls_braid(
        tmp_path, pki, plain=False, extra=("--kafka-advertised-port", str(plain_port))
    ) as braid:
        assert " kafka=- " in braid.ready_line + " "
        assert f" kafka-tls=127.0.0.1:{braid.tls_port}" in braid.ready_line
        config = confluent_ssl(braid, pki, pki.alice)
        Admin(braid.http_port).user("alice", PASSWORD)
        Admin(braid.http_port).permit("alice", **ALICE)
        metadata = AdminClient(config).list_topics(timeout=DEADLINE_S)
        assert [(b.host, b.port) for b in metadata.brokers.values()] == [
            ("127.0.0.1", braid.tls_port)
        ]
        topic = unique()
        assert confluent_produce(config, topic, b"tls only") is None
        assert confluent_consume_one(config, topic) == b"tls only"
