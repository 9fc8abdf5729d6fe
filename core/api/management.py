"""What the management API reads and does (issue 19): the Broker API's calls for operators.

The HTTP management API (``braid/web/``) answers RabbitMQ's ``/api/queues``,
``/api/exchanges``, ``/api/bindings`` and BraidMQ's own ``/api/braid/...`` from these calls, so
that it, like a gateway, sees the core only through :class:`~core.api.BrokerAPI`. Every call
takes the :class:`ClientContext` of the HTTP user; what comes back are values made for the call
(:class:`BindingView`, :class:`ConsumerView`, :class:`BrowsedMessage`, copies of
:class:`TopicInfo`), never a core object.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from core.api.base import BrokerCalls, ClientContext
from core.broker.topics import TopicInfo
from core.delivery.ackqueue import Delivery


@dataclass(frozen=True, slots=True)
class BindingView:
    """One binding: from the topic ``source`` to ``destination`` (an ack queue's topic when
    ``destination_queue`` is 0, an exchange's topic when it is the exchange queue)."""

    source: str
    kind: str
    pattern: str
    destination: str
    destination_queue: int
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """One consumer attached to an ack queue."""

    queue_topic: str
    tag: str
    prefetch: int
    inflight: int
    ack_required: bool


@dataclass(frozen=True, slots=True)
class BrowsedMessage:
    """A record taken from a queue by :meth:`ManagementCalls.browse_queue` (copied out)."""

    topic: str
    subject: str
    headers: list[tuple[str, bytes]]
    body: bytes
    protocol: int
    client: str
    born_ms: int
    store_ms: int
    redelivered: bool
    offset: int


class ManagementCalls(BrokerCalls):
    """Listings, counts and operator actions (purge, browse) over the broker's objects."""

    def topics_snapshot(self, context: ClientContext) -> list[TopicInfo]:
        """Every topic, system topics included, each a copy (its config deep-copied)."""
        return [
            TopicInfo(info.name, info.queues, copy.deepcopy(info.config))
            for info in self._broker.topics.all()
        ]

    def all_bindings(self, context: ClientContext) -> list[BindingView]:
        """Every binding, in the order they were added."""
        return [
            BindingView(
                binding.source,
                str(binding.kind),
                binding.pattern,
                binding.destination[0],
                binding.destination[1],
                dict(binding.arguments or {}),
            )
            for binding in self._broker.bindings.bindings()
        ]

    def all_consumers(self, context: ClientContext) -> list[ConsumerView]:
        """Every consumer of every ack queue."""
        views: list[ConsumerView] = []
        for (topic, _queue), ack in self._broker.ack_queues.items():
            for consumer in ack.consumers:
                views.append(
                    ConsumerView(
                        topic,
                        consumer.tag,
                        consumer.prefetch,
                        consumer.inflight,
                        not consumer.no_ack,
                    )
                )
        return views

    def ack_queue_topics(self, context: ClientContext) -> list[str]:
        """The topics whose queue 0 is an ack queue (AMQP queues, MQTT session queues)."""
        return [topic for (topic, queue) in self._broker.ack_queues if queue == 0]

    def purge_queue(self, context: ClientContext, topic: str) -> int | None:
        """Drop the ready records of the ack queue ``topic`` (in-flight ones stay, as AMQP's
        queue.purge); how many, or None when there is no such queue."""
        ack = self._broker.ack_queue(topic)
        return None if ack is None else ack.purge()

    def browse_queue(
        self, context: ClientContext, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage] | None:
        """Take up to ``count`` ready records of the ack queue ``topic`` (RabbitMQ's
        ``POST /api/queues/{vhost}/{name}/get``). With ``requeue`` they go back to the head
        of the queue, in their order, flagged redelivered; else they are acknowledged (gone).
        None when there is no such queue."""
        ack = self._broker.ack_queue(topic)
        if ack is None:
            return None
        taken: list[Delivery] = []
        while len(taken) < count:
            delivery = ack.get(no_ack=False)
            if delivery is None:
                break
            taken.append(delivery)
        browsed = [
            BrowsedMessage(
                delivery.message.topic,
                delivery.message.subject,
                list(delivery.message.headers),
                bytes(delivery.message.body or b""),
                delivery.message.protocol,
                delivery.message.client,
                delivery.message.born_ms,
                delivery.message.store_ms,
                delivery.redelivered,
                delivery.offset,
            )
            for delivery in taken
        ]
        # Settled only once all are taken: a record requeued at once would be taken again.
        # Requeued last-first, so the first taken is back at the head.
        for delivery in reversed(taken):
            if requeue:
                ack.nack(delivery.offset, requeue=True)
            else:
                ack.ack(delivery.offset)
        if requeue and taken:
            ack.notify()  # consumers with credit get the requeued records now
        return browsed
