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

Which check each API makes, and how a refusal answers, follows Kafka's ``KafkaApis`` with its
``AclAuthorizer`` (docs/security.md, Kafka section): a transaction's requests need WRITE on the
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 53) before anything else, then WRITE
on each topic added (TOPIC_AUTHORIZATION_FAILED, 29; the authorized partitions of a refused
request are OPERATION_NOT_ATTEMPTED, 55) or READ on the group whose offsets it commits
(GROUP_AUTHORIZATION_FAILED, 30) and on the committed topics (29). DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs check each resource on its own
(:func:`config_refusal`): a topic's DESCRIBE_CONFIGS / ALTER_CONFIGS (29), a group's (30), the
broker's (and its loggers') on the cluster (CLUSTER_AUTHORIZATION_FAILED, 31), before the
resource is looked at, so a refused client learns nothing of whether it exists.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import ClientContext, is_system_topic
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import Connection, Handler, KafkaContext, ResponseBody
from gateway.kafka.entities import build_response
from gateway.kafka.tagfilters import GROUP_RESOURCE_TYPES

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
# What SaslHandshake offers, in Kafka's order (sasl.enabled.mechanisms).
MECHANISMS: Final = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
# SaslHandshake v1 (KIP-152): the SASL tokens go in SaslAuthenticate requests.
SASL_HANDSHAKE_WITH_AUTHENTICATE: Final = 1
# The requests a client may send before it is anyone (Kafka's SaslServerAuthenticator takes
# ApiVersions and the two SASL requests before authentication).
BEFORE_LOGIN: Final = frozenset(
    (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
)
# Allowed answers kept per connection before the cache starts over: a bound for a client that
# names ever new topics, far above a working set.
MAX_CACHED_ANSWERS: Final = 4096
# DescribeConfigs / AlterConfigs resource types (ConfigResource.Type) and the resource each is
# authorized as (KafkaApis.authorizeConfigResource): a topic, the cluster, or a group
# (tagfilters.GROUP_RESOURCE_TYPES: 32, and 3 from librdkafka < 2.10).
CONFIG_TOPIC: Final = 2
CONFIG_BROKER: Final = 4
CONFIG_BROKER_LOGGER: Final = 8
# Kafka's texts for the three refusals (Errors.*.message()), which clients print.
TOPIC_AUTHORIZATION_FAILED_TEXT: Final = "Topic authorization failed."
GROUP_AUTHORIZATION_FAILED_TEXT: Final = "Group authorization failed."
CLUSTER_AUTHORIZATION_FAILED_TEXT: Final = "Cluster authorization failed."
TRANSACTIONAL_ID_AUTHORIZATION_FAILED_TEXT: Final = "Transactional Id authorization failed."


def _log_in(connection: Connection, user: str) -> None:
    connection.login.logged_in = True
    connection.login.mechanism = None
    connection.login.scram = None
    connection.client = dataclasses.replace(connection.client, user=user)


def admit(context: KafkaContext, connection: Connection, api_key: int) -> bool:
    """A request other than ApiVersions/SASL from a connection not logged in: log it in by its
    certificate or as anonymous, or say no (the caller closes the connection)."""
    login = connection.login
    api = context.api
    if login.failed or login.mechanism is not None:
        log.warning(
            "kafka: %s sent api %d %s; closing the connection",
            connection.peer,
            api_key,
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
            api_key,
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


def add_partitions_refusals(
    context: KafkaContext,
    connection: Connection,
    transactional_id: str,
    partitions: list[tuple[str, int]],
) -> dict[tuple[str, int], ErrorCode] | None:
    """AddPartitionsToTxn's answer when the connection may not add these partitions, or None
    when it may: without WRITE on the transactional id every partition is 53; else a topic
    without WRITE (the broker's ``__`` topics never have it) is 29 and, since one refusal
    fails the whole request, each other partition is OPERATION_NOT_ATTEMPTED (as KafkaApis)."""
    if not allowed(context, connection, "kafka AddPartitionsToTxn", transactional_id):
        return dict.fromkeys(partitions, ErrorCode.transactional_id_authorization_failed)
    refused = {
        topic
        for topic, _ in partitions
        if is_system_topic(topic)
        or not allowed(context, connection, "kafka AddPartitionsToTxn topic", topic)
    }
    if not refused:
        return None
    return {
        (topic, partition): (
            ErrorCode.topic_authorization_failed
            if topic in refused
            else ErrorCode.operation_not_attempted
        )
        for topic, partition in partitions
    }


def add_offsets_refusal(
    context: KafkaContext, connection: Connection, transactional_id: str, group_id: str
) -> ErrorCode:
    """AddOffsetsToTxn: WRITE on the transactional id (53), then READ on the group (30)."""
    if not allowed(context, connection, "kafka AddOffsetsToTxn", transactional_id):
        return ErrorCode.transactional_id_authorization_failed
    if not allowed(context, connection, "kafka AddOffsetsToTxn group", group_id):
        return ErrorCode.group_authorization_failed
    return ErrorCode.none


def txn_offset_commit_refusal(
    context: KafkaContext, connection: Connection, transactional_id: str, group_id: str
) -> ErrorCode:
    """TxnOffsetCommit as a whole: WRITE on the transactional id (53), then READ on the group
    (30); each topic's READ is checked per partition by the handler (29)."""
    if not allowed(context, connection, "kafka TxnOffsetCommit transaction", transactional_id):
        return ErrorCode.transactional_id_authorization_failed
    if not allowed(context, connection, "kafka TxnOffsetCommit", group_id):
        return ErrorCode.group_authorization_failed
    return ErrorCode.none


def config_refusal(
    context: KafkaContext,
    connection: Connection,
    resource_type: int,
    name: str,
    *,
    alter: bool,
) -> tuple[ErrorCode, str] | None:
    """The answer (error, message) for a DescribeConfigs (``alter=False``) or AlterConfigs /
    IncrementalAlterConfigs resource this connection may not see or change, or None when it
    may (or the type is none Kafka authorizes: the handler answers it as unsupported)."""
    verb = "AlterConfigs" if alter else "DescribeConfigs"
    if resource_type == CONFIG_TOPIC:
        if allowed(context, connection, f"kafka {verb} topic", name):
            return None
        return ErrorCode.topic_authorization_failed, TOPIC_AUTHORIZATION_FAILED_TEXT
    if resource_type in (CONFIG_BROKER, CONFIG_BROKER_LOGGER):
        if allowed(context, connection, f"kafka {verb} broker", ""):
            return None
        return ErrorCode.cluster_authorization_failed, CLUSTER_AUTHORIZATION_FAILED_TEXT
    if resource_type in GROUP_RESOURCE_TYPES:
        if allowed(context, connection, f"kafka {verb} group", name):
            return None
        return ErrorCode.group_authorization_failed, GROUP_AUTHORIZATION_FAILED_TEXT
    return None


# -- SASL ------------------------------------------------------------------------------------


async def handle_sasl_handshake(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    mechanism: str = body.mechanism
    login = connection.login
    error = ErrorCode.none
    if request.api_version < SASL_HANDSHAKE_WITH_AUTHENTICATE:
        # v0: raw SASL tokens would follow, which the decoder does not read (apis.py).
        error = ErrorCode.unsupported_version
        log.info(
            "kafka: %s sent SaslHandshake v0 (raw SASL tokens): unsupported, v1 is",
            connection.peer,
        )
    elif login.logged_in or login.mechanism is not None or login.failed:
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
