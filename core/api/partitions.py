"""Partitions, stored batches, offsets, groups, producers and transactions: the Broker API's
calls for Kafka's model.

A partition's log start offset is the first offset of its index (retention moves it), or higher
where DeleteRecords moved it (``delete_records``): that offset is kept, exact, in the topic's
config (:data:`LOG_START_OFFSETS_KEY`), so it is durable, survives a restart and goes with the
topic. A topic's own retention (Kafka's ``retention.ms`` / ``retention.bytes`` topic configs,
:data:`RETENTION_KEY`) is kept there too and applied by the log's retention
(``core/log/retention.py``, ``Retention.topic_limits``), which this API points at the topics.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import shutil

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
from typing import Any, Final, Protocol, TypeVar

from core.api.base import BrokerCalls, ClientContext, Publication, PublishOutcome
from core.broker.broker import (
    Destination,
    PublishResult,
)
from core.broker.eager import Pending, run_eagerly
from core.broker.shards import ShardSet
from core.broker.topics import TopicError, TopicInfo, TopicRegistry
from core.cluster.metadata import KIND_SETTING, Change
from core.errors import ShardUnavailable
from core.groups.results import GroupDescription, GroupListing, JoinResult, LeaveResult, SyncResult
from core.groups.state import GroupState
from core.kafka_values import OffsetCommit, OpenTransaction, StorageSettings
from core.limits import QUEUE_VHOST_KEY
from core.log import record as rec
from core.log.names import is_system_topic
from core.log.retention import TopicLimits, stored_bytes
from core.offsets.store import CommittedOffset
from core.scoped_reads import (
    StoredEntry,
    StoredRecordReader,
    stored_body,
    stored_flags,
)
from core.transactions.partitions import OpenInPartition, PartitionTransactions

# What a serve_stored_records caller builds from the entries it reads.
_Answer = TypeVar("_Answer")
# TopicInfo.config keys: {"<partition>": log start offset} set by delete_records, and the
# topic's own retention {"ms": int | None, "bytes": int | None} (None: no limit of that kind).
LOG_START_OFFSETS_KEY: Final = "braid.log_start_offsets"
RETENTION_KEY: Final = "braid.retention"


def _log_start_floor(topics: TopicRegistry, topic: str, partition: int) -> int:
    """The log start offset DeleteRecords set for the partition (0: none)."""
    info = topics.get(topic)
    if info is None:
        return 0
    floors = info.config.get(LOG_START_OFFSETS_KEY)
    return int(floors.get(str(partition), 0)) if floors else 0


def topic_retention_limits(topics: TopicRegistry) -> dict[str, TopicLimits]:
    """Every topic with retention of its own, for the log's retention."""
    limits: dict[str, TopicLimits] = {}
    for info in topics.all():
        own = info.config.get(RETENTION_KEY)
        if own:
            limits[info.name] = TopicLimits(own.get("ms"), own.get("bytes"))
    return limits


class ProducerIdSource(Protocol):
    """Where a cluster node takes Kafka producer ids from (docs/cluster.md sections 4 and 8):
    blocks no other node gets (``core/cluster/redis_metadata.py:RedisMetadata.next_ids``,
    ``INCRBY kafka:producer_id``). A node alone has none: its gateway reserves blocks in its
    own metadata table, as it always did."""

    async def next_ids(self, block: int) -> range:
        """``block`` ids no other caller is given, ever."""
        ...


class TxnMarkerSender(Protocol):
    """How a cluster node's Kafka transaction coordinator ends a transaction in partitions other
    nodes lead (docs/cluster.md section 8; ``core/cluster/rpc/txn_markers.py``): the leader of
    ``shard`` writes a COMMIT or ABORT marker of ``producer_id``/``epoch`` in each partition."""

    async def write_markers(
        self,
        shard: int,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """Returns once the markers are durable on the shard's owner; retries until it
        answers (a transaction cannot be left half ended)."""
        ...


class _PartitionReader(StoredRecordReader):
    """The stored-entry reader of a fetch, with the log start offsets DeleteRecords set."""

    __slots__ = ("_shards", "_topics")

    def __init__(self, shards: ShardSet, topics: TopicRegistry) -> None:
        super().__init__(shards.home.store)
        self._topics = topics
        # Many shards: each partition read in its own shard's log (one shard: the base's).
        self._shards = None if shards.single else shards

    def partition_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        shards = self._shards
        if shards is None:
            start, end = super().partition_offsets(topic, partition)
        else:
            start, end = shards.for_queue(topic, partition).store.queue_bounds(topic, partition)
        return max(start, _log_start_floor(self._topics, topic, partition)), end

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int,
        max_bytes: int | None = None,
    ) -> list[StoredEntry]:
        shards = self._shards
        if shards is None:
            return super().read(
                topic, partition, offset, max_records=max_records, max_bytes=max_bytes
            )
        super().read(topic, partition, 0, max_records=0)  # (refused once the reader is closed)
        return shards.for_queue(topic, partition).store.read(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )


class PartitionCalls(BrokerCalls):
    """Partitions, stored batches, groups, offsets, producers and transactions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Each shard's log retention asks the topics for their own limits at each enforcement.
        limits = functools.partial(topic_retention_limits, self._node.topics)
        for shard in self._node.shards:
            shard.store.retention.topic_limits = limits
            shard.store.retention.trim_topics()  # at start too: a restart brings back none

    # Topics as Kafka sees them: partitions are the topic's queues; system topics are hidden.

    def list_topics(self, context: ClientContext) -> list[TopicInfo]:
        """Every topic but the system ones, by name."""
        return self._node.topics.all()

    def system_topics(self, context: ClientContext) -> list[TopicInfo]:
        """The broker's own ``__`` topics that have queues in the log, by name, each with its
        number of queues: what Kafka's Metadata lists as internal topics. Only their names
        and sizes: their records (other clients' offsets and sessions, the broker's tables)
        are no client's to read."""
        queues: dict[str, int] = {}
        for shard in self._node.shards:
            for topic, queue in shard.store.queues(include_system=True):
                if is_system_topic(topic):
                    queues[topic] = max(queues.get(topic, 0), queue + 1)
        return [TopicInfo(name, count) for name, count in sorted(queues.items())]

    async def create_topic(
        self,
        context: ClientContext,
        name: str,
        partitions: int,
        config: Mapping[str, Any] | None = None,
    ) -> TopicInfo:
        """Declare ``name`` with ``partitions`` queues (an existing topic is returned as is),
        its queues counting for the queue limits of ``context.vhost`` (docs/limits.md)."""
        marked = {**(config or {}), QUEUE_VHOST_KEY: context.vhost}
        return (await self._node.declare_topic(name, partitions, marked))[0]

    def check_topic_partitions(
        self, context: ClientContext, name: str, partitions: int, added: int
    ) -> None:
        """Raise :class:`TopicError` (code ``invalid_partitions`` or ``policy_violation``) when
        topic ``name`` may not have ``partitions`` partitions, ``added`` of them new, under the
        broker's caps (``max_partitions_per_topic``, ``max_partitions``, and ``max_topics`` for
        a new topic): what CreateTopics and CreatePartitions with ``validate_only`` answer."""
        topics = self._node.topics
        topics.check_new_queues(name, partitions, added)
        if name not in topics and len(topics) >= topics.limits.max_topics:
            raise TopicError("policy_violation", f"at most {topics.limits.max_topics} topics")

    async def delete_topic(self, context: ClientContext, name: str) -> bool:
        """Delete the topic, its queues, bindings and committed offsets; False if unknown."""
        return await self._node.delete_topic(name)

    async def add_partitions(self, context: ClientContext, name: str, total: int) -> TopicInfo:
        """Grow the topic to ``total`` queues (:class:`TopicError` if unknown)."""
        return await self._node.add_queues(name, total)

    def storage_settings(self, context: ClientContext, topic: str | None = None) -> StorageSettings:
        """The log's retention and segment size, and ``topic``'s durability (DescribeConfigs)."""
        config = self._node.shards.home.store.config  # (every shard's log has the same)
        return StorageSettings(
            config.retention_ms,
            config.retention_bytes,
            config.segment_size,
            config.durability_for(topic) if topic is not None else config.durability,
        )

    def topic_retention(
        self, context: ClientContext, topic: str
    ) -> tuple[int | None, int | None] | None:
        """The topic's own ``(retention ms, retention bytes)`` (None: no limit of that kind),
        or None when it has none and the log's limits apply."""
        info = self._node.topics.get(topic)
        own = info.config.get(RETENTION_KEY) if info is not None else None
        return (own.get("ms"), own.get("bytes")) if own else None

    async def set_topic_retention(
        self,
        context: ClientContext,
        topic: str,
        limits: tuple[int | None, int | None] | None,
    ) -> int:
        """Give the topic retention of its own, ``(ms, bytes)`` (None in either: no limit of
        that kind), or back to the log's (``limits`` None). Applied at once and at each
        retention check. Returns the durable mark to wait for. :class:`TopicError` for an
        unknown topic, and for one with an ack queue (an AMQP queue, an MQTT session): its
        records are kept until acknowledged, never by age or size."""
        info = self._node.topics.get(topic)
        if info is None:
            raise TopicError("unknown", f"no topic {topic!r}")
        if any(self._node.ack_queue(topic, queue) is not None for queue in range(info.queues)):
            raise TopicError(
                "invalid", f"{topic!r} is a queue: its records are kept until acknowledged"
            )
        config = copy.deepcopy(info.config)
        if limits is None:
            config.pop(RETENTION_KEY, None)
        else:
            config[RETENTION_KEY] = {"ms": limits[0], "bytes": limits[1]}
        end = await self._update_topic_config(info, config)
        for shard in self._node.shards:
            shard.store.retention.trim_topics()
        return end

    async def set_topic_config(
        self, context: ClientContext, topic: str, key: str, value: Any
    ) -> int:
        """Keep ``value`` (JSON-able; None deletes) under ``key`` in the topic's config (a
        gateway's own settings, such as the Kafka configs a client gave); the durable mark to
        wait for. :class:`TopicError` for an unknown topic."""
        info = self._node.topics.get(topic)
        if info is None:
            raise TopicError("unknown", f"no topic {topic!r}")
        config = copy.deepcopy(info.config)
        if value is None:
            config.pop(key, None)
        else:
            config[key] = copy.deepcopy(value)
        return await self._update_topic_config(info, config)

    async def _update_topic_config(self, info: TopicInfo, config: dict[str, Any]) -> int:
        await self._node.topics.update(TopicInfo(info.name, info.queues, config))
        # The update is the metadata's last change: its end is the durable mark.
        return self._node.metadata.durable_mark

    async def delete_records(
        self, context: ClientContext, topic: str, partition: int, offset: int
    ) -> int:
        """DeleteRecords: move the partition's log start offset to ``offset`` (-1: the high
        watermark); the records before it are gone for every reader of the partition (a
        fetch below it is out of range). Never moves it back. Returns the new log start
        offset once durable. :class:`TopicError` ``unknown`` for an unknown topic or
        partition, ``offset_out_of_range`` for an offset past the high watermark or below -1."""
        info = self._node.topics.get(topic)
        if info is None or not 0 <= partition < info.queues:
            raise TopicError("unknown", f"no partition {topic}/{partition}")
        start, end = self.partition_offsets(context, topic, partition)
        if offset == -1:
            offset = end
        if not 0 <= offset <= end:
            raise TopicError(
                "offset_out_of_range",
                f"offset {offset} is not within 0..{end} (the high watermark) of "
                f"{topic}/{partition}",
            )
        if offset > start:
            floors = dict(info.config.get(LOG_START_OFFSETS_KEY) or {})
            floors[str(partition)] = offset
            await self.when_durable(
                await self.set_topic_config(context, topic, LOG_START_OFFSETS_KEY, floors)
            )
            start = offset
        return start

    def partition_bytes(self, context: ClientContext, topic: str, partition: int) -> int:
        """The commit-log bytes of the partition's records from its log start offset on
        (DescribeLogDirs' partition size; records past a DeleteRecords start in the entry
        holding it are counted)."""
        index = self._node.shards.for_queue(topic, partition).store.queue_index(topic, partition)
        if index is None:
            return 0
        start, _ = self.partition_offsets(context, topic, partition)
        return stored_bytes(index, index.entry_for_offset(start), index.next_entry)

    def log_directory(self, context: ClientContext) -> tuple[str, int, int]:
        """``(absolute path, total bytes, usable bytes)`` of the data directory's file system
        (many shards: the lowest local one's directory; they share the root's file system)."""
        path = os.path.abspath(self._node.shards.home.store.data_dir)
        usage = shutil.disk_usage(path)
        return path, usage.total, usage.free

    # Producing: a RecordBatch stored as ONE batch record, indexed once, never re-encoded.

    def publishing_blocked(self) -> bool:
        """Flow control holds publishers back now (Kafka answers with a throttle time)."""
        return self._node.flow.blocked

    async def wait_publishing_allowed(self) -> None:
        """Return once flow control lets publishers go on (at once when it does now)."""
        if self._node.flow.blocked:
            await self._node.flow.wait_unblocked()

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
        ``transaction``: the batch is a Kafka transaction's (``transaction`` names it, its
        producer id is the batch's): stored in the partition now, with its offset, behind the
        partition's last stable offset until a marker ends it (:meth:`write_transaction_marker`,
        :meth:`last_stable_offset`; ``core/transactions/partitions.py``). A delayed batch
        (``deliver_at_ms``) gets its offset when it becomes visible. Raises
        :class:`TopicError` for an unknown topic or partition."""
        if transaction is not None:
            self._check_partition(topic, partition)
            appended = self._kafka_transactions(topic, partition).append_data(
                topic, partition, batch, record_count, born_ms=born_ms, client=context.client_id
            )
            # In the partition now, at the offset the producer is told; read_committed readers
            # are held at the last stable offset until the transaction ends. Not routed.
            outcome = PublishOutcome(
                appended, [(topic, partition)], partition, record_count=record_count
            )
            return Publication(self, topic, outcome, None)
        return self._stored_batch(
            topic,
            run_eagerly(
                self._node.publish_batch(
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

    def max_inflated_batch_bytes(self, context: ClientContext) -> int:
        """What the records of one batch ``context`` produces may inflate to (``[broker]
        max_inflated_batch_bytes``): past it, Kafka's MESSAGE_TOO_LARGE."""
        return self._node.config.max_inflated_batch_bytes

    def write_transaction_marker(
        self,
        context: ClientContext,
        topic: str,
        partition: int,
        marker: bytes,
        *,
        born_ms: int,
    ) -> Publication:
        """Store a Kafka control batch (a COMMIT or ABORT marker) in ``(topic, partition)``: the
        transaction of the marker's producer ends there (the last stable offset moves; an
        ABORT joins the partition's aborted transactions). :class:`TopicError` if the
        partition is gone."""
        self._check_partition(topic, partition)
        transactions = self._kafka_transactions(topic, partition)
        appended = transactions.append_marker(topic, partition, marker, born_ms=born_ms)
        outcome = PublishOutcome(appended, [(topic, partition)], partition)
        return Publication(self, topic, outcome, None)

    # Markers for partitions other nodes lead: a cluster node's, set once at start.
    _txn_markers: TxnMarkerSender | None = None

    def set_txn_markers(self, sender: TxnMarkerSender) -> None:
        """End Kafka transactions in partitions other nodes lead through ``sender`` (a cluster
        node's, set once at start)."""
        self._txn_markers = sender

    def partition_is_local(self, context: ClientContext, topic: str, partition: int) -> bool:
        """This node stores ``(topic, partition)`` (always, on a node alone)."""
        shards = self._node.shards
        return shards.local(shards.queue_number(topic, partition)) is not None

    async def write_remote_transaction_markers(
        self,
        context: ClientContext,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        """The COMMIT (``commit``) or ABORT markers of a transaction in partitions other nodes
        lead, written by their leaders (Kafka's WriteTxnMarkers); returns once every leader
        made them durable, retrying a leader that does not answer. Raises
        :class:`ShardUnavailable` on a node that has no way to reach other nodes."""
        if not partitions:
            return
        by_shard: dict[int, list[tuple[str, int]]] = {}
        shards = self._node.shards
        for topic, partition in partitions:
            by_shard.setdefault(shards.queue_number(topic, partition), []).append(
                (topic, partition)
            )
        sender = self._txn_markers
        if sender is None:
            raise ShardUnavailable(min(by_shard), reason="no cluster to send markers through")
        await asyncio.gather(
            *(
                sender.write_markers(shard, transactional_id, producer_id, epoch, commit, named)
                for shard, named in by_shard.items()
            )
        )

    def _check_partition(self, topic: str, partition: int) -> None:
        info = self._node.topic(topic)
        if not 0 <= partition < info.queues:
            raise TopicError("unknown_queue", f"topic {topic!r} has no queue {partition}")

    def _kafka_transactions(self, topic: str, partition: int) -> PartitionTransactions:
        """The Kafka transactions of the shard that holds the partition."""
        return self._node.shards.for_queue(topic, partition).partition_transactions

    def last_stable_offset(self, context: ClientContext, topic: str, partition: int) -> int:
        """The partition's last stable offset: the first offset of its earliest open Kafka
        transaction, else the high watermark. A read_committed consumer reads below it."""
        shard = self._node.shards.for_queue(topic, partition)
        _, end = shard.store.queue_bounds(topic, partition)
        return shard.partition_transactions.last_stable_offset(topic, partition, end)

    def aborted_transactions(
        self, context: ClientContext, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of the partition's aborted Kafka transactions that
        overlap offsets ``[start, end)``: a read_committed Fetch's aborted-transactions list,
        by which the client drops their records."""
        return self._kafka_transactions(topic, partition).aborted(topic, partition, start, end)

    def open_partition_transactions(self, context: ClientContext) -> list[OpenInPartition]:
        """Every Kafka transaction open in some partition (after a restart: those it cut, as
        the log holds them), with the producer id and epoch of its batches."""
        return [
            opened
            for shard in self._node.shards
            for opened in shard.partition_transactions.open_transactions()
        ]

    # Kafka producer ids: a cluster node's come from the cluster's store, set once at start.
    _producer_ids: ProducerIdSource | None = None

    def set_producer_ids(self, source: ProducerIdSource) -> None:
        """Take producer id blocks from ``source`` from now on (a cluster node's, set once at
        start): ids then never collide with another node's."""
        self._producer_ids = source

    async def producer_id_block(self, context: ClientContext, block: int) -> range | None:
        """``block`` producer ids unique across the cluster (errors of the cluster's store
        propagate), or None on a node alone: the gateway's own table reserves its blocks."""
        source = self._producer_ids
        if source is None:
            return None
        return await source.next_ids(block)

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
        store = self._node.shards.for_queue(topic, partition).store
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
        reader = _PartitionReader(self._node.shards, self._node.topics)
        try:
            return respond(reader)
        finally:
            reader.close()

    def partition_offsets(
        self, context: ClientContext, topic: str, partition: int
    ) -> tuple[int, int]:
        """``(log start offset, high watermark)``; the last stable offset is
        :meth:`last_stable_offset`."""
        start, end = self._node.shards.for_queue(topic, partition).store.queue_bounds(
            topic, partition
        )
        return max(start, _log_start_floor(self._node.topics, topic, partition)), end

    async def wait_for_records(
        self, context: ClientContext, partitions: Sequence[Destination], timeout_s: float
    ) -> bool:
        """Long poll: True once any of ``partitions`` got a new entry, False after
        ``timeout_s``."""
        return await self._node.wait_for_records(partitions, timeout_s)

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
        return await self._node.shards.for_group(group_id).groups.join(
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
        return await self._node.shards.for_group(group_id).groups.sync(
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
            self._node.shards.for_group(group_id).groups.heartbeat(
                group_id, generation_id, member_id, group_instance_id
            )
        )

    def leave_group(
        self,
        context: ClientContext,
        group_id: str,
        members: Sequence[tuple[str, str | None]],
    ) -> LeaveResult:
        """LeaveGroup of ``(member id, group instance id)`` members."""
        return self._node.shards.for_group(group_id).groups.leave(group_id, list(members))

    def describe_group(self, context: ClientContext, group_id: str) -> GroupDescription:
        return self._node.shards.for_group(group_id).groups.describe(group_id)

    def group_state(self, context: ClientContext, group_id: str) -> GroupState | None:
        """The group's state; None for a group the coordinator does not know."""
        return self._node.shards.for_group(group_id).groups.state(group_id)

    def list_groups(
        self, context: ClientContext, states: Collection[str] | None = None
    ) -> list[GroupListing]:
        return [
            listing for shard in self._node.shards for listing in shard.groups.list_groups(states)
        ]

    def delete_groups(self, context: ClientContext, group_ids: Iterable[str]) -> dict[str, int]:
        """DeleteGroups: each group's error code; a deleted group's offsets go with it."""
        answers: dict[str, int] = {}
        for group_id in group_ids:
            shard = self._node.shards.for_group(group_id)
            for deleted, error in shard.groups.delete_groups([group_id]).items():
                if error == 0:
                    shard.offsets.delete_group(deleted)
                answers[deleted] = int(error)
        return answers

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
            self._node.shards.for_group(group_id).groups.validate_member(
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
        await self._node.shards.for_group(group_id).offsets.commit(group_id, commits)

    def commit_offsets_nowait(
        self, context: ClientContext, group_id: str, commits: Iterable[OffsetCommit]
    ) -> int:
        """:meth:`commit_offsets` without waiting: the durable mark to wait for."""
        return self._node.shards.for_group(group_id).offsets.commit_nowait(group_id, commits)

    def fetch_offset(
        self, context: ClientContext, group_id: str, topic: str, partition: int
    ) -> CommittedOffset | None:
        return self._node.shards.for_group(group_id).offsets.fetch(group_id, topic, partition)

    async def delete_group_offsets(
        self, context: ClientContext, group_id: str, partitions: Iterable[Destination]
    ) -> None:
        """OffsetDelete: forget the group's committed offsets of these ``(topic, partition)``
        (the group keeps the others); returns once durable."""
        shard = self._node.shards.for_group(group_id)
        end = shard.offsets.delete_partitions(group_id, partitions)
        if end:
            await shard.store.wait_durable(end)

    def fetch_group_offsets(
        self, context: ClientContext, group_id: str
    ) -> dict[Destination, CommittedOffset]:
        """Every committed offset of the group, by ``(topic, partition)``."""
        return self._node.shards.for_group(group_id).offsets.fetch_group(group_id)

    # Transactions: half messages (RocketMQ semantics), the base of Kafka transactions.

    def open_transactions(self) -> list[OpenTransaction]:
        """Every transaction still open (after a restart: the ones it cut)."""
        return [
            OpenTransaction(pending.txn_id, pending.producer_group, pending.halves)
            for shard in self._node.shards
            for pending in shard.transactions.pending()
        ]

    def begin_transaction(
        self, context: ClientContext, producer_group: str, transaction_id: str, *, timeout_ms: int
    ) -> str:
        """Open a transaction whose halves are decided by the producer alone: it is never
        asked back, and after ``timeout_ms`` it is rolled back. Returns its id."""
        service = self._node.shards.for_transaction(transaction_id).transactions
        service.set_check_back(producer_group, None)
        return service.begin(producer_group, transaction_id, timeout_ms=timeout_ms)

    async def commit_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Make every half of the transaction visible at once (one LINK); returns once
        durable. :class:`TransactionError` if it was decided otherwise meanwhile."""
        await self._node.shards.for_transaction(transaction_id).transactions.commit(transaction_id)

    async def roll_back_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Discard every half of the transaction; returns once durable."""
        await self._node.shards.for_transaction(transaction_id).transactions.rollback(
            transaction_id
        )

    # The broker's metadata (kind ``setting``; ``__meta`` on a single node): small durable
    # settings a gateway keeps.

    def metadata_items(self, context: ClientContext, prefix: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``."""
        settings = self._node.metadata.items(KIND_SETTING)
        return [item for item in settings if item[0].startswith(prefix)]

    def metadata_value(self, context: ClientContext, key: str) -> bytes | None:
        return self._node.metadata.get(KIND_SETTING, key)

    async def put_metadata(self, context: ClientContext, key: str, value: bytes) -> int:
        """Store ``key``; returns the durable mark to wait for (:meth:`when_durable`)."""
        metadata = self._node.metadata
        await metadata.apply([Change(KIND_SETTING, key, value)])
        return metadata.durable_mark

    async def delete_metadata(self, context: ClientContext, key: str) -> int | None:
        """Delete ``key``; the durable mark to wait for, None if there was no such key."""
        metadata = self._node.metadata
        if metadata.get(KIND_SETTING, key) is None:
            return None
        await metadata.apply([Change(KIND_SETTING, key, None)])
        return metadata.durable_mark
