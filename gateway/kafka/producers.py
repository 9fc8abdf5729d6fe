"""Idempotent producers: producer ids, and per-partition sequence checks that drop duplicates.

Kafka's model (``ProducerStateManager``, ``ProducerAppendInfo``, KIP-98): a producer with
idempotence gets a producer id and epoch (InitProducerId) and numbers the records it sends to
each partition from 0. The broker remembers, per (partition, producer), the epoch and the
sequence ranges of the last ``BATCHES_PER_PRODUCER`` batches it stored. A batch whose
(epoch, first sequence, last sequence) equals a remembered one is a retry of a stored batch:
it is acknowledged with the original base offset and not stored again. Otherwise:

- an epoch older than the remembered one: INVALID_PRODUCER_EPOCH (47), a zombie;
- a newer epoch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER (45);
- the same epoch must continue at last sequence + 1 (wrapping at 2**31 - 1 to 0), else 45;
- a producer the partition does not know (new, or older than what was rebuilt) may start at
  any sequence, as Kafka accepts for a producer whose state retention removed.

Across a restart: the state of a partition is rebuilt from the headers of the last
``TAIL_ENTRIES`` batches stored in it, the first time the partition sees an idempotent batch
after the broker starts (batch headers carry producer id, epoch and base sequence; the
index entry carries the base offset). A client retries within ``delivery.timeout.ms``
(2 minutes by default), so a retry's original is always within that tail unless thousands of
batches from other producers came in between.

Producer ids come from :class:`ProducerIdAllocator`: blocks of ``PRODUCER_ID_BLOCK`` ids whose
end is stored durably before any id of the block is handed out (Kafka's ProducerIdManager), so
an id is never reused after a restart. On a cluster node the blocks come from the cluster's
store instead (``BrokerAPI.producer_id_block``, docs/cluster.md section 8): every node's
producers, transactional ones included, then get ids no other node hands out.

Not thread-safe: event-loop thread only. Pure bookkeeping; the caller stores the batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

from kio.schema.errors import ErrorCode

from core.api import PROTOCOL_KAFKA, ClientContext

if TYPE_CHECKING:
    from core.api import BrokerAPI

log = logging.getLogger(__name__)

# Kafka's ProducerStateEntry.NumBatchesToRetain: the producer has at most 5 requests in flight
# (max.in.flight.requests.per.connection <= 5 with idempotence), so a retry is of one of them.
BATCHES_PER_PRODUCER: Final = 5
# Index entries read back from the end of a partition to rebuild its producer state.
TAIL_ENTRIES: Final = 4096
# Ids handed out per durable write (Kafka's ProducerIdManager takes blocks of 1000).
PRODUCER_ID_BLOCK: Final = 1000
MAX_SEQUENCE: Final = 2**31 - 1
NO_EPOCH: Final = -1


class StoredBatch(NamedTuple):
    """What is remembered of one stored batch of a producer in a partition."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    end_position: int  # commit-log end of the stored record (0: rebuilt; durable already)


class SequenceCheck(NamedTuple):
    """The verdict on one batch: ``error`` NONE and ``duplicate`` set: acknowledge, skip."""

    error: ErrorCode
    duplicate: StoredBatch | None = None


ACCEPT: Final = SequenceCheck(ErrorCode.none)


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap to 0 after 2**31 - 1."""
    return (base_sequence + last_offset_delta) % (MAX_SEQUENCE + 1)


def in_sequence(last: int, first: int) -> bool:
    return first == last + 1 or (first == 0 and last == MAX_SEQUENCE)


class _ProducerEntry:
    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[StoredBatch] = deque(maxlen=BATCHES_PER_PRODUCER)


# (producer_id, epoch, first_sequence, last_sequence, base_offset) of a stored batch, oldest
# first: what a partition's tail yields to rebuild its state.
TailBatch = tuple[int, int, int, int, int]
TailLoader = Callable[[str, int], Iterable[TailBatch]]


class ProducerStates:
    """Sequence state of every (partition, producer id); ``load_tail`` rebuilds a partition."""

    def __init__(self, load_tail: TailLoader) -> None:
        self._load_tail = load_tail
        self._partitions: dict[tuple[str, int], dict[int, _ProducerEntry]] = {}

    def _partition(self, topic: str, partition: int) -> dict[int, _ProducerEntry]:
        key = (topic, partition)
        producers = self._partitions.get(key)
        if producers is None:
            producers = self._partitions[key] = {}
            rebuilt = 0
            for producer_id, epoch, first, last, base_offset in self._load_tail(topic, partition):
                entry = producers.get(producer_id)
                if entry is None or epoch > entry.epoch:
                    entry = producers[producer_id] = _ProducerEntry(epoch)
                elif epoch < entry.epoch:
                    continue
                entry.batches.append(StoredBatch(first, last, base_offset, 0))
                rebuilt += 1
            if rebuilt:
                log.info(
                    "kafka: rebuilt %d producer batches of %d producers for %s/%d",
                    rebuilt,
                    len(producers),
                    topic,
                    partition,
                )
        return producers

    def check(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        last_sequence: int,
    ) -> SequenceCheck:
        """Kafka's duplicate check, then checkProducerEpoch and checkSequence."""
        entry = self._partition(topic, partition).get(producer_id)
        if entry is None:
            return ACCEPT
        if epoch == entry.epoch:
            for stored in entry.batches:
                if stored.first_sequence == first_sequence and stored.last_sequence == (
                    last_sequence
                ):
                    return SequenceCheck(ErrorCode.none, stored)
        if epoch < entry.epoch:
            return SequenceCheck(ErrorCode.invalid_producer_epoch)
        if epoch > entry.epoch:
            if first_sequence != 0:
                return SequenceCheck(ErrorCode.out_of_order_sequence_number)
            return ACCEPT
        if entry.batches and not in_sequence(entry.batches[-1].last_sequence, first_sequence):
            return SequenceCheck(ErrorCode.out_of_order_sequence_number)
        return ACCEPT

    def record(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        batch: StoredBatch,
    ) -> None:
        """Remember a batch just stored (after ``check`` accepted it)."""
        producers = self._partition(topic, partition)
        entry = producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = producers[producer_id] = _ProducerEntry(epoch)
        entry.batches.append(batch)

    def producers_of(self, topic: str, partition: int) -> list[tuple[int, int, int]]:
        """``(producer id, epoch, last sequence)`` of each producer the partition remembers
        (DescribeProducers)."""
        return [
            (producer_id, entry.epoch, entry.batches[-1].last_sequence if entry.batches else -1)
            for producer_id, entry in sorted(self._partition(topic, partition).items())
        ]

    def forget_partition(self, topic: str, partition: int) -> None:
        self._partitions.pop((topic, partition), None)

    def forget_topic(self, topic: str) -> None:
        for key in [key for key in self._partitions if key[0] == topic]:
            del self._partitions[key]


# Who the gateway's own table calls are made as (producer id blocks, transactional ids).
TABLE_CONTEXT: Final = ClientContext(PROTOCOL_KAFKA, connection_id="kafka-producer-state")


class KeyValueTable(Protocol):
    """The durable key-value table state is kept in; ``put`` returns the durable mark to wait
    for (``BrokerAPI.when_durable``)."""

    def get(self, key: str) -> bytes | None: ...
    async def put(self, key: str, value: bytes) -> int: ...
    def items(self) -> Iterator[tuple[str, bytes]]: ...


class MetadataTable:
    """The broker's metadata table (``__meta``) through the Broker API, as a ``KeyValueTable``
    of the ``kafka:`` keys (producer id blocks, transactional ids): the gateway's own state,
    read and written as ``TABLE_CONTEXT``."""

    PREFIX: Final = "kafka:"

    def __init__(self, api: BrokerAPI) -> None:
        self._api = api

    def get(self, key: str) -> bytes | None:
        return self._api.metadata_value(TABLE_CONTEXT, key)

    async def put(self, key: str, value: bytes) -> int:
        return await self._api.put_metadata(TABLE_CONTEXT, key, value)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(self._api.metadata_items(TABLE_CONTEXT, self.PREFIX))


PRODUCER_ID_KEY: Final = "kafka:producer-id-block"


class ProducerIdAllocator:
    """Producer ids never handed out twice, also across restarts, and on a cluster by no
    other node (``cluster_blocks``: the Broker API's ``producer_id_block``, None on a node
    alone).

    ``next_id()`` returns an id and, when it opened a new block in the node's own table, the
    table write reserving the block: the caller makes it durable before handing the id out.
    """

    def __init__(
        self,
        table: KeyValueTable,
        cluster_blocks: Callable[[int], Awaitable[range | None]] | None = None,
    ) -> None:
        self._table = table
        self._cluster_blocks = cluster_blocks
        raw = table.get(PRODUCER_ID_KEY)
        # Everything below the stored block end may have been handed out before a restart.
        self._next = int(json.loads(raw)["block_end"]) if raw else 0
        self._block_end = self._next
        # The cluster's block is asked for once for every caller waiting on it.
        self._cluster_lock = asyncio.Lock()

    async def next_id(self) -> tuple[int, int | None]:
        """A producer id, and the durable mark of the block reservation it needed (None: the
        block was reserved before, or came from the cluster's store)."""
        if self._next >= self._block_end and self._cluster_blocks is not None:
            async with self._cluster_lock:
                if self._next >= self._block_end:
                    block = await self._cluster_blocks(PRODUCER_ID_BLOCK)
                    if block is not None:
                        self._next, self._block_end = block.start, block.stop
        reservation = None
        if self._next >= self._block_end:
            self._block_end = self._next + PRODUCER_ID_BLOCK
            reservation = await self._table.put(
                PRODUCER_ID_KEY, json.dumps({"block_end": self._block_end}).encode()
            )
        producer_id = self._next
        self._next += 1
        return producer_id, reservation
