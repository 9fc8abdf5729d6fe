"""The Broker API: everything a gateway may use of the core, and nothing else.

A gateway (``gateway/amqp``, ``gateway/mqtt``, ``gateway/kafka``) imports ``core.api`` and no
other ``core`` module (``tests/test_layers.py`` enforces it). It is handed one
:class:`BrokerAPI` by the process that assembles the listeners (``braid/server.py``) and calls
only its methods; it never reaches into the broker's parts.

The contract, so that security, limits and the cluster fit behind the same calls later:

- **Who is calling.** Every call that acts for a client, or reads what a client may be refused
  (a topic, queue, partition, group or metadata entry it names; the retained messages a
  filter matches), takes a :class:`ClientContext` (protocol, vhost, user, peer address,
  connection id, client id) as its first argument, so that authorization and limits can be
  decided here, once, for every protocol (``core/api/security.py``: logins, and
  :meth:`~BrokerAPI.authorize` for every operation of docs/security.md's table). A gateway
  passes the connection's or session's context, or, for what it does on its own behalf (its
  vhost's or hub's own objects, the Kafka transaction coordinator, tag-filter registry and
  producer-state table), a context of its own or :data:`INTERNAL_CONTEXT`. The calls without
  one are the gateway's own plumbing, and only these:

  - durability checks: ``when_durable``, ``is_durable``, ``failed_marks``,
    ``waits_for_fsync``;
  - flow control and its listeners: ``publishing_blocked``, ``publishing_blocked_reason``,
    ``wait_publishing_allowed``, ``add_flow_listener``, ``remove_flow_listener``, and the
    disk alarm among its reasons: ``disk_alarm``, and whether a new connection may be kept:
    ``may_accept_connection``;
  - start-up loading (finding back what the gateway stored, and the configured MQTT
    exchange): ``topics_with_config``, ``open_queue``, ``session_states``,
    ``session_queue_names``, ``session_queue_bindings``, ``open_transactions``,
    ``read_tail_batch_headers``, ``mqtt_compat_exchange``;
  - live-router lookups on the publish path (the publish itself carries the context):
    ``routed_destinations``, ``has_ack_queue``, ``bound_destinations``,
    ``live_subscribers``, ``has_live_subscriptions``;
  - the rest of a call that carried a context: ``enforce_max_length`` (after a transaction's
    commit), ``exchange_has_bindings`` (AMQP's if-unused and auto-delete checks around
    :meth:`~BrokerAPI.delete_exchange` and :meth:`~BrokerAPI.unbind`),
    ``unfollow_live_records`` and ``remove_route_hook`` (undoing
    :meth:`~BrokerAPI.follow_live_records` and :meth:`~BrokerAPI.add_route_hook`);
  - gauges: ``retained_count``, ``disk_status``;
  - the cluster's view (``cluster.py``): ``this_node``, and ``set_cluster_view`` and
    ``set_mqtt_cluster`` and ``set_remote_retained`` (``sessions.py``),
    ``set_remote_queues`` (``queues.py``),
    ``set_producer_ids`` and ``set_txn_markers`` (``partitions.py``), which the process that
    assembles a cluster node calls once; and the AMQP gateway's lookups of queues declared on
    other nodes (at start and on a name it does not know; ``queues.py``): ``queue_is_local``,
    ``known_queue``, ``refresh_queue``, ``purge_known_queue``, and told of those of its
    shards as other nodes define or delete them: ``add_queue_listener``.

  ``tests/test_layers.py`` holds the class to this list (each name above in double
  backquotes, one list, ending here).
- **Durability is a handle.** :meth:`BrokerAPI.publish` is a plain call: it routes and stores
  the record now (in the order the frames came) and returns a :class:`Publication`, whose
  ``result`` is there at once unless flow control holds the publish back, and which is
  *awaited* for durability. Where the record is stored (this process's log, another shard or
  node) is behind it.
- **Deliveries are pushed under credit.** :meth:`BrokerAPI.consume` attaches a consumer with a
  prefetch (AMQP prefetch, MQTT Receive Maximum) and returns a :class:`Subscription` with ack,
  nack/requeue, pause, resume and detach.
- **Nothing outlives the call.** No call returns a core object (a store, a queue, a table) or a
  buffer into the log's mappings that the caller may keep: what comes back is values
  (:class:`PublishOutcome`, :class:`QueueStats`, ``bytes``), value types re-exported below, or
  handles defined in this module.

Value types and constants a gateway needs (record fields, protocol codes, header names, error
types) are re-exported here, so this module is the one place that says what the boundary is.

Not thread-safe: the event loop's thread, like the broker behind it.
"""

from __future__ import annotations

from core.api.base import INTERNAL_CONTEXT as INTERNAL_CONTEXT
from core.api.base import (
    PROTOCOL_AMQP,
    PROTOCOL_INTERNAL,
    PROTOCOL_KAFKA,
    PROTOCOL_MQTT,
    ClientContext,
    Headers,
    Publication,
    PublishOutcome,
)
from core.api.cluster import COORDINATOR_GROUP as COORDINATOR_GROUP
from core.api.cluster import COORDINATOR_TXN as COORDINATOR_TXN
from core.api.cluster import SINGLE_NODE_ID as SINGLE_NODE_ID
from core.api.cluster import BrokerNode as BrokerNode
from core.api.cluster import ClusterCalls
from core.api.cluster import ClusterView as ClusterView
from core.api.cluster import LeaderTable as LeaderTable
from core.api.cluster import PartitionLeader as PartitionLeader
from core.api.connections import ConnectionCalls
from core.api.limits import LimitCalls
from core.api.management import REFUSED_ACCESS as REFUSED_ACCESS
from core.api.management import REFUSED_NOT_FOUND as REFUSED_NOT_FOUND
from core.api.management import REFUSED_PRECONDITION as REFUSED_PRECONDITION
from core.api.management import REFUSED_UNAVAILABLE as REFUSED_UNAVAILABLE
from core.api.management import BindingView as BindingView
from core.api.management import BrowsedMessage as BrowsedMessage
from core.api.management import ConsumerView as ConsumerView
from core.api.management import DelayedDestination as DelayedDestination
from core.api.management import ManagementCalls
from core.api.management import ManagementRefusal as ManagementRefusal
from core.api.management import ObjectAdministrator as ObjectAdministrator
from core.api.management import StoredRecord as StoredRecord
from core.api.partitions import PartitionCalls
from core.api.queues import QueueCalls
from core.api.security import SecurityCalls
from core.api.sessions import SessionCalls
from core.broker.broker import BRAID_HEADER_PREFIX as BRAID_HEADER_PREFIX
from core.broker.broker import EXCHANGE_QUEUE, Destination
from core.broker.broker import may_carry_braid_headers as may_carry_braid_headers
from core.broker.eager import Pending, run_eagerly
from core.broker.eager import start_eagerly as start_eagerly
from core.broker.topics import TopicError, TopicInfo
from core.clock import Clock as Clock
from core.clock import LoopClock as LoopClock
from core.clock import ManualClock as ManualClock
from core.clock import Timer as Timer
from core.deadletter.policy import DEAD_LETTER_REASON_HEADER as DEAD_LETTER_REASON_HEADER
from core.deadletter.policy import DEAD_LETTER_SUBJECT_HEADER as DEAD_LETTER_SUBJECT_HEADER
from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER as DEAD_LETTER_TOPIC_HEADER
from core.deadletter.policy import X_DEATH_HEADER as X_DEATH_HEADER
from core.deadletter.policy import DeadLetterPolicy as DeadLetterPolicy
from core.deadletter.redrive import DeadLetterQueue as DeadLetterQueue
from core.deadletter.redrive import RedriveResult as RedriveResult
from core.delivery.ackqueue import OVERFLOW_DROP_HEAD as OVERFLOW_DROP_HEAD
from core.delivery.ackqueue import OVERFLOW_REJECT_PUBLISH as OVERFLOW_REJECT_PUBLISH
from core.delivery.ackqueue import AckQueueConfig as AckQueueConfig
from core.delivery.ackqueue import Delivery as Delivery
from core.delivery.handles import NO_CREDIT as NO_CREDIT
from core.delivery.handles import QueueHandle as QueueHandle
from core.delivery.handles import QueueStats as QueueStats
from core.delivery.handles import Settlements as Settlements
from core.delivery.handles import Subscription as Subscription
from core.delivery.message import EXPIRES_AT_HEADER as EXPIRES_AT_HEADER
from core.delivery.message import Message as Message
from core.errors import NotLeader as NotLeader
from core.errors import ShardUnavailable as ShardUnavailable
from core.groups.results import GroupDescription as GroupDescription
from core.groups.results import GroupListing as GroupListing
from core.groups.results import JoinResult as JoinResult
from core.groups.results import LeaveResult as LeaveResult
from core.groups.results import SyncResult as SyncResult
from core.groups.state import GroupState as GroupState
from core.kafka_values import OffsetCommit as OffsetCommit
from core.kafka_values import OpenTransaction as OpenTransaction
from core.kafka_values import StorageSettings as StorageSettings
from core.log.batches import unpack_batch as unpack_batch
from core.log.names import is_system_topic as is_system_topic
from core.log.record import CorruptRecordError as CorruptRecordError
from core.log.store import now_ms
from core.log.tags import TagFilter as TagFilter
from core.log.tags import parse_tag_expression as parse_tag_expression
from core.log.tags import tags_from_headers as tags_from_headers
from core.management.connections import PROTOCOL_AMQP_091 as PROTOCOL_AMQP_091
from core.management.connections import PROTOCOL_KAFKA_NAME as PROTOCOL_KAFKA_NAME
from core.management.connections import PROTOCOL_MQTT_5 as PROTOCOL_MQTT_5
from core.management.connections import PROTOCOL_MQTT_311 as PROTOCOL_MQTT_311
from core.management.connections import ChannelDetails as ChannelDetails
from core.management.connections import ConnectionControl as ConnectionControl
from core.management.connections import ConnectionDetails as ConnectionDetails
from core.management.connections import connection_name as connection_name
from core.management.connections import split_address as split_address
from core.offsets.store import CommittedOffset as CommittedOffset
from core.routing.errors import RoutingError as RoutingError
from core.routing.live import EMPTY_LEVEL_TOPIC as EMPTY_LEVEL_TOPIC
from core.routing.mqtt_topic import LEVEL_SEPARATOR as LEVEL_SEPARATOR
from core.routing.mqtt_topic import MULTI_LEVEL as MULTI_LEVEL
from core.routing.mqtt_topic import ONE_LEVEL as ONE_LEVEL
from core.routing.mqtt_topic import filter_levels_match as filter_levels_match
from core.routing.mqtt_topic import mqtt_name_of, routing_key_of
from core.routing.mqtt_topic import parse_shared_subscription as parse_shared_subscription
from core.routing.mqtt_topic import validate_topic_filter as validate_topic_filter
from core.scoped_reads import STORED_BATCH as STORED_BATCH
from core.scoped_reads import STORED_TXN_CONTROL as STORED_TXN_CONTROL
from core.scoped_reads import StoredEntry as StoredEntry
from core.scoped_reads import StoredRecordReader as StoredRecordReader
from core.scoped_reads import stored_body as stored_body
from core.scoped_reads import stored_flags as stored_flags
from core.scoped_reads import stored_tags as stored_tags
from core.scoped_reads import stored_time as stored_time
from core.security.mapping import OPERATIONS as SECURITY_OPERATIONS
from core.security.model import OPERATION_NUMBERS as KAFKA_ACL_OPERATION_NUMBERS
from core.security.model import PATTERN_TYPE_NUMBERS as KAFKA_ACL_PATTERN_TYPE_NUMBERS
from core.security.model import PERMISSION_TYPE_NUMBERS as KAFKA_ACL_PERMISSION_TYPE_NUMBERS
from core.security.model import RESOURCE_TYPE_NUMBERS as KAFKA_ACL_RESOURCE_TYPE_NUMBERS
from core.security.model import KafkaAcl as KafkaAcl
from core.security.model import KafkaAclFilter as KafkaAclFilter
from core.security.model import SecurityModelError as SecurityModelError
from core.security.scram import KAFKA_MECHANISM_NUMBERS as KAFKA_SCRAM_MECHANISM_NUMBERS
from core.security.scram import ScramCredential as ScramCredential
from core.security.service import LoginResult as LoginResult
from core.security.service import ScramLogin as ScramLogin
from core.transactions import TransactionError as TransactionError
from core.transactions.control import GROUP_HEADER as PRODUCER_GROUP_HEADER
from core.transactions.control import TXN_ID_HEADER as TXN_ID_HEADER

# (TagFilter and TransactionError: re-exported by the AMQP section's imports above.)
# The Kafka listener runs each request handler eagerly, to its first real wait, so that what
# a handler does before waiting happens in request order (core/broker/eager.py says why).
RestOfCoroutine = Pending
run_until_first_wait = run_eagerly

__all__ = [
    "EXCHANGE_QUEUE",
    "KAFKA_ACL_OPERATION_NUMBERS",
    "KAFKA_ACL_PATTERN_TYPE_NUMBERS",
    "KAFKA_ACL_PERMISSION_TYPE_NUMBERS",
    "KAFKA_ACL_RESOURCE_TYPE_NUMBERS",
    "KAFKA_SCRAM_MECHANISM_NUMBERS",
    "PRODUCER_GROUP_HEADER",
    "PROTOCOL_AMQP",
    "PROTOCOL_INTERNAL",
    "PROTOCOL_KAFKA",
    "PROTOCOL_MQTT",
    "SECURITY_OPERATIONS",
    "BrokerAPI",
    "ClientContext",
    "Destination",
    "Headers",
    "Publication",
    "PublishOutcome",
    "TopicError",
    "TopicInfo",
    "mqtt_name_of",
    "now_ms",
    "routing_key_of",
]


class BrokerAPI(
    QueueCalls,
    SessionCalls,
    PartitionCalls,
    SecurityCalls,
    ManagementCalls,
    LimitCalls,
    ConnectionCalls,
    ClusterCalls,
):
    """The one object a gateway talks to (the contract is the module docstring's): the calls
    every protocol uses (``base.py``), those of each consumption model: queues
    (``queues.py``), sessions (``sessions.py``) and partitions (``partitions.py``), and
    logins and access checks (``security.py``), listings and operator actions for the
    management API (``management.py``), the open connections (``connections.py``), the
    limits on counts and sizes (``limits.py``) and the cluster as Kafka clients see it
    (``cluster.py``).
    ``BrokerAPI(node, security)``, over the broker's :class:`~core.broker.Node` (each call
    resolves the shard it is for through the node's ``ShardSet``): the process passes its
    :class:`~core.security.SecurityService`; without one, a default one over the node's
    metadata is made at the first security call."""
