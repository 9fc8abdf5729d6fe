"""Who a Kafka connection is, and what it may do (issue 18; docs/security.md, Kafka section).

Logins. A client that wants to log in sends SaslHandshake (17, v1) naming a mechanism, then
SaslAuthenticate (36) with the SASL tokens: ``PLAIN`` in one round (``authzid NUL user NUL
password``, checked by :meth:`BrokerAPI.login_password`), ``SCRAM-SHA-256`` and
``SCRAM-SHA-512`` in two (RFC 5802, against the store's SCRAM credentials through
:meth:`BrokerAPI.scram_login`). A wrong password or unknown user is answered
SASL_AUTHENTICATION_FAILED (58), as Kafka answers it, with an audit line (the core's). Every
listener takes SASL, the plain one (SASL_PLAINTEXT) and the TLS one (SASL_SSL) alike.

A client that sends another request first is not logged in: on a TLS connection with a verified
client certificate it is the user its certificate's CN names (Kafka's SSL principal; the user
must exist in the store), otherwise ``User:ANONYMOUS``, allowed as ``[auth] anonymous`` says
(default: from loopback addresses only). A refused one is disconnected, as a Kafka SASL listener
drops a client that skips the handshake; so is a client that goes on after a failed login or in
the middle of an exchange.

Access. Every handler asks :func:`allowed` before it touches a topic, group or transactional id,
with the operation's key in the mapping table (``core/security/mapping.py``: ``"kafka
Produce"``, ``"kafka Fetch"``, ...). The core decides (vhost permissions, Kafka ACLs; a DENY
wins) and writes the audit line of a refusal; the answer that allows is kept on the connection
until the security store's generation changes, so the hot paths (Produce, Fetch) cost a dict
look-up per topic and a permission change applies to the next request.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import ClientContext
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import Connection, Handler, KafkaContext, ResponseBody
from gateway.kafka.entities import build_response

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
# What SaslHandshake offers, in Kafka's order (sasl.enabled.mechanisms).
MECHANISMS: Final = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
# The requests a client may send before it is anyone (Kafka's SaslServerAuthenticator takes
# ApiVersions and the two SASL requests before authentication).
BEFORE_LOGIN: Final = frozenset(
    (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
)
# Allowed answers kept per connection before the cache starts over: a bound for a client that
# names ever new topics, far above a working set.
MAX_CACHED_ANSWERS: Final = 4096


def certificate_common_name(peercert: Any) -> str | None:
    """The CN of a verified client certificate (``ssl`` ``getpeercert()``), or None."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _log_in(connection: Connection, user: str) -> None:
    connection.login.logged_in = True
    connection.login.mechanism = None
    connection.login.scram = None
    connection.client = dataclasses.replace(connection.client, user=user)


def admit(context: KafkaContext, connection: Connection, request: Request) -> bool:
    """A request other than ApiVersions/SASL from a connection not logged in: log it in by its
    certificate or as anonymous, or say no (the caller closes the connection)."""
    login = connection.login
    api = context.api
    if login.failed or login.mechanism is not None:
        log.warning(
            "kafka: %s sent api %d %s; closing the connection",
            connection.peer,
            request.api_key,
            "after a failed SASL login" if login.failed else "during a SASL exchange",
        )
        return False
    if login.certificate_user is not None:
        result = api.login_certificate(connection.client, login.certificate_user)
    else:
        result = api.login_anonymous(connection.client)
    if not result.ok:
        log.warning(
            "kafka: %s not logged in (%s) sent api %d; closing the connection",
            connection.peer,
            result.reason,
            request.api_key,
        )
        return False
    _log_in(connection, result.user)
    return True


def allowed(context: KafkaContext, connection: Connection, operation: str, name: str) -> bool:
    """May this connection's principal do ``operation`` (a ``"kafka ..."`` key of the mapping
    table) on ``name``? A yes is kept until the security store changes; a no is asked again
    (it is not the hot path, and each refusal gets its audit line)."""
    login = connection.login
    api = context.api
    client = connection.client
    generation = api.security_generation(client)
    answers = login.allowed
    if generation != login.generation:
        answers.clear()
        login.generation = generation
    elif answers.get((operation, name)):
        return True
    if not api.authorize(client, operation, name):
        return False
    if len(answers) >= MAX_CACHED_ANSWERS:
        answers.clear()
    answers[(operation, name)] = True
    return True


# -- SASL ------------------------------------------------------------------------------------


async def handle_sasl_handshake(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    mechanism: str = body.mechanism
    login = connection.login
    error = ErrorCode.none
    if login.logged_in or login.mechanism is not None or login.failed:
        # Kafka: a second handshake on an authenticated connection is ILLEGAL_SASL_STATE.
        error = ErrorCode.illegal_sasl_state
    elif mechanism not in MECHANISMS:
        error = ErrorCode.unsupported_sasl_mechanism
        log.info("kafka: %s asked for SASL mechanism %r: unsupported", connection.peer, mechanism)
    else:
        login.mechanism = mechanism
    return build_response(
        ApiKey.SASL_HANDSHAKE,
        request.api_version,
        {"error_code": error, "mechanisms": list(MECHANISMS)},
    )


def _sasl_answer(
    request: Request, error: ErrorCode, message: str | None = None, token: bytes = b""
) -> ResponseBody:
    return build_response(
        ApiKey.SASL_AUTHENTICATE,
        request.api_version,
        {
            "error_code": error,
            "error_message": message,
            "auth_bytes": token,
            "session_lifetime": 0,
        },
    )


def _failed(connection: Connection, request: Request, mechanism: str) -> ResponseBody:
    login = connection.login
    login.failed = True
    login.mechanism = None
    login.scram = None
    # Kafka's words; the audit line (the core's) says why.
    return _sasl_answer(
        request,
        ErrorCode.sasl_authentication_failed,
        f"Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}",
    )


async def handle_sasl_authenticate(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    login = connection.login
    mechanism = login.mechanism
    body: Any = request.body
    token: bytes = bytes(body.auth_bytes)
    if mechanism is None or login.logged_in:
        return _sasl_answer(
            request, ErrorCode.illegal_sasl_state, "SaslAuthenticate without SaslHandshake"
        )
    api = context.api
    client: ClientContext = connection.client
    if mechanism == PLAIN:
        parts = token.split(b"\0")
        if len(parts) != 3:
            return _failed(connection, request, mechanism)
        try:
            user, password = parts[1].decode(), parts[2].decode()
        except UnicodeDecodeError:
            return _failed(connection, request, mechanism)
        login.mechanism = PLAIN  # an exchange in progress while the password is checked
        result = await api.login_password(client, user, password, PLAIN)
        if not result.ok:
            return _failed(connection, request, mechanism)
        _log_in(connection, result.user)
        return _sasl_answer(request, ErrorCode.none)
    scram = login.scram
    if scram is None:
        scram = login.scram = api.scram_login(client, mechanism)
        server_first = await scram.first(token)
        if server_first is None:
            return _failed(connection, request, mechanism)
        return _sasl_answer(request, ErrorCode.none, token=server_first)
    server_final = scram.final(token)
    if server_final is None or scram.result is None or not scram.result.ok:
        return _failed(connection, request, mechanism)
    _log_in(connection, scram.result.user)
    return _sasl_answer(request, ErrorCode.none, token=server_final)


HANDLERS: dict[int, Handler] = {
    ApiKey.SASL_HANDSHAKE: handle_sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: handle_sasl_authenticate,
}
