"""What both ends of a cluster gRPC connection agree on (docs/cluster.md sections 7 and 13): the
shared secret and where it travels, message sizes, keepalive and reconnect timing, and the
shape of ``Admin`` calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from core.limits.config import DEFAULT_MAX_MESSAGE_SIZE

# The call metadata key that carries the shared secret (gRPC keys are lower case).
SECRET_METADATA_KEY: Final = "braid-cluster-secret"

# Room for a message's envelope (routing, properties) above the largest body a client may publish.
ENVELOPE_ALLOWANCE: Final = 1024 * 1024

# An Admin call's arguments and answer: a JSON object.
JsonObject = dict[str, Any]

# The Admin call every node answers: {"node": id, "incarnation": n}.
PING: Final = "ping"

# An option value as grpc takes it.
ChannelOption = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RpcSettings:
    """``[cluster]`` settings the gRPC layer uses. ``secret`` is the same on every node; a call
    without it is refused, so it must not be empty."""

    secret: str
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # [limits] max_message_size
    heartbeat_ms: int = 2000
    rpc_timeout_ms: int = 30000

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("the cluster secret must not be empty")
        if self.heartbeat_ms <= 0 or self.rpc_timeout_ms <= 0:
            raise ValueError("heartbeat_ms and rpc_timeout_ms must be positive")

    @property
    def max_grpc_message(self) -> int:
        """gRPC's message limit, both ways: its 4 MiB default would refuse RabbitMQ's 128 MiB."""
        return self.max_message_size + ENVELOPE_ALLOWANCE

    @property
    def rpc_timeout_s(self) -> float:
        return self.rpc_timeout_ms / 1000


def _common_options(settings: RpcSettings) -> list[ChannelOption]:
    # Keepalive pings every heartbeat, also on idle streams (a consumer stream without
    # deliveries): a peer that died without closing its sockets is noticed in about two
    # heartbeats, before its lease (lease_ms, ~4.5 heartbeats) runs out. Pings are not capped by
    # data sent (max_pings_without_data 0), since a quiet stream is normal here.
    return [
        ("grpc.max_send_message_length", settings.max_grpc_message),
        ("grpc.max_receive_message_length", settings.max_grpc_message),
        ("grpc.keepalive_time_ms", settings.heartbeat_ms),
        ("grpc.keepalive_timeout_ms", settings.heartbeat_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options(settings: RpcSettings) -> list[ChannelOption]:
    return [
        *_common_options(settings),
        # Accept the peers' pings at the rate above (gRPC's default minimum is 5 minutes without
        # data, and it answers faster pings with GOAWAY "too_many_pings"); half a heartbeat
        # leaves room for timer jitter.
        ("grpc.http2.min_ping_interval_without_data_ms", max(1, settings.heartbeat_ms // 2)),
        # gRPC sets SO_REUSEPORT by default: a second node given the same --cluster-port would
        # then share it silently instead of failing to start.
        ("grpc.so_reuseport", 0),
    ]


def channel_options(settings: RpcSettings) -> list[ChannelOption]:
    return [
        *_common_options(settings),
        # Reconnect to a restarted peer within a heartbeat (gRPC's backoff grows to 120 s, and
        # calls fail fast with UNAVAILABLE all that while).
        ("grpc.initial_reconnect_backoff_ms", min(1000, settings.heartbeat_ms)),
        ("grpc.min_reconnect_backoff_ms", min(1000, settings.heartbeat_ms)),
        ("grpc.max_reconnect_backoff_ms", settings.heartbeat_ms),
    ]
