"""SecurityStore: users, vhost permissions, topic permissions and Kafka ACLs, durable metadata.

Everything is metadata of kind ``security`` (a :class:`~core.cluster.metadata.MetadataStore`;
on a single node the system topic ``__security``: one record per change, replayed on start,
compacted by snapshots), so that a restart keeps it, ``braid log dump`` and Spark can audit its
history, and a cluster can share it (docs/cluster.md section 4). Keys are JSON arrays
(``["user", name]``, ``["permission", vhost, user]``, ``["topic-permission", vhost, user,
exchange]``, ``["acl", ...]``, ``["initialized"]``); values are the JSON of
:mod:`core.security.model`. No value holds a password: hashes and SCRAM keys only.

A fresh store (no ``["initialized"]`` key) gets RabbitMQ's first-boot user: ``guest`` with the
password ``guest``, tag ``administrator`` and ``.*`` permissions on ``/``, once; deleting it
later is kept (RabbitMQ creates its default user only when its database is new).

Each change returns the metadata version to wait for (:meth:`SecurityStore.last_version`, for
:meth:`MetadataStore.wait_durable`) and bumps :attr:`SecurityStore.generation`, which the
authorizer's caches compare. Not thread-safe: the event loop's thread, like the log store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Final

from core.broker.eager import Pending, run_eagerly
from core.cluster.local import SECURITY_TOPIC as SECURITY_TOPIC  # re-exported: named here
from core.cluster.metadata import KIND_SECURITY, Change, MetadataStore
from core.security.model import (
    KafkaAcl,
    KafkaAclFilter,
    TopicPermission,
    User,
    VhostPermission,
    check_user_name,
)
from core.security.passwords import PasswordHash, hash_password
from core.security.scram import ScramCredential, credentials_from_password

DEFAULT_USER: Final = "guest"  # RabbitMQ's default_user / default_pass
DEFAULT_PASSWORD: Final = "guest"
DEFAULT_VHOST: Final = "/"
FULL_ACCESS: Final = VhostPermission(".*", ".*", ".*")

_USER: Final = "user"
_PERMISSION: Final = "permission"
_TOPIC_PERMISSION: Final = "topic-permission"
_ACL: Final = "acl"
_INITIALIZED: Final = "initialized"


def _key(*parts: str) -> str:
    return json.dumps(list(parts))


class SecurityStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self._setup(metadata)
        if metadata.get(KIND_SECURITY, _key(_INITIALIZED)) is None:
            # A store that answers at once (the single node's) is set up now; one that must
            # wait (Redis) is set up by open(), which awaits it.
            booting = run_eagerly(self._first_boot())
            if isinstance(booting, Pending):
                booting.close()
                raise ValueError(
                    "this metadata store waits: make the SecurityStore with "
                    "await SecurityStore.open(metadata)"
                )

    @classmethod
    async def open(cls, metadata: MetadataStore) -> SecurityStore:
        """The store over ``metadata``, its first-boot user made (awaited) when it is new."""
        store = cls.__new__(cls)
        store._setup(metadata)
        if metadata.get(KIND_SECURITY, _key(_INITIALIZED)) is None:
            await store._first_boot()
        return store

    def _setup(self, metadata: MetadataStore) -> None:
        """The store's state, loaded from ``metadata``."""
        self.metadata = metadata
        self.generation = 0
        self._listeners: list[Callable[[], None]] = []
        self._users: dict[str, User] = {}
        self._permissions: dict[tuple[str, str], VhostPermission] = {}
        self._topic_permissions: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        self._acls: dict[str, KafkaAcl] = {}
        self._last_version = 0
        self._load()

    # -- loading ---------------------------------------------------------------------------

    def _load(self) -> None:
        for key, value in self.metadata.items(KIND_SECURITY):
            self._apply(key, value)

    def _apply(self, key: str, value: bytes | None) -> None:
        parts = json.loads(key)
        kind = parts[0]
        data = json.loads(value) if value is not None else None
        if kind == _USER:
            if data is None:
                self._users.pop(parts[1], None)
            else:
                self._users[parts[1]] = User.from_json(data)
        elif kind == _PERMISSION:
            if data is None:
                self._permissions.pop((parts[1], parts[2]), None)
            else:
                self._permissions[(parts[1], parts[2])] = VhostPermission.from_json(data)
        elif kind == _TOPIC_PERMISSION:
            per_user = self._topic_permissions.setdefault((parts[1], parts[2]), {})
            if data is None:
                per_user.pop(parts[3], None)
                if not per_user:
                    del self._topic_permissions[(parts[1], parts[2])]
            else:
                per_user[parts[3]] = TopicPermission.from_json(data)
        elif kind == _ACL:
            acl_key = json.dumps(parts[1:])
            if data is None:
                self._acls.pop(acl_key, None)
            else:
                self._acls[acl_key] = KafkaAcl.from_key(acl_key)

    def apply_remote(self, key: str, value: bytes | None) -> None:
        """Take the entry ``key`` another node stored (``value``: the store's JSON, None:
        deleted), as loading it at start would, and tell the listeners (the authorizer's
        caches)."""
        self._apply(key, value)
        self._changed()

    async def _first_boot(self) -> None:
        await self.put_user(
            User(
                DEFAULT_USER,
                hash_password(DEFAULT_PASSWORD),
                ("administrator",),
                credentials_from_password(DEFAULT_PASSWORD),
            )
        )
        await self.set_permission(DEFAULT_VHOST, DEFAULT_USER, FULL_ACCESS)
        await self._put(_key(_INITIALIZED), {})

    # -- changes ---------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change (the authorizer drops its caches)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.generation += 1
        for listener in self._listeners:
            listener()

    async def _put(self, key: str, value: object) -> int:
        raw = json.dumps(value, sort_keys=True).encode()
        self._last_version = await self.metadata.apply([Change(KIND_SECURITY, key, raw)])
        self._apply(key, raw)
        self._changed()
        return self._last_version

    async def _delete(self, key: str) -> bool:
        if self.metadata.get(KIND_SECURITY, key) is None:
            return False
        self._last_version = await self.metadata.apply([Change(KIND_SECURITY, key, None)])
        self._apply(key, None)
        self._changed()
        return True

    @property
    def last_version(self) -> int:
        """The metadata version of the last change: wait for it to make every change durable."""
        return self._last_version

    # -- users -----------------------------------------------------------------------------

    def user(self, name: str) -> User | None:
        return self._users.get(name)

    def users(self) -> list[User]:
        return sorted(self._users.values(), key=lambda user: user.name)

    async def put_user(self, user: User) -> int:
        check_user_name(user.name)
        return await self._put(_key(_USER, user.name), user.to_json())

    async def delete_user(self, name: str) -> bool:
        """Delete the user, its permissions and topic permissions (RabbitMQ does the same);
        False when there was no such user."""
        if name not in self._users:
            return False
        for vhost, user in list(self._permissions):
            if user == name:
                await self._delete(_key(_PERMISSION, vhost, user))
        for vhost, user in list(self._topic_permissions):
            if user == name:
                for exchange in list(self._topic_permissions.get((vhost, user), {})):
                    await self._delete(_key(_TOPIC_PERMISSION, vhost, user, exchange))
        return await self._delete(_key(_USER, name))

    async def set_password(
        self, name: str, password: PasswordHash, scram: dict[str, ScramCredential]
    ) -> int:
        user = self._users[name]
        return await self.put_user(User(name, password, user.tags, scram))

    # -- vhost permissions -----------------------------------------------------------------

    def permission(self, vhost: str, user: str) -> VhostPermission | None:
        return self._permissions.get((vhost, user))

    def permissions(self) -> Iterator[tuple[str, str, VhostPermission]]:
        """``(vhost, user, permission)`` sorted by vhost, then user."""
        for (vhost, user), permission in sorted(self._permissions.items()):
            yield vhost, user, permission

    async def set_permission(self, vhost: str, user: str, permission: VhostPermission) -> int:
        return await self._put(_key(_PERMISSION, vhost, user), permission.to_json())

    async def clear_permission(self, vhost: str, user: str) -> bool:
        return await self._delete(_key(_PERMISSION, vhost, user))

    # -- topic permissions -----------------------------------------------------------------

    def topic_permissions_of(self, vhost: str, user: str) -> dict[str, TopicPermission]:
        """Exchange name -> topic permission of ``user`` in ``vhost`` (a copy)."""
        return dict(self._topic_permissions.get((vhost, user), {}))

    def topic_permissions(self) -> Iterator[tuple[str, str, TopicPermission]]:
        for (vhost, user), per_exchange in sorted(self._topic_permissions.items()):
            for _exchange, permission in sorted(per_exchange.items()):
                yield vhost, user, permission

    async def set_topic_permission(self, vhost: str, user: str, permission: TopicPermission) -> int:
        key = _key(_TOPIC_PERMISSION, vhost, user, permission.exchange)
        return await self._put(key, permission.to_json())

    async def clear_topic_permissions(
        self, vhost: str, user: str, exchange: str | None = None
    ) -> bool:
        """Clear one exchange's topic permission, or all of the user's in the vhost."""
        exchanges = list(self._topic_permissions.get((vhost, user), {}))
        if exchange is not None:
            exchanges = [name for name in exchanges if name == exchange]
        cleared = False
        for name in exchanges:
            cleared |= await self._delete(_key(_TOPIC_PERMISSION, vhost, user, name))
        return cleared

    # -- Kafka ACLs ------------------------------------------------------------------------

    def acls(self, selected: KafkaAclFilter | None = None) -> list[KafkaAcl]:
        every = [self._acls[key] for key in sorted(self._acls)]
        return every if selected is None else [acl for acl in every if selected.matches(acl)]

    async def add_acl(self, acl: KafkaAcl) -> int:
        return await self._put(_ACL_PREFIX + acl.key()[1:], {})

    async def delete_acls(self, selected: KafkaAclFilter) -> list[KafkaAcl]:
        """Delete every ACL the filter selects; returns them."""
        deleted = self.acls(selected)
        for acl in deleted:
            await self._delete(_ACL_PREFIX + acl.key()[1:])
        return deleted


# An ACL's table key: ["acl", <its own key's fields>] (its key without the opening bracket).
_ACL_PREFIX: Final = '["acl", '
