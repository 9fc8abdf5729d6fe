"""Partitions, stored batches, offsets, groups, producers and transactions: the Broker API's
calls for Kafka's model."""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

from core.api.base import BrokerCalls, ClientContext, Publication, PublishOutcome
from core.broker.broker import (
    Destination,
    PublishResult,
)
from core.broker.eager import Pending, run_eagerly
from core.broker.topics import TopicInfo
from core.groups.results import GroupDescription, GroupListing, JoinResult, LeaveResult, SyncResult
from core.groups.state import GroupState
from core.kafka_values import OffsetCommit, OpenTransaction, StorageSettings
from core.log import record as rec
from core.log.names import is_system_topic
from core.offsets.store import CommittedOffset
from core.scoped_reads import (
    StoredRecordReader,
    stored_body,
    stored_flags,
)

# What a serve_stored_records caller builds from the entries it reads.
_Answer = TypeVar("_Answer")


class PartitionCalls(BrokerCalls):
    """Partitions, stored batches, groups, offsets, producers and transactions."""

    # Topics as Kafka sees them: partitions are the topic's queues; system topics are hidden.

    def list_topics(self, context: ClientContext) -> list[TopicInfo]:
        """Every topic but the system ones, by name."""
        return self._broker.topics.all()

    def system_topics(self, context: ClientContext) -> list[TopicInfo]:
        """The broker's own ``__`` topics that have queues in the log, by name, each with its
        number of queues: what Kafka's Metadata lists as internal topics. Only their names
        and sizes: their records (other clients' offsets and sessions, the broker's tables)
        are no client's to read."""
        queues: dict[str, int] = {}
        for topic, queue in self._broker.store.queues(include_system=True):
            if is_system_topic(topic):
                queues[topic] = max(queues.get(topic, 0), queue + 1)
        return [TopicInfo(name, count) for name, count in sorted(queues.items())]

    def create_topic(
        self,
        context: ClientContext,
        name: str,
        partitions: int,
        config: Mapping[str, Any] | None = None,
    ) -> TopicInfo:
        """Declare ``name`` with ``partitions`` queues (an existing topic is returned as is)."""
        return self._broker.declare_topic(name, partitions, dict(config) if config else None)[0]

    def delete_topic(self, context: ClientContext, name: str) -> bool:
        """Delete the topic, its queues, bindings and committed offsets; False if unknown."""
        return self._broker.delete_topic(name)

    def add_partitions(self, context: ClientContext, name: str, total: int) -> TopicInfo:
        """Grow the topic to ``total`` queues (:class:`TopicError` if unknown)."""
        return self._broker.topics.add_queues(name, total)

    def storage_settings(self, context: ClientContext, topic: str | None = None) -> StorageSettings:
        """The log's retention and segment size, and ``topic``'s durability (DescribeConfigs)."""
        config = self._broker.store.config
        return StorageSettings(
            config.retention_ms,
            config.retention_bytes,
            config.segment_size,
            config.durability_for(topic) if topic is not None else config.durability,
        )

    # Producing: a RecordBatch stored as ONE batch record, indexed once, never re-encoded.

    def publishing_blocked(self) -> bool:
        """Flow control holds publishers back now (Kafka answers with a throttle time)."""
        return self._broker.flow.blocked

    async def wait_publishing_allowed(self) -> None:
        """Return once flow control lets publishers go on (at once when it does now)."""
        if self._broker.flow.blocked:
            await self._broker.flow.wait_unblocked()

    def produce_batch(
        self,
        context: ClientContext,
        topic: str,
        partition: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        braid_headers: bool | None = None,
        transaction: str | None = None,
    ) -> Publication:
        """Store a Kafka RecordBatch in ``(topic, partition)`` now, as one batch record routed
        by its records' subjects (decoded only when the topic has bindings); the handle is
        awaited for durability. ``braid_headers=False``: the caller searched the batch and
        found no ``x-braid-`` header name (no tags, no half), so it is not searched again.
        ``transaction``: a transaction of :meth:`begin_transaction`; the batch is stored as a
        half message, visible (and given its offset) when that commits. A delayed batch
        (``deliver_at_ms``) gets its offset when it becomes visible. Raises
        :class:`TopicError` for an unknown topic or partition."""
        if transaction is not None:
            appended = self._broker.transactions.add_nowait(
                transaction,
                topic,
                partition,
                batch,
                protocol=rec.PROTOCOL_KAFKA,
                flags=rec.FLAG_BATCH,
                record_count=record_count,
                born_ms=born_ms,
                client=context.client_id,
            )
            # A half is indexed only in __half: its offset comes with the commit's LINK.
            outcome = PublishOutcome(
                appended, [(topic, partition)], partition, half=True, record_count=record_count
            )
            return Publication(self, topic, outcome, None)
        return self._stored_batch(
            topic,
            run_eagerly(
                self._broker.publish_batch(
                    topic,
                    partition,
                    batch,
                    record_count,
                    born_ms=born_ms,
                    client=context.client_id,
                    deliver_at_ms=deliver_at_ms,
                    wait_durable=False,
                    braid_headers=braid_headers,
                )
            ),
        )

    def write_transaction_marker(
        self,
        context: ClientContext,
        topic: str,
        partition: int,
        marker: bytes,
        *,
        born_ms: int,
    ) -> Publication:
        """Store a Kafka control batch (a COMMIT or ABORT marker) in ``(topic, partition)``;
        :class:`TopicError` if the partition is gone."""
        return self._stored_batch(
            topic,
            run_eagerly(
                self._broker.publish_batch(
                    topic,
                    partition,
                    marker,
                    1,
                    born_ms=born_ms,
                    flags=rec.FLAG_TXN_CONTROL,
                    wait_durable=False,
                )
            ),
        )

    def _stored_batch(
        self, topic: str, started: PublishResult | Pending[PublishResult]
    ) -> Publication:
        if isinstance(started, Pending):
            return Publication(self, topic, None, started)
        return Publication(self, topic, started, None)

    def read_tail_batch_headers(
        self, topic: str, partition: int, *, max_entries: int, header_size: int
    ) -> list[tuple[int, bytes]]:
        """``(base offset, first header_size bytes)`` of the producer batches (no control
        batches) among the last ``max_entries`` index entries of a partition, oldest first:
        what rebuilds a partition's idempotent-producer state after a restart (copies)."""
        store = self._broker.store
        index = store.queue_index(topic, partition)
        if index is None:
            return []
        start, end = store.queue_bounds(topic, partition)
        first_entry = max(index.start_entry, index.next_entry - max_entries)
        if first_entry >= index.next_entry or start >= end:
            return []
        found: list[tuple[int, bytes]] = []
        offset = max(index.entry(first_entry).first_offset, start)
        while offset < end:
            entries = store.read(topic, partition, offset, max_records=2**62)  # bytes bound it
            if not entries:
                break
            for entry in entries:
                offset = entry.next_offset
                flags = stored_flags(entry)
                if flags & rec.FLAG_BATCH and not flags & rec.FLAG_TXN_CONTROL:
                    found.append((entry.offset, bytes(stored_body(entry)[:header_size])))
        return found

    # Fetching: stored batches served as stored, views of the log valid during the call only.

    def serve_stored_records(
        self, context: ClientContext, respond: Callable[[StoredRecordReader], _Answer]
    ) -> _Answer:
        """Call ``respond`` with a reader of stored entries and return what it returns: the
        response built from them (a Fetch: its bytes, or ``None`` for nothing to answer yet;
        a ListOffsets search: the offset found). The entries hold views of the log's memory
        maps (the fetch fast path copies each batch once, into the response frame): they are
        valid until ``respond`` returns, and the reader is closed then, so what ``respond``
        returns must be values or copies, never an entry."""
        reader = StoredRecordReader(self._broker.store)
        try:
            return respond(reader)
        finally:
            reader.close()

    def partition_offsets(
        self, context: ClientContext, topic: str, partition: int
    ) -> tuple[int, int]:
        """``(log start offset, high watermark)``; the last stable offset is the high
        watermark (open transactions are half messages, invisible in the partition)."""
        return self._broker.store.queue_bounds(topic, partition)

    async def wait_for_records(
        self, context: ClientContext, partitions: Sequence[Destination], timeout_s: float
    ) -> bool:
        """Long poll: True once any of ``partitions`` got a new entry, False after
        ``timeout_s``."""
        return await self._broker.wait_for_records(partitions, timeout_s)

    # Consumer groups (Kafka's classic protocol): the coordinator answers with Kafka's codes.

    async def join_group(
        self,
        context: ClientContext,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_host: str,
        require_known_member_id: bool,
    ) -> JoinResult:
        """JoinGroup: returns once the rebalance completes (or at once, with an error)."""
        return await self._broker.groups.join(
            group_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocols,
            session_timeout_ms,
            rebalance_timeout_ms,
            client_id=context.client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
        )

    async def sync_group(
        self,
        context: ClientContext,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        assignments: Mapping[str, bytes],
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        """SyncGroup: the leader's assignments in, each member's out."""
        return await self._broker.groups.sync(
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            dict(assignments),
            protocol_type,
            protocol_name,
        )

    def heartbeat(
        self,
        context: ClientContext,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
    ) -> int:
        """Heartbeat: a Kafka error code (0: none)."""
        return int(
            self._broker.groups.heartbeat(group_id, generation_id, member_id, group_instance_id)
        )

    def leave_group(
        self,
        context: ClientContext,
        group_id: str,
        members: Sequence[tuple[str, str | None]],
    ) -> LeaveResult:
        """LeaveGroup of ``(member id, group instance id)`` members."""
        return self._broker.groups.leave(group_id, list(members))

    def describe_group(self, context: ClientContext, group_id: str) -> GroupDescription:
        return self._broker.groups.describe(group_id)

    def group_state(self, context: ClientContext, group_id: str) -> GroupState | None:
        """The group's state; None for a group the coordinator does not know."""
        return self._broker.groups.state(group_id)

    def list_groups(
        self, context: ClientContext, states: Collection[str] | None = None
    ) -> list[GroupListing]:
        return self._broker.groups.list_groups(states)

    def delete_groups(self, context: ClientContext, group_ids: Iterable[str]) -> dict[str, int]:
        """DeleteGroups: each group's error code; a deleted group's offsets go with it."""
        errors = self._broker.groups.delete_groups(group_ids)
        for group_id, error in errors.items():
            if error == 0:
                self._broker.offsets.delete_group(group_id)
        return {group_id: int(error) for group_id, error in errors.items()}

    def validate_group_member(
        self,
        context: ClientContext,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
        *,
        transactional: bool = False,
    ) -> int:
        """May this member commit offsets for the group now? A Kafka error code (0: yes)."""
        return int(
            self._broker.groups.validate_member(
                group_id,
                member_id,
                generation_id,
                group_instance_id,
                transactional=transactional,
            )
        )

    async def commit_offsets(
        self, context: ClientContext, group_id: str, commits: Iterable[OffsetCommit]
    ) -> None:
        """Commit ``(topic, partition, offset, leader epoch, metadata)`` for the group;
        returns once durable (in ``__offsets``)."""
        await self._broker.offsets.commit(group_id, commits)

    def commit_offsets_nowait(
        self, context: ClientContext, group_id: str, commits: Iterable[OffsetCommit]
    ) -> int:
        """:meth:`commit_offsets` without waiting: the durable mark to wait for."""
        return self._broker.offsets.commit_nowait(group_id, commits)

    def fetch_offset(
        self, context: ClientContext, group_id: str, topic: str, partition: int
    ) -> CommittedOffset | None:
        return self._broker.offsets.fetch(group_id, topic, partition)

    def fetch_group_offsets(
        self, context: ClientContext, group_id: str
    ) -> dict[Destination, CommittedOffset]:
        """Every committed offset of the group, by ``(topic, partition)``."""
        return self._broker.offsets.fetch_group(group_id)

    # Transactions: half messages (RocketMQ semantics), the base of Kafka transactions.

    def open_transactions(self) -> list[OpenTransaction]:
        """Every transaction still open (after a restart: the ones it cut)."""
        return [
            OpenTransaction(pending.txn_id, pending.producer_group, pending.halves)
            for pending in self._broker.transactions.pending()
        ]

    def begin_transaction(
        self, context: ClientContext, producer_group: str, transaction_id: str, *, timeout_ms: int
    ) -> str:
        """Open a transaction whose halves are decided by the producer alone: it is never
        asked back, and after ``timeout_ms`` it is rolled back. Returns its id."""
        service = self._broker.transactions
        service.set_check_back(producer_group, None)
        return service.begin(producer_group, transaction_id, timeout_ms=timeout_ms)

    async def commit_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Make every half of the transaction visible at once (one LINK); returns once
        durable. :class:`TransactionError` if it was decided otherwise meanwhile."""
        await self._broker.transactions.commit(transaction_id)

    async def roll_back_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Discard every half of the transaction; returns once durable."""
        await self._broker.transactions.rollback(transaction_id)

    # The broker's metadata table (``__meta``): small durable settings a gateway keeps.

    def metadata_items(self, context: ClientContext, prefix: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``."""
        return [item for item in self._broker.topics.table.items() if item[0].startswith(prefix)]

    def metadata_value(self, context: ClientContext, key: str) -> bytes | None:
        return self._broker.topics.table.get(key)

    def put_metadata(self, context: ClientContext, key: str, value: bytes) -> int:
        """Store ``key``; returns the durable mark to wait for (:meth:`when_durable`)."""
        return self._broker.topics.table.put(key, value).end

    def delete_metadata(self, context: ClientContext, key: str) -> int | None:
        """Delete ``key``; the durable mark to wait for, None if there was no such key."""
        deleted = self._broker.topics.table.delete(key)
        return deleted.end if deleted is not None else None
