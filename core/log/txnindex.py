"""Kafka transactions in the log: which stored batches are transactional, and their outcomes.

A Kafka transaction's batches are stored in their partitions when produced (offsets and
timestamps are the ones the producer was told), and its end is a control batch (COMMIT or
ABORT marker) in each partition it touched, as Kafka writes them. Both are ordinary batch
frames of the partition; nothing here changes the frame format. What tells them apart is the
Kafka RecordBatch header in the body (``attributes`` bit 4: transactional, bit 5: control),
the producer id, and a control record's key (version int16, type int16: 0 ABORT, 1 COMMIT).

The transaction index: queue ``__kafka_txns/0`` (:data:`TXN_INDEX_TOPIC`). Written by the
log's dispatcher like any destination, from the same frames (store once, index many): the
first batch of a transaction in a partition and every control batch are indexed in their
partition AND here, in one append. So the index holds, in log order, every transaction's
beginning in each partition and every end; a replay of it rebuilds which transactions are
open (the Last Stable Offset) and which were aborted (Kafka's ``.txnindex``), without
scanning partitions. It is derived from the frames themselves, so it is never out of step with
them: a crash keeps a frame with its index entries or neither. Readers that are not the broker
(Spark, ``braid tail``) read it too, through :class:`TxnOutcomes`, to show committed records
only (or aborted ones too, on request) and never control batches.

Pure functions and a plain class over the log's read API: usable by ``spark/`` without an
event loop. Not thread-safe.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from core.log import record as rec

if TYPE_CHECKING:
    from core.log.consumequeue import ConsumeQueue
    from core.log.reader import LogReader

TXN_INDEX_TOPIC = "__kafka_txns"
TXN_INDEX_QUEUE = 0

# RecordBatch v2 header (Kafka's DefaultRecordBatch), big-endian, the fields read here:
#   21 attributes int16, 43 producer_id int64, 51 producer_epoch int16, 61 first record
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_PRODUCER = struct.Struct(">qh")
_PRODUCER_AT = 43
_RECORDS_AT = 61
_MAGIC_AT = 16
_TRANSACTIONAL = 0x10  # attributes bit 4
_CONTROL = 0x20  # attributes bit 5
# Control record key: version int16, type int16 (ControlRecordType.java).
_CONTROL_KEY = struct.Struct(">hh")
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

# A transactional batch's outcome as readers see it.
COMMITTED = "committed"
ABORTED = "aborted"
OPEN = "open"


class BatchTxn(NamedTuple):
    """The transaction fields of a transactional or control RecordBatch."""

    producer_id: int
    producer_epoch: int
    control: bool
    # A control batch's marker: True COMMIT, False ABORT (None: not a control batch, or a
    # control record of another type).
    commit: bool | None


def _varint(body: bytes | memoryview, at: int) -> tuple[int, int]:
    """A zigzag varint at ``at``: (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        byte = body[at]
        at += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def control_marker(body: bytes | memoryview) -> bool | None:
    """The marker of a control batch: True COMMIT, False ABORT, None another control type.
    A control batch is never compressed (Kafka's rule), so its one record is read in place:
    length, attributes int8, timestamp delta, offset delta, key length, key."""
    at = _RECORDS_AT
    _, at = _varint(body, at)  # record length
    at += 1  # record attributes
    _, at = _varint(body, at)  # timestamp delta
    _, at = _varint(body, at)  # offset delta
    key_length, at = _varint(body, at)
    if key_length < _CONTROL_KEY.size:
        return None
    _, kind = _CONTROL_KEY.unpack_from(body, at)
    if kind == CONTROL_COMMIT:
        return True
    if kind == CONTROL_ABORT:
        return False
    return None


def batch_txn(body: bytes | memoryview | None) -> BatchTxn | None:
    """The transaction fields of a stored Kafka batch; None when it is neither transactional
    nor a control batch (or too short to be a v2 batch)."""
    if body is None or len(body) < _RECORDS_AT or body[_MAGIC_AT] != 2:
        return None
    (attributes,) = _ATTRIBUTES.unpack_from(body, _ATTRIBUTES_AT)
    if not attributes & (_TRANSACTIONAL | _CONTROL):
        return None
    producer_id, epoch = _PRODUCER.unpack_from(body, _PRODUCER_AT)
    control = bool(attributes & _CONTROL)
    commit: bool | None = None
    if control:
        try:
            commit = control_marker(body)
        except (IndexError, ValueError, struct.error):
            commit = None
    return BatchTxn(producer_id, epoch, control, commit)


# Entries read from the index per call while replaying it.
READ_CHUNK = 4096


def index_records(
    reader: LogReader, start: int | None = None, read_to: list[int] | None = None
) -> Iterator[rec.Record]:
    """Every frame indexed in the transaction index, in log order, from queue offset
    ``start`` (default: the index's first). ``read_to``: a one-item list that is set to the
    queue offset after the last entry read (where the next read may go on)."""
    first, end = reader.queue_bounds(TXN_INDEX_TOPIC, TXN_INDEX_QUEUE)
    offset = first if start is None else max(first, start)
    while offset < end:
        entries = reader.read(TXN_INDEX_TOPIC, TXN_INDEX_QUEUE, offset, max_records=READ_CHUNK)
        if not entries:
            break
        for entry in entries:
            offset = max(offset, entry.next_offset)
            yield entry.record()
    if read_to is not None:
        read_to[:] = [offset]


# How far past a frame's store time its index entry is looked for (the entry is written in the
# same append, with the same time; a margin costs a few entries read).
STORE_MS_SLACK = 1000


def offset_at(index: ConsumeQueue | None, position: int, store_ms: int) -> int | None:
    """The queue offset of ``index``'s entry for the frame at ``position``, appended at
    ``store_ms``; None if the queue has no such entry. Entries' store times grow with their
    offsets (their positions need not: a delayed or linked entry points back), and an appended
    frame's entry carries the frame's store time, so the entry is among those of that
    millisecond (binary search by time, then a short scan)."""
    if index is None:
        return None
    number = max(index.entry_for_time(store_ms), index.start_entry)
    while number < index.next_entry:
        chunk = index.raw_entries(number, 256)
        if not chunk:
            return None
        for entry_position, _, _, _, entry_ms, first_offset in chunk:
            if entry_position == position:
                return first_offset
            if entry_ms > store_ms + STORE_MS_SLACK:
                return None
        number += len(chunk)
    return None


class TxnOutcomes:
    """The outcome of each transactional batch of the log, by commit-log position: for
    readers that see a partition's frames (Spark, ``braid tail``). A transactional batch of
    producer P in partition (T, Q) at position X belongs to the transaction that the first
    control batch of P in (T, Q) after X ends; none yet: still open."""

    def __init__(self) -> None:
        # (topic, queue, producer id) -> positions of its control batches, and their markers
        self._positions: dict[tuple[str, int, int], list[int]] = {}
        self._markers: dict[tuple[str, int, int], list[bool]] = {}
        # (topic, queue) -> producer id -> (commit-log position, store ms) of the first batch
        # of its transaction still open there: what a reader's last stable offset comes from.
        self._open: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
        self._next_offset: int | None = None  # in the transaction index: where to go on

    @classmethod
    def read(cls, reader: LogReader) -> TxnOutcomes:
        """From the transaction index of ``reader``'s log (as it is now)."""
        outcomes = cls()
        outcomes.refresh(reader)
        return outcomes

    def refresh(self, reader: LogReader) -> None:
        """Add what was indexed since the last read (``reader`` refreshed by the caller). A
        read-only reader's transaction index is refreshed once more here, so it is at least as
        new as the partitions the caller refreshed before (see :meth:`last_stable_offset`),
        and then its segments, so every entry seen has its frame's segment mapped (a frame is
        written before its entries)."""
        if not reader.writable:
            index = reader.queue_index(TXN_INDEX_TOPIC, TXN_INDEX_QUEUE)
            if index is not None:
                index.refresh()
            reader.commitlog.refresh()
        read_to = [0]
        for record in index_records(reader, self._next_offset, read_to):
            info = batch_txn(record.body)
            if info is None:
                continue
            partition = (record.topic, record.queue)
            if not info.control:
                opened = self._open.setdefault(partition, {})
                opened.setdefault(info.producer_id, (record.position, record.store_ms))
            elif info.commit is not None:
                self.add_marker(
                    record.topic, record.queue, info.producer_id, record.position, info.commit
                )
                began = self._open.get(partition, {}).get(info.producer_id)
                if began is not None and began[0] < record.position:
                    del self._open[partition][info.producer_id]
        self._next_offset = read_to[0]

    def open_first_batches(self, topic: str, queue: int) -> list[tuple[int, int]]:
        """``(commit-log position, store ms)`` of the first batch of each transaction still
        open in ``(topic, queue)``, as far as the index read so far tells."""
        return list(self._open.get((topic, queue), {}).values())

    def last_stable_offset(self, reader: LogReader, topic: str, queue: int) -> int:
        """The Last Stable Offset of ``(topic, queue)`` as ``reader`` sees it: the first offset
        of its earliest open transaction, else its next offset. What a reader of committed data
        does not read past (Kafka's read_committed), as the broker's
        ``PartitionTransactions.last_stable_offset``.

        Refresh ``reader`` first, then this (:meth:`refresh`), so the index (where a
        transaction's beginning is known from) is read after the partition: a frame's partition
        entry is written just before its transaction-index entry, so then the only entry whose
        transaction-index entry may not be visible yet is the partition's last, and it is
        looked at here (one frame read)."""
        _, end = reader.queue_bounds(topic, queue)
        stable = end
        index = reader.queue_index(topic, queue)
        for position, store_ms in self.open_first_batches(topic, queue):
            offset = offset_at(index, position, store_ms)
            if offset is not None:
                stable = min(stable, offset)
        if index is None or index.next_entry <= index.start_entry or end == 0:
            return stable
        last = reader.read(topic, queue, end - 1, max_records=1)
        if last and last[0].offset < stable:
            entry = last[0]
            info = batch_txn(entry.body)
            if (
                info is not None
                and not info.control
                and self.outcome(topic, queue, info.producer_id, entry.position) == OPEN
            ):
                stable = entry.offset
        return stable

    def add_marker(
        self, topic: str, queue: int, producer_id: int, position: int, commit: bool
    ) -> None:
        key = (topic, queue, producer_id)
        positions = self._positions.setdefault(key, [])
        markers = self._markers.setdefault(key, [])
        at = bisect.bisect_left(positions, position)
        if at < len(positions) and positions[at] == position:
            return
        positions.insert(at, position)
        markers.insert(at, commit)

    def outcome(self, topic: str, queue: int, producer_id: int, position: int) -> str:
        """:data:`COMMITTED`, :data:`ABORTED` or :data:`OPEN` for the transactional batch of
        ``producer_id`` at ``position`` in ``(topic, queue)``."""
        key = (topic, queue, producer_id)
        positions = self._positions.get(key)
        if not positions:
            return OPEN
        at = bisect.bisect_right(positions, position)
        if at == len(positions):
            return OPEN
        return COMMITTED if self._markers[key][at] else ABORTED

    def shows(
        self,
        topic: str,
        queue: int,
        position: int,
        body: bytes | memoryview | None,
        *,
        include_aborted: bool = False,
    ) -> bool:
        """Whether a reader of committed data shows the batch frame at ``position``: never a
        control batch; a transactional batch once committed (aborted ones too with
        ``include_aborted``); any other batch always."""
        info = batch_txn(body)
        if info is None:
            return True
        if info.control:
            return False
        state = self.outcome(topic, queue, info.producer_id, position)
        return state == COMMITTED or (include_aborted and state == ABORTED)
