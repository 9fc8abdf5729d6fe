"""The one authorization service: may this principal do this operation on this name?

Every protocol's access checks come here, through the Broker API (``core/api/security.py``),
as an operation of :data:`core.security.mapping.OPERATIONS` and a name (a log topic, a group id,
a transactional id). The decision, in the order Kafka's and RabbitMQ's authorizers take it:

1. a Kafka DENY ACL for the principal (``User:<name>``, ``User:*``; anonymous clients are
   ``User:ANONYMOUS``), the client's host (or ``*``) and the operation (or ``ALL``) refuses;
2. else the user's vhost permission grants when its expression (configure, write or read, as
   the operation needs; any of them for ``describe``) matches the resource's name, and, for an
   exchange with a topic permission and an operation that carries a routing key, the topic
   permission's write or read expression matches the routing key; ``administrator`` operations
   need the user's ``administrator`` tag;
3. else a Kafka ALLOW ACL grants (READ, WRITE, DELETE and ALTER imply DESCRIBE;
   ALTER_CONFIGS implies DESCRIBE_CONFIGS);
4. else the operation is refused.

Expressions are searched (``re.search``: RabbitMQ's ``re:run``, so ``^alice\\.`` anchors and
``alice`` matches anywhere); ``""`` matches nothing, as in RabbitMQ. In topic permissions
``{username}``, ``{vhost}`` and ``{client_id}`` are replaced by the caller's values, escaped, so
a user named ``a.*`` gets no more than the literal name (RabbitMQ substitutes them unescaped).

An anonymous client acts with the vhost permissions and tags of the configured anonymous user
(RabbitMQ's MQTT ``default_user``, ``guest`` by default). A deleted user's open connections are
refused from their next operation on: decisions are cached per store generation, and every
change of the store drops the cache. Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

from core.security.mapping import (
    ADMINISTRATOR,
    DESCRIBE,
    EXCHANGE,
    IMPLIED_BY_ALLOW,
    OPERATIONS,
    WRITE,
    OperationRule,
    Resource,
    resource_of,
)
from core.security.model import USER_PRINCIPAL_PREFIX, WILDCARD, KafkaAcl, VhostPermission
from core.security.store import SecurityStore

# Kafka's principal for a client that did not authenticate (KafkaPrincipal.ANONYMOUS).
ANONYMOUS_PRINCIPAL: Final = "User:ANONYMOUS"
# Decisions kept before the cache is cleared whole: a bound on memory for a client that
# publishes to ever new names (MQTT topics with ids in them), far above a working set.
MAX_CACHED_DECISIONS: Final = 65_536


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def expression_error(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable regular expression, or None (HTTP answers 400)."""
    try:
        re.compile(pattern)
    except re.error as error:
        return str(error)
    return None


def matches(pattern: str, value: str) -> bool:
    """RabbitMQ's permission match: ``""`` matches nothing, otherwise a regex search."""
    if not pattern:
        return False
    compiled = _compiled(pattern)
    return compiled is not None and compiled.search(value) is not None


def expand_variables(pattern: str, *, username: str, vhost: str, client_id: str) -> str:
    """RabbitMQ's topic-permission variables, each value escaped."""
    if "{" not in pattern:
        return pattern
    return (
        pattern.replace("{username}", re.escape(username))
        .replace("{vhost}", re.escape(vhost))
        .replace("{client_id}", re.escape(client_id))
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer, with what was checked (for the audit line)."""

    allowed: bool
    rule: OperationRule
    resource: Resource
    reason: str  # "vhost permission", "kafka acl allow", "kafka acl deny", "no permission"


class Authorizer:
    def __init__(self, store: SecurityStore, anonymous_user: str | None) -> None:
        self.store = store
        self.anonymous_user = anonymous_user
        self._cache: dict[tuple[str, str, str, str, str, str | None], Decision] = {}
        self._acls_by_type: dict[str, list[KafkaAcl]] = {}
        self._refresh()
        store.add_listener(self._refresh)

    def _refresh(self) -> None:
        self._cache.clear()
        by_type: dict[str, list[KafkaAcl]] = {}
        for acl in self.store.acls():
            by_type.setdefault(acl.resource_type, []).append(acl)
        self._acls_by_type = by_type

    # -- the decision ----------------------------------------------------------------------

    def decide(
        self,
        user: str,
        host: str,
        client_id: str,
        operation: str,
        name: str,
        routing_key: str | None = None,
    ) -> Decision:
        """May ``user`` (``""``: anonymous) connected from ``host`` do ``operation`` (a key of
        :data:`OPERATIONS`) on ``name``, with ``routing_key`` when the operation carries one?"""
        key = (user, host, client_id, operation, name, routing_key)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        rule = OPERATIONS[operation]  # KeyError: a gateway's typo, found by its tests
        decision = self._decide(user, host, client_id, rule, name, routing_key)
        if len(self._cache) >= MAX_CACHED_DECISIONS:
            self._cache.clear()
        self._cache[key] = decision
        return decision

    def _decide(
        self,
        user: str,
        host: str,
        client_id: str,
        rule: OperationRule,
        name: str,
        routing_key: str | None,
    ) -> Decision:
        resource = resource_of(rule.resource, name)
        principal = USER_PRINCIPAL_PREFIX + user if user else ANONYMOUS_PRINCIPAL
        if self._acl_says("DENY", principal, host, resource, (rule.kafka_operation, "ALL")):
            return Decision(False, rule, resource, "kafka acl deny")
        acting = user or self.anonymous_user
        if acting is not None and self._vhost_grants(
            acting, client_id, rule, resource, routing_key
        ):
            return Decision(True, rule, resource, "vhost permission")
        implied = (*IMPLIED_BY_ALLOW.get(rule.kafka_operation, (rule.kafka_operation,)), "ALL")
        if self._acl_says("ALLOW", principal, host, resource, implied):
            return Decision(True, rule, resource, "kafka acl allow")
        return Decision(False, rule, resource, "no permission")

    def _vhost_grants(
        self,
        user: str,
        client_id: str,
        rule: OperationRule,
        resource: Resource,
        routing_key: str | None,
    ) -> bool:
        record = self.store.user(user)
        if record is None:
            return False
        if rule.permission == ADMINISTRATOR:
            return record.is_administrator
        permission = self.store.permission(resource.vhost, user)
        if permission is None:
            return False
        if not _permits(permission, rule.permission, resource.name):
            return False
        if rule.routing_key and routing_key is not None and resource.kind == EXCHANGE:
            topic = self.store.topic_permissions_of(resource.vhost, user).get(resource.name)
            if topic is not None:
                pattern = topic.write if rule.permission == WRITE else topic.read
                pattern = expand_variables(
                    pattern, username=user, vhost=resource.vhost, client_id=client_id
                )
                return matches(pattern, routing_key)
        return True

    def _acl_says(
        self,
        permission_type: str,
        principal: str,
        host: str,
        resource: Resource,
        operations: tuple[str, ...],
    ) -> bool:
        for acl in self._acls_by_type.get(resource.acl_type, ()):
            if (
                acl.permission_type == permission_type
                and acl.operation in operations
                and acl.principal in (principal, USER_PRINCIPAL_PREFIX + WILDCARD)
                and acl.host in (host, WILDCARD)
                and acl.applies_to(resource.acl_type, resource.acl_name)
            ):
                return True
        return False


def _permits(permission: VhostPermission, needed: str, name: str) -> bool:
    if needed == DESCRIBE:
        return any(
            matches(pattern, name)
            for pattern in (permission.configure, permission.write, permission.read)
        )
    pattern: str = getattr(permission, needed)
    return matches(pattern, name)
