"""Errors the core raises to a gateway for a request that cannot be served, each carrying the
code the gateway maps to its protocol's answer (a Kafka error code, an AMQP reply code, an MQTT
reason code).

A module of its own, below every package of the core: ``core.broker`` and
``core.transactions.control`` both raise :class:`TopicError`, and neither may import the other
(``core.broker.broker`` imports ``core.transactions.control``).
"""

from __future__ import annotations


class TopicError(ValueError):
    """An invalid topic operation; ``code`` names the condition for the gateway to map."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
