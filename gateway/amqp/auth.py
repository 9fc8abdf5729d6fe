"""Who an AMQP connection is, and what it may do (issue 18; docs/security.md, AMQP section).

Logins (Connection.Start-Ok). The server offers ``PLAIN`` and ``AMQPLAIN`` (RabbitMQ's
``auth_mechanisms``), and ``EXTERNAL`` on a TLS connection whose client certificate the TLS
layer verified (``--tls-ca`` with ``--tls-verify-peer``), as RabbitMQ's
``rabbit_auth_mechanism_ssl`` offers it only then (``should_offer``). PLAIN's response is
``authzid NUL user NUL password``; AMQPLAIN's a field table without its length with ``LOGIN``
and ``PASSWORD``; EXTERNAL's response is not looked at: the certificate's CN names the user,
who must exist in the store. Passwords are checked by the Broker API's one user store
(:meth:`BrokerAPI.login_password`: the host's slow-down, argon2id or an imported RabbitMQ hash,
``guest`` from loopback only, the audit line of a failure).

Access. Each channel method the mapping table lists (``core/security/mapping.py``: ``"amqp
basic.publish"``, ``"amqp queue.declare"``, ...) asks :meth:`Access.require` with the log topic
of the exchange or queue it touches; a refusal is a 403 ACCESS_REFUSED channel error with
RabbitMQ's text (``rabbit_access_control:check_resource_access`` and ``check_topic_access``;
the default exchange is ``amq.default`` there, as in RabbitMQ), and the core writes the audit
line. Answers are kept per connection until the security store's generation changes, so a
publish costs a dict look-up, and a permission changed over the HTTP API applies to the next
operation of every open connection.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from typing import Final

from core.api import SECURITY_OPERATIONS, BrokerAPI, ClientContext, LoginResult
from gateway.amqp.constants import ACCESS_REFUSED, COMMAND_INVALID
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError, AmqpError
from gateway.amqp.fieldtable import read_table

PLAIN: Final = "PLAIN"
AMQPLAIN: Final = "AMQPLAIN"
EXTERNAL: Final = "EXTERNAL"
# What Connection.Start offers, in RabbitMQ's default auth_mechanisms order.
PASSWORD_MECHANISMS: Final = (PLAIN, AMQPLAIN)
# RabbitMQ names the default exchange "" as this resource in permission checks and errors.
DEFAULT_EXCHANGE_RESOURCE: Final = "amq.default"
# Answers one connection keeps at most: a publisher to a topic exchange with ever new routing
# keys must not grow it without bound; cleared whole when full, far above a working set.
MAX_CACHED_ANSWERS: Final = 4096


def mechanisms_offered(certificate_user: str | None) -> str:
    """Connection.Start's ``mechanisms``: EXTERNAL only with a verified client certificate."""
    offered = PASSWORD_MECHANISMS + ((EXTERNAL,) if certificate_user is not None else ())
    return " ".join(offered)


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def password_credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(user, password) of a PLAIN or AMQPLAIN response; None when it is malformed."""
    if mechanism == PLAIN:
        parts = response.split(b"\x00")
        if len(parts) == 3:
            return _text(parts[1]), _text(parts[2])
        return None
    try:
        table, _ = read_table(len(response).to_bytes(4, "big") + response)
    except AmqpError:
        return None
    login, secret = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(login, str | bytes) and isinstance(secret, str | bytes):
        return _text(login), _text(secret)
    return None


async def log_in(
    api: BrokerAPI,
    context: ClientContext,
    mechanism: str,
    response: bytes,
    certificate_user: str | None,
) -> LoginResult:
    """Check Start-Ok's credentials against the user store. An unknown mechanism (or EXTERNAL
    without a verified certificate: not offered) is 503 COMMAND_INVALID, as RabbitMQ's
    ``rabbit_reader:get_auth_mechanism`` answers a mechanism it did not offer."""
    if mechanism == EXTERNAL and certificate_user is not None:
        return api.login_certificate(context, certificate_user)
    if mechanism not in PASSWORD_MECHANISMS:
        raise AmqpConnectionError(
            COMMAND_INVALID, f"COMMAND_INVALID - unknown authentication mechanism '{mechanism}'"
        )
    credentials = password_credentials(mechanism, response)
    if credentials is None:
        # Counted as a failed login (slow-down, audit line) under an empty user name.
        return await api.login_password(context, "", "", mechanism)
    user, password = credentials
    return await api.login_password(context, user, password, mechanism)


def refusal(permission: str, kind: str, name: str, vhost: str, user: str) -> AmqpChannelError:
    """RabbitMQ's ``check_resource_access`` error."""
    return AmqpChannelError(
        ACCESS_REFUSED,
        f"ACCESS_REFUSED - {permission} access to {kind} '{name or DEFAULT_EXCHANGE_RESOURCE}' "
        f"in vhost '{vhost}' refused for user '{user}'",
    )


def topic_refusal(
    permission: str, routing_key: str, exchange: str, vhost: str, user: str
) -> AmqpChannelError:
    """RabbitMQ's ``check_topic_access`` error."""
    return AmqpChannelError(
        ACCESS_REFUSED,
        f"ACCESS_REFUSED - {permission} access to topic '{routing_key}' in exchange "
        f"'{exchange}' in vhost '{vhost}' refused for user '{user}'",
    )


class Access:
    """The cached permission answers of one connection (after Connection.Open)."""

    __slots__ = ("_generation_now", "answers", "api", "context", "generation")

    def __init__(self, api: BrokerAPI, context: ClientContext) -> None:
        self.api = api
        self.context = context
        self._generation_now = api.security_generation  # (bound once: the publish path)
        self.generation = api.security_generation(context)
        self.answers: dict[tuple[str, str, str | None], bool] = {}

    def allowed(self, operation: str, topic: str, routing_key: str | None = None) -> bool:
        """May this connection do ``operation`` (an ``"amqp ..."`` key of the mapping table) on
        the exchange or queue whose log topic is ``topic``, with ``routing_key`` (topic
        exchanges only, as RabbitMQ checks topic permissions)?"""
        generation = self._generation_now(self.context)
        answers = self.answers
        if generation != self.generation:
            self.generation = generation
            answers.clear()
        key = (operation, topic, routing_key)
        answer = answers.get(key)
        if answer is None:
            answer = self.api.authorize(self.context, operation, topic, routing_key)
            if len(answers) >= MAX_CACHED_ANSWERS:
                answers.clear()
            answers[key] = answer
        return answer

    def require(
        self,
        operation: str,
        topic: str,
        kind: str,
        name: str,
        routing_key: str | None = None,
    ) -> None:
        """:meth:`allowed`, or the 403 channel error RabbitMQ answers: the topic permission's
        text when only the routing key is refused. ``kind`` and ``name``: the exchange or queue
        as the client named it (for the text)."""
        if self.allowed(operation, topic, routing_key):
            return
        context = self.context
        permission = SECURITY_OPERATIONS[operation].permission
        if routing_key is not None and self.allowed(operation, topic):
            raise topic_refusal(permission, routing_key, name, context.vhost, context.user)
        raise refusal(permission, kind, name, context.vhost, context.user)
