"""core/security/passwords.py and scram.py: hashes made and checked, RabbitMQ's included."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from core.security.passwords import (
    ARGON2ID,
    NO_PASSWORD_HASH,
    RABBIT_MD5,
    RABBIT_SHA256,
    RABBIT_SHA512,
    PasswordHash,
    PasswordHashError,
    hash_password,
    rabbit_hash,
    verify_password,
)
from core.security.scram import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramCredentialError,
    credential_from_password,
    credential_from_salted_password,
    credentials_from_password,
    salted_password,
)

# RabbitMQ's own worked examples (www.rabbitmq.com/docs/passwords, "Computing a password hash":
# salt 908DC60A and "test12"; the older MD5 example: salt CAD5089B and "simon").
RABBIT_SHA256_TEST12 = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
RABBIT_MD5_SIMON = "ytUIm8s3AnKsXQjptplKFytfVxI="


def test_argon2id_round_trip_and_salted():
    first = hash_password("s3cret")
    second = hash_password("s3cret")
    assert first.algorithm == ARGON2ID
    assert first.value.startswith("$argon2id$")
    assert first.value != second.value  # a salt of its own
    assert "s3cret" not in first.value
    assert verify_password(first, "s3cret")
    assert not verify_password(first, "s3cret ")
    assert not verify_password(first, "")


def test_rabbitmq_documented_hashes_log_in():
    assert verify_password(PasswordHash(RABBIT_SHA256, RABBIT_SHA256_TEST12), "test12")
    assert not verify_password(PasswordHash(RABBIT_SHA256, RABBIT_SHA256_TEST12), "test13")
    assert verify_password(PasswordHash(RABBIT_MD5, RABBIT_MD5_SIMON), "simon")
    assert rabbit_hash("test12", salt=bytes.fromhex("908DC60A")) == RABBIT_SHA256_TEST12


@pytest.mark.parametrize("algorithm", [RABBIT_SHA256, RABBIT_SHA512])
def test_rabbitmq_hashes_made_independently(algorithm):
    digest = "sha256" if algorithm == RABBIT_SHA256 else "sha512"
    salt = b"\x01\x02\x03\x04"
    value = base64.b64encode(salt + hashlib.new(digest, salt + "pässword".encode()).digest())
    stored = PasswordHash(algorithm, value.decode())
    assert verify_password(stored, "pässword")
    assert not verify_password(stored, "password")


@pytest.mark.parametrize(
    ("algorithm", "value"),
    [
        ("rabbit_password_hashing_sha1", "x"),
        (RABBIT_SHA256, "not base64!"),
        (RABBIT_SHA256, base64.b64encode(b"short").decode()),
        (ARGON2ID, "$2b$12$bcrypt-looking"),
    ],
)
def test_malformed_stored_hashes_are_refused(algorithm, value):
    with pytest.raises(PasswordHashError):
        PasswordHash(algorithm, value)


def test_no_password_never_logs_in():
    assert not verify_password(NO_PASSWORD_HASH, "")
    assert not verify_password(NO_PASSWORD_HASH, "guest")


def test_scram_credentials_follow_rfc_5802():
    credential = credential_from_password(SCRAM_SHA_256, "pencil", salt=b"salt" * 4)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", b"salt" * 4, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert credential.stored_key == hashlib.sha256(client_key).digest()
    assert credential.server_key == hmac.digest(salted, b"Server Key", "sha256")
    assert credential.iterations == 4096
    again = credential_from_salted_password(
        SCRAM_SHA_256,
        b"salt" * 4,
        salted_password(SCRAM_SHA_256, "pencil", b"salt" * 4, 4096),
        4096,
    )
    assert again == credential


def test_every_mechanism_gets_its_own_salt():
    made = credentials_from_password("pencil")
    assert set(made) == {SCRAM_SHA_256, SCRAM_SHA_512}
    assert made[SCRAM_SHA_256].salt != made[SCRAM_SHA_512].salt
    assert len(made[SCRAM_SHA_512].server_key) == 64


@pytest.mark.parametrize("iterations", [4095, 16385])
def test_scram_iterations_within_kafkas_bounds(iterations):
    with pytest.raises(ScramCredentialError):
        credential_from_password(SCRAM_SHA_256, "pencil", iterations=iterations)


def test_unknown_scram_mechanism():
    with pytest.raises(ScramCredentialError):
        credential_from_password("SCRAM-SHA-1", "pencil")
