"""What every request handler works with: the broker-wide Kafka state and the connection.

``KafkaContext`` is built once per ``KafkaServer``: the Broker API (``core.api``), the listener's
settings (advertised address, topic auto-creation), the idempotent-producer state, the
transaction coordinator and the counters exported as metrics. ``Connection`` is what a handler
may know about the connection a request came on, with the ``ClientContext`` every API call it
makes for that client carries.

A handler is ``async def handler(context, connection, request) -> response body | None``; the
transport runs it eagerly (see ``server``), so work done before its first ``await`` happens in
request order.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from kio.schema.errors import ErrorCode

from core.api import PROTOCOL_KAFKA, ClientContext, ScramLogin, is_system_topic
from gateway.kafka.codec import Request

if TYPE_CHECKING:
    from core.api import BrokerAPI
    from gateway.kafka.producers import ProducerIdAllocator, ProducerStates
    from gateway.kafka.transactions import TransactionCoordinator

# A broker alone's node id: leader of every partition and controller (a cluster node's id and
# its partitions' leaders come from the Broker API's cluster view: leaders.py).
NODE_ID: Final = 0
# A broker alone's one leader epoch, forever: there is never another leader. Also the epoch
# stamped on the batches Fetch serves (fetch.py).
LEADER_EPOCH: Final = 0
# Kafka's Topic.LEGAL_CHARS and Topic.MAX_NAME_LENGTH.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME_LENGTH: Final = 249
# throttle_time_ms sent while the broker's flow control blocks publishers: clients wait this
# long before sending again (KIP-219), which is how Kafka tells producers to slow down.
FLOW_THROTTLE_MS: Final = 100
# The ClientContext of a connection before the transport tells who is there.
NO_CLIENT_YET: Final = ClientContext(PROTOCOL_KAFKA)
# Kafka's group offsets topic (Topic.GROUP_METADATA_TOPIC_NAME). BraidMQ keeps offsets in its own
# __offsets, but Metadata lists this entry (internal, one partition) as every Kafka cluster
# has one, so tools that look for it find it.
CONSUMER_OFFSETS_TOPIC: Final = "__consumer_offsets"
# The half-message convention's topics, braid.txn and braid.txn.check (docs/mapping.md): the
# broker's, so internal in Metadata, yet clients produce outcomes to one and read check-backs
# from the other, so both are produced to and fetched like any topic.
HALF_MESSAGE_TOPIC: Final = "braid.txn"


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    advertised_host: str | None = None  # None: the address the client connected to
    advertised_port: int | None = None
    auto_create_topics: bool = True
    num_partitions: int = 1
    cluster_id: str = "braidmq"


@dataclass(eq=False)
class KafkaContext:
    api: BrokerAPI
    settings: KafkaSettings
    producer_states: ProducerStates
    producer_ids: ProducerIdAllocator
    transactions: TransactionCoordinator
    metrics: dict[str, int] = field(default_factory=dict)

    def throttle_ms(self) -> int:
        return FLOW_THROTTLE_MS if self.api.publishing_blocked() else 0


@dataclass(eq=False, slots=True)
class LoginState:
    """A connection's login: set by SASL, a client certificate or the anonymous check."""

    logged_in: bool = False
    mechanism: str | None = None  # chosen by SaslHandshake, until the exchange ends
    scram: ScramLogin | None = None  # a SCRAM exchange after its first message
    failed: bool = False  # a SASL login failed: the connection is good for nothing else
    certificate_user: str | None = None  # the verified client certificate's CN (TLS)
    # Allowed (operation, name) pairs and the store generation they were decided under.
    allowed: dict[tuple[str, str], bool] = field(default_factory=dict)
    generation: int = -1


@dataclass(eq=False, slots=True)
class Connection:
    """One client connection as handlers see it."""

    peer: str  # "host:port" of the client, for logs and DescribeGroups
    local_host: str  # the address the client connected to (advertised when not configured)
    local_port: int
    client_id: str | None = None
    # Who calls the Broker API for this connection (client_id follows the request headers').
    client: ClientContext = NO_CLIENT_YET
    # Its login and the access answers kept for it (access.py).
    login: LoginState = field(default_factory=LoginState)
    tls: bool = False  # came in on a TLS listener (SSL / SASL_SSL)

    def advertised(self, settings: KafkaSettings) -> tuple[str, int]:
        """The broker address Metadata and FindCoordinator give this client: the advertised
        host, and the advertised port for the plain listener; a TLS client is told the TLS
        port it came in on, so that it stays on TLS (Kafka advertises one address per
        listener, ``advertised.listeners``)."""
        port = self.local_port if self.tls else settings.advertised_port or self.local_port
        return settings.advertised_host or self.local_host, port


ResponseBody: TypeAlias = Any  # a kio response entity
Handler: TypeAlias = Callable[
    [KafkaContext, Connection, Request], Coroutine[Any, Any, ResponseBody | None]
]


def is_legal_topic_name(name: str) -> bool:
    """Kafka's Topic.validate: 1..249 legal characters, not "." or ".."."""
    return (
        0 < len(name) <= MAX_TOPIC_NAME_LENGTH
        and name not in (".", "..")
        and _LEGAL_TOPIC.fullmatch(name) is not None
    )


def is_internal_topic(name: str) -> bool:
    """Metadata's ``is_internal``: the broker's ``__`` topics (``__consumer_offsets``
    included) and ``braid.txn``, ``braid.txn.*``. Consumers leave them out of pattern
    subscriptions (``exclude.internal.topics``, on by default)."""
    return (
        is_system_topic(name)
        or name == HALF_MESSAGE_TOPIC
        or name.startswith(HALF_MESSAGE_TOPIC + ".")
    )


def ms(value: datetime.timedelta | int | None) -> int:
    """A kio ``timedelta_i32`` field as milliseconds."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return round(value.total_seconds() * 1000)


def fenced_error(api_version: int, first_version_with_fenced: int = 2) -> ErrorCode:
    """PRODUCER_FENCED (90) for request versions that know it, INVALID_PRODUCER_EPOCH (47)
    before (KafkaApis converts it the same way for old clients)."""
    if api_version >= first_version_with_fenced:
        return ErrorCode.producer_fenced
    return ErrorCode.invalid_producer_epoch
