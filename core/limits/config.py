"""LimitsConfig: the ``[limits]`` settings of ``braid serve`` (docs/configuration.md,
docs/limits.md).

Each count cap is ``None`` (``-1`` in the config file) for "no limit", the default of the broker
named beside it; the per-user and per-vhost limits are not settings but data, changed through
the management API as RabbitMQ's (``core/limits/store.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024
# RabbitMQ 3.x's max_message_size: 128 MiB by default (RabbitMQ 4.0 lowered it to 16 MiB), and
# at most 512 MiB (rabbit_command_assembler ?MAX_MSG_SIZE; its config schema refuses more).
DEFAULT_MAX_MESSAGE_SIZE: Final = 128 * MIB
MAX_MESSAGE_SIZE_CEILING: Final = 512 * MIB
# Bindings to one AMQP queue or exchange. RabbitMQ, Kafka and Mosquitto have no such cap (EMQX
# caps one client's subscriptions, infinity by default); BraidMQ's own: a binding costs a few
# hundred bytes in the binding table and the routing trie and a record in __meta, so one queue
# bound in a loop must stop long before memory does, and no application we know of binds one
# queue to more routing keys than this.
DEFAULT_MAX_BINDINGS_PER_DESTINATION: Final = 100_000
# Bytes of one Kafka request (frame) before the connection has logged in: Kafka's
# sasl.server.max.receive.size (524288), which bounds what an unauthenticated client may make the
# broker buffer; after the login, socket.request.max.bytes (100 MiB, the Kafka listener's own
# max_request_size) applies. Every client sends ApiVersions or Metadata first, a few hundred bytes.
DEFAULT_KAFKA_MAX_REQUEST_BYTES_BEFORE_LOGIN: Final = 524288
# Seconds a request (a Kafka request, an AMQP frame, an MQTT packet) may stay partly received
# before the connection is closed: Kafka's request.timeout.ms (30 s), after which the client has
# given up on the request anyway; a peer that stops half-way through a 100 MiB request would
# otherwise pin its buffer for as long as the socket lives.
DEFAULT_INCOMPLETE_REQUEST_TIMEOUT_S: Final = 30.0
# Bytes one connection may have waiting to be sent (the socket's user-space write buffer) before
# deliveries to it stop: MQTT QoS 0 and clean-session messages are dropped and counted (as
# Mosquitto's max_queued_messages and EMQX's max_mqueue_len drop), persistent sessions' records
# stay in the log until it drains, AMQP consumers without a prefetch get nothing more (RabbitMQ's
# credit flow stops its writer the same way). The listeners' own read-pause marks (MQTT 1 MiB,
# AMQP 4 MiB) are lowered to it when it is smaller; 4 MiB keeps them as they are.
DEFAULT_MAX_OUTGOING_BUFFER_BYTES: Final = 4 * MIB
# The least it may be set to: a few PUBLISH packets or Basic.Deliver frames of ordinary size.
MIN_OUTGOING_BUFFER_BYTES: Final = 64 * 1024
# Seconds a connection may stay above that bound (the client takes nothing, or too little to get
# back under the low mark) before it is disconnected with a log line: RabbitMQ's
# tcp_listen_options.send_timeout (15 s, with send_timeout_close), which closes a connection whose
# socket write has been blocked that long. Mosquitto has none; EMQX's force_shutdown policy kills
# a client whose mailbox grows past max_mailbox_size instead.
DEFAULT_STALLED_CLIENT_TIMEOUT_S: Final = 15.0
# Milliseconds a Kafka connection may go without a request or a response before it is closed
# with a log line: Kafka's connections.max.idle.ms (600,000 ms, 10 minutes), enforced by its
# Selector. Clients reconnect when they next need the broker (the Java client, kafka-python and
# aiokafka close theirs after 540,000 ms themselves, just under it; librdkafka keeps them).
DEFAULT_KAFKA_CONNECTIONS_MAX_IDLE_MS: Final = 600_000


@dataclass(frozen=True)
class LimitsConfig:
    # Open connections of every protocol together. RabbitMQ's connection_max and Kafka's
    # max.connections default to no limit.
    max_connections: int | None = None
    # Queues in all vhosts together: AMQP queues and Kafka partitions (docs/limits.md says why
    # a Kafka partition is one). RabbitMQ 3.x has no node-wide cap (3.13's
    # cluster_queue_limit defaults to no limit); [broker] max_topics caps them with every topic.
    max_queues: int | None = None
    # Persistent MQTT sessions (a session expiry above 0, or clean session off in 3.1.1),
    # connected or not. Mosquitto and EMQX have no cap (EMQX's max_sessions: infinity).
    max_mqtt_sessions: int | None = None
    # Subscriptions of one MQTT client (EMQX's mqtt.max_subscriptions, default infinity).
    max_subscriptions_per_client: int | None = None
    # Bindings to one AMQP queue or exchange (the destination), from every source together.
    max_bindings_per_destination: int | None = DEFAULT_MAX_BINDINGS_PER_DESTINATION
    # The largest AMQP message body, in bytes (RabbitMQ 3.x's max_message_size).
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # The largest Kafka request before the connection logged in (sasl.server.max.receive.size).
    kafka_max_request_bytes_before_login: int = DEFAULT_KAFKA_MAX_REQUEST_BYTES_BEFORE_LOGIN
    # How long a partly received request may stay incomplete before the connection is closed.
    incomplete_request_timeout_s: float = DEFAULT_INCOMPLETE_REQUEST_TIMEOUT_S
    # Outgoing bytes one connection may have buffered before deliveries to it stop.
    max_outgoing_buffer_bytes: int = DEFAULT_MAX_OUTGOING_BUFFER_BYTES
    # A connection whose outgoing buffer stays over that bound this long is disconnected.
    stalled_client_timeout_s: float = DEFAULT_STALLED_CLIENT_TIMEOUT_S
    # A Kafka connection idle this long (no request, nothing sent) is closed.
    kafka_connections_max_idle_ms: int = DEFAULT_KAFKA_CONNECTIONS_MAX_IDLE_MS

    def __post_init__(self) -> None:
        if self.kafka_max_request_bytes_before_login < 64:
            raise ValueError(
                "kafka_max_request_bytes_before_login must be at least 64 (an ApiVersions "
                f"request), not {self.kafka_max_request_bytes_before_login}"
            )
        if not self.incomplete_request_timeout_s > 0:
            raise ValueError(
                "incomplete_request_timeout_s must be above 0, "
                f"not {self.incomplete_request_timeout_s}"
            )
        if self.max_outgoing_buffer_bytes < MIN_OUTGOING_BUFFER_BYTES:
            raise ValueError(
                f"max_outgoing_buffer_bytes must be at least {MIN_OUTGOING_BUFFER_BYTES}, "
                f"not {self.max_outgoing_buffer_bytes}"
            )
        if not self.stalled_client_timeout_s > 0:
            raise ValueError(
                f"stalled_client_timeout_s must be above 0, not {self.stalled_client_timeout_s}"
            )
        if self.kafka_connections_max_idle_ms < 1:
            raise ValueError(
                "kafka_connections_max_idle_ms must be at least 1, "
                f"not {self.kafka_connections_max_idle_ms}"
            )
        if not 1 <= self.max_message_size <= MAX_MESSAGE_SIZE_CEILING:
            raise ValueError(
                f"max_message_size must be 1..{MAX_MESSAGE_SIZE_CEILING} "
                f"(RabbitMQ's range), not {self.max_message_size}"
            )
