"""The read API of the log: by (queue, offset), by time, with a tag filter; and commit-log scans.

:class:`LogReader` opens a data directory read-only, so another process (Spark, ``braid log``)
can read the files of a running broker or a stopped one; :class:`~core.log.store.LogStore`
extends it with the writer. Every frame read is CRC-checked: a corrupt record raises
:class:`~core.log.record.CorruptRecordError` and is never returned. In a cluster's shard, what
lies past a segment's seal (a fenced owner's writes, :mod:`core.log.fence`) is never returned.
Not thread-safe for writes; concurrent reads from several threads are fine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Self

from crc32c import crc32c

from core.log import names
from core.log import record as rec
from core.log.commitlog import CommitLog
from core.log.config import LogMeta
from core.log.consumequeue import ConsumeQueue, IndexEntry
from core.log.fence import Seals
from core.log.openfiles import DEFAULT_MAX_OPEN_FILES, OpenFiles
from core.log.tags import TagFilter

log = logging.getLogger(__name__)

# A record moved (dead-lettered, retried) more often than this is refused as corrupt.
MAX_LINK_DEPTH = 64
# How many index entries one read looks at, at most, when a tag filter skips entries.
MAX_ENTRIES_SCANNED_PER_READ = 65_536
_NO_BUFFER = memoryview(b"")
_new_tuple = tuple.__new__


class QueueRecord(tuple):  # type: ignore[type-arg]
    """One entry of a queue read back: where it is, and its frame as a zero-copy view.

    A tuple subclass (index entry fields, topic, queue, then where the data frame lies: a
    mapping, the frame's start and end in it, and the LINK headers) with read-only attributes,
    like a NamedTuple: a read builds one per record, and building it from the index entry tuple
    in one C call measured half the cost of setting ten slots in __init__. ``frame`` and ``body``
    are sliced when asked for (a read no longer makes a memoryview per record: measured 20% of
    a read, its share of garbage-collector passes included). Compared and hashed by identity, as
    the slotted class it replaces was."""

    __slots__ = ()

    if TYPE_CHECKING:
        position: int
        size: int
        record_count: int
        tag_mask: int
        store_ms: int
        offset: int
        topic: str
        queue: int
        link_headers: list[tuple[str, bytes]] | None
    else:
        position = property(itemgetter(0))
        size = property(itemgetter(1))
        record_count = property(itemgetter(2))
        tag_mask = property(itemgetter(3))
        store_ms = property(itemgetter(4))
        offset = property(itemgetter(5))
        topic = property(itemgetter(6))
        queue = property(itemgetter(7))
        link_headers = property(itemgetter(11))

    def __new__(
        cls,
        topic: str,
        queue: int,
        entry: IndexEntry | tuple[int, int, int, int, int, int],
        frame: memoryview,
        link_headers: list[tuple[str, bytes]] | None = None,
    ) -> QueueRecord:
        return _new_tuple(cls, (*entry, topic, queue, frame, 0, len(frame), link_headers))

    __eq__ = object.__eq__  # type: ignore[assignment]
    __ne__ = object.__ne__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    @property
    def frame(self) -> memoryview:
        """The data frame (a LINK entry is followed to its target), a new view at each call."""
        buf: memoryview = self[8]
        return buf[self[9] : self[10]]

    @property
    def next_offset(self) -> int:
        return self.offset + self.record_count

    def record(self) -> rec.Record:
        record = rec.decode_record(self[8], self[9], self.position)
        if self.link_headers:
            overridden = {name for name, _ in self.link_headers}
            record.headers[:] = [h for h in record.headers if h[0] not in overridden]
            record.headers.extend(self.link_headers)
        return record

    @property
    def body(self) -> memoryview:
        return rec.body_slice(self[8], self[9])

    def batch_with_base_offset(self) -> bytes:
        """A stored Kafka RecordBatch with its base offset (first 8 bytes, big-endian, outside the
        batch CRC) set to this entry's queue offset; every other byte as stored."""
        body = self.body
        return self.offset.to_bytes(8, "big", signed=True) + bytes(body[8:])

    def __repr__(self) -> str:
        return f"QueueRecord({self.topic}/{self.queue}@{self.offset} pos={self.position})"


class LogReader:
    """Read-only view of a data directory."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        _writable: bool = False,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    ) -> None:
        """``max_open_files``: the most index files mapped at once (each mapping holds a
        descriptor; see core/log/openfiles.py)."""
        self.data_dir = Path(data_dir)
        self.open_files = OpenFiles(max_open_files)
        self.corrupt_reads = 0  # damaged records met by queue reads (read)
        meta = LogMeta.load(self.data_dir)
        if meta is None:
            raise FileNotFoundError(f"{self.data_dir} holds no BraidMQ log ({names.LOG_META_FILE})")
        self.meta = meta
        self.writable = _writable
        self.commitlog = CommitLog(
            self.data_dir / names.COMMITLOG_DIR, meta.segment_size, writable=_writable
        )
        # The seals of a cluster shard's epoch files (core.log.fence): bytes past a segment's
        # seal are a fenced owner's, and no read returns them.
        self._seals = Seals(self.data_dir)
        self.commitlog.seals = self._seals.refresh()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._index_root = str(self.data_dir / names.INDEX_DIR)  # shared by every queue
        self._discover_queues()

    # -- catalogue -------------------------------------------------------------------------

    def _discover_queues(self) -> None:
        index_root = self.data_dir / names.INDEX_DIR
        if not index_root.exists():
            return
        for topic_dir in index_root.iterdir():
            if not topic_dir.is_dir():
                continue
            topic = names.decode_topic_dir(topic_dir.name)
            for queue_dir in topic_dir.iterdir():
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    key = (topic, int(queue_dir.name))
                    if key not in self._queues:
                        self._queues[key] = self._open_queue(*key)

    def _open_queue(self, topic: str, queue: int) -> ConsumeQueue:
        return ConsumeQueue(
            self._index_root,
            topic,
            queue,
            self.meta.index_entries_per_file,
            writable=self.writable,
            open_files=self.open_files,
        )

    def refresh(self) -> None:
        """Pick up what a running broker appended since this reader looked (read-only readers)."""
        if self.writable:
            return
        self.commitlog.seals = self._seals.refresh()
        self.commitlog.refresh()
        self._discover_queues()
        for queue in self._queues.values():
            queue.refresh()

    def queues(self, *, include_system: bool = False) -> list[tuple[str, int]]:
        return sorted(
            key for key in self._queues if include_system or not names.is_system_topic(key[0])
        )

    def topics(self, *, include_system: bool = False) -> list[str]:
        return sorted({topic for topic, _ in self.queues(include_system=include_system)})

    def queue_index(self, topic: str, queue: int) -> ConsumeQueue | None:
        found = self._queues.get((topic, queue))
        if (
            found is None
            and not self.writable
            and names.queue_dir(self.data_dir, topic, queue).exists()
        ):
            found = self._queues[(topic, queue)] = self._open_queue(topic, queue)
        return found

    def queue_bounds(self, topic: str, queue: int) -> tuple[int, int]:
        """``(start offset, next offset)`` of a queue; ``(0, 0)`` for one never written."""
        index = self.queue_index(topic, queue)
        if index is None:
            return 0, 0
        self._skip_deleted_head(index)
        return index.start_offset, index.next_offset

    def _skip_deleted_head(self, index: ConsumeQueue) -> None:
        """Advance past entries whose commit-log segment retention has deleted."""
        log_start = self.commitlog.start_position
        while index.start_entry < index.next_entry:
            if index.entry(index.start_entry).position >= log_start:
                break
            index.start_entry += 1

    # -- queue reads -----------------------------------------------------------------------

    def read(
        self,
        topic: str,
        queue: int,
        offset: int,
        *,
        max_records: int = 1000,
        max_bytes: int | None = None,
        tag_filter: TagFilter | None = None,
        on_corrupt: Callable[[rec.CorruptRecordError], None] | None = None,
    ) -> list[QueueRecord]:
        """Entries from ``offset`` on (an entry holding ``offset`` inside a batch included).

        A damaged record (issue 21 item 6) ends the read: the records before it are returned,
        and a read that starts at it raises :class:`~core.log.record.CorruptRecordError` with
        its queue offsets (``offset``, ``next_offset``), so a Kafka fetch serves every record up
        to the damage and answers CORRUPT_MESSAGE from there. With ``on_corrupt``, the damaged
        record is handed to it instead and the read goes on past it (an ack queue skips it).

        ``max_records`` counts records (a batch counts as its records, and at least one entry is
        returned). With ``tag_filter``, entries whose tag mask cannot match are skipped without
        touching the commit log; hash hits are confirmed against the record's tags. Entries
        pointing at a LINK (a moved record) are returned as the record it points at, with the
        LINK's headers laid over its own, except in system topics, read as stored.
        """
        index = self.queue_index(topic, queue)
        if index is None:
            return []
        if not self.writable and offset >= index.next_offset:
            index.refresh()
        self._skip_deleted_head(index)
        entry_number = max(index.entry_for_offset(offset), index.start_entry)
        out: list[QueueRecord] = []
        records = 0
        total_bytes = 0
        scanned = 0
        commitlog = self.commitlog
        # System queues (``__timers`` holds delayed LINKs) are read as stored.
        link_flag = 0 if names.is_system_topic(topic) else rec.FLAG_LINK
        masks = tag_filter.masks if tag_filter is not None else None
        # CommitLog.read_frame, inlined (this loop runs once per record): the segment is looked
        # up once per run of entries inside it, a frame's prefix is unpacked once and its CRC
        # checked on a slice of the mapping, except for frames this process appended itself
        # (CommitLog.trust_from). Anything unusual goes to read_frame, which
        # raises (and logs) exactly as before.
        trusted_start = commitlog.trusted_start
        trusted_end = commitlog.write_position
        seals = commitlog.seals
        unpack_prefix = rec.PREFIX.unpack_from
        record_magic = rec.RECORD_MAGIC
        header_size = rec.HEADER_SIZE
        crc_start = rec.CRC_START
        flags_at = rec.FLAGS_OFFSET
        base = 0
        buf = _NO_BUFFER
        limit = 0  # bytes of ``buf``: positions [base, base + limit) are in it
        damage: rec.CorruptRecordError | None = None
        while (
            damage is None
            and entry_number < index.next_entry
            and scanned < MAX_ENTRIES_SCANNED_PER_READ
        ):
            count = min(1024, max_records - records + 1, index.next_entry - entry_number)
            # Unpacked as the loop goes, not into a list first: each entry tuple is freed as
            # soon as its record is built, so fewer objects live at once for the garbage
            # collector to walk (measured: its passes were 15-20% of a read).
            batch = index.iter_entries(entry_number, count)
            entry_number += count
            scanned += count
            for entry in batch:
                # entry: (position, size, record_count, tag_mask, store_ms, first_offset)
                if masks is not None:
                    # TagFilter.may_match, inlined.
                    entry_mask = entry[3]
                    for mask in masks:
                        if entry_mask & mask == mask:
                            break
                    else:
                        continue
                position = entry[0]
                start = position - base
                if not 0 <= start < limit:
                    segment = commitlog.segment_at(position)
                    if segment is None:
                        continue  # deleted by retention while we read
                    base = segment.base
                    buf = segment.view
                    limit = len(buf)
                    start = position - base
                    if seals and base in seals:
                        # Entries past the seal point at a fenced owner's bytes (core.log.fence).
                        limit = min(limit, seals[base] - base)
                        if start >= limit:
                            continue
                if trusted_start <= position < trusted_end:
                    size = entry[1]
                else:
                    size, magic, crc = (
                        unpack_prefix(buf, start) if start <= limit - crc_start else (0, 0, 0)
                    )
                    if (
                        magic != record_magic
                        or size < header_size
                        or start + size > limit
                        or crc32c(buf[start + crc_start : start + size]) != crc
                    ):
                        try:
                            _, _, size = commitlog.read_frame(position)  # raises if corrupt
                        except rec.CorruptRecordError as error:
                            damage = self._damaged(error, entry, on_corrupt)
                            if damage is None:
                                continue  # on_corrupt took it: go on past it
                        if damage is not None:
                            break  # the read ends here (below)
                # The QueueRecord's fields: tuple concatenation measured faster than
                # star-unpacking or a call to QueueRecord here.
                fields: tuple[object, ...]
                if buf[start + flags_at] & link_flag:  # the low byte of flags holds FLAG_LINK
                    try:
                        frame, link_headers = self._follow_link(buf[start : start + size], position)
                    except rec.CorruptRecordError as error:  # the record a LINK points at
                        damage = self._damaged(error, entry, on_corrupt)
                        if damage is None:
                            continue
                    if damage is not None:
                        break
                    if tag_filter is not None and not tag_filter.matches(rec.tags_slice(frame, 0)):
                        continue
                    fields = entry + (topic, queue, frame, 0, len(frame), link_headers)  # noqa: RUF005
                else:
                    if tag_filter is not None and not tag_filter.matches(
                        rec.tags_slice(buf, start)
                    ):
                        continue
                    fields = entry + (topic, queue, buf, start, start + size, None)  # noqa: RUF005
                if max_bytes is not None and out and total_bytes + size > max_bytes:
                    return out
                out.append(_new_tuple(QueueRecord, fields))
                records += entry[2]
                total_bytes += size
                if records >= max_records:
                    return out
        if damage is None or out:
            return out
        # Nothing before the damage: raise it, leaving no reference cycle either (see
        # _damaged): the views go first, and the name once raised.
        batch = iter(())
        buf = _NO_BUFFER
        try:
            raise damage
        finally:
            del damage

    def _damaged(
        self,
        error: rec.CorruptRecordError,
        entry: tuple[int, int, int, int, int, int],
        on_corrupt: Callable[[rec.CorruptRecordError], None] | None,
    ) -> rec.CorruptRecordError | None:
        """A damaged record met by :meth:`read` at index ``entry``: None to go on past it
        (``on_corrupt`` took it), else the error that ends the read."""
        error.offset = entry[5]
        error.next_offset = entry[5] + entry[2]
        # Kept by read() past its except block: without its traceback, so that no reference
        # cycle (read's frame -> error -> traceback -> read's frame) keeps the frame's views
        # of the mappings for the garbage collector, which CPython 3.11 crashes clearing a
        # memoryview with an export (a run of index entries being unpacked).
        error.__traceback__ = None
        error.__context__ = None
        self.corrupt_reads += 1
        if on_corrupt is not None:
            on_corrupt(error)
            return None
        return error

    def _follow_link(
        self, frame: memoryview, position: int
    ) -> tuple[memoryview, list[tuple[str, bytes]]]:
        """The data frame behind a LINK entry, and the LINK headers to lay over its own (a
        record dead-lettered twice is a LINK to a LINK: the outer headers win)."""
        headers: dict[str, bytes] = {}
        for _ in range(MAX_LINK_DEPTH):
            link = rec.decode_record(frame, 0, position)
            for name, value in link.headers:
                headers.setdefault(name, value)
            ((position, _size),) = rec.decode_link_body(link.body or b"")
            buf, start, size = self.commitlog.read_frame(position)
            frame = buf[start : start + size]
            if not rec.FLAGS.unpack_from(frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
                return frame, list(headers.items())
        raise rec.CorruptRecordError(position, "LINK chain too deep")

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms``; the next offset if none."""
        index = self.queue_index(topic, queue)
        if index is None:
            return 0
        entry_number = index.entry_for_time(timestamp_ms)
        if entry_number >= index.next_entry:
            return index.next_offset
        return index.entry(max(entry_number, index.start_entry)).first_offset

    def read_at(self, position: int) -> rec.Record:
        """Decode the record at a commit-log position (CRC-checked)."""
        buf, start, _size = self.commitlog.read_frame(position)
        return rec.decode_record(buf, start, position)

    # -- commit-log scans ------------------------------------------------------------------

    def scan(self, start: int | None = None) -> Iterator[rec.Record]:
        """Every record frame in commit-log order, including ones no queue indexes yet
        (half messages, timers). A corrupt frame raises CorruptRecordError."""
        position = self.commitlog.start_position if start is None else start
        for frame_position, _size, _magic in self.commitlog.scan(position):
            yield self.read_at(frame_position)

    def verify(self) -> list[rec.CorruptRecordError]:
        """Check every frame of every segment; returns the corruptions found (one per segment,
        since framing after a bad frame cannot be trusted)."""
        errors: list[rec.CorruptRecordError] = []
        for number in self.commitlog.segment_numbers():
            position = number * self.commitlog.segment_size
            try:
                for _ in self.commitlog.scan(position, position + self.commitlog.segment_size):
                    pass
            except rec.CorruptRecordError as error:
                errors.append(error)
        return errors

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()
        self.commitlog.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
