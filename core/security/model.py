"""The values the user store keeps: users, vhost permissions, topic permissions, Kafka ACLs.

Each is a frozen dataclass with a JSON form (``to_json`` / ``from_json``), which is what
:class:`core.security.store.SecurityStore` writes to the log. Nothing here holds a password:
a user carries a :class:`~core.security.passwords.PasswordHash` and SCRAM credentials.

- **Users** (RabbitMQ's): name, password hash with its algorithm, tags (``administrator``,
  ``management``, ``monitoring``, ``policymaker``, ``impersonator``, or any other word, as
  RabbitMQ accepts), SCRAM credentials per mechanism.
- **Vhost permissions** (RabbitMQ's ``set_permissions``): three regular expressions a resource
  name must match (searched, as RabbitMQ's ``re:run``, so anchor them) to be configured,
  written or read. ``""`` matches nothing.
- **Topic permissions** (RabbitMQ's ``set_topic_permissions``): per exchange, write and read
  expressions for routing keys, with ``{username}``, ``{vhost}``, ``{client_id}`` replaced.
- **Kafka ACLs** (``CreateAcls``): resource type, name and pattern, principal ``User:<name>``,
  host, operation, ALLOW or DENY, as Kafka's ``AclBinding``; the names are Kafka's, the wire
  numbers in the ``*_NUMBERS`` tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from core.security.passwords import NO_PASSWORD_HASH, PasswordHash
from core.security.scram import ScramCredential

# RabbitMQ's user tags with a meaning (rabbit_auth_backend_internal, management plugin).
TAG_ADMINISTRATOR: Final = "administrator"
TAG_MONITORING: Final = "monitoring"
TAG_MANAGEMENT: Final = "management"
TAG_POLICYMAKER: Final = "policymaker"
KNOWN_TAGS: Final = (TAG_ADMINISTRATOR, TAG_MONITORING, TAG_MANAGEMENT, TAG_POLICYMAKER)

# The longest user name kept (RabbitMQ's is a binary without limit; Kafka's SCRAM names and
# MQTT user names are UTF-8 strings; a bound keeps a log line and a key small).
MAX_USER_NAME_CHARS: Final = 255


class SecurityModelError(ValueError):
    """A value that cannot be stored (bad name, bad regular expression, unknown ACL word)."""


def check_user_name(name: str) -> str:
    if not name or len(name) > MAX_USER_NAME_CHARS or any(ord(c) < 0x20 for c in name):
        raise SecurityModelError(
            f"a user name is 1-{MAX_USER_NAME_CHARS} characters without control characters"
        )
    return name


def parse_tags(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """RabbitMQ's tags: a comma-separated string (``"administrator,management"``, the HTTP API's
    form) or a list; blanks dropped, order kept, duplicates removed."""
    words = text.split(",") if isinstance(text, str) else list(text)
    tags: list[str] = []
    for word in words:
        tag = str(word).strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tuple(tags)


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: PasswordHash = NO_PASSWORD_HASH
    tags: tuple[str, ...] = ()
    scram: Mapping[str, ScramCredential] = field(default_factory=dict)

    @property
    def is_administrator(self) -> bool:
        return TAG_ADMINISTRATOR in self.tags

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "hashing_algorithm": self.password.algorithm,
            "password_hash": self.password.value,
            "tags": list(self.tags),
            "scram": {mechanism: cred.to_json() for mechanism, cred in self.scram.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> User:
        scram = data.get("scram", {})
        assert isinstance(scram, dict)
        tags = data.get("tags", [])
        assert isinstance(tags, list)
        return cls(
            str(data["name"]),
            PasswordHash(str(data["hashing_algorithm"]), str(data["password_hash"])),
            tuple(str(tag) for tag in tags),
            {str(m): ScramCredential.from_json(str(m), c) for m, c in scram.items()},
        )


@dataclass(frozen=True, slots=True)
class VhostPermission:
    """RabbitMQ's configure / write / read expressions of one user in one vhost."""

    configure: str
    write: str
    read: str

    def to_json(self) -> dict[str, object]:
        return {"configure": self.configure, "write": self.write, "read": self.read}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> VhostPermission:
        return cls(str(data["configure"]), str(data["write"]), str(data["read"]))


@dataclass(frozen=True, slots=True)
class TopicPermission:
    """RabbitMQ's topic permission of one user, vhost and exchange: routing-key expressions."""

    exchange: str
    write: str
    read: str

    def to_json(self) -> dict[str, object]:
        return {"exchange": self.exchange, "write": self.write, "read": self.read}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TopicPermission:
        return cls(str(data["exchange"]), str(data["write"]), str(data["read"]))


# -- Kafka ACLs (org.apache.kafka.common.acl / resource) -------------------------------------

RESOURCE_TYPE_NUMBERS: Final = {
    "ANY": 1,
    "TOPIC": 2,
    "GROUP": 3,
    "CLUSTER": 4,
    "TRANSACTIONAL_ID": 5,
    "DELEGATION_TOKEN": 6,
    "USER": 7,
}
PATTERN_TYPE_NUMBERS: Final = {"ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
OPERATION_NUMBERS: Final = {
    "ANY": 1,
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
    "CREATE_TOKENS": 13,
    "DESCRIBE_TOKENS": 14,
}
PERMISSION_TYPE_NUMBERS: Final = {"ANY": 1, "DENY": 2, "ALLOW": 3}
# The words an ACL itself may hold (ANY and MATCH only select, in Describe/DeleteAcls filters).
ACL_RESOURCE_TYPES: Final = ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID")
ACL_PATTERN_TYPES: Final = ("LITERAL", "PREFIXED")
ACL_OPERATIONS: Final = tuple(op for op in OPERATION_NUMBERS if op != "ANY")
ACL_PERMISSION_TYPES: Final = ("DENY", "ALLOW")
CLUSTER_RESOURCE_NAME: Final = "kafka-cluster"  # Kafka's one cluster resource's name
WILDCARD: Final = "*"  # a literal ACL name or host, or User:*, matching every one
USER_PRINCIPAL_PREFIX: Final = "User:"


def _word(value: str, allowed: tuple[str, ...] | Mapping[str, int], what: str) -> str:
    if value not in allowed:
        raise SecurityModelError(f"unknown {what} {value!r} (known: {', '.join(allowed)})")
    return value


@dataclass(frozen=True, slots=True)
class KafkaAcl:
    """One ACL binding, as Kafka's ``AclBinding``."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission_type: str

    def __post_init__(self) -> None:
        _word(self.resource_type, ACL_RESOURCE_TYPES, "ACL resource type")
        _word(self.pattern_type, ACL_PATTERN_TYPES, "ACL pattern type")
        _word(self.operation, ACL_OPERATIONS, "ACL operation")
        _word(self.permission_type, ACL_PERMISSION_TYPES, "ACL permission type")
        if not self.principal.startswith(USER_PRINCIPAL_PREFIX):
            raise SecurityModelError(
                f"an ACL principal is User:<name> or User:*, not {self.principal!r}"
            )
        if not self.resource_name:
            raise SecurityModelError("an ACL needs a resource name")
        if self.pattern_type == "PREFIXED" and self.resource_name == WILDCARD:
            raise SecurityModelError("a PREFIXED ACL cannot have the name '*' (Kafka refuses it)")

    def key(self) -> str:
        return json.dumps(
            [
                self.resource_type,
                self.resource_name,
                self.pattern_type,
                self.principal,
                self.host,
                self.operation,
                self.permission_type,
            ]
        )

    @classmethod
    def from_key(cls, key: str) -> KafkaAcl:
        fields = json.loads(key)
        return cls(*[str(item) for item in fields])

    def applies_to(self, resource_type: str, name: str) -> bool:
        """Whether this ACL covers the resource (Kafka's matching: a literal name or ``*``, or
        a prefix)."""
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "LITERAL":
            return self.resource_name in (name, WILDCARD)
        return name.startswith(self.resource_name)


@dataclass(frozen=True, slots=True)
class KafkaAclFilter:
    """What DescribeAcls and DeleteAcls select: ``None`` or ``ANY`` matches every value; the
    pattern type ``MATCH`` selects the ACLs that would apply to ``resource_name`` (literal,
    ``*`` and prefixes of it), as Kafka's ``ResourcePatternFilter``."""

    resource_type: str = "ANY"
    resource_name: str | None = None
    pattern_type: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: str = "ANY"
    permission_type: str = "ANY"

    def __post_init__(self) -> None:
        _word(self.resource_type, RESOURCE_TYPE_NUMBERS, "ACL resource type")
        _word(self.pattern_type, PATTERN_TYPE_NUMBERS, "ACL pattern type")
        _word(self.operation, OPERATION_NUMBERS, "ACL operation")
        _word(self.permission_type, PERMISSION_TYPE_NUMBERS, "ACL permission type")

    def matches(self, acl: KafkaAcl) -> bool:
        if self.resource_type != "ANY" and acl.resource_type != self.resource_type:
            return False
        if self.pattern_type == "MATCH":
            if self.resource_name is None:
                return True
            if acl.pattern_type == "LITERAL":
                if acl.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(acl.resource_name):
                return False
        else:
            if self.pattern_type != "ANY" and acl.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and acl.resource_name != self.resource_name:
                return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation != "ANY" and acl.operation != self.operation:
            return False
        return self.permission_type == "ANY" or acl.permission_type == self.permission_type
