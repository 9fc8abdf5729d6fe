"""Admin APIs over a partition's records and a group's offsets: DeleteRecords (21),
DescribeLogDirs (35) and OffsetDelete (47), answered as a one-broker Kafka answers them.

- DeleteRecords moves a partition's log start offset (``BrokerAPI.delete_records``, durable):
  a fetch below it is OFFSET_OUT_OF_RANGE, ListOffsets earliest and the fetch responses'
  ``log_start_offset`` give it. An offset past the high watermark is OFFSET_OUT_OF_RANGE, as in
  Kafka; -1 means the high watermark. The broker's ``__`` topics are INVALID_TOPIC_EXCEPTION
  (Kafka refuses internal topics the same way). A partition this node does not lead is
  NOT_LEADER_OR_FOLLOWER (``leaders.py``): admin clients send it to the leader.
- DescribeLogDirs: one log directory, the data directory, with each partition's stored bytes
  from its log start offset on, and (v4) the file system's total and usable bytes.
- OffsetDelete, as Kafka's GroupCoordinator.handleDeleteOffsets (NOT_COORDINATOR on a node
  that does not coordinate the group): an unknown group is
  GROUP_ID_NOT_FOUND; an Empty group loses the named offsets; a consumer group with members
  keeps the offsets of topics it is subscribed to (GROUP_SUBSCRIBED_TO_TOPIC; while it is not
  Stable its subscriptions are unknown, so every topic counts as subscribed, as Kafka's
  ``isSubscribedToTopic`` does without them); any other group with members: NON_EMPTY_GROUP.

Access, as Kafka's KafkaApis: DELETE on each topic for DeleteRecords (``"kafka
DeleteRecords"``), DESCRIBE on the cluster for DescribeLogDirs, DELETE on the group and READ on
each topic for OffsetDelete. :func:`admin_allowed` asks the mapping table's key for the API, or
the nearest existing one while the table has no row of its own (docs/security.md).
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import COORDINATOR_GROUP, SECURITY_OPERATIONS, TopicError, is_system_topic
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import (
    Connection,
    Handler,
    KafkaContext,
    ResponseBody,
    is_legal_topic_name,
)
from gateway.kafka.entities import build_response
from gateway.kafka.leaders import coordinator_error, partition_check

log = logging.getLogger(__name__)

# DeleteRecords' "up to the high watermark" offset (DeleteRecordsRequest.HIGH_WATERMARK).
HIGH_WATERMARK: Final = -1
# Group states (GroupState values) OffsetDelete tells apart.
_EMPTY: Final = "Empty"
_DEAD: Final = "Dead"
_STABLE: Final = "Stable"
# The consumer protocol's protocol type: only its member metadata names subscriptions.
CONSUMER_PROTOCOL_TYPE: Final = "consumer"
# ConsumerProtocolSubscription (every version starts the same way): version int16, then the
# topics as an int32 count of int16-length strings.
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def admin_allowed(
    context: KafkaContext, connection: Connection, operation: str, nearest: str, name: str
) -> bool:
    """:func:`allowed` for ``operation`` when the mapping table has it, else for ``nearest``
    (an existing row that needs the same Kafka permission on the same kind of resource)."""
    key = operation if operation in SECURITY_OPERATIONS else nearest
    return allowed(context, connection, key, name)


# -- DeleteRecords ---------------------------------------------------------------------------


async def handle_delete_records(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    client = connection.client
    topics = []
    leaders = context.api.leader_table(client)
    this_node = context.api.this_node()
    for topic in body.topics:
        name = topic.name
        results = []
        may_delete = not is_system_topic(name) and allowed(
            context, connection, "kafka DeleteRecords", name
        )
        # Whether this node leads the partitions (an unknown one is the core's to refuse).
        info = context.api.topic_info(client, name) if leaders is not None else None
        for wanted in topic.partitions:
            error = ErrorCode.none
            low_watermark = -1
            if is_system_topic(name):
                error = ErrorCode.invalid_topic_exception
            elif not may_delete:
                error = ErrorCode.topic_authorization_failed
            elif (
                info is not None
                and 0 <= wanted.partition_index < info.queues
                and partition_check(leaders, this_node, name, wanted.partition_index)
                != ErrorCode.none
            ):
                error = ErrorCode.not_leader_or_follower
            else:
                try:
                    low_watermark = await context.api.delete_records(
                        client, name, wanted.partition_index, wanted.offset
                    )
                except TopicError as refusal:
                    error = (
                        ErrorCode.offset_out_of_range
                        if refusal.code == "offset_out_of_range"
                        else ErrorCode.unknown_topic_or_partition
                    )
                    log.info("kafka: %s DeleteRecords refused: %s", connection.peer, refusal)
                else:
                    log.info(
                        "kafka: %s moved the log start offset of %s/%d to %d",
                        connection.peer,
                        name,
                        wanted.partition_index,
                        low_watermark,
                    )
            results.append(
                {
                    "partition_index": wanted.partition_index,
                    "low_watermark": low_watermark,
                    "error_code": error,
                }
            )
        topics.append({"name": name, "partitions": results})
    return build_response(
        ApiKey.DELETE_RECORDS,
        request.api_version,
        {"throttle_time": context.throttle_ms(), "topics": topics},
    )


# -- DescribeLogDirs -------------------------------------------------------------------------


async def handle_describe_log_dirs(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    api = context.api
    client = connection.client
    if not admin_allowed(context, connection, "kafka DescribeLogDirs", "kafka DescribeAcls", ""):
        # Kafka: v3+ says so at the top; older versions get an empty list.
        return build_response(
            ApiKey.DESCRIBE_LOG_DIRS,
            request.api_version,
            {
                "throttle_time": context.throttle_ms(),
                "error_code": ErrorCode.cluster_authorization_failed,
                "results": [],
            },
        )
    known = {
        info.name: info.queues for info in api.list_topics(client) if is_legal_topic_name(info.name)
    }
    wanted: dict[str, list[int]] = {}
    if body.topics is None:
        wanted = {name: list(range(queues)) for name, queues in sorted(known.items())}
    else:
        for item in body.topics:
            queues = known.get(item.topic)
            if queues is not None:
                present = [p for p in item.partitions if 0 <= p < queues]
                wanted.setdefault(item.topic, []).extend(present)
    topics = [
        {
            "name": name,
            "partitions": [
                {
                    "partition_index": partition,
                    "partition_size": api.partition_bytes(client, name, partition),
                    "offset_lag": 0,  # the only replica: never behind
                    "is_future_key": False,
                }
                for partition in partitions
            ],
        }
        for name, partitions in wanted.items()
        if partitions
    ]
    path, total, usable = api.log_directory(client)
    return build_response(
        ApiKey.DESCRIBE_LOG_DIRS,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": ErrorCode.none,
            "results": [
                {
                    "error_code": ErrorCode.none,
                    "log_dir": path,
                    "topics": topics,
                    "total_bytes": total,
                    "usable_bytes": usable,
                }
            ],
        },
    )


# -- OffsetDelete ----------------------------------------------------------------------------


def subscribed_topics(metadata: bytes) -> set[str] | None:
    """The topics a consumer-protocol member subscribes to, from its JoinGroup metadata
    (ConsumerProtocolSubscription), or None if it cannot be read."""
    try:
        position = _INT16.size  # the version: every version starts with the topics
        (count,) = _INT32.unpack_from(metadata, position)
        position += _INT32.size
        topics: set[str] = set()
        for _ in range(count):
            (length,) = _INT16.unpack_from(metadata, position)
            position += _INT16.size
            topics.add(metadata[position : position + length].decode())
            position += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def _group_subscriptions(
    context: KafkaContext, connection: Connection, group_id: str
) -> set[str] | None:
    """Every topic the group's members subscribe to; None when unknown (not Stable, or a
    member's metadata unreadable)."""
    description = context.api.describe_group(connection.client, group_id)
    if description.state != _STABLE:
        return None
    topics: set[str] = set()
    for member in description.members:
        member_topics = subscribed_topics(member.metadata)
        if member_topics is None:
            return None
        topics |= member_topics
    return topics


async def handle_offset_delete(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    api = context.api
    client = connection.client
    group_id: str = body.group_id
    top_error = ErrorCode.none
    if not admin_allowed(context, connection, "kafka OffsetDelete", "kafka DeleteGroups", group_id):
        top_error = ErrorCode.group_authorization_failed
    elif coordinator_error(context, connection, COORDINATOR_GROUP, group_id) != ErrorCode.none:
        top_error = ErrorCode.not_coordinator  # another node's group: the client finds it
    else:
        state = api.group_state(client, group_id)
        if state is None or str(state) == _DEAD:
            top_error = ErrorCode.group_id_not_found
    topics = []
    to_delete: list[tuple[str, int]] = []
    if top_error == ErrorCode.none:
        state_name = str(api.group_state(client, group_id))
        subscriptions: set[str] | None = set()
        group_error = ErrorCode.none
        if state_name != _EMPTY:
            protocol_type = api.describe_group(client, group_id).protocol_type
            if protocol_type == CONSUMER_PROTOCOL_TYPE:
                subscriptions = _group_subscriptions(context, connection, group_id)
            else:
                group_error = ErrorCode.non_empty_group
        if group_error != ErrorCode.none:
            top_error = group_error
        else:
            for topic in body.topics:
                name = topic.name
                info = None if is_system_topic(name) else api.topic_info(client, name)
                may_read = allowed(context, connection, "kafka OffsetCommit topic", name)
                results = []
                for wanted in topic.partitions:
                    partition = wanted.partition_index
                    error = ErrorCode.none
                    if not may_read:
                        error = ErrorCode.topic_authorization_failed
                    elif info is None or not 0 <= partition < info.queues:
                        error = ErrorCode.unknown_topic_or_partition
                    elif subscriptions is None or name in subscriptions:
                        error = ErrorCode.group_subscribed_to_topic
                    else:
                        to_delete.append((name, partition))
                    results.append({"partition_index": partition, "error_code": error})
                topics.append({"name": name, "partitions": results})
    if to_delete:
        await api.delete_group_offsets(client, group_id, to_delete)
        log.info(
            "kafka: %s deleted %d committed offsets of group %r",
            connection.peer,
            len(to_delete),
            group_id,
        )
    return build_response(
        ApiKey.OFFSET_DELETE,
        request.api_version,
        {"error_code": top_error, "throttle_time": context.throttle_ms(), "topics": topics},
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.DELETE_RECORDS: handle_delete_records,
    ApiKey.DESCRIBE_LOG_DIRS: handle_describe_log_dirs,
    ApiKey.OFFSET_DELETE: handle_offset_delete,
}
