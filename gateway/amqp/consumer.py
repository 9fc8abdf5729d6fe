"""One basic.consume: numbering a channel's deliveries and framing Basic.Deliver.

A ``ChannelConsumer`` is what the core's ack queue calls back (synchronously, from its pump) for
each record it hands out; it numbers the delivery on its channel, keeps it unacked there unless
the consumer is no-ack, and writes the frames. The helpers here also serve basic.get: the
properties a record is delivered with and the exchange and routing key it is delivered under
(a dead letter's are those it was dead-lettered to; an MQTT record's those of RabbitMQ's MQTT
plugin when ``mqtt_exchange`` is set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.api import PROTOCOL_AMQP, PROTOCOL_MQTT, Delivery, Message, Subscription, routing_key_of
from gateway.amqp.codec import encode_deliver
from gateway.amqp.messages import PROPERTIES_HEADER, dead_letter_address, delivery_properties
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX, Queue, VirtualHost

if TYPE_CHECKING:
    from gateway.amqp.channel import Channel

__all__ = [
    "ChannelConsumer",
    "delivered_address",
    "mqtt_compat_address",
    "properties_of",
    "resume_channel_deliveries",
    "stop_channel_deliveries",
]


def properties_of(message: Message, vhost: VirtualHost) -> bytes:
    """The property octets ``message`` is delivered with in ``vhost`` (messages.py)."""
    return delivery_properties(
        message.headers, message.protocol == PROTOCOL_AMQP, vhost.exchange_name, vhost.queue_name
    )


def delivered_address(message: Message) -> tuple[str, str]:
    """(topic, routing key) a record is delivered with: a dead letter's are those it was
    dead-lettered to (its dead-letter exchange, as RabbitMQ), others' its own."""
    dead_letter = dead_letter_address(message.headers) if message.headers else None
    return dead_letter if dead_letter is not None else (message.topic, message.subject)


def mqtt_compat_address(exchange: str, mqtt_topic: str) -> tuple[str, str]:
    """(exchange, routing key) of an MQTT record as RabbitMQ's MQTT plugin delivers it: topic
    ``a/b.c`` on ``amq.topic`` with routing key ``a.b/c``."""
    return exchange, routing_key_of(mqtt_topic)


class ChannelConsumer:
    """A basic.consume: its subscription plus what the channel needs to deliver to it."""

    __slots__ = (
        "cancelled",
        "channel",
        "exclusive",
        "no_ack",
        "prefetch",
        "queue",
        "subscription",
        "tag",
        "tag_bytes",
    )

    def __init__(
        self,
        channel: Channel,
        tag: str,
        queue: Queue | None,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
    ) -> None:
        self.channel = channel
        self.tag = tag
        self.tag_bytes = tag.encode()
        self.queue = queue  # None: the direct reply-to pseudo-queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # its own basic.qos(global=false) limit, 0 = none
        self.subscription: Subscription | None = None
        self.cancelled = False

    def deliver(self, delivery: Delivery) -> None:
        """The subscription's callback: number the delivery and write Basic.Deliver (hot
        path)."""
        channel = self.channel
        tag = channel.delivery_tag = channel.delivery_tag + 1
        if not self.no_ack:
            channel.unacked[tag] = delivery
        message = delivery.message
        topic = message.topic
        subject = message.subject
        headers = message.headers
        # Fast path: a record an AMQP client published, not dead-lettered since: its own
        # property octets (stored first) go back out untouched.
        if (
            message.protocol == PROTOCOL_AMQP
            and len(headers) == 1
            and headers[0][0] == PROPERTIES_HEADER
        ):
            properties = headers[0][1]
        else:
            properties = properties_of(message, channel.vhost)
            topic, subject = delivered_address(message)
        session = channel.session
        if channel.vhost_prefix:  # a vhost other than "/": its topics' names are prefixed
            topic = channel.vhost.exchange_name(topic)
        elif message.protocol == PROTOCOL_MQTT and channel.mqtt_exchange and message.address:
            topic, subject = mqtt_compat_address(channel.mqtt_exchange, message.address)
        elif topic.startswith(QUEUE_TOPIC_PREFIX):
            topic = ""
        frames = encode_deliver(
            channel.number,
            self.tag_bytes,
            tag,
            delivery.redelivered,
            topic,
            subject,
            properties,
            message.body or b"",
            session.frame_max,
        )
        session.write(frames)
        session.metrics["delivered"] += 1
        # The outgoing bound: this loop iteration's writes leave in one flush after it, so a
        # queue's pump (a whole backlog for a consumer without prefetch) stops here once the
        # connection's buffer would pass it, rather than at the transport's pause_writing.
        session.outgoing_room -= len(frames)
        if session.outgoing_room <= 0:
            session.stop_deliveries()
        elif channel.limited:
            channel.update_capacity(notify=False)

    def deliver_direct(self, routing_key: str, properties_raw: bytes, body: bytes) -> None:
        """A direct reply-to message: straight to this consumer, never stored; dropped (and
        counted) instead while the requester's outgoing buffer is over its bound: a reply has
        no queue to wait in, and holding it would let one requester that does not read grow
        the broker's memory (RabbitMQ 4's volatile queue drops what it cannot hand over)."""
        channel = self.channel
        session = channel.session
        if session.deliveries_stopped or session.outgoing_room <= 0:
            session.reply_dropped()
            return
        tag = channel.delivery_tag = channel.delivery_tag + 1
        frames = encode_deliver(
            channel.number,
            self.tag_bytes,
            tag,
            False,
            "",
            routing_key,
            properties_raw,
            body,
            session.frame_max,
        )
        session.write(frames)
        session.metrics["delivered"] += 1
        # The bound, as for stored deliveries: the reply that crosses it goes out and stops the
        # connection's other consumers too (the next replies are dropped until it drains).
        session.outgoing_room -= len(frames)
        if session.outgoing_room <= 0:
            session.stop_deliveries()

    def cancelled_by_server(self) -> None:
        """Its queue was deleted: consumer_cancel_notify clients get a Basic.Cancel."""
        self.channel.server_cancel(self)

    def __repr__(self) -> str:
        return f"ChannelConsumer({self.tag!r}, channel={self.channel.number})"


def stop_channel_deliveries(channel: Channel) -> None:
    """Its connection's outgoing buffer is full: the queues hand its consumers nothing more
    (what is in flight stays settleable; the rest stays in the queues, never dropped)."""
    for consumer in channel.consumers.values():
        if consumer.subscription is not None:
            consumer.subscription.pause()


def resume_channel_deliveries(channel: Channel) -> None:
    """The buffer drained: each consumer gets its own credit back (a channel with a global
    prefetch lends it, ``Channel.update_capacity``; no-ack consumers have none)."""
    if channel.closed:
        return
    limited = channel.limited
    for consumer in channel.consumers.values():
        subscription = consumer.subscription
        if subscription is not None and (consumer.no_ack or not limited):
            subscription.resume(consumer.prefetch)
    if limited:
        channel.update_capacity(notify=True)
