"""SCRAM credentials managed with confluent-kafka's AdminClient against a real ``braid serve``
(DescribeUserScramCredentials and AlterUserScramCredentials, APIs 50 and 51): with no user named
(librdkafka sends an empty array) every user with a credential is described, as Kafka does; a
credential made over the admin API logs in with SCRAM; a non-administrator is refused 31."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in its stubs
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.braid_process import BraidProcess
from tests.security.http_admin import Admin
from tests.security.test_kafka_access import produce, sasl

DEADLINE_S = 30.0


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("kafka", "http")) as process:
        yield process


def admin_client(braid: BraidProcess, user: str = "guest", password: str = "guest") -> AdminClient:
    return AdminClient(sasl(braid, "SCRAM-SHA-512", user, password))


def described(admin: AdminClient, users: list[str] | None = None) -> dict[str, Any]:
    """User name -> its UserScramCredentialsDescription (or the exception it failed with)."""
    if users is None:
        every: Any = admin.describe_user_scram_credentials()  # one future for every user
        result: dict[str, Any] = every.result(DEADLINE_S)
        return result
    futures: dict[str, Any] = admin.describe_user_scram_credentials(users)  # type: ignore[assignment]
    found: dict[str, Any] = {}
    for name, future in futures.items():
        try:
            found[name] = future.result(DEADLINE_S)
        except KafkaException as error:
            found[name] = error
    return found


def test_describe_without_users_lists_every_user(braid: BraidProcess) -> None:
    alice_password = uuid.uuid4().hex
    Admin(braid.http_port).user("alice", alice_password)
    everyone = described(admin_client(braid))
    assert set(everyone) == {"guest", "alice"}, everyone
    mechanisms = {info.mechanism for info in everyone["alice"].scram_credential_infos}
    assert mechanisms == {ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512}
    assert all(info.iterations == 4096 for info in everyone["alice"].scram_credential_infos)
    # Named users: only those; an unknown one is RESOURCE_NOT_FOUND.
    named = described(admin_client(braid), ["alice", "nobody"])
    assert {info.mechanism for info in named["alice"].scram_credential_infos} == mechanisms
    assert isinstance(named["nobody"], KafkaException)
    assert named["nobody"].args[0].code() == KafkaError.RESOURCE_NOT_FOUND


def test_a_credential_made_with_the_admin_client_logs_in(braid: BraidProcess) -> None:
    Admin(braid.http_port).user("carol", uuid.uuid4().hex)
    Admin(braid.http_port).permit("carol", configure=".*", write=".*", read=".*")
    admin = admin_client(braid)
    new_password = uuid.uuid4().hex
    upsertion = UserScramCredentialUpsertion(
        "carol",
        ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
        new_password.encode(),
    )
    for future in admin.alter_user_scram_credentials([upsertion]).values():
        future.result(DEADLINE_S)
    infos = described(admin)["carol"].scram_credential_infos
    assert {(info.mechanism, info.iterations) for info in infos} >= {
        (ScramMechanism.SCRAM_SHA_512, 8192)
    }
    assert produce(sasl(braid, "SCRAM-SHA-512", "carol", new_password), "carol.t") is None
