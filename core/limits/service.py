"""LimitsService: one place that decides whether a client may have one more connection, channel,
queue, binding, MQTT session or subscription, for every protocol (issue 21 item 1).

It decides from counts it is handed (the connection registry's, a vhost's queues) and from the
limits it holds: the ``[limits]`` settings (:class:`~core.limits.config.LimitsConfig`) and the
per-user and per-vhost limits of :class:`~core.limits.store.LimitsStore`. A refusal carries
RabbitMQ's text, which each gateway answers in its own protocol's words (AMQP 530 or 406, MQTT
CONNACK 0x97 / 3.1.1 0x03, a closed Kafka socket) with a log line.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from core.limits.config import LimitsConfig
from core.limits.store import MAX_CHANNELS, MAX_CONNECTIONS, MAX_QUEUES, USER, VHOST, LimitsStore

SCOPE_NODE: Final = "node"
SCOPE_VHOST: Final = "vhost"
SCOPE_USER: Final = "user"
# The topic config entry that makes a topic's queues count for the queue limits, naming the
# vhost they count in: the Broker API sets it on the topics it creates as queues (an AMQP queue,
# a Kafka topic), so that the count needs no protocol's naming rules (docs/limits.md).
QUEUE_VHOST_KEY: Final = "limits.vhost"


@dataclass(frozen=True, slots=True)
class LimitRefusal:
    """Why one more is refused: which limit (``scope``: node, vhost or user), its value, and
    RabbitMQ's text for it (without the AMQP reply-code prefix)."""

    scope: str
    limit: int
    text: str


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """Open connections: in all, of each user, of each vhost (the registry's counters)."""

    total: int
    by_user: Mapping[str, int]
    by_vhost: Mapping[str, int]


def count_queues(configs: Iterable[tuple[Mapping[str, Any], int]], vhost: str) -> tuple[int, int]:
    """``(in vhost, in all)``: the queues of the topics marked with :data:`QUEUE_VHOST_KEY`
    among ``configs`` (each topic's config and number of queues)."""
    in_vhost = in_all = 0
    for config, queues in configs:
        counted_in = config.get(QUEUE_VHOST_KEY)
        if counted_in is None:
            continue
        in_all += queues
        if counted_in == vhost:
            in_vhost += queues
    return in_vhost, in_all


def _reached(count: int, limit: int | None) -> bool:
    # RabbitMQ: a limit of 0 refuses every one; otherwise one more is refused at the limit.
    return limit is not None and count >= limit


class LimitsService:
    def __init__(self, store: LimitsStore, config: LimitsConfig | None = None) -> None:
        self.store = store
        self.config = config or LimitsConfig()

    # -- connections -----------------------------------------------------------------------

    def connection_refusal(
        self, user: str, vhost: str | None, counts: ConnectionCounts
    ) -> LimitRefusal | None:
        """Whether ``user`` may open one more connection (to ``vhost``; None: a protocol
        without vhosts at connect time). RabbitMQ's order (rabbit_reader, connection.open): the
        vhost's limit, then the user's; the node's cap (``[limits] max_connections``) first."""
        node_limit = self.config.max_connections
        if _reached(counts.total, node_limit):
            assert node_limit is not None
            return LimitRefusal(
                SCOPE_NODE,
                node_limit,
                f"connection refused: node connection limit ({node_limit}) is reached",
            )
        if vhost is not None:
            vhost_limit = self.store.limit(VHOST, vhost, MAX_CONNECTIONS)
            if _reached(counts.by_vhost.get(vhost, 0), vhost_limit):
                assert vhost_limit is not None
                return LimitRefusal(
                    SCOPE_VHOST,
                    vhost_limit,
                    f"access to vhost '{vhost}' refused for user '{user}': "
                    f"connection limit ({vhost_limit}) is reached",
                )
        return self.user_connection_refusal(user, counts)

    def user_connection_refusal(self, user: str, counts: ConnectionCounts) -> LimitRefusal | None:
        """The user limit ``max-connections`` alone (a connection counted in all and in its
        vhost already, whose client has just logged in: Kafka SASL)."""
        user_limit = self.store.limit(USER, user, MAX_CONNECTIONS) if user else None
        if not _reached(counts.by_user.get(user, 0), user_limit):
            return None
        assert user_limit is not None
        return LimitRefusal(
            SCOPE_USER,
            user_limit,
            f"connection refused for user '{user}': "
            f"user connection limit ({user_limit}) is reached",
        )

    def channel_refusal(self, user: str, channels_of_user: int) -> LimitRefusal | None:
        """The user limit ``max-channels`` (rabbit_reader:create_channel's text)."""
        limit = self.store.limit(USER, user, MAX_CHANNELS)
        if not _reached(channels_of_user, limit):
            return None
        assert limit is not None
        return LimitRefusal(
            SCOPE_USER,
            limit,
            f"number of channels opened for user '{user}' has reached the maximum allowed "
            f"user limit of ({limit})",
        )

    # -- queues ----------------------------------------------------------------------------

    def has_queue_limit(self, vhost: str) -> bool:
        """Whether a queue limit applies in ``vhost`` (its ``max-queues`` or ``[limits]
        max_queues``): the queues are counted only then."""
        return (
            self.config.max_queues is not None
            or self.store.limit(VHOST, vhost, MAX_QUEUES) is not None
        )

    def queue_refusal(
        self,
        vhost: str,
        queue: str,
        in_vhost: int,
        in_all: int,
        *,
        added: int = 1,
        action: str | None = None,
    ) -> LimitRefusal | None:
        """Whether ``added`` more queues may be made in ``vhost``, which has ``in_vhost``
        (all vhosts: ``in_all``). ``action`` says what is refused (``declare queue 'q'`` by
        default). Texts: RabbitMQ 3.10's rabbit_channel:check_vhost_queue_limit, and for the
        node-wide cap RabbitMQ 3.13's cluster_queue_limit."""
        doing = action or f"declare queue '{queue}'"
        vhost_limit = self.store.limit(VHOST, vhost, MAX_QUEUES)
        if _reached(in_vhost + added - 1, vhost_limit):
            assert vhost_limit is not None
            return LimitRefusal(
                SCOPE_VHOST,
                vhost_limit,
                f"cannot {doing}: queue limit in vhost '{vhost}' ({vhost_limit}) is reached",
            )
        node_limit = self.config.max_queues
        if _reached(in_all + added - 1, node_limit):
            assert node_limit is not None
            return LimitRefusal(
                SCOPE_NODE,
                node_limit,
                f"cannot {doing}: queues cluster limit ({node_limit}) is reached",
            )
        return None

    # -- bindings --------------------------------------------------------------------------

    def binding_refusal(self, destination: str, vhost: str, bindings: int) -> LimitRefusal | None:
        """One more binding to ``destination`` (``queue 'q'`` or ``exchange 'x'``), which has
        ``bindings`` (``[limits] max_bindings_per_destination``; RabbitMQ has no such limit,
        so the text is ours, in the words of its queue limit's)."""
        limit = self.config.max_bindings_per_destination
        if not _reached(bindings, limit):
            return None
        assert limit is not None
        return LimitRefusal(
            SCOPE_NODE,
            limit,
            f"cannot bind to {destination} in vhost '{vhost}': "
            f"binding limit per queue or exchange ({limit}) is reached",
        )

    # -- MQTT ------------------------------------------------------------------------------

    def session_refusal(self, persistent_sessions: int) -> LimitRefusal | None:
        """One more persistent MQTT session (``[limits] max_mqtt_sessions``)."""
        limit = self.config.max_mqtt_sessions
        if not _reached(persistent_sessions, limit):
            return None
        assert limit is not None
        return LimitRefusal(SCOPE_NODE, limit, f"persistent session limit ({limit}) is reached")

    def subscription_refusal(self, subscriptions: int) -> LimitRefusal | None:
        """One more subscription for a client that has ``subscriptions`` (EMQX's
        max_subscriptions)."""
        limit = self.config.max_subscriptions_per_client
        if not _reached(subscriptions, limit):
            return None
        assert limit is not None
        return LimitRefusal(SCOPE_NODE, limit, f"subscription limit ({limit}) is reached")
