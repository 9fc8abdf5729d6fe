"""Admin APIs about replicas, producers and transactions: ElectLeaders (43),
AlterPartitionReassignments (45), ListPartitionReassignments (46), DescribeProducers (61),
DescribeTransactions (65) and ListTransactions (66), answered as a one-broker Kafka does.

A cluster of one broker, node 0, the only replica and the leader of every partition:

- ElectLeaders: the preferred (and only) replica leads already, so each partition named is
  ELECTION_NOT_NEEDED, an unknown one UNKNOWN_TOPIC_OR_PARTITION; asked for every partition
  (a null list), the answer lists none, since Kafka lists only the partitions it elected.
- AlterPartitionReassignments: a target of ``[0]`` is where the partition is (done at once);
  another broker is INVALID_REPLICA_ASSIGNMENT, as KRaft says of a broker not registered;
  cancelling (null replicas) is NO_REASSIGNMENT_IN_PROGRESS. ListPartitionReassignments: none
  is ever in progress.
- DescribeProducers: the idempotent producers the partition remembers (``producers.py``), with
  their epoch and last sequence, and ``current_txn_start_offset``: the first offset of the
  producer's transaction still open in the partition (its batches are stored there when
  produced), else -1, as Kafka's ProducerStateEntry. A producer with an open transaction that
  the partition's idempotence state does not list (after a restart) is listed too.
- DescribeTransactions / ListTransactions: the transaction coordinator's state per
  transactional id (``transactions.py``), Kafka's state names.

Access, as KafkaApis: ALTER on the cluster for ElectLeaders and AlterPartitionReassignments,
DESCRIBE on the cluster for ListPartitionReassignments (CLUSTER_AUTHORIZATION_FAILED), READ on
each topic for DescribeProducers (TOPIC_AUTHORIZATION_FAILED), DESCRIBE on each transactional id
for DescribeTransactions (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); ListTransactions lists only
the ids the principal may describe.
"""

from __future__ import annotations

import datetime
import logging
import re
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import COORDINATOR_TXN, is_system_topic, now_ms
from gateway.kafka.admin_records import admin_allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import (
    NODE_ID,
    Connection,
    Handler,
    KafkaContext,
    ResponseBody,
)
from gateway.kafka.entities import build_response
from gateway.kafka.leaders import coordinator_error
from gateway.kafka.transactions import Transaction, TxnState

log = logging.getLogger(__name__)

# ElectLeaders election types (ElectionType): PREFERRED and UNCLEAN.
ELECTION_PREFERRED: Final = 0
ELECTION_UNCLEAN: Final = 1
# Kafka's transaction state names (TransactionState), for ListTransactions' filters.
KAFKA_TXN_STATES: Final = frozenset(
    (*(state.value for state in TxnState), "Dead", "PrepareEpochFence")
)
# Kafka's "no start time" (-1 ms): a datetime, since the field is not nullable.
NO_START_TIME: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) - datetime.timedelta(
    milliseconds=1
)
_CLUSTER_ALTER: Final = "kafka CreateAcls"  # the existing rows that need ALTER ...
_CLUSTER_DESCRIBE: Final = "kafka DescribeAcls"  # ... and DESCRIBE on the cluster


def _partition_count(context: KafkaContext, connection: Connection, topic: str) -> int | None:
    if is_system_topic(topic):
        return None
    info = context.api.topic_info(connection.client, topic)
    return None if info is None else info.queues


# -- ElectLeaders ----------------------------------------------------------------------------


async def handle_elect_leaders(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    election_type = getattr(body, "election_type", ELECTION_PREFERRED)
    may_alter = admin_allowed(context, connection, "kafka ElectLeaders", _CLUSTER_ALTER, "")
    top_error = ErrorCode.none
    results = []
    if not may_alter:
        top_error = ErrorCode.cluster_authorization_failed
    elif election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN):
        top_error = ErrorCode.invalid_request
    if body.topic_partitions is not None:
        for topic in body.topic_partitions:
            count = _partition_count(context, connection, topic.topic)
            partition_results = []
            for partition in topic.partitions:
                if top_error != ErrorCode.none:
                    error, message = top_error, None
                elif count is None or not 0 <= partition < count:
                    error = ErrorCode.unknown_topic_or_partition
                    message = "The partition does not exist."
                else:
                    error = ErrorCode.election_not_needed
                    message = "Leader election not needed for topic partition."
                partition_results.append(
                    {"partition_id": partition, "error_code": error, "error_message": message}
                )
            results.append({"topic": topic.topic, "partition_result": partition_results})
    return build_response(
        ApiKey.ELECT_LEADERS,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": top_error,
            "replica_election_results": results,
        },
    )


# -- partition reassignments -----------------------------------------------------------------


def _reassignment_error(
    replicas: tuple[int, ...] | None, count: int | None, partition: int
) -> tuple[ErrorCode, str | None]:
    if count is None or not 0 <= partition < count:
        return ErrorCode.unknown_topic_or_partition, "The partition does not exist."
    if replicas is None:
        return ErrorCode.no_reassignment_in_progress, "No ongoing reassignment for partition."
    if not replicas:
        return (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes an empty replica list.",
        )
    if len(set(replicas)) != len(replicas):
        return (
            ErrorCode.invalid_replica_assignment,
            "The manual partition assignment includes duplicate replicas.",
        )
    for broker in replicas:
        if broker != NODE_ID:
            return (
                ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes broker {broker}, but no such "
                "broker is registered.",
            )
    return ErrorCode.none, None  # [0]: where it is already


async def handle_alter_partition_reassignments(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    if not admin_allowed(
        context, connection, "kafka AlterPartitionReassignments", _CLUSTER_ALTER, ""
    ):
        return build_response(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            request.api_version,
            {
                "throttle_time": context.throttle_ms(),
                "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": "Cluster authorization failed.",
                "responses": [],
            },
        )
    responses = []
    for topic in body.topics:
        count = _partition_count(context, connection, topic.name)
        partitions = []
        for wanted in topic.partitions:
            replicas = None if wanted.replicas is None else tuple(wanted.replicas)
            error, message = _reassignment_error(replicas, count, wanted.partition_index)
            partitions.append(
                {
                    "partition_index": wanted.partition_index,
                    "error_code": error,
                    "error_message": message,
                }
            )
        responses.append({"name": topic.name, "partitions": partitions})
    return build_response(
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": ErrorCode.none,
            "error_message": None,
            "responses": responses,
        },
    )


async def handle_list_partition_reassignments(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    allowed_here = admin_allowed(
        context, connection, "kafka ListPartitionReassignments", _CLUSTER_DESCRIBE, ""
    )
    return build_response(
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": ErrorCode.none
            if allowed_here
            else ErrorCode.cluster_authorization_failed,
            "error_message": None if allowed_here else "Cluster authorization failed.",
            "topics": [],  # one replica per partition: nothing is ever being moved
        },
    )


# -- DescribeProducers -----------------------------------------------------------------------


async def handle_describe_producers(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    topics = []
    for topic in body.topics:
        name = topic.name
        may_read = not is_system_topic(name) and admin_allowed(
            context, connection, "kafka DescribeProducers", "kafka Fetch", name
        )
        count = _partition_count(context, connection, name) if may_read else None
        # Open transactions of this topic: (partition, producer id) -> (epoch, first offset).
        open_txns = {
            (opened.partition, opened.producer_id): (opened.producer_epoch, opened.first_offset)
            for opened in (
                context.api.open_partition_transactions(connection.client) if count else []
            )
            if opened.topic == name
        }
        partitions = []
        for partition in topic.partition_indexes:
            error = ErrorCode.none
            message: str | None = None
            producers: list[dict[str, Any]] = []
            if not may_read:
                error, message = ErrorCode.topic_authorization_failed, "Topic authorization failed."
            elif count is None or not 0 <= partition < count:
                error = ErrorCode.unknown_topic_or_partition
                message = "This server does not host this topic-partition."
            else:
                known = {
                    producer_id: (epoch, last_sequence)
                    for producer_id, epoch, last_sequence in context.producer_states.producers_of(
                        name, partition
                    )
                }
                for (txn_partition, producer_id), (epoch, _) in open_txns.items():
                    if txn_partition == partition:
                        known.setdefault(producer_id, (epoch, -1))
                producers = [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": epoch,
                        "last_sequence": last_sequence,
                        "last_timestamp": -1,  # not kept per producer
                        "coordinator_epoch": -1,
                        "current_txn_start_offset": open_txns.get(
                            (partition, producer_id), (epoch, -1)
                        )[1],
                    }
                    for producer_id, (epoch, last_sequence) in sorted(known.items())
                ]
            partitions.append(
                {
                    "partition_index": partition,
                    "error_code": error,
                    "error_message": message,
                    "active_producers": producers,
                }
            )
        topics.append({"name": name, "partitions": partitions})
    return build_response(
        ApiKey.DESCRIBE_PRODUCERS,
        request.api_version,
        {"throttle_time": context.throttle_ms(), "topics": topics},
    )


# -- DescribeTransactions / ListTransactions --------------------------------------------------


def _may_describe_transaction(
    context: KafkaContext, connection: Connection, transactional_id: str
) -> bool:
    return admin_allowed(
        context,
        connection,
        "kafka DescribeTransactions",
        "kafka FindCoordinator transaction",
        transactional_id,
    )


def _describe(txn: Transaction) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "error_code": ErrorCode.none,
        "transactional_id": txn.transactional_id,
        "transaction_state": txn.state.value,
        "transaction_timeout": txn.timeout_ms,
        "transaction_start_time": txn.started_ms if txn.started_ms >= 0 else NO_START_TIME,
        "producer_id": txn.producer_id,
        "producer_epoch": txn.producer_epoch,
        "topics": [
            {"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()
        ],
    }


async def handle_describe_transactions(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    known = {txn.transactional_id: txn for txn in context.transactions.transactions()}
    states = []
    for transactional_id in body.transactional_ids:
        txn = known.get(transactional_id)
        if not _may_describe_transaction(context, connection, transactional_id):
            error = ErrorCode.transactional_id_authorization_failed
        elif (
            coordinator_error(context, connection, COORDINATOR_TXN, transactional_id)
            != ErrorCode.none
        ):
            error = ErrorCode.not_coordinator  # another node coordinates it
        elif txn is None:
            error = ErrorCode.transactional_id_not_found
        else:
            states.append(_describe(txn))
            continue
        states.append(
            {
                "error_code": error,
                "transactional_id": transactional_id,
                "transaction_state": "",
                "transaction_timeout": 0,
                "transaction_start_time": NO_START_TIME,
                "producer_id": -1,
                "producer_epoch": -1,
                "topics": [],
            }
        )
    return build_response(
        ApiKey.DESCRIBE_TRANSACTIONS,
        request.api_version,
        {"throttle_time": context.throttle_ms(), "transaction_states": states},
    )


async def handle_list_transactions(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    state_filters = set(body.state_filters)
    producer_filters = set(body.producer_id_filters)
    duration_ms = getattr(body, "duration_filter", -1)
    pattern_text = getattr(body, "transactional_id_pattern", None)
    error = ErrorCode.none
    pattern: re.Pattern[str] | None = None
    if pattern_text:
        try:
            pattern = re.compile(pattern_text)
        except re.error:
            error = ErrorCode.invalid_regular_expression
    now = now_ms()
    listed = []
    if error == ErrorCode.none:
        for txn in context.transactions.transactions():
            if state_filters and txn.state.value not in state_filters:
                continue
            if producer_filters and txn.producer_id not in producer_filters:
                continue
            # KIP-994: only the transactions running longer than the duration.
            if duration_ms >= 0 and (txn.started_ms < 0 or now - txn.started_ms < duration_ms):
                continue
            if pattern is not None and pattern.fullmatch(txn.transactional_id) is None:
                continue
            if not _may_describe_transaction(context, connection, txn.transactional_id):
                continue
            listed.append(
                {
                    "transactional_id": txn.transactional_id,
                    "producer_id": txn.producer_id,
                    "transaction_state": txn.state.value,
                }
            )
    return build_response(
        ApiKey.LIST_TRANSACTIONS,
        request.api_version,
        {
            "throttle_time": context.throttle_ms(),
            "error_code": error,
            "unknown_state_filters": sorted(state_filters - KAFKA_TXN_STATES),
            "transaction_states": listed,
        },
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.ELECT_LEADERS: handle_elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: handle_alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: handle_list_partition_reassignments,
    ApiKey.DESCRIBE_PRODUCERS: handle_describe_producers,
    ApiKey.DESCRIBE_TRANSACTIONS: handle_describe_transactions,
    ApiKey.LIST_TRANSACTIONS: handle_list_transactions,
}
