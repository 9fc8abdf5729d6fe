"""Kafka logins and permissions against a real ``braid serve`` with the real clients:
SASL PLAIN and SCRAM-SHA-256/512 (confluent-kafka, aiokafka, kafka-python, kcat) against the
user store, SASL_AUTHENTICATION_FAILED for a wrong password, anonymous clients as ``[auth]
anonymous`` says, vhost permissions deciding produce (TOPIC_AUTHORIZATION_FAILED), Kafka ACLs
made with kafka-python's admin client (a DENY wins over a vhost permission), and a private
vhost's queue out of an anonymous client's reach."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.braid_process import BraidProcess
from tests.security.http_admin import Admin

PRIVATE_QUEUE = "amq.vhost.secret.amq.queue.payroll"
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the module: each test has its own user, topics and ACLs."""
    path = tmp_path_factory.mktemp("kafka-access")
    with BraidProcess(path, listeners=("kafka", "http")) as process:
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
    user = f"alice-{mechanism.lower()}"  # the broker serves the whole module: a user per case
    password = user_with(braid, user, configure=r"^alice\.", write=r"^alice\.", read=r"^alice\.")
    config = sasl(braid, mechanism, user, password)
    assert produce(config, "alice.t") is None
    error = produce(config, "bob.t")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # the audit line of the denial (librdkafka stops at Metadata's answer)
    denials = [line for line in braid.stderr().splitlines() if f"user='{user}'" in line]
    assert any("resource='exchange bob.t'" in line for line in denials), denials


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


def guest_admin(braid: BraidProcess) -> Any:
    """kafka-python's admin client logged in as guest (administrator) with SASL PLAIN."""
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=braid.kafka_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="guest",
        sasl_plain_password="guest",
        request_timeout_ms=int(DEADLINE_S * 1000),
    )


def acl(principal: str, operation: str, permission: str, topic: str, pattern: str) -> Any:
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    return ACL(
        principal=principal,
        host="*",
        operation=ACLOperation[operation],
        permission_type=ACLPermissionType[permission],
        resource_pattern=ResourcePattern(
            ResourceType.TOPIC, topic, ACLResourcePatternType[pattern]
        ),
    )


def test_acls_made_with_kafka_python_grant_and_a_deny_wins(braid: BraidProcess) -> None:
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePatternFilter,
        ResourceType,
    )

    password = user_with(braid, "dave", write=".*", configure=".*", read=".*")
    admin = guest_admin(braid)
    try:
        created = admin.create_acls([acl("User:dave", "WRITE", "DENY", "dave.locked", "LITERAL")])
        assert not created["failed"], created
        acls, error = admin.describe_acls(
            ACLFilter(
                principal="User:dave",
                host="*",
                operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.ANY, None, ACLResourcePatternType.ANY
                ),
            )
        )
        assert [(a.resource_pattern.resource_name, a.permission_type.name) for a in acls] == [
            ("dave.locked", "DENY")
        ]
    finally:
        admin.close()
    config = sasl(braid, "SCRAM-SHA-512", "dave", password)
    assert produce(config, "dave.open") is None
    # The vhost permission allows every topic; the DENY ACL still wins.
    error = produce(config, "dave.locked")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_non_administrator_cannot_create_acls(braid: BraidProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import ClusterAuthorizationFailedError

    password = user_with(braid, "erin", write=".*", configure=".*", read=".*")
    admin = KafkaAdminClient(
        bootstrap_servers=braid.kafka_bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="erin",
        sasl_plain_password=password,
    )
    try:
        result = admin.create_acls([acl("User:erin", "ALL", "ALLOW", "x", "LITERAL")])
        assert result["failed"], result
        assert ClusterAuthorizationFailedError in result["failed"], result
    finally:
        admin.close()


def test_private_vhost_queue_is_out_of_an_anonymous_clients_reach(braid: BraidProcess) -> None:
    password = user_with(braid, "owner")  # no vhost permission: a Kafka ACL grants it
    admin = guest_admin(braid)
    try:
        created = admin.create_acls(
            [acl("User:owner", "ALL", "ALLOW", "amq.vhost.secret.", "PREFIXED")]
        )
        assert not created["failed"], created
    finally:
        admin.close()
    assert produce(sasl(braid, "SCRAM-SHA-256", "owner", password), PRIVATE_QUEUE) is None
    anonymous: dict[str, Any] = {"bootstrap.servers": braid.kafka_bootstrap}
    error = produce(anonymous, PRIVATE_QUEUE)
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    anonymous_admin = AdminClient(anonymous)  # kept: a dropped client fails its futures
    listed = anonymous_admin.list_topics(timeout=DEADLINE_S)
    assert PRIVATE_QUEUE not in listed.topics
    deleted = anonymous_admin.delete_topics([PRIVATE_QUEUE], operation_timeout=10)
    with pytest.raises(KafkaException) as refused:
        deleted[PRIVATE_QUEUE].result(DEADLINE_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Each refusal has its audit line, naming the vhost's queue.
    assert "vhost='secret' resource='queue payroll'" in braid.stderr()


async def test_aiokafka_scram_sha_256_produces_and_consumes(braid: BraidProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    password = user_with(braid, "frank", configure="^frank", write="^frank", read="^frank")
    options: dict[str, Any] = {
        "bootstrap_servers": braid.kafka_bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "frank",
        "sasl_plain_password": password,
    }
    producer = AIOKafkaProducer(**options)
    await producer.start()
    try:
        await producer.send_and_wait("frank.t", b"hello")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "frank.t", group_id="frank.g", auto_offset_reset="earliest", **options
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), DEADLINE_S)
        assert record.value == b"hello"
    finally:
        await consumer.stop()
