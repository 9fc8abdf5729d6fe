"""Logins and access checks: the Broker API's calls for security (issue 18, docs/security.md).

A gateway authenticates a connection with one of the ``login_*`` calls (or a
:class:`ScramLogin` for Kafka's SCRAM), puts the user name it gets into the connection's
:class:`ClientContext`, and asks :meth:`SecurityCalls.authorize` before each operation the
mapping table lists (``core/security/mapping.py:OPERATIONS``, keys such as
``"amqp basic.publish"``, ``"mqtt SUBSCRIBE"``, ``"kafka Produce"``), answering a refusal in its
own protocol's words (AMQP 403 ACCESS_REFUSED, MQTT 0x80/0x87, Kafka 29/30/31). Every refusal
and failed login writes an audit line; the calls decide from the store as it is now, so a
permission change applies to open connections at their next operation.

The Kafka admin requests (CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials,
AlterUserScramCredentials) change and read the same store through the calls at the end.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

from core.api.base import (
    PROTOCOL_AMQP,
    PROTOCOL_INTERNAL,
    PROTOCOL_KAFKA,
    PROTOCOL_MQTT,
    BrokerCalls,
    ClientContext,
)
from core.broker.node import Node
from core.security.config import MQTT_DENIED_DISCONNECT
from core.security.model import KafkaAcl, KafkaAclFilter
from core.security.scram import ScramCredential
from core.security.service import LoginResult, ScramLogin, SecurityService

PROTOCOL_NAMES: Final = {
    PROTOCOL_AMQP: "amqp",
    PROTOCOL_MQTT: "mqtt",
    PROTOCOL_KAFKA: "kafka",
    PROTOCOL_INTERNAL: "internal",
}


def protocol_name(context: ClientContext) -> str:
    return PROTOCOL_NAMES.get(context.protocol, str(context.protocol))


class SecurityCalls(BrokerCalls):
    """Logins, access decisions and the Kafka admin calls on users and ACLs."""

    def __init__(self, node: Node, security: SecurityService | None = None) -> None:
        super().__init__(node)
        self._security_service_given = security

    _security_service_given: SecurityService | None = None

    def _security(self) -> SecurityService:
        service = self._security_service_given
        if service is None:  # an API built without one (tests): defaults over the same log
            service = self._security_service_given = SecurityService(self._node.metadata)
        return service

    # -- logins ----------------------------------------------------------------------------

    async def login_password(
        self, context: ClientContext, user: str, password: str, mechanism: str = "PLAIN"
    ) -> LoginResult:
        """Check a user name and password (AMQP PLAIN/AMQPLAIN, MQTT, Kafka SASL PLAIN). May
        wait: the host's login slow-down, then the hash check in a thread."""
        return await self._security().login_password(
            protocol_name(context), context.peer, user, password, mechanism
        )

    def login_anonymous(self, context: ClientContext) -> LoginResult:
        """A client without credentials (MQTT without user name, Kafka without SASL): allowed
        as the ``[auth] anonymous`` setting says; it then acts as the anonymous user."""
        return self._security().login_anonymous(protocol_name(context), context.peer)

    def login_certificate(self, context: ClientContext, user: str) -> LoginResult:
        """A client certificate verified by the TLS layer names ``user`` (its CN; AMQP
        EXTERNAL, MQTT's identity as user name, Kafka's SSL principal)."""
        return self._security().login_certificate(protocol_name(context), context.peer, user)

    def scram_login(self, context: ClientContext, mechanism: str) -> ScramLogin:
        """A SCRAM-SHA-256 or -512 exchange to feed the client's messages to (ValueError for
        another mechanism)."""
        return self._security().scram_login(protocol_name(context), context.peer, mechanism)

    # -- access ----------------------------------------------------------------------------

    def authorize(
        self,
        context: ClientContext,
        operation: str,
        name: str,
        routing_key: str | None = None,
    ) -> bool:
        """May the context's user do ``operation`` (a key of the mapping table) on ``name``
        (a log topic; a group id; a transactional id; ``""`` for the cluster), with
        ``routing_key`` when the operation carries one? A refusal writes an audit line."""
        return self._security().authorize(
            protocol_name(context),
            context.peer,
            context.user,
            context.client_id,
            operation,
            name,
            routing_key,
        )

    def may_open_vhost(self, context: ClientContext, vhost: str) -> bool:
        """May the context's user open ``vhost`` (AMQP Connection.Open: RabbitMQ's
        ``check_vhost_access``, any permission on it)? A refusal writes an audit line."""
        return self._security().may_open_vhost(
            protocol_name(context), context.peer, context.user, vhost
        )

    async def import_users(
        self,
        context: ClientContext,
        users: Mapping[str, tuple[str, Collection[str]]],
        vhosts: Sequence[str],
    ) -> None:
        """Bring users a listener's settings name (name -> (password, vhosts it may open;
        ``"*"``: all of ``vhosts``)) into the one user store, as the config file's
        ``[amqp.users]`` are: a missing user is created, a vhost without a permission for it
        gets ``.*`` for all three; nothing the store holds is overwritten. ``vhosts``: the
        listener's vhosts (permissions may be set on them from then on)."""
        service = self._security()
        service.add_vhosts(vhosts)
        await service.import_config_users(
            {name: (password, tuple(opened)) for name, (password, opened) in users.items()}
        )

    def security_generation(self, context: ClientContext) -> int:
        """A number that changes with every change of users, permissions or ACLs: a gateway
        may keep :meth:`authorize`'s answers for a connection while it stays the same.
        (Asked before every publish: no more than two attribute reads once the service is
        there.)"""
        service = self._security_service_given
        if service is None:
            service = self._security()
        return service.store.generation

    def denied_mqtt_publish_closes(self, context: ClientContext) -> bool:
        """Whether an MQTT 3.1.1 PUBLISH without permission closes the connection (RabbitMQ)
        instead of being acknowledged and dropped (Mosquitto, the default)."""
        return self._security().config.mqtt_denied_publish == MQTT_DENIED_DISCONNECT

    # -- Kafka admin: ACLs and SCRAM credentials -------------------------------------------

    async def create_acls(self, context: ClientContext, acls: Sequence[KafkaAcl]) -> None:
        """Store the ACLs (durable on return)."""
        await self._security().add_acls(acls)

    def describe_acls(self, context: ClientContext, selected: KafkaAclFilter) -> list[KafkaAcl]:
        return self._security().store.acls(selected)

    async def delete_acls(self, context: ClientContext, selected: KafkaAclFilter) -> list[KafkaAcl]:
        """Delete what the filter selects; returns the deleted ACLs."""
        return await self._security().delete_acls(selected)

    def scram_credentials(
        self, context: ClientContext, users: Sequence[str] | None = None
    ) -> dict[str, list[ScramCredential]]:
        """User name -> its SCRAM credentials (every user with one when ``users`` is None; a
        named user without any maps to ``[]``)."""
        store = self._security().store
        names = [user.name for user in store.users()] if users is None else list(users)
        found: dict[str, list[ScramCredential]] = {}
        for name in names:
            user = store.user(name)
            credentials = list(user.scram.values()) if user is not None else []
            if credentials or users is not None:
                found[name] = credentials
        return found

    async def upsert_scram_credential(
        self,
        context: ClientContext,
        user: str,
        mechanism: str,
        salt: bytes,
        salted_password: bytes,
        iterations: int,
    ) -> None:
        """AlterUserScramCredentials' upsertion (ValueError: mechanism or iterations)."""
        await self._security().set_scram_credential(
            user, mechanism, salt, salted_password, iterations
        )

    async def delete_scram_credential(
        self, context: ClientContext, user: str, mechanism: str
    ) -> bool:
        """AlterUserScramCredentials' deletion; False when the user had no such credential."""
        return await self._security().delete_scram_credential(user, mechanism)
