"""SCRAM credentials (RFC 5802, RFC 7677): what a user needs to log in by SCRAM-SHA-256 or
SCRAM-SHA-512 (Kafka's SASL mechanisms) without the server ever keeping the password.

For each mechanism a user keeps ``salt``, ``iterations``, ``StoredKey = H(HMAC(SaltedPassword,
"Client Key"))`` and ``ServerKey = HMAC(SaltedPassword, "Server Key")`` where ``SaltedPassword
= PBKDF2-HMAC-H(password, salt, iterations)``. They are made whenever a password is set
(:func:`credentials_from_password`), or from the salted password a Kafka admin client sends in
``AlterUserScramCredentials`` (:func:`credential_from_salted_password`, which is how Kafka's
``kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]'`` arrives).

The password is used as its UTF-8 bytes, without SASLprep, as Kafka's ``ScramFormatter`` does,
so credentials made here and by a Kafka admin client agree. The login exchange itself is
scramp's (:mod:`core.security.service`), but for one step: a client-final message that scramp
refuses for its nonce alone is checked again by :func:`client_final_as_kafka`, with the rule
Kafka's ``ScramSaslServer`` applies (the nonce must *end with* the one the server sent), which
librdkafka before 2.x's fix needs (kcat 1.7: see the function). Pure functions; thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
MECHANISMS: Final = (SCRAM_SHA_256, SCRAM_SHA_512)
_DIGESTS: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
# Kafka's wire numbers for the mechanisms (DescribeUserScramCredentials,
# AlterUserScramCredentials: ScramMechanism 1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512).
KAFKA_MECHANISM_NUMBERS: Final = {SCRAM_SHA_256: 1, SCRAM_SHA_512: 2}

# Kafka's minimum and the iteration count its tools default to (ScramMechanism.minIterations
# is 4096; RFC 7677 asks for at least 4096 with SHA-256).
MIN_ITERATIONS: Final = 4096
DEFAULT_ITERATIONS: Final = 4096
# Kafka's maximum (ScramMechanism.maxIterations), which bounds the work one login costs.
MAX_ITERATIONS: Final = 16384
SALT_BYTES: Final = 32


class ScramCredentialError(ValueError):
    """Unknown mechanism, or an iteration count outside Kafka's bounds."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One mechanism's credential of one user."""

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, object]:
        return {
            "salt": base64.b64encode(self.salt).decode(),
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, mechanism: str, data: Mapping[str, object]) -> ScramCredential:
        iterations = data["iterations"]
        if not isinstance(iterations, int):
            raise ScramCredentialError(f"{mechanism}: iterations must be an integer")
        return cls(
            check_mechanism(mechanism),
            base64.b64decode(str(data["salt"])),
            base64.b64decode(str(data["stored_key"])),
            base64.b64decode(str(data["server_key"])),
            iterations,
        )


def check_mechanism(mechanism: str) -> str:
    if mechanism not in _DIGESTS:
        raise ScramCredentialError(
            f"unknown SCRAM mechanism {mechanism!r} (known: {', '.join(MECHANISMS)})"
        )
    return mechanism


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramCredentialError(
            f"SCRAM iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS} (Kafka's bounds), "
            f"not {iterations}"
        )
    return iterations


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    digest = _DIGESTS[check_mechanism(mechanism)]
    return hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)


def credential_from_salted_password(
    mechanism: str, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    digest = _DIGESTS[check_mechanism(mechanism)]
    check_iterations(iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", digest)
    return ScramCredential(mechanism, salt, stored_key, server_key, iterations)


def credential_from_password(
    mechanism: str,
    password: str,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = salted_password(mechanism, password, salt, check_iterations(iterations))
    return credential_from_salted_password(mechanism, salt, salted, iterations)


def credentials_from_password(
    password: str, *, iterations: int = DEFAULT_ITERATIONS
) -> dict[str, ScramCredential]:
    """A credential for every mechanism (each with its own salt): made when a password is set."""
    return {
        mechanism: credential_from_password(mechanism, password, iterations=iterations)
        for mechanism in MECHANISMS
    }


def client_final_as_kafka(
    mechanism: str,
    credential_keys: tuple[bytes, bytes],
    auth_prefix: str,
    nonce: str,
    gs2_header: bytes,
    client_final: str,
) -> str | None:
    """The server-final message for ``client_final``, checked as Kafka's ``ScramSaslServer``
    checks it, or None when the login fails.

    RFC 5802 wants the client-final nonce equal to the server-first one (``nonce``: the client's
    nonce and the server's). Kafka accepts one that ends with it
    (``clientFinalMessage.nonce().endsWith(serverFirstMessage.nonce())``), and librdkafka 2.0
    (kcat 1.7) sends its own nonce once more in front; the proof covers the message as sent, so
    nothing is weakened: the server's random part must be there and the proof must verify.
    ``credential_keys``: (StoredKey, ServerKey); ``auth_prefix``: client-first-bare "," server-
    first; ``gs2_header``: the client-first message's (``n,,``), which ``c=`` must encode."""
    digest = _DIGESTS[check_mechanism(mechanism)]
    stored_key, server_key = credential_keys
    without_proof, separator, proof_text = client_final.rpartition(",p=")
    if not separator:
        return None
    attributes = dict(part.partition("=")[::2] for part in without_proof.split(","))
    try:
        binding = base64.b64decode(attributes.get("c", ""), validate=True)
        proof = base64.b64decode(proof_text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if (
        not hmac.compare_digest(binding, gs2_header)
        or not attributes.get("r", "").endswith(nonce)
        or len(proof) != len(stored_key)
    ):
        return None
    auth_message = f"{auth_prefix},{without_proof}".encode()
    client_signature = hmac.digest(stored_key, auth_message, digest)
    client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
    if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), stored_key):
        return None
    server_signature = hmac.digest(server_key, auth_message, digest)
    return "v=" + base64.b64encode(server_signature).decode()
