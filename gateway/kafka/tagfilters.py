"""Tag filters of Kafka consumer groups: a broker-side group setting (docs/kafka.md, "Tag
filters").

A group's filter (``TagA || TagB``) comes from the config file (``[kafka.group_tag_filters]``)
or, overriding it, from an admin client: IncrementalAlterConfigs / DescribeConfigs on resource
type GROUP, config ``braid.tag.filter`` (durable in ``__meta``; DELETE goes back to the file's
value; ``*`` means no filter).

Fetch requests carry no group id, and clients fetch over another connection than the one they
talk to the group coordinator on, so a fetch is tied to a group through the members:

- every successful SyncGroup of a ``consumer`` group records, per member, its client id, its
  client host and the partitions of its ``ConsumerProtocolAssignment``;
- a Fetch for partition P from client id C on host H belongs to the groups with a member (C, H)
  assigned P (groups that are Empty or Dead do not count);
- one candidate: that group's filter applies, and the fetch connection is remembered as that
  member's (a *claim*, fresh while the connection keeps fetching);
- several candidates (consumers of several groups on one host with the same client id, all
  assigned P): a connection that already has a claim keeps its member; else the members other
  fresh connections claim are left out; if candidates still differ in their filter, the fetch
  is served unfiltered (a consumer never loses records to another group's filter) and a
  warning is logged once per client id and host.

Cost: nothing for fetches while no group has a filter (one truth test per Fetch).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import logging
import struct
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from core.api import (
    PROTOCOL_KAFKA,
    BrokerAPI,
    ClientContext,
    GroupState,
    TagFilter,
    parse_tag_expression,
)

if TYPE_CHECKING:
    from gateway.kafka.context import Connection

log = logging.getLogger(__name__)

# The config resource type of a group: ConfigResource.Type.GROUP (KIP-848), what kafka-python
# and librdkafka >= 2.10 send (librdkafka maps its ResourceType.GROUP, 3, to 32 on the wire:
# ``rd_kafka_ResourceType_to_ConfigResourceType``). Older librdkafka (kcat) sent its enum value
# 3 as is; Kafka has no config resource type 3, so it is taken as a group too.
CONFIG_RESOURCE_GROUP: Final = 32
LEGACY_RESOURCE_GROUP: Final = 3
GROUP_RESOURCE_TYPES: Final = frozenset({CONFIG_RESOURCE_GROUP, LEGACY_RESOURCE_GROUP})
TAG_FILTER_CONFIG: Final = "braid.tag.filter"
# Characters a tag of a filter cannot hold: ``x-braid-tags`` separates tags with ``,`` (so such
# a tag never matches), and ``|``/``&`` are a mistyped operator (only ``||`` exists).
_TAG_FORBIDDEN: Final = frozenset(",|&")
CONSUMER_PROTOCOL_TYPE: Final = "consumer"
# Keys in the broker's ``__meta`` table (as ``kafka:txn:``): a group's filter set at runtime.
_CONFIG_KEY: Final = "kafka:group-tag-filter:"
# A fetch connection's claim on a member lasts this long after its last fetch (clients fetch
# every fetch.max.wait.ms, 500 ms by default, while they have room for records).
CLAIM_TTL_S: Final = 5.0
# Who the registry's own calls are made as (it loads the filters set at runtime, and reads
# groups the coordinator formed to pick a fetch's filter); a filter an admin client sets is
# stored with that client's context.
_REGISTRY_CONTEXT: Final = ClientContext(PROTOCOL_KAFKA, connection_id="kafka-tag-filters")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

Partition = tuple[str, int]


def expression_error(expression: str) -> str | None:
    """Why ``expression`` is not a tag filter (``None``: it is). A filter is ``*`` or empty
    (every record), or tags joined by ``||`` (RocketMQ's syntax): no empty alternative, no
    ``*`` among tags, no ``,``, ``|`` or ``&`` and no control character inside a tag."""
    text = expression.strip()
    if text in ("", "*"):
        return None
    for part in text.split("||"):
        tag = part.strip()
        if not tag:
            return f"empty tag in {expression!r} (write TagA || TagB)"
        if tag == "*":
            return f"'*' (every record) cannot be combined with tags in {expression!r}"
        bad = sorted({c for c in tag if c in _TAG_FORBIDDEN or not c.isprintable()})
        if bad:
            return (
                f"tag {tag!r} of {expression!r} holds {''.join(bad)!r}: tags are joined by "
                "' || ' and cannot contain ',', '|', '&' or control characters"
            )
    return None


def client_host(connection: Connection) -> str:
    """The host part of a connection's peer, as groups.py reports it (``/127.0.0.1``)."""
    return "/" + connection.peer.rpartition(":")[0]


def assigned_partitions(assignment: bytes) -> frozenset[Partition]:
    """The partitions of a ``ConsumerProtocolAssignment`` (v0-v3: version int16, then
    [topic string, [partition int32]], then user data); empty if it cannot be read."""
    data = memoryview(assignment)
    found: set[Partition] = set()
    try:
        position = 2  # version
        (topics,) = _INT32.unpack_from(data, position)
        position += 4
        for _ in range(max(0, topics)):
            (length,) = _INT16.unpack_from(data, position)
            position += 2
            topic = bytes(data[position : position + length]).decode()
            position += length
            (count,) = _INT32.unpack_from(data, position)
            position += 4
            for _ in range(max(0, count)):
                found.add((topic, _INT32.unpack_from(data, position)[0]))
                position += 4
    except (struct.error, UnicodeDecodeError):
        return frozenset()
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Owner:
    """A member of a consumer group as fetches see it."""

    group_id: str
    member_id: str
    partitions: frozenset[Partition]


class GroupTagFilters:
    """The tag filters of consumer groups and the members that fetch for them."""

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.configured: dict[str, str] = {}  # group -> expression, from the config file
        self.runtime: dict[str, str] = {}  # group -> expression set by an admin client
        self.filters: dict[str, TagFilter | None] = {}  # in effect (None: explicitly none)
        self.active = False  # some group has a filter: fetches look for theirs
        # (client id, client host) -> members; group -> its members' keys.
        self._owners: dict[tuple[str, str], list[Owner]] = {}
        self._group_keys: dict[str, set[tuple[str, str]]] = {}
        # fetch connection peer -> (group, member id, last fetch time).
        self._claims: dict[str, tuple[str, str, float]] = {}
        self._warned: set[tuple[str, str]] = set()
        self.metrics: dict[str, int] = {"filtered_fetches": 0, "ambiguous_fetches": 0}
        for key, value in api.metadata_items(_REGISTRY_CONTEXT, _CONFIG_KEY):
            self.runtime[key[len(_CONFIG_KEY) :]] = value.decode()
        self._refresh()

    # -- settings --------------------------------------------------------------------------

    def configure(self, expressions: Mapping[str, str]) -> None:
        """The config file's ``[kafka.group_tag_filters]``: group id -> expression."""
        self.configured = dict(expressions)
        self._refresh()

    def expression(self, group_id: str) -> tuple[str | None, bool]:
        """The group's filter expression (``None``: none) and whether it is the default (from
        the config file, or unset) rather than set at runtime."""
        if group_id in self.runtime:
            return self.runtime[group_id], False
        return self.configured.get(group_id), True

    def setting(self, group_id: str) -> tuple[str | None, str]:
        """The group's filter expression as DescribeConfigs shows it (``None``: none) and where
        it comes from: ``"runtime"`` (an admin client, in ``__meta``), ``"file"`` (the config
        file) or ``"none"``."""
        if group_id in self.runtime:
            return self.runtime[group_id], "runtime"
        if group_id in self.configured:
            return self.configured[group_id], "file"
        return None, "none"

    async def set_filter(
        self, context: ClientContext, group_id: str, expression: str | None
    ) -> int | None:
        """Set (``None``: delete, back to the config file's) a group's filter in ``__meta``,
        for ``context`` (the admin client's). Returns the durable mark of the record written
        (``None``: nothing written), which ``store_filter`` waits for."""
        end: int | None = None
        if expression is None:
            if self.runtime.pop(group_id, None) is not None:
                end = await self.api.delete_metadata(context, _CONFIG_KEY + group_id)
        else:
            self.runtime[group_id] = expression
            end = await self.api.put_metadata(context, _CONFIG_KEY + group_id, expression.encode())
        self._refresh()
        return end

    async def store_filter(
        self, context: ClientContext, group_id: str, expression: str | None
    ) -> None:
        """``set_filter``, returning once the change is durable (an admin client's answer)."""
        end = await self.set_filter(context, group_id, expression)
        if end is not None:
            await self.api.when_durable(end)

    def _refresh(self) -> None:
        merged = {**self.configured, **self.runtime}
        self.filters = {
            group: TagFilter(tags) if (tags := parse_tag_expression(expression)) else None
            for group, expression in merged.items()
        }
        self.active = any(value is not None for value in self.filters.values())

    # -- membership ------------------------------------------------------------------------

    def on_sync(self, group_id: str) -> None:
        """A SyncGroup succeeded: record the members' assignments (the coordinator has them
        all once the leader's SyncGroup came)."""
        described = self.api.describe_group(_REGISTRY_CONTEXT, group_id)
        self._drop_group(group_id)
        now = time.monotonic()
        for peer, (_, _, seen) in list(self._claims.items()):
            if now - seen > CLAIM_TTL_S:
                del self._claims[peer]
        if described.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return
        keys = self._group_keys[group_id] = set()
        for member in described.members:
            partitions = assigned_partitions(member.assignment) if member.assignment else None
            if not partitions:
                continue
            key = (member.client_id, member.client_host)
            self._owners.setdefault(key, []).append(Owner(group_id, member.member_id, partitions))
            keys.add(key)

    def on_leave(self, group_id: str, member_ids: set[str]) -> None:
        for key in self._group_keys.get(group_id, ()):
            owners = self._owners.get(key)
            if owners:
                owners[:] = [
                    o for o in owners if o.group_id != group_id or o.member_id not in member_ids
                ]

    def on_delete(self, group_id: str) -> None:
        self._drop_group(group_id)

    def _drop_group(self, group_id: str) -> None:
        for key in self._group_keys.pop(group_id, ()):
            owners = self._owners.get(key)
            if owners is None:
                continue
            owners[:] = [owner for owner in owners if owner.group_id != group_id]
            if not owners:
                del self._owners[key]

    # -- fetches ---------------------------------------------------------------------------

    def filter_for(self, connection: Connection, topic: str, partition: int) -> TagFilter | None:
        """The tag filter a fetch of ``(topic, partition)`` on ``connection`` is served with."""
        key = (connection.client_id or "", client_host(connection))
        owners = self._owners.get(key)
        if not owners:
            return None
        wanted = (topic, partition)
        api = self.api
        candidates = [
            owner
            for owner in owners
            if wanted in owner.partitions
            and api.group_state(_REGISTRY_CONTEXT, owner.group_id)
            not in (None, GroupState.EMPTY, GroupState.DEAD)
        ]
        if not candidates:
            return None
        peer = connection.peer
        now = time.monotonic()
        if len(candidates) > 1:
            candidates = self._narrow(candidates, peer, now)
        if len(candidates) == 1:
            owner = candidates[0]
            self._claims[peer] = (owner.group_id, owner.member_id, now)
            tag_filter = self.filters.get(owner.group_id)
        else:
            # Equal filters (same tags) of different groups are one filter.
            found = {
                None if (f := self.filters.get(owner.group_id)) is None else f.tags: f
                for owner in candidates
            }
            if len(found) != 1:
                self.metrics["ambiguous_fetches"] += 1
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning(
                        "kafka: fetches of client id %r from %s match members of groups %s "
                        "with different tag filters: served unfiltered (give each group's "
                        "consumers their own client.id)",
                        key[0],
                        key[1],
                        sorted({owner.group_id for owner in candidates}),
                    )
                return None
            (tag_filter,) = found.values()
        if tag_filter is not None:
            self.metrics["filtered_fetches"] += 1
        return tag_filter

    def _narrow(self, candidates: list[Owner], peer: str, now: float) -> list[Owner]:
        claim = self._claims.get(peer)
        if claim is not None:
            mine = [o for o in candidates if (o.group_id, o.member_id) == claim[:2]]
            if mine:
                return mine
        taken = set()
        for other, (group_id, member_id, seen) in list(self._claims.items()):
            if now - seen > CLAIM_TTL_S:
                del self._claims[other]
            elif other != peer:
                taken.add((group_id, member_id))
        left = [o for o in candidates if (o.group_id, o.member_id) not in taken]
        return left or candidates


# One registry per Broker API (the server makes one per broker: braid/server.py).
_registries: weakref.WeakKeyDictionary[BrokerAPI, GroupTagFilters] = weakref.WeakKeyDictionary()


def group_tag_filters(api: BrokerAPI) -> GroupTagFilters:
    """The broker's registry, made on first use (every Kafka listener of it shares it)."""
    registry = _registries.get(api)
    if registry is None:
        registry = _registries[api] = GroupTagFilters(api)
    return registry


def active_tag_filters(api: BrokerAPI) -> GroupTagFilters | None:
    """The registry if some group has a filter (the fetch path's one test), else None."""
    registry = _registries.get(api)
    return registry if registry is not None and registry.active else None
