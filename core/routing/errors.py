"""Errors raised by the routing layer when a name, filter or binding is refused.

Every error is a ``ValueError`` (a bad value from a client, never a broker fault) and carries
what a gateway sends back on the wire: an MQTT 5.0 reason code or an AMQP 0-9-1 reply code.
``reason`` says what is wrong in words, ``rule`` cites the normative statement, when there is one.
Not thread-specific: instances are immutable after construction.
"""

from __future__ import annotations

from typing import ClassVar

# Long values (a topic may be 65,535 bytes) are cut in messages; the full value stays in `.value`.
_MAX_VALUE_IN_MESSAGE = 80

# MQTT 5.0 reason codes (section 2.4) and AMQP 0-9-1 reply codes used by the errors below.
MQTT_TOPIC_FILTER_INVALID = 0x8F
MQTT_TOPIC_NAME_INVALID = 0x90
AMQP_PRECONDITION_FAILED = 406  # RabbitMQ's reply to a refused binding (binding_invalid)


class RoutingError(ValueError):
    """A routing value (topic name, filter, binding arguments) was refused.

    Attributes:
        value: the offending value, unshortened.
        reason: what is wrong with it, in words.
        rule: the normative statement enforced (``"MQTT-4.7.1-1"``), or ``None``.
    """

    mqtt_reason_code: ClassVar[int | None] = None
    amqp_reply_code: ClassVar[int | None] = None

    def __init__(self, value: object, reason: str, rule: str | None = None) -> None:
        self.value = value
        self.reason = reason
        self.rule = rule
        shown = repr(value)
        if len(shown) > _MAX_VALUE_IN_MESSAGE:
            shown = shown[: _MAX_VALUE_IN_MESSAGE - 3] + "..."
        cited = f" [{rule}]" if rule else ""
        super().__init__(f"{reason}{cited}: {shown}")


class InvalidTopicName(RoutingError):
    """An MQTT topic name (the address of a PUBLISH) is malformed."""

    mqtt_reason_code = MQTT_TOPIC_NAME_INVALID


class InvalidTopicFilter(RoutingError):
    """An MQTT topic filter (a SUBSCRIBE entry) is malformed."""

    mqtt_reason_code = MQTT_TOPIC_FILTER_INVALID


class InvalidSharedSubscription(InvalidTopicFilter):
    """A ``$share/<group>/<filter>`` subscription is malformed [MQTT-4.8.2-1], [MQTT-4.8.2-2]."""


class InvalidBindingArguments(RoutingError):
    """Binding arguments were refused (for example an unknown ``x-match`` value)."""

    amqp_reply_code = AMQP_PRECONDITION_FAILED
