"""Ack-queue delivery semantics (AMQP queues, MQTT session queues)."""

from core.delivery.ackqueue import AckQueue, AckQueueConfig, Consumer, Delivery
from core.delivery.message import Message, messages_of

__all__ = ["AckQueue", "AckQueueConfig", "Consumer", "Delivery", "Message", "messages_of"]
