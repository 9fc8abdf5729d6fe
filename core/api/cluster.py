"""The cluster as a Kafka client sees it (docs/cluster.md sections 6 and 8): which nodes are
brokers, which node leads a partition and at which leader epoch, and which node coordinates a
consumer group or a transactional id.

A :class:`ClusterView` answers these from what the node knows now, without I/O (a Metadata
request must not wait for Redis): :data:`SINGLE_NODE` is a broker alone, node 0, leader of
every partition at epoch 0 and coordinator of everything, today's single-node answers;
``core/cluster/kafka_view.py:MembershipView`` is a cluster node's, over the membership and the
ownership table in Redis, cached. :class:`ClusterCalls` puts the view behind the Broker API.

Addresses. A view names this node (:meth:`ClusterView.this_node`) but need not know its own
address: the Kafka listener tells each client the address it came in on (or the advertised
one, and the TLS port to a TLS client), as it always did. The other brokers are listed with
what they registered.

The per-partition check on produce and fetch is one dict lookup: :meth:`ClusterView.
leader_table` hands out a :class:`LeaderTable` that computes a partition's leader on its first
lookup and keeps it until the view's next refresh (a new table then). The single node has none
(``None``): it leads everything, so there is nothing to check.

Not thread-safe: the event loop's thread, like the rest of the Broker API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, Protocol

from core.api.base import BrokerCalls, ClientContext

# The coordinator kinds (FindCoordinator's key types): a consumer group, a transactional id.
# The same words as the placement kinds of core/cluster/placement.py, PLACE_GROUP and PLACE_TXN.
COORDINATOR_GROUP: Final = "group"
COORDINATOR_TXN: Final = "txn"
COORDINATOR_KINDS: Final = (COORDINATOR_GROUP, COORDINATOR_TXN)
# The single node's broker id (Metadata has always said 0) and its one leader epoch.
SINGLE_NODE_ID: Final = 0
SINGLE_NODE_EPOCH: Final = 0


class BrokerNode(NamedTuple):
    """One Kafka broker: its node id (an int32) and the address it registered for Kafka
    clients (``tls_port``: its TLS listener's, None without one). ``host`` is ``""`` and
    ``port`` 0 for this node when the view does not know them (the listener does)."""

    node_id: int
    host: str
    port: int
    tls_port: int | None = None
    rack: str | None = None


class PartitionLeader(NamedTuple):
    """Who leads a partition: the node owning its shard, and the shard's epoch (Kafka's leader
    epoch: it only grows)."""

    node_id: int
    epoch: int


class LeaderTable(dict[tuple[str, int], PartitionLeader | None]):
    """``(topic, partition) -> PartitionLeader | None`` (None: the partition's shard has no
    live owner), filled on first lookup by ``lookup`` and kept for as long as the view that
    made it is current: ``table[topic, partition]`` costs a dict lookup after the first."""

    __slots__ = ("_lookup",)

    def __init__(self, lookup: Callable[[str, int], PartitionLeader | None]) -> None:
        super().__init__()
        self._lookup = lookup

    def __missing__(self, key: tuple[str, int]) -> PartitionLeader | None:
        leader = self[key] = self._lookup(*key)
        return leader


class ClusterView(Protocol):
    """What a node knows of the cluster, for Kafka clients; every call answers from memory."""

    def this_node(self) -> int:
        """This node's broker id."""
        ...

    def brokers(self) -> Sequence[BrokerNode]:
        """The live nodes serving Kafka, this one included, by node id."""
        ...

    def partition_leader(self, topic: str, partition: int) -> PartitionLeader | None:
        """The leader of ``topic``'s partition ``partition`` (the live owner of its shard),
        or None when that shard has no live owner."""
        ...

    def coordinator(self, kind: str, key: str) -> int | None:
        """The node coordinating the group (``kind`` :data:`COORDINATOR_GROUP`) or the
        transactional id (:data:`COORDINATOR_TXN`) ``key``: the live owner of its shard, or
        None when it has none."""
        ...

    def leader_table(self) -> LeaderTable | None:
        """The current :class:`LeaderTable`, or None when this node leads every partition
        (a broker alone): the gateway then checks nothing."""
        ...


class SingleNodeView:
    """A broker alone: node 0, the leader of every partition at epoch 0 and the coordinator of
    every group and transaction, as a single BraidMQ node has always told Kafka clients."""

    _LEADER: Final = PartitionLeader(SINGLE_NODE_ID, SINGLE_NODE_EPOCH)
    _BROKERS: Final = (BrokerNode(SINGLE_NODE_ID, "", 0),)

    def this_node(self) -> int:
        return SINGLE_NODE_ID

    def brokers(self) -> Sequence[BrokerNode]:
        return self._BROKERS

    def partition_leader(self, topic: str, partition: int) -> PartitionLeader | None:
        return self._LEADER

    def coordinator(self, kind: str, key: str) -> int | None:
        return SINGLE_NODE_ID

    def leader_table(self) -> LeaderTable | None:
        return None


SINGLE_NODE: Final = SingleNodeView()


class ClusterCalls(BrokerCalls):
    """The cluster as Kafka clients see it: brokers, partition leaders, coordinators (module
    docstring). The view is :data:`SINGLE_NODE` until the process that assembles a cluster
    node sets its own (:meth:`set_cluster_view`)."""

    _cluster_view: ClusterView = SINGLE_NODE

    def set_cluster_view(self, view: ClusterView) -> None:
        """Answer from ``view`` from now on (a cluster node's, set once at start)."""
        self._cluster_view = view

    def this_node(self) -> int:
        """This node's Kafka broker id (0 for a node alone)."""
        return self._cluster_view.this_node()

    def brokers(self, context: ClientContext) -> Sequence[BrokerNode]:
        """The live brokers, by node id; this node's address is the listener's to give."""
        return self._cluster_view.brokers()

    def partition_leader(
        self, context: ClientContext, topic: str, partition: int
    ) -> PartitionLeader | None:
        """The leader of a partition and its leader epoch; None: its shard has no live
        owner."""
        return self._cluster_view.partition_leader(topic, partition)

    def coordinator(self, context: ClientContext, kind: str, key: str) -> int | None:
        """The node coordinating a group or a transactional id (``kind``: one of
        :data:`COORDINATOR_KINDS`); None: its shard has no live owner."""
        if kind not in COORDINATOR_KINDS:
            raise ValueError(f"unknown coordinator kind {kind!r}")
        return self._cluster_view.coordinator(kind, key)

    def leader_table(self, context: ClientContext) -> LeaderTable | None:
        """The partition leaders as a dict to look up per partition on produce and fetch;
        None when this node leads every partition (nothing to check)."""
        return self._cluster_view.leader_table()
