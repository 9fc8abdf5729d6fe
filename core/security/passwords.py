"""Password hashes: made with argon2id, checked in every algorithm a stored user may carry.

A stored password is a :class:`PasswordHash`: the algorithm's name and the hash, so that users
imported from RabbitMQ (``rabbit_password_hashing_sha256`` / ``_sha512`` / ``_md5``, the names
its definitions export) log in with the hashes RabbitMQ made, and get an argon2id hash (and SCRAM
credentials) at their next password change.

RabbitMQ's layout (``rabbit_password_hashing_sha256``; ``rabbit_password``): the stored value
is ``base64(salt ++ H(salt ++ utf8(password)))`` with a 4-byte random salt.

argon2id is made with OWASP's password-storage parameters (19 MiB, 2 passes, 1 lane: its first
argon2id recommendation), not argon2-cffi's default 64 MiB: a broker checks a password on every
connection, and a flood of logins must not need gigabytes. Hashing and checking argon2id take
~20 ms of CPU: callers on the event loop run them in a thread (:mod:`core.security.service`).
Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

ARGON2ID: Final = "argon2id"
RABBIT_SHA256: Final = "rabbit_password_hashing_sha256"
RABBIT_SHA512: Final = "rabbit_password_hashing_sha512"
RABBIT_MD5: Final = "rabbit_password_hashing_md5"
# The algorithm of a user without a password: no password logs it in (RabbitMQ's users with
# an empty password_hash log in only by EXTERNAL, with a client certificate).
NO_PASSWORD: Final = "none"
ALGORITHMS: Final = (ARGON2ID, RABBIT_SHA256, RABBIT_SHA512, RABBIT_MD5, NO_PASSWORD)

# RabbitMQ's salt: 32 random bits before the password (rabbit_password:generate_salt/0).
RABBIT_SALT_BYTES: Final = 4
_RABBIT_DIGESTS: Final = {RABBIT_SHA256: "sha256", RABBIT_SHA512: "sha512", RABBIT_MD5: "md5"}

# OWASP Password Storage Cheat Sheet, argon2id: m=19 MiB, t=2, p=1.
ARGON2_MEMORY_KIB: Final = 19 * 1024
ARGON2_TIME_COST: Final = 2
ARGON2_PARALLELISM: Final = 1
_HASHER: Final = PasswordHasher(
    time_cost=ARGON2_TIME_COST, memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_PARALLELISM
)


class PasswordHashError(ValueError):
    """A stored hash that cannot be used: unknown algorithm or malformed value."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """A stored password: ``algorithm`` (one of :data:`ALGORITHMS`) and its ``value`` (argon2's
    PHC string, or RabbitMQ's base64 text; ``""`` for :data:`NO_PASSWORD`)."""

    algorithm: str
    value: str

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise PasswordHashError(
                f"unknown password hashing algorithm {self.algorithm!r} "
                f"(known: {', '.join(ALGORITHMS)})"
            )
        if self.algorithm in _RABBIT_DIGESTS:
            raw = _rabbit_bytes(self.value)
            size = hashlib.new(_RABBIT_DIGESTS[self.algorithm]).digest_size
            if len(raw) != RABBIT_SALT_BYTES + size:
                raise PasswordHashError(
                    f"a {self.algorithm} hash is {RABBIT_SALT_BYTES + size} bytes "
                    f"(salt and digest) in base64, not {len(raw)}"
                )
        elif self.algorithm == ARGON2ID and not self.value.startswith("$argon2id$"):
            raise PasswordHashError("an argon2id hash is a PHC string starting with $argon2id$")


NO_PASSWORD_HASH: Final = PasswordHash(NO_PASSWORD, "")


def _rabbit_bytes(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PasswordHashError("a RabbitMQ password hash is base64 text") from None


def hash_password(password: str) -> PasswordHash:
    """A new argon2id hash of ``password`` (random salt). ~20 ms of CPU."""
    return PasswordHash(ARGON2ID, _HASHER.hash(password))


def rabbit_hash(password: str, algorithm: str = RABBIT_SHA256, salt: bytes | None = None) -> str:
    """``password`` hashed as RabbitMQ hashes it (what ``rabbitmqctl hash_password`` prints for
    the sha256 default): for tests and for importing definitions."""
    digest = _RABBIT_DIGESTS[algorithm]
    salt = os.urandom(RABBIT_SALT_BYTES) if salt is None else salt
    return base64.b64encode(salt + hashlib.new(digest, salt + password.encode()).digest()).decode()


def verify_password(stored: PasswordHash, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (constant-time compares)."""
    if stored.algorithm == NO_PASSWORD:
        return False
    if stored.algorithm == ARGON2ID:
        try:
            return _HASHER.verify(stored.value, password)
        except (VerificationError, InvalidHashError):
            return False
    raw = _rabbit_bytes(stored.value)
    salt, expected = raw[:RABBIT_SALT_BYTES], raw[RABBIT_SALT_BYTES:]
    actual = hashlib.new(_RABBIT_DIGESTS[stored.algorithm], salt + password.encode()).digest()
    return hmac.compare_digest(actual, expected)
