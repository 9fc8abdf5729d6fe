"""The ``[cluster]`` settings of a node (docs/cluster.md section 13), with their precedents.

``shards`` is not here: it is fixed when the data root is made (``braid cluster init --shards``,
default 16 as Kafka's ``offsets.topic.num.partitions`` is fixed, section 2) and read from
``cluster.json`` (core/cluster/layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Section 13's table:
#
# | setting                     | default | precedent / reason                                     |
# |-----------------------------|---------|--------------------------------------------------------|
# | lease_ms                    | 9000    | Kafka KRaft broker.session.timeout.ms                  |
# | heartbeat_ms                | 2000    | Kafka KRaft broker.heartbeat.interval.ms               |
# | expect_nodes                | 1       | RabbitMQ cluster_formation.target_cluster_size_hint    |
# |                             |         | (--workers N passes N)                                 |
# | rpc_timeout_ms              | 30000   | Kafka request.timeout.ms                               |
# | metadata_wait_ms            | 15000   | RabbitMQ channel_operation_timeout (a declare is a     |
# |                             |         | channel operation)                                     |
# | unavailable_wait_ms         | 15000   | RabbitMQ channel_operation_timeout                     |
# | takeover_timeout_ms         | 15000   | RabbitMQ channel_operation_timeout                     |
# | forward_batch_bytes         | 1048576 | Kafka max.request.size                                 |
# | cluster_port                | 0       | any free port, registered in Redis                     |
# | kafka_worker_port_base      | 19092   | issue 22: worker i advertises base + i                 |
# | kafka_worker_tls_port_base  | 19192   | issue 22: the TLS twin                                 |
# | takeover                    | true    | issue 23: live nodes take a dead node's shards over    |
# |                             |         | (Kafka KRaft moves leadership off a fenced broker)     |

LEASE_MS = 9000
HEARTBEAT_MS = 2000
EXPECT_NODES = 1
RPC_TIMEOUT_MS = 30000
METADATA_WAIT_MS = 15000
UNAVAILABLE_WAIT_MS = 15000
TAKEOVER_TIMEOUT_MS = 15000
FORWARD_BATCH_BYTES = 1048576
CLUSTER_PORT = 0
KAFKA_WORKER_PORT_BASE = 19092
KAFKA_WORKER_TLS_PORT_BASE = 19192
TAKEOVER = True
MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """What ``[cluster]`` of ``braid.toml`` (and its ``--flags``) say; the defaults are section
    13's. Checked when made: a lease must outlast a heartbeat, or a node would fence itself
    between two renewals."""

    lease_ms: int = LEASE_MS
    heartbeat_ms: int = HEARTBEAT_MS
    expect_nodes: int = EXPECT_NODES
    rpc_timeout_ms: int = RPC_TIMEOUT_MS
    metadata_wait_ms: int = METADATA_WAIT_MS
    unavailable_wait_ms: int = UNAVAILABLE_WAIT_MS
    takeover_timeout_ms: int = TAKEOVER_TIMEOUT_MS
    forward_batch_bytes: int = FORWARD_BATCH_BYTES
    cluster_port: int = CLUSTER_PORT
    kafka_worker_port_base: int = KAFKA_WORKER_PORT_BASE
    kafka_worker_tls_port_base: int = KAFKA_WORKER_TLS_PORT_BASE
    # Whether this node takes over the shards of nodes whose lease is gone (issue 23); off: a
    # dead node's shards wait for it to come back (issue 22's behaviour).
    takeover: bool = TAKEOVER

    def __post_init__(self) -> None:
        if not isinstance(self.takeover, bool):
            raise ValueError(f"[cluster] takeover must be true or false, not {self.takeover!r}")
        for setting in fields(self):
            if setting.name == "takeover":
                continue
            value = getattr(self, setting.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"[cluster] {setting.name} must be an integer, not {value!r}")
        positive = (
            "lease_ms",
            "heartbeat_ms",
            "expect_nodes",
            "rpc_timeout_ms",
            "metadata_wait_ms",
            "unavailable_wait_ms",
            "takeover_timeout_ms",
            "forward_batch_bytes",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"[cluster] {name} must be positive, not {getattr(self, name)}")
        if self.heartbeat_ms >= self.lease_ms:
            raise ValueError(
                f"[cluster] heartbeat_ms ({self.heartbeat_ms}) must be below lease_ms "
                f"({self.lease_ms}): the lease must outlast the time between two renewals"
            )
        for name in ("cluster_port", "kafka_worker_port_base", "kafka_worker_tls_port_base"):
            if not 0 <= getattr(self, name) <= MAX_PORT:
                raise ValueError(
                    f"[cluster] {name} must be a port number, not {getattr(self, name)}"
                )
