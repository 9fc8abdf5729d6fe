"""Limits on counts and sizes: the Broker API's calls for the limits service (issue 21 item 1,
``core/limits/``, docs/limits.md).

A gateway asks before it admits one more of something, and answers a refusal
(:class:`LimitRefusal`, with RabbitMQ's text) in its own protocol's words:

- :meth:`LimitCalls.connection_limit_refusal` before a logged-in client's connection is
  registered (AMQP Connection.Open: 530 NOT_ALLOWED; MQTT CONNACK 0x97 Quota exceeded, 3.1.1
  0x03 Server unavailable; Kafka: the socket closed, as Kafka's ``max.connections.per.ip``);
- :meth:`LimitCalls.channel_limit_refusal` before an AMQP channel is opened (530 NOT_ALLOWED,
  the connection closed, as RabbitMQ);
- :meth:`LimitCalls.queue_limit_refusal` before an AMQP queue is created (406
  PRECONDITION_FAILED) or a Kafka topic or partitions (POLICY_VIOLATION);
- :meth:`LimitCalls.binding_limit_refusal` before an AMQP binding is added (406);
- :meth:`LimitCalls.session_limit_refusal` before an MQTT persistent session is created
  (CONNACK 0x97 / 3.1.1 0x03), and :meth:`LimitCalls.subscription_limit_refusal` before a
  client's next subscription (SUBACK 0x97 / 3.1.1 0x80);
- :meth:`LimitCalls.max_message_size` is the largest AMQP body.

The management API reads and changes RabbitMQ's user and vhost limits through the calls at the
end (``braid/web/rabbit/limits.py``: ``/api/user-limits``, ``/api/vhost-limits``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core.api.base import ClientContext
from core.api.connections import ConnectionCalls
from core.broker.broker import Destination
from core.limits import (
    ConnectionCounts,
    LimitRefusal,
    LimitsService,
    LimitsStore,
    count_queues,
)
from core.limits.store import MAX_CHANNELS, USER, VHOST


class LimitCalls(ConnectionCalls):
    """Limit decisions over the connection registry's counts, and RabbitMQ's limits."""

    _limits_service: LimitsService | None = None

    def _limits(self) -> LimitsService:
        service = self._limits_service
        if service is None:  # an API built without one (tests): the defaults over the same log
            service = self._limits_service = LimitsService(LimitsStore(self._node.metadata))
        return service

    # -- decisions -------------------------------------------------------------------------

    def connection_limit_refusal(
        self, context: ClientContext, vhost: str | None = None
    ) -> LimitRefusal | None:
        """Whether the client of ``context`` (logged in as ``context.user``) may have one more
        open connection, to ``vhost`` (None: the context's). None: yes. Call it before
        :meth:`register_connection`; a Kafka connection, registered at accept and again after
        its login, is not counted twice (it counts for its last registration's user)."""
        registry = self._connections()
        counts = ConnectionCounts(len(registry), registry.by_user, registry.by_vhost)
        return self._limits().connection_refusal(
            context.user, context.vhost if vhost is None else vhost, counts
        )

    def login_connection_limit_refusal(self, context: ClientContext) -> LimitRefusal | None:
        """The user limit alone, for a connection registered before its client logged in as
        ``context.user`` (Kafka: at accept, then SASL); register it again (as that user) when
        None."""
        registry = self._connections()
        counts = ConnectionCounts(len(registry), registry.by_user, registry.by_vhost)
        return self._limits().user_connection_refusal(context.user, counts)

    def channel_limit_refusal(self, context: ClientContext) -> LimitRefusal | None:
        """The user limit ``max-channels`` for one more AMQP channel of ``context.user``,
        counting the channels open on every connection of that user now (call it before the
        new channel is added to its connection). The connections are described only while
        the user has a limit."""
        service = self._limits()
        if service.store.limit(USER, context.user, MAX_CHANNELS) is None:
            return None
        registry = self._connections()
        open_channels = 0
        # The registry's owners map (name -> (user, vhost)): only that user's connections
        # are described, not every client's.
        for name, (user, _vhost) in list(registry._owners.items()):
            if user == context.user:
                details = registry.describe(name)
                if details is not None:
                    open_channels += len(details.channels)
        return service.channel_refusal(context.user, open_channels)

    def queue_limit_refusal(
        self, context: ClientContext, queue: str, added: int = 1, action: str | None = None
    ) -> LimitRefusal | None:
        """Whether ``added`` more queues (an AMQP queue named ``queue``; a Kafka topic's
        partitions) may be made in ``context.vhost``, under its ``max-queues`` and ``[limits]
        max_queues``. What counts: the queues of the topics :meth:`declare_queue` and
        :meth:`create_topic` made (docs/limits.md). ``action`` words the refusal (``declare
        queue 'q'`` by default). Counted only while a limit applies: one pass over the topics
        (about 14 ms per 100,000)."""
        service = self._limits()
        if not service.has_queue_limit(context.vhost):
            return None
        topics = self._node.topics._topics.values()  # no copy, no sort (TopicRegistry.all)
        in_vhost, in_all = count_queues(((t.config, t.queues) for t in topics), context.vhost)
        return service.queue_refusal(
            context.vhost, queue, in_vhost, in_all, added=added, action=action
        )

    def binding_limit_refusal(
        self,
        context: ClientContext,
        source: str,
        kind: str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None,
        described: str,
    ) -> LimitRefusal | None:
        """Whether the binding :meth:`bind` would add (same arguments) may be added under
        ``[limits] max_bindings_per_destination``: refused when ``destination`` (``described``
        in the text: ``queue 'q'`` or ``exchange 'x'``) has that many bindings and this one is
        not among them (binding again what is bound changes nothing, as in RabbitMQ)."""
        table = self._node.bindings
        # The table's per-destination index: a count without copying its bindings.
        bound = len(table._by_destination.get(destination, ()))
        refusal = self._limits().binding_refusal(described, context.vhost, bound)
        if refusal is None:
            return None
        wanted = dict(arguments) if arguments else None
        for binding in table.bindings(destination=destination):
            if (
                binding.source == source
                and binding.kind.value == kind
                and binding.pattern == pattern
                and (dict(binding.arguments) if binding.arguments else None) == wanted
            ):
                return None
        return refusal

    def session_limit_refusal(
        self, context: ClientContext, persistent_sessions: Callable[[], int]
    ) -> LimitRefusal | None:
        """Whether one more persistent MQTT session may be created under ``[limits]
        max_mqtt_sessions``; ``persistent_sessions`` counts them (called only under a
        limit)."""
        service = self._limits()
        if service.config.max_mqtt_sessions is None:
            return None
        return service.session_refusal(persistent_sessions())

    def subscription_limit_refusal(
        self, context: ClientContext, subscriptions: int
    ) -> LimitRefusal | None:
        """Whether the client of ``context``, which has ``subscriptions``, may have one more."""
        return self._limits().subscription_refusal(subscriptions)

    def max_message_size(self, context: ClientContext) -> int:
        """The largest AMQP message body (``[limits] max_message_size``)."""
        return self._limits().config.max_message_size

    def incomplete_request_limits(self, context: ClientContext) -> tuple[int, float]:
        """``([limits] kafka_max_request_bytes_before_login, incomplete_request_timeout_s)``:
        the largest Kafka request before a login, and how long a partly received request may
        stay incomplete before its connection is closed (docs/limits.md, "Partial requests")."""
        config = self._limits().config
        return config.kafka_max_request_bytes_before_login, config.incomplete_request_timeout_s

    def outgoing_buffer_limits(self, context: ClientContext) -> tuple[int, float]:
        """``([limits] max_outgoing_buffer_bytes, stalled_client_timeout_s)``: the outgoing
        bytes a connection may have buffered before deliveries to it stop, and how long it may
        stay over them before it is disconnected (docs/limits.md, "Slow consumers")."""
        config = self._limits().config
        return config.max_outgoing_buffer_bytes, config.stalled_client_timeout_s

    def kafka_connections_max_idle_ms(self, context: ClientContext) -> int:
        """``[limits] kafka_connections_max_idle_ms``: how long a Kafka connection may go
        without a request or a response before it is closed (Kafka's
        ``connections.max.idle.ms``; docs/limits.md, "Idle connections")."""
        return self._limits().config.kafka_connections_max_idle_ms

    # -- RabbitMQ's user and vhost limits (management API) -----------------------------------

    def user_limits(self, context: ClientContext) -> dict[str, dict[str, int]]:
        """``{user: {"max-connections": N, ...}}`` of every user with limits."""
        return self._limits().store.limits(USER)

    def vhost_limits(self, context: ClientContext) -> dict[str, dict[str, int]]:
        """``{vhost: {"max-connections": N, "max-queues": N}}`` of every vhost with limits."""
        return self._limits().store.limits(VHOST)

    async def set_user_limit(
        self, context: ClientContext, user: str, name: str, value: object
    ) -> int:
        """Set a user's limit; raises :class:`~core.limits.LimitError` with RabbitMQ's text
        for an unknown name or a value that is not an integer. Returns the log position to
        wait for (:meth:`when_durable`)."""
        await self._limits().store.set_limit(USER, user, name, value)
        return self._node.metadata.durable_mark

    async def clear_user_limit(self, context: ClientContext, user: str, name: str) -> int:
        await self._limits().store.clear_limit(USER, user, name)
        return self._node.metadata.durable_mark

    async def set_vhost_limit(
        self, context: ClientContext, vhost: str, name: str, value: object
    ) -> int:
        await self._limits().store.set_limit(VHOST, vhost, name, value)
        return self._node.metadata.durable_mark

    async def clear_vhost_limit(self, context: ClientContext, vhost: str, name: str) -> int:
        await self._limits().store.clear_limit(VHOST, vhost, name)
        return self._node.metadata.durable_mark


def attach_limits(api: LimitCalls, service: LimitsService) -> None:
    """``braid serve``'s: the limits service with the process's ``[limits]`` settings (an API
    without one makes a default one at the first call)."""
    api._limits_service = service
