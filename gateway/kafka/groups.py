"""Consumer groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups,
DeleteGroups, OffsetCommit and OffsetFetch, translated onto the Broker API's group calls
(the core's coordinator of Kafka's classic protocol) and its committed offsets.

The coordinator answers with Kafka's own error codes, so they go on the wire unchanged; this
module only maps fields between versions. A group's coordinator is the owner of its shard
(``h(group) % S``, FindCoordinator names it): on any other node a group request is answered
NOT_COORDINATOR (16), after the access check as Kafka does, and the client finds the
coordinator again (``leaders.py``; a node alone coordinates every group). Assignors run in
the clients (the leader's SyncGroup carries every assignment), so every client's assignors
work unchanged.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import COORDINATOR_GROUP, ClientContext, is_system_topic
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import Connection, Handler, KafkaContext, ResponseBody, ms
from gateway.kafka.entities import build_response
from gateway.kafka.leaders import coordinator_error
from gateway.kafka.tagfilters import group_tag_filters

# Kafka's offset.metadata.max.bytes default: longer commit metadata is refused.
MAX_METADATA_BYTES: Final = 4096
# ListGroups v5+ group type of classic groups (KIP-848).
CLASSIC_GROUP_TYPE: Final = "classic"
NO_OFFSET: Final = -1


def _client_host(connection: Connection) -> str:
    # Kafka reports the client's InetAddress.toString(): "/127.0.0.1".
    return "/" + connection.peer.rpartition(":")[0]


def _group_denied(
    api_key: int, request: Request, error: ErrorCode = ErrorCode.group_authorization_failed
) -> ResponseBody:
    """GROUP_AUTHORIZATION_FAILED (30) for the whole request, as Kafka answers a group
    operation without READ (DESCRIBE for OffsetFetch) on the group; or ``error`` (another
    node's group: NOT_COORDINATOR)."""
    return _build(
        api_key,
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "generation_id": -1,
        },
    )


def not_coordinator(context: KafkaContext, connection: Connection, group_id: str) -> bool:
    """Another node (or none) coordinates ``group_id``."""
    return (
        coordinator_error(context, connection, COORDINATOR_GROUP, group_id)
        == ErrorCode.not_coordinator
    )


def _build(api_key: int, request: Request, values: dict[str, Any]) -> ResponseBody:
    return build_response(api_key, request.api_version, values)


async def handle_join_group(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka JoinGroup", body.group_id):
        return _group_denied(ApiKey.JOIN_GROUP, request)
    if not_coordinator(context, connection, body.group_id):
        return _group_denied(ApiKey.JOIN_GROUP, request, ErrorCode.not_coordinator)
    version = request.api_version
    result = await context.api.join_group(
        connection.client,
        body.group_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
        body.protocol_type,
        [(protocol.name, protocol.metadata) for protocol in body.protocols],
        session_timeout_ms=ms(body.session_timeout),
        rebalance_timeout_ms=ms(body.rebalance_timeout) if version >= 1 else -1,
        client_host=_client_host(connection),
        require_known_member_id=version >= 4,
    )
    return _build(
        ApiKey.JOIN_GROUP,
        request,
        {
            "throttle_time": 0,
            "error_code": int(result.error_code),
            "generation_id": result.generation_id,
            "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name,
            "leader": result.leader_id,
            "member_id": result.member_id,
            "members": [
                {
                    "member_id": member.member_id,
                    "group_instance_id": member.group_instance_id,
                    "metadata": member.metadata,
                }
                for member in result.members
            ],
        },
    )


async def handle_sync_group(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka SyncGroup", body.group_id):
        return _group_denied(ApiKey.SYNC_GROUP, request)
    if not_coordinator(context, connection, body.group_id):
        return _group_denied(ApiKey.SYNC_GROUP, request, ErrorCode.not_coordinator)
    result = await context.api.sync_group(
        connection.client,
        body.group_id,
        body.generation_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
        {item.member_id: item.assignment for item in body.assignments},
        getattr(body, "protocol_type", None),
        getattr(body, "protocol_name", None),
    )
    if int(result.error_code) == ErrorCode.none:
        # Who fetches which partitions for the group: for its tag filter (tagfilters.py).
        group_tag_filters(context.api).on_sync(body.group_id)
    return _build(
        ApiKey.SYNC_GROUP,
        request,
        {
            "throttle_time": 0,
            "error_code": int(result.error_code),
            "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name,
            "assignment": result.assignment,
        },
    )


async def handle_heartbeat(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka Heartbeat", body.group_id):
        return _group_denied(ApiKey.HEARTBEAT, request)
    if not_coordinator(context, connection, body.group_id):
        return _group_denied(ApiKey.HEARTBEAT, request, ErrorCode.not_coordinator)
    error = context.api.heartbeat(
        connection.client,
        body.group_id,
        body.generation_id,
        body.member_id,
        getattr(body, "group_instance_id", None),
    )
    return _build(ApiKey.HEARTBEAT, request, {"throttle_time": 0, "error_code": error})


async def handle_leave_group(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka LeaveGroup", body.group_id):
        return _group_denied(ApiKey.LEAVE_GROUP, request)
    if not_coordinator(context, connection, body.group_id):
        return _group_denied(ApiKey.LEAVE_GROUP, request, ErrorCode.not_coordinator)
    if request.api_version >= 3:
        members = [(member.member_id, member.group_instance_id) for member in body.members]
    else:
        members = [(body.member_id, None)]
    result = context.api.leave_group(connection.client, body.group_id, members)
    group_tag_filters(context.api).on_leave(
        body.group_id, {member.member_id for member in result.members if member.member_id}
    )
    error = int(result.error_code)
    if request.api_version < 3 and error == ErrorCode.none and result.members:
        error = int(result.members[0].error_code)  # v0-2: the one member's error at the top
    return _build(
        ApiKey.LEAVE_GROUP,
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "members": [
                {
                    "member_id": member.member_id,
                    "group_instance_id": member.group_instance_id,
                    "error_code": int(member.error_code),
                }
                for member in result.members
            ],
        },
    )


async def handle_describe_groups(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    groups = []
    body: Any = request.body
    for group_id in body.groups:
        if not allowed(context, connection, "kafka DescribeGroups", group_id):
            groups.append(
                {
                    "error_code": ErrorCode.group_authorization_failed,
                    "group_id": group_id,
                    "authorized_operations": -(2**31),
                }
            )
            continue
        if not_coordinator(context, connection, group_id):
            groups.append(
                {
                    "error_code": ErrorCode.not_coordinator,
                    "group_id": group_id,
                    "authorized_operations": -(2**31),
                }
            )
            continue
        described = context.api.describe_group(connection.client, group_id)
        groups.append(
            {
                "error_code": int(described.error_code),
                "group_id": described.group_id,
                "group_state": described.state,
                "protocol_type": described.protocol_type,
                "protocol_data": described.protocol_name,
                "members": [
                    {
                        "member_id": member.member_id,
                        "group_instance_id": member.group_instance_id,
                        "client_id": member.client_id,
                        "client_host": member.client_host,
                        "member_metadata": member.metadata,
                        "member_assignment": member.assignment,
                    }
                    for member in described.members
                ],
                "authorized_operations": -(2**31),
            }
        )
    return _build(ApiKey.DESCRIBE_GROUPS, request, {"throttle_time": 0, "groups": groups})


async def handle_list_groups(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    states = getattr(body, "states_filter", None) or None
    types = getattr(body, "types_filter", None) or None
    listings = context.api.list_groups(connection.client, states)
    if types is not None and CLASSIC_GROUP_TYPE not in {t.lower() for t in types}:
        listings = []
    return _build(
        ApiKey.LIST_GROUPS,
        request,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "groups": [
                {
                    "group_id": listing.group_id,
                    "protocol_type": listing.protocol_type,
                    "group_state": listing.state,
                    "group_type": CLASSIC_GROUP_TYPE,
                }
                for listing in listings
                # Kafka lists the groups the principal may describe.
                if allowed(context, connection, "kafka ListGroups", listing.group_id)
            ],
        },
    )


async def handle_delete_groups(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    permitted = [
        name
        for name in body.groups_names
        if allowed(context, connection, "kafka DeleteGroups", name)
    ]
    # A deleted group's committed offsets go with it.
    errors: dict[str, int] = dict.fromkeys(
        body.groups_names, int(ErrorCode.group_authorization_failed)
    )
    elsewhere = {name for name in permitted if not_coordinator(context, connection, name)}
    if elsewhere:
        errors.update(dict.fromkeys(elsewhere, int(ErrorCode.not_coordinator)))
        permitted = [name for name in permitted if name not in elsewhere]
    errors.update(context.api.delete_groups(connection.client, permitted) if permitted else {})
    for group_id, error in errors.items():
        if error == 0:
            group_tag_filters(context.api).on_delete(group_id)
    return _build(
        ApiKey.DELETE_GROUPS,
        request,
        {
            "throttle_time": 0,
            "results": [
                {"group_id": group_id, "error_code": error} for group_id, error in errors.items()
            ],
        },
    )


def partition_exists(
    context: KafkaContext, client: ClientContext, topic: str, partition: int
) -> bool:
    info = None if is_system_topic(topic) else context.api.topic_info(client, topic)
    return info is not None and 0 <= partition < info.queues


async def handle_offset_commit(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    api = context.api
    # Refused: GROUP_AUTHORIZATION_FAILED on every partition (OffsetCommit has no top-level
    # error; Kafka's getErrorResponse), not an empty answer.
    error: int
    if not allowed(context, connection, "kafka OffsetCommit", body.group_id):
        error = ErrorCode.group_authorization_failed
    elif not_coordinator(context, connection, body.group_id):
        error = ErrorCode.not_coordinator
    else:
        error = api.validate_group_member(
            connection.client,
            body.group_id,
            body.member_id,
            body.generation_id_or_member_epoch,
            getattr(body, "group_instance_id", None),
        )
    commits: list[tuple[str, int, int, int, str]] = []
    topics = []
    for topic in body.topics:
        results = []
        for partition in topic.partitions:
            partition_error: int = error
            metadata = partition.committed_metadata or ""
            if partition_error == ErrorCode.none:
                if not allowed(context, connection, "kafka OffsetCommit topic", topic.name):
                    partition_error = ErrorCode.topic_authorization_failed
                elif not partition_exists(
                    context, connection.client, topic.name, partition.partition_index
                ):
                    partition_error = ErrorCode.unknown_topic_or_partition
                elif len(metadata.encode()) > MAX_METADATA_BYTES:
                    partition_error = ErrorCode.offset_metadata_too_large
                else:
                    commits.append(
                        (
                            topic.name,
                            partition.partition_index,
                            partition.committed_offset,
                            getattr(partition, "committed_leader_epoch", -1),
                            metadata,
                        )
                    )
            results.append(
                {"partition_index": partition.partition_index, "error_code": int(partition_error)}
            )
        topics.append({"name": topic.name, "partitions": results})
    if commits:
        await api.commit_offsets(connection.client, body.group_id, commits)
    return _build(ApiKey.OFFSET_COMMIT, request, {"throttle_time": 0, "topics": topics})


async def handle_offset_fetch(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka OffsetFetch", body.group_id):
        return _group_denied(ApiKey.OFFSET_FETCH, request)
    if not_coordinator(context, connection, body.group_id):
        return _group_denied(ApiKey.OFFSET_FETCH, request, ErrorCode.not_coordinator)
    api = context.api
    client = connection.client
    group_id = body.group_id
    require_stable = getattr(body, "require_stable", False)
    wanted: list[tuple[str, list[int]]]
    if body.topics is None:  # v2+: every partition the group has offsets for
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(api.fetch_group_offsets(client, group_id)):
            by_topic.setdefault(topic, []).append(partition)
        wanted = list(by_topic.items())
    else:
        wanted = [(topic.name, list(topic.partition_indexes)) for topic in body.topics]
    topics = []
    for topic, partitions in wanted:
        results = []
        visible = allowed(context, connection, "kafka OffsetFetch topic", topic)
        for partition in partitions:
            committed = api.fetch_offset(client, group_id, topic, partition) if visible else None
            error = ErrorCode.none if visible else ErrorCode.topic_authorization_failed
            if require_stable and context.transactions.has_pending_offsets(
                group_id, topic, partition
            ):
                error = ErrorCode.unstable_offset_commit
            results.append(
                {
                    "partition_index": partition,
                    "committed_offset": committed.offset if committed else NO_OFFSET,
                    "committed_leader_epoch": committed.leader_epoch if committed else -1,
                    "metadata": committed.metadata if committed else "",
                    "error_code": error,
                }
            )
        topics.append({"name": topic, "partitions": results})
    return _build(
        ApiKey.OFFSET_FETCH,
        request,
        {"throttle_time": 0, "topics": topics, "error_code": ErrorCode.none},
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.JOIN_GROUP: handle_join_group,
    ApiKey.SYNC_GROUP: handle_sync_group,
    ApiKey.HEARTBEAT: handle_heartbeat,
    ApiKey.LEAVE_GROUP: handle_leave_group,
    ApiKey.DESCRIBE_GROUPS: handle_describe_groups,
    ApiKey.LIST_GROUPS: handle_list_groups,
    ApiKey.DELETE_GROUPS: handle_delete_groups,
    ApiKey.OFFSET_COMMIT: handle_offset_commit,
    ApiKey.OFFSET_FETCH: handle_offset_fetch,
}
