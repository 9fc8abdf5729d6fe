"""LimitsStore: RabbitMQ's per-user and per-vhost limits, durable metadata.

RabbitMQ keeps user limits (``max-connections``, ``max-channels``) in the user record and vhost
limits (``max-connections``, ``max-queues``) as the vhost's ``vhost-limits`` runtime parameter;
both are set with ``PUT /api/user-limits/{user}/{name}`` and ``PUT /api/vhost-limits/{vhost}/
{name}`` ``{"value": N}``. Here both are metadata of kind ``limit`` (a
:class:`~core.cluster.metadata.MetadataStore`; on a single node the system topic ``__limits``:
one record per change, replayed on start). Keys are
JSON arrays ``["user", name]`` and ``["vhost", name]``; values are JSON objects
``{"max-connections": N, ...}``. A negative value means no limit and ``0`` refuses every
connection or queue, as RabbitMQ (``rabbit_vhost_limit:is_over_connection_limit``).

Not thread-safe: the event loop's thread, like the log store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from core.cluster.local import LIMITS_TOPIC as LIMITS_TOPIC  # re-exported: named here
from core.cluster.metadata import KIND_LIMIT, Change, MetadataStore

MAX_CONNECTIONS: Final = "max-connections"
MAX_CHANNELS: Final = "max-channels"
MAX_QUEUES: Final = "max-queues"
# The names each kind accepts (rabbit_auth_backend_internal:user_limit_validation,
# rabbit_vhost_limit:vhost_limit_validation).
USER_LIMIT_NAMES: Final = (MAX_CONNECTIONS, MAX_CHANNELS)
VHOST_LIMIT_NAMES: Final = (MAX_CONNECTIONS, MAX_QUEUES)
USER: Final = "user"
VHOST: Final = "vhost"
_NAMES: Final = {USER: USER_LIMIT_NAMES, VHOST: VHOST_LIMIT_NAMES}


class LimitError(ValueError):
    """A limit that cannot be set; the message is RabbitMQ's (a 400 ``bad_request``)."""


def _key(kind: str, name: str) -> str:
    return json.dumps([kind, name])


class LimitsStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._limits: dict[tuple[str, str], dict[str, int]] = {}
        for key, value in metadata.items(KIND_LIMIT):
            kind, name = json.loads(key)
            self._limits[(kind, name)] = dict(json.loads(value))
        self._last_version = 0

    def apply_remote(self, key: str, value: bytes | None) -> None:
        """Take the limits of ``key`` another node stored (``value``: the store's JSON, None:
        removed), as loading them at start would."""
        kind, name = json.loads(key)
        if value is None:
            self._limits.pop((kind, name), None)
        else:
            self._limits[(kind, name)] = dict(json.loads(value))

    @property
    def last_version(self) -> int:
        """The metadata version of the last change: wait for it (``metadata.wait_durable``)
        to make every change durable."""
        return self._last_version

    def limits(self, kind: str) -> dict[str, dict[str, int]]:
        """``{user or vhost: {limit name: value}}`` of every one that has limits."""
        return {name: dict(values) for (k, name), values in self._limits.items() if k == kind}

    def limit(self, kind: str, name: str, limit: str) -> int | None:
        """The limit's value, or None when there is none (not set, or negative)."""
        value = self._limits.get((kind, name), {}).get(limit)
        return None if value is None or value < 0 else value

    async def set_limit(self, kind: str, name: str, limit: str, value: object) -> int:
        """Set one limit (RabbitMQ's update_limit); returns the metadata version to wait for."""
        allowed = _NAMES[kind]
        if limit not in allowed:
            # rabbit_parameter_validation:proplist's text for a key it does not know.
            raise LimitError(f'Unrecognised terms [{{<<"{limit}">>,{value}}}] in {kind}-limits')
        if isinstance(value, bool) or not isinstance(value, int):
            raise LimitError(f"{limit} should be a number, actually was {value!r}")
        values = dict(self._limits.get((kind, name), {}))
        values[limit] = value
        return await self._write(kind, name, values)

    async def clear_limit(self, kind: str, name: str, limit: str) -> int:
        """Remove one limit (``DELETE``; ``all`` removes every one of a user, as RabbitMQ)."""
        values = dict(self._limits.get((kind, name), {}))
        if limit == "all":
            values.clear()
        values.pop(limit, None)
        return await self._write(kind, name, values)

    async def forget(self, kind: str, name: str) -> None:
        """The user or vhost was deleted: its limits go with it."""
        if (kind, name) in self._limits:
            await self._write(kind, name, {})

    async def _write(self, kind: str, name: str, values: Mapping[str, int]) -> int:
        key = _key(kind, name)
        if values:
            raw = json.dumps(dict(values), sort_keys=True).encode()
            self._last_version = await self.metadata.apply([Change(KIND_LIMIT, key, raw)])
            self._limits[(kind, name)] = dict(values)
        else:
            # Deleting an absent key changes nothing and keeps the version (apply's rule).
            self._last_version = await self.metadata.apply([Change(KIND_LIMIT, key, None)])
            self._limits.pop((kind, name), None)
        return self._last_version
