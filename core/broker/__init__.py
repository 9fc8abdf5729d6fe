"""The Broker facade: the one object every gateway talks to."""

from core.broker.broker import (
    EXCHANGE_QUEUE,
    Broker,
    BrokerConfig,
    Destination,
    PublishResult,
)
from core.broker.flow import FlowControl

__all__ = [
    "EXCHANGE_QUEUE",
    "Broker",
    "BrokerConfig",
    "Destination",
    "FlowControl",
    "PublishResult",
]
