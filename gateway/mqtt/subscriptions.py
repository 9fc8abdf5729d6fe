"""What a session holds per subscription and per outbound message in flight: ``Sub`` (one
subscription: its filter, options and, for ``$share``, its group), ``Inflight`` (an outbound
QoS 1/2 PUBLISH not yet fully acknowledged), and how one record matched by several
subscriptions of a session becomes one PUBLISH (``combine`` [MQTT-3.3.4-2, 3.3.4-3]).

Plain data and pure functions: no I/O. Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.api import PROTOCOL_KAFKA, Delivery, Message, TagFilter, tags_from_headers
from gateway.mqtt.messages import OutMessage

if TYPE_CHECKING:
    from gateway.mqtt.client_session import Session
    from gateway.mqtt.shared import SharedGroup

NO_IDS: tuple[int, ...] = ()  # no Subscription Identifier: one shared empty tuple


class Sub:
    """One subscription of a session (identity-hashed: the live router's and groups' key)."""

    __slots__ = (
        "filter",
        "group",
        "identifier",
        "levels",
        "no_local",
        "per_record",
        "qos",
        "retain_as_published",
        "retain_handling",
        "session",
        "tag_filter",
    )

    def __init__(
        self,
        session: Session,
        topic_filter: str,
        levels: list[str],
        qos: int,
        no_local: bool,
        retain_as_published: bool,
        retain_handling: int,
        identifier: int,
        group: SharedGroup | None,
        tag_filter: TagFilter | None = None,
    ) -> None:
        self.session = session
        self.filter = topic_filter  # as subscribed, "$share/g/..." included
        self.levels = levels  # the (inner) filter's levels, for matching
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling
        self.identifier = identifier  # 0: none
        self.group = group
        # Tag filter (user property ``tag-filter``): a plain subscription matches only records
        # carrying one of its tags; a shared one's is its group queue's (kept here to persist).
        self.tag_filter = tag_filter
        # A filter whose first level is a wildcard names no exchange to check at SUBSCRIBE: each
        # record it would deliver is checked instead (``mqtt deliver``, docs/security.md).
        self.per_record = levels[0] in ("+", "#")

    def takes(self, tags: list[str] | None) -> bool:
        """Whether this subscription's tag filter lets a record with ``tags`` through."""
        tag_filter = self.tag_filter
        return tag_filter is None or (tags is not None and tag_filter.matches(tags))

    def to_json(self) -> list[Any]:
        data: list[Any] = [
            self.filter,
            self.qos,
            self.no_local,
            self.retain_as_published,
            self.retain_handling,
            self.identifier,
        ]
        if self.tag_filter is not None:
            data.append(tag_expression(self.tag_filter))
        return data

    def __repr__(self) -> str:
        return f"Sub({self.session.client_id!r}, {self.filter!r}, qos={self.qos})"


class Inflight:
    """An outbound QoS 1/2 PUBLISH not yet fully acknowledged."""

    __slots__ = ("delivery", "message", "qos", "released", "retain", "subscription_ids")

    def __init__(
        self,
        message: OutMessage,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        delivery: Delivery | None,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.delivery = delivery  # the ack-queue record to ack (None: live or retained)
        self.released = False  # QoS 2: PUBREC came, PUBREL sent, waiting for PUBCOMP


# A message waiting for room in the window: (message, qos, retain, subscription ids, delivery).
Queued = tuple[OutMessage, int, bool, tuple[int, ...], Delivery | None]


def tag_expression(tag_filter: TagFilter) -> str:
    """The filter as an expression ``TagFilter.parse`` reads back (``A || B``)."""
    return " || ".join(sorted(tag_filter.tags))


def record_tags(message: Message) -> list[str]:
    """A record's own tags: a Kafka batch record's are the union of its records' (the log's
    tags field), so each record of it is judged by its own ``x-braid-tags`` header."""
    if message.protocol == PROTOCOL_KAFKA:
        headers = message.headers
        if not headers:
            return []
        return tags_from_headers([(name, value) for name, value in headers if value is not None])
    return message.tags


def combine(message: OutMessage, subs: list[Sub]) -> tuple[int, bool, tuple[int, ...]]:
    """One copy for several matching subscriptions of a session: the highest QoS they grant,
    RETAIN if one keeps it (Retain As Published), every Subscription Identifier
    [MQTT-3.3.4-2, 3.3.4-3]."""
    if len(subs) == 1:
        sub = subs[0]
        qos = sub.qos if sub.qos < message.qos else message.qos
        return (
            qos,
            message.retain and sub.retain_as_published,
            (sub.identifier,) if sub.identifier else NO_IDS,
        )
    qos = 0
    retain = False
    ids: list[int] = []
    for sub in subs:
        granted = sub.qos if sub.qos < message.qos else message.qos
        if granted > qos:
            qos = granted
        if sub.retain_as_published and message.retain:
            retain = True
        if sub.identifier:
            ids.append(sub.identifier)
    return qos, retain, tuple(ids)
