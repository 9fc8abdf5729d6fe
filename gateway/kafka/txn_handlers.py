"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit: wire
mapping onto ``transactions.TransactionCoordinator`` (idempotent producers need only
InitProducerId without a transactional id: a fresh producer id, epoch 0).

A transactional id's coordinator is the owner of its shard (``h(id) % S``), a group's the owner
of the group's: on another node the transaction requests are answered NOT_COORDINATOR (16),
and TxnOffsetCommit, which goes to the group's coordinator as in Kafka, too (``leaders.py``).
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import COORDINATOR_GROUP, COORDINATOR_TXN
from gateway.kafka import access
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import (
    Connection,
    Handler,
    KafkaContext,
    ResponseBody,
    fenced_error,
    ms,
)
from gateway.kafka.entities import build_response
from gateway.kafka.groups import MAX_METADATA_BYTES, partition_exists
from gateway.kafka.leaders import coordinator_error

# First versions that carry PRODUCER_FENCED (KafkaApis maps it to INVALID_PRODUCER_EPOCH
# for older ones): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit v2.
FIRST_VERSION_WITH_FENCED: Final = 2


async def handle_init_producer_id(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if body.transactional_id is None:
        producer_id, reservation = await context.producer_ids.next_id()
        if reservation is not None:
            await context.api.when_durable(reservation)
        error, epoch = ErrorCode.none, 0
        context.metrics["producer_ids"] += 1
    elif not allowed(context, connection, "kafka InitProducerId", body.transactional_id):
        error, producer_id, epoch = ErrorCode.transactional_id_authorization_failed, -1, -1
    elif (
        coordinator_error(context, connection, COORDINATOR_TXN, body.transactional_id)
        != ErrorCode.none
    ):
        error, producer_id, epoch = ErrorCode.not_coordinator, -1, -1
    else:
        error, producer_id, epoch = await context.transactions.init_producer_id(
            body.transactional_id, ms(body.transaction_timeout)
        )
    return build_response(
        ApiKey.INIT_PRODUCER_ID,
        request.api_version,
        {
            "throttle_time": 0,
            "error_code": error,
            "producer_id": producer_id,
            "producer_epoch": epoch,
        },
    )


async def handle_add_partitions_to_txn(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    wanted = [
        (topic.name, partition)
        for topic in body.v3_and_below_topics
        for partition in topic.partitions
    ]
    errors = access.add_partitions_refusals(
        context, connection, body.v3_and_below_transactional_id, wanted
    )
    if errors is None and (
        coordinator_error(context, connection, COORDINATOR_TXN, body.v3_and_below_transactional_id)
        != ErrorCode.none
    ):
        errors = dict.fromkeys(wanted, ErrorCode.not_coordinator)
    if errors is None:
        errors = await context.transactions.add_partitions(
            connection.client,
            body.v3_and_below_transactional_id,
            body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch,
            wanted,
            fenced_error(request.api_version, FIRST_VERSION_WITH_FENCED),
        )
    return build_response(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        request.api_version,
        {
            "throttle_time": 0,
            "results_by_topic_v3_and_below": [
                {
                    "name": topic.name,
                    "results_by_partition": [
                        {
                            "partition_index": partition,
                            "partition_error_code": errors[(topic.name, partition)],
                        }
                        for partition in topic.partitions
                    ],
                }
                for topic in body.v3_and_below_topics
            ],
        },
    )


async def handle_add_offsets_to_txn(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    error = access.add_offsets_refusal(context, connection, body.transactional_id, body.group_id)
    if error == ErrorCode.none:
        error = coordinator_error(context, connection, COORDINATOR_TXN, body.transactional_id)
    if error == ErrorCode.none:
        error = context.transactions.add_offsets(
            body.transactional_id,
            body.producer_id,
            body.producer_epoch,
            body.group_id,
            fenced_error(request.api_version, FIRST_VERSION_WITH_FENCED),
        )
    return build_response(
        ApiKey.ADD_OFFSETS_TO_TXN, request.api_version, {"throttle_time": 0, "error_code": error}
    )


async def handle_end_txn(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not allowed(context, connection, "kafka EndTxn", body.transactional_id):
        error = ErrorCode.transactional_id_authorization_failed
    elif (
        coordinator_error(context, connection, COORDINATOR_TXN, body.transactional_id)
        != ErrorCode.none
    ):
        error = ErrorCode.not_coordinator
    else:
        error = await context.transactions.end_transaction(
            body.transactional_id,
            body.producer_id,
            body.producer_epoch,
            body.committed,
            fenced_error(request.api_version, FIRST_VERSION_WITH_FENCED),
        )
    return build_response(
        ApiKey.END_TXN, request.api_version, {"throttle_time": 0, "error_code": error}
    )


async def handle_txn_offset_commit(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    error = access.txn_offset_commit_refusal(
        context, connection, body.transactional_id, body.group_id
    )
    if error == ErrorCode.none:
        error = coordinator_error(context, connection, COORDINATOR_GROUP, body.group_id)
    generation = getattr(body, "generation_id", -1)
    member_id = getattr(body, "member_id", "")
    instance_id = getattr(body, "group_instance_id", None)
    # A refusal (access.py) answers every partition with its error, as does a member check.
    if error == ErrorCode.none and (generation >= 0 or member_id or instance_id is not None):
        # v3 (KIP-447): the producer proves it is a current member of the consumer group.
        error = ErrorCode(
            int(
                context.api.validate_group_member(
                    connection.client,
                    body.group_id,
                    member_id,
                    generation,
                    instance_id,
                    transactional=True,
                )
            )
        )
    staged: list[tuple[str, int, int, int, str]] = []
    partition_errors: dict[tuple[str, int], ErrorCode] = {}
    for topic in body.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            metadata = partition.committed_metadata or ""
            if error != ErrorCode.none:
                partition_errors[key] = error
            elif not allowed(context, connection, "kafka TxnOffsetCommit topic", topic.name):
                partition_errors[key] = ErrorCode.topic_authorization_failed
            elif not partition_exists(context, connection.client, *key):
                partition_errors[key] = ErrorCode.unknown_topic_or_partition
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                partition_errors[key] = ErrorCode.offset_metadata_too_large
            else:
                staged.append(
                    (
                        *key,
                        partition.committed_offset,
                        getattr(partition, "committed_leader_epoch", -1),
                        metadata,
                    )
                )
    if staged:
        staged_error = context.transactions.stage_offsets(
            body.transactional_id,
            body.producer_id,
            body.producer_epoch,
            body.group_id,
            staged,
            fenced_error(request.api_version, FIRST_VERSION_WITH_FENCED),
        )
        for topic_name, partition_index, *_ in staged:
            partition_errors[(topic_name, partition_index)] = staged_error
    return build_response(
        ApiKey.TXN_OFFSET_COMMIT,
        request.api_version,
        {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": partition.partition_index,
                            "error_code": partition_errors[(topic.name, partition.partition_index)],
                        }
                        for partition in topic.partitions
                    ],
                }
                for topic in body.topics
            ],
        },
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.INIT_PRODUCER_ID: handle_init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: handle_add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: handle_add_offsets_to_txn,
    ApiKey.END_TXN: handle_end_txn,
    ApiKey.TXN_OFFSET_COMMIT: handle_txn_offset_commit,
}
