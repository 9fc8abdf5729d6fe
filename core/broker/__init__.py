"""The broker: a :class:`Node` (cluster-wide: definitions, routing, flow control) over its
shards (:class:`Shard`, store-bound). The Broker API (``core/api``) is built over the node, and
gateways talk to that API only (docs/cluster.md section 6)."""

from core.broker.broker import (
    EXCHANGE_QUEUE,
    BrokerConfig,
    Destination,
    PublishResult,
)
from core.broker.flow import FlowControl
from core.broker.node import Node
from core.broker.shard import Shard
from core.broker.shards import ShardSet

__all__ = [
    "EXCHANGE_QUEUE",
    "BrokerConfig",
    "Destination",
    "FlowControl",
    "Node",
    "PublishResult",
    "Shard",
    "ShardSet",
]
