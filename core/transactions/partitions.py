"""Kafka transactions with Kafka's semantics in the partitions: open transactions (the Last
Stable Offset) and aborted ones (the Fetch response's aborted-transactions list).

A Kafka transactional batch is stored in its partition when produced, at the offset the
producer is told; a commit or an abort is a control batch in each partition of the
transaction (see :mod:`core.log.txnindex` for how both are recognised and indexed). Per
partition this keeps what Kafka's ProducerStateManager and ``.txnindex`` keep:

- the open transactions: producer id -> first offset (and commit-log position) of its current
  transaction in the partition. The Last Stable Offset is the lowest of those first offsets, or
  the high watermark when none is open: a read_committed consumer is served nothing at or past
  it, non-transactional records produced after it included (Kafka's rule);
- the aborted transactions: ``(producer id, first offset, last offset)``, the last offset being
  the ABORT marker's; a read_committed Fetch lists those its range overlaps and the client
  drops their batches (librdkafka, the Java client, aiokafka do).

Durability: the state is derived from frames of the log (the first transactional batch of a
producer in a partition, and each control batch, are indexed in ``__kafka_txns/0`` as well as
in the partition, in the same append), and rebuilt at start by replaying that queue: a batch's
partition offset is found by its commit-log position in the partition's index (binary search).
The replay reads every entry of ``__kafka_txns/0`` still in the log: its cost grows with the
number of Kafka transactions retained (two small entries per transaction and partition).

A retention guard keeps the segment of an open transaction's first batch (and so everything
after it) until the transaction ends.

Not thread-safe: the event-loop thread of the store's writer.
"""

from __future__ import annotations

import bisect
import logging
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

from core.log import LogStore
from core.log import record as rec
from core.log.consumequeue import ConsumeQueue
from core.log.store import Appended
from core.log.txnindex import (
    TXN_INDEX_QUEUE,
    TXN_INDEX_TOPIC,
    BatchTxn,
    batch_txn,
    index_records,
    offset_at,
)

log = logging.getLogger(__name__)

_INDEX = (TXN_INDEX_TOPIC, TXN_INDEX_QUEUE)


class OpenTxn(NamedTuple):
    """A transaction still open in one partition."""

    first_offset: int
    position: int  # commit-log position of its first batch there
    producer_epoch: int


class AbortedTxn(NamedTuple):
    """An aborted transaction of one partition (Kafka's AbortedTxn of ``.txnindex``)."""

    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


class OpenInPartition(NamedTuple):
    """An open transaction as :meth:`PartitionTransactions.open_transactions` lists it."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_offset: int


@dataclass(slots=True)
class _Partition:
    open: dict[int, OpenTxn] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)  # by last offset
    aborted_last: list[int] = field(default_factory=list)  # the last offsets (bisect)


class PartitionTransactions:
    """The open and aborted Kafka transactions of every partition (module docstring)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self.replayed = self._replay()
        store.retention_guards.append(self.owes_segment)

    # -- writing ---------------------------------------------------------------------------

    def append_data(
        self,
        topic: str,
        partition: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int,
        client: str,
    ) -> Appended:
        """Store a transactional batch in ``(topic, partition)`` now (visible to
        read_uncommitted readers, held back from read_committed ones by the LSO). The first
        batch of its transaction in the partition is indexed in ``__kafka_txns/0`` too. Not
        routed to bindings: other protocols see a transaction's records only once committed
        (never, today: see docs/kafka.md)."""
        info = batch_txn(batch)
        if info is None or info.control:
            raise ValueError("not a transactional data batch")
        state = self._partitions.get((topic, partition))
        first = state is None or info.producer_id not in state.open
        appended = self.store.append_batch(
            topic,
            partition,
            batch,
            record_count,
            born_ms=born_ms,
            client=client,
            destinations=[(topic, partition), _INDEX] if first else None,
        )
        if first:
            self._opened(topic, partition, info, appended.offsets[0][2], appended.position)
        return appended

    def append_marker(self, topic: str, partition: int, marker: bytes, *, born_ms: int) -> Appended:
        """Store a control batch (COMMIT or ABORT marker) in ``(topic, partition)``, indexed in
        ``__kafka_txns/0`` too; the producer's transaction there is over."""
        info = batch_txn(marker)
        if info is None or not info.control or info.commit is None:
            raise ValueError("not a COMMIT or ABORT control batch")
        appended = self.store.append_batch(
            topic,
            partition,
            marker,
            1,
            born_ms=born_ms,
            flags=rec.FLAG_TXN_CONTROL,
            destinations=[(topic, partition), _INDEX],
        )
        self._ended(topic, partition, info, appended.offsets[0][2])
        return appended

    def _opened(
        self, topic: str, partition: int, info: BatchTxn, offset: int, position: int
    ) -> None:
        state = self._partitions.get((topic, partition))
        if state is None:
            state = self._partitions[(topic, partition)] = _Partition()
        if info.producer_id not in state.open:
            state.open[info.producer_id] = OpenTxn(offset, position, info.producer_epoch)

    def _ended(self, topic: str, partition: int, info: BatchTxn, marker_offset: int) -> None:
        state = self._partitions.get((topic, partition))
        if state is None:
            return
        opened = state.open.pop(info.producer_id, None)
        if opened is None or info.commit:
            return
        state.aborted.append(AbortedTxn(info.producer_id, opened.first_offset, marker_offset))
        state.aborted_last.append(marker_offset)

    # -- reading ---------------------------------------------------------------------------

    def is_open(self, topic: str, partition: int, producer_id: int) -> bool:
        state = self._partitions.get((topic, partition))
        return state is not None and producer_id in state.open

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> int:
        """The first offset of the earliest open transaction, else ``high_watermark``."""
        state = self._partitions.get((topic, partition))
        if state is None or not state.open:
            return high_watermark
        return min(high_watermark, min(txn.first_offset for txn in state.open.values()))

    def aborted(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of the aborted transactions that overlap offsets
        ``[start, end)``: what a Fetch of that range lists (Kafka's
        ``collectAbortedTransactions``: last offset >= start, first offset < end)."""
        state = self._partitions.get((topic, partition))
        if state is None or not state.aborted or end <= start:
            return []
        at = bisect.bisect_left(state.aborted_last, start)
        return [
            (txn.producer_id, txn.first_offset)
            for txn in state.aborted[at:]
            if txn.first_offset < end
        ]

    def open_transactions(self) -> list[OpenInPartition]:
        """Every transaction open in some partition."""
        return [
            OpenInPartition(topic, partition, producer_id, txn.producer_epoch, txn.first_offset)
            for (topic, partition), state in sorted(self._partitions.items())
            for producer_id, txn in state.open.items()
        ]

    def owes_segment(self, start: int, end: int) -> bool:
        """Retention guard: keep ``[start, end)`` while it may hold the first batch of an open
        transaction (segments go oldest first, so keeping everything from there is enough)."""
        return any(
            txn.position < end for state in self._partitions.values() for txn in state.open.values()
        )

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's partitions (its records stay until retention)."""
        for key in [key for key in self._partitions if key[0] == topic]:
            del self._partitions[key]

    # -- restart ---------------------------------------------------------------------------

    def _replay(self) -> int:
        """Rebuild the state from ``__kafka_txns/0``; returns the frames read."""
        count = 0
        indexes: dict[tuple[str, int], ConsumeQueue | None] = {}
        for record in index_records(self.store):
            info = batch_txn(record.body)
            if info is None:
                continue
            key = (record.topic, record.queue)
            if key not in indexes:
                indexes[key] = self.store.queue_index(*key)
            offset = offset_at(indexes[key], record.position, record.store_ms)
            if offset is None:
                continue  # no longer in the partition (retention, a deleted topic)
            count += 1
            if info.control:
                if info.commit is not None:
                    self._ended(record.topic, record.queue, info, offset)
            else:
                self._opened(record.topic, record.queue, info, offset, record.position)
        still_open = sum(len(state.open) for state in self._partitions.values())
        if still_open:
            log.info("kafka transactions: %d open in partitions after restart", still_open)
        return count


# One per store: the Broker API may be made more than once over a broker (tests), and the
# replay and the retention guard must happen once.
_BY_STORE: weakref.WeakKeyDictionary[LogStore, PartitionTransactions] = weakref.WeakKeyDictionary()


def partition_transactions(store: LogStore) -> PartitionTransactions:
    """The store's :class:`PartitionTransactions` (made, and replayed, at the first call)."""
    found = _BY_STORE.get(store)
    if found is None:
        found = _BY_STORE[store] = PartitionTransactions(store)
    return found
