"""Reads of stored entries that are valid during one API call only (a Kafka fetch response).

A Kafka fetch serves stored batches as they are, copied once from the log's memory maps into
the response frame (``gateway/kafka/wire.py``: kio's encoder copied them three times). The
entries a read returns hold views of those maps, so they must not outlive the call that reads
them: a view kept past it would pin a segment retention wants to delete (closing a map with
views exported raises ``BufferError``). :meth:`core.api.BrokerAPI.serve_stored_records` hands
a :class:`StoredRecordReader` to the gateway's ``respond`` function and closes it when that
returns; ``respond`` turns the entries into the response's ``bytes`` before it returns, and a
read through a closed reader raises :class:`RuntimeError`.

The entry helpers (``stored_flags``, ``stored_body``, ``stored_tags``) read the fields of an
entry's frame a fetch needs, without decoding the record.

Not thread-safe: the event loop's thread, like the log behind it.
"""

from __future__ import annotations

import struct
from typing import Final

from core.log import record as rec
from core.log.reader import QueueRecord
from core.log.store import LogStore

# One index entry read back: its offset, next offset, size, tag mask and store time, and its
# frame as a view of the log (valid during the call that read it only).
StoredEntry = QueueRecord

# Record flags a fetch tells entries apart by (core/log/record.py).
STORED_BATCH: Final = rec.FLAG_BATCH  # a Kafka producer's RecordBatch, stored as one record
STORED_TXN_CONTROL: Final = rec.FLAG_TXN_CONTROL  # a Kafka transaction marker (control batch)
# born_ms, the publisher's timestamp, in the frame header (core/log/record.py's layout: after
# total_size, magic, crc32c, flags, protocol, reserved and store_ms).
_BORN_MS_OFFSET: Final = struct.calcsize("<IIIHBxq")  # 24
_BORN_MS: Final = struct.Struct("<q")


def stored_flags(entry: StoredEntry) -> int:
    """The record flags of an entry (``STORED_BATCH`` ...)."""
    flags: int = rec.FLAGS.unpack_from(entry.frame, rec.FLAGS_OFFSET)[0]
    return flags


def stored_body(entry: StoredEntry) -> memoryview:
    """The entry's body (a batch entry: the RecordBatch as the producer sent it), a view."""
    return rec.body_slice(entry.frame, 0)


def stored_time(entry: StoredEntry) -> int:
    """A plain record's timestamp as consumers see it (a Kafka record's CreateTime): its
    publisher's time, else the time the broker stored it. A batch entry's records carry
    their own timestamps in the batch; this is the time its producer stamped on the first."""
    born: int = _BORN_MS.unpack_from(entry.frame, _BORN_MS_OFFSET)[0]
    return born or entry.store_ms


def stored_tags(entry: StoredEntry) -> list[str]:
    """The entry's tags, what :meth:`core.log.TagFilter.matches` takes (after a mask hit)."""
    return rec.tags_slice(entry.frame, 0)


class StoredRecordReader:
    """Reads of partitions' stored entries, open only during one ``serve_stored_records``."""

    __slots__ = ("_open", "_store")

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._open = True

    def close(self) -> None:
        self._open = False

    def partition_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)`` of a partition."""
        return self._store.queue_bounds(topic, partition)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int,
        max_bytes: int | None = None,
    ) -> list[StoredEntry]:
        """The entries from ``offset`` on (at least one when there is one, KIP-74)."""
        if not self._open:
            raise RuntimeError("stored entries are read during serve_stored_records only")
        return self._store.read(
            topic, partition, offset, max_records=max_records, max_bytes=max_bytes
        )
