"""The index writer: the one place that writes per-queue index entries (RocketMQ's
``CommitLogDispatcher`` building the ConsumeQueue; the entries themselves are
:mod:`core.log.consumequeue`'s).

Every entry goes through :meth:`IndexWriter.add` (or :meth:`IndexWriter.add_run`, a run of plain
records of one queue): the append paths of :class:`~core.log.store.LogStore`, a transaction's
commit (``core/transactions/decisions.py``) and recovery, which replays each frame through
:meth:`IndexWriter.dispatch_frame`, the same dispatch the general append path takes. Each entry
written is counted (``entries``) and announced to the ``listeners``.

Dispatch rules: a record is indexed into each of its destinations (its own (topic, queue) when it
names none); a half message only into ``__half/0``; a delayed record only into ``__timers/0``; a
LINK indexes its targets into its destinations (each into its own when it names none), pointing
at the LINK itself when it carries headers; an indexed LINK (a transaction's commit) is indexed
in its own queue first.

The index files are derived data: not checksummed, rebuilt by recovery. Not thread-safe: the
event-loop thread of the one writer.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from core.log import names
from core.log import record as rec
from core.log.commitlog import CommitLog
from core.log.consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueue
from core.log.tags import tags_mask

# Called with (topic, queue, first offset) after each index entry is written.
IndexListener = Callable[[str, int, int], None]


class IndexWriter:
    """Writes the index entries of the frames in ``commitlog`` into ``queues`` (the store's
    open indexes, by (topic, queue); ``open_queue`` opens a missing one). ``entries`` counts
    the entries written."""

    def __init__(
        self,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        open_queue: Callable[[str, int], ConsumeQueue],
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self._open_queue = open_queue
        self.entries = 0
        self.listeners: list[IndexListener] = []

    def queue(self, topic: str, queue: int) -> ConsumeQueue:
        """The index of (topic, queue), created when it does not exist yet."""
        index = self.queues.get((topic, queue))
        if index is None:
            index = self.queues[(topic, queue)] = self._open_queue(topic, queue)
        return index

    # -- the entries -----------------------------------------------------------------------

    def add(
        self,
        topic: str,
        queue: int,
        index: ConsumeQueue,
        position: int,
        size: int,
        record_count: int,
        tag_mask: int,
        store_ms: int,
    ) -> int:
        """Write one entry into ``index`` (the index of (topic, queue)) for the frame at
        ``position``; returns the queue offset of its first record."""
        # ConsumeQueue.append, inlined for the common case (the cursor is inside the
        # preallocated stretch): a plain publish writes one entry, and a call more is a few
        # percent of its CPU. Same entry, same cursor fields.
        at = index.tail_at
        if at < index.tail_end:
            first = index.next_offset
            ENTRY.pack_into(
                index.tail_buf, at, position, size, record_count, tag_mask, store_ms, first
            )
            index.tail_at = at + ENTRY_SIZE
            index.next_entry += 1
            index.next_offset = first + record_count
        else:
            first = index.append(position, size, record_count, tag_mask, store_ms)
        self.entries += 1
        for listener in self.listeners:
            listener(topic, queue, first)
        return first

    def add_run(
        self,
        topic: str,
        queue: int,
        index: ConsumeQueue,
        positions: Sequence[int],
        sizes: Sequence[int],
        store_ms: int,
    ) -> int:
        """:meth:`add` for each of a run of plain records (record count 1, no tags) of one
        queue, written with one copy (ConsumeQueue.append_run); returns the first offset."""
        first = index.append_run(positions, sizes, store_ms)
        count = len(positions)
        self.entries += count
        if self.listeners:
            for offset in range(first, first + count):
                for listener in self.listeners:
                    listener(topic, queue, offset)
        return first

    def index(
        self,
        position: int,
        size: int,
        targets: Sequence[tuple[str, int]],
        tag_mask: int,
        record_count: int,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        """One entry per (topic, queue) of ``targets`` for the frame at ``position``."""
        offsets = []
        for topic, queue in targets:
            index = self.queues.get((topic, queue)) or self.queue(topic, queue)
            offset = self.add(topic, queue, index, position, size, record_count, tag_mask, store_ms)
            offsets.append((topic, queue, offset))
        return offsets

    # -- dispatch: which entries a frame gets ---------------------------------------------

    def dispatch(
        self,
        position: int,
        size: int,
        flags: int,
        targets: Sequence[tuple[str, int]] | None,
        tag_mask: int,
        record_count: int,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        """Write the index entries of the frame at ``position``. ``targets`` None: the frame
        names no destinations (a LINK: per link target)."""
        if flags & rec.FLAG_HALF:
            targets = ((names.HALF_TOPIC, 0),)
        elif flags & rec.FLAG_DELAYED:
            targets = ((names.TIMERS_TOPIC, 0),)
        elif flags & rec.FLAG_LINK:
            return self._dispatch_link(position, size, targets, store_ms)
        assert targets is not None
        return self.index(position, size, targets, tag_mask, record_count, store_ms)

    def dispatch_frame(self, position: int, size: int) -> None:
        """Index one verified frame again from its bytes (recovery)."""
        buf, start, _ = self.commitlog.read_frame(position)
        record = rec.decode_record(buf, start, position)
        self.dispatch(
            position,
            size,
            record.flags,
            record.destinations
            or (None if record.flags & rec.FLAG_LINK else record.index_targets()),
            tags_mask(record.tags) if record.tags else 0,
            record.record_count,
            record.store_ms,
        )

    def _dispatch_link(
        self,
        position: int,
        size: int,
        destinations: Sequence[tuple[str, int]] | None,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        buf, start = self.commitlog.frame_unchecked(position)
        frame = buf[start : start + size]
        fields = rec.HEADER.unpack_from(frame, 0)
        offsets: list[tuple[str, int, int]] = []
        if rec.FLAGS.unpack_from(frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK_INDEXED:
            # A decision (a transaction's commit): the LINK is a record of its own queue too,
            # indexed first (the decision, then what it makes visible, as one dispatch). Its
            # headers are its own, so the targets are indexed as themselves.
            own_tags = rec.tags_slice(frame, 0)
            own_topic = bytes(frame[rec.HEADER_SIZE : rec.HEADER_SIZE + fields[10]]).decode()
            offsets += self.index(
                position,
                size,
                ((own_topic, fields[8]),),
                tags_mask(own_tags) if own_tags else 0,
                1,
                store_ms,
            )
            has_headers = False
        else:
            has_headers = fields[13] > 0
        offsets += self.link_targets(
            position,
            size,
            rec.decode_link_body(rec.body_slice(frame, 0)),
            destinations,
            has_headers,
            store_ms,
        )
        return offsets

    def link_targets(
        self,
        position: int,
        size: int,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]] | None,
        has_headers: bool,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        """Index each ``(position, size)`` target of the LINK at ``position`` into
        ``destinations``, or its own, reading what an entry needs from the target's frame;
        ``has_headers``: the entries point at the LINK itself."""
        offsets: list[tuple[str, int, int]] = []
        for target_position, target_size in targets:
            tbuf, tstart = self.commitlog.frame_unchecked(target_position)
            frame_size, record_count, tags, own_targets = rec.index_fields(tbuf, tstart)
            if rec.FLAGS.unpack_from(tbuf, tstart + rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
                # Linking a LINK (a delayed retry firing): tags and count are its target's.
                body = rec.body_slice(tbuf[tstart : tstart + frame_size], 0)
                inner_position = rec.decode_link_body(body)[0][0]
                ibuf, istart = self.commitlog.frame_unchecked(inner_position)
                _, record_count, tags, _ = rec.index_fields(ibuf, istart)
            mask = tags_mask(tags) if tags else 0
            where = destinations or own_targets
            if has_headers:
                # The entry points at the LINK so readers see its headers (x-death and such).
                offsets += self.index(position, size, where, mask, record_count, store_ms)
            else:
                offsets += self.index(
                    target_position, target_size, where, mask, record_count, store_ms
                )
        return offsets

    def link_known_targets(
        self,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]],
        index_info: Sequence[tuple[int, int]],
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        """The entries :meth:`link_targets` writes for a LINK without headers into
        ``destinations``, in the same order, from each target's ``(tag mask, record count)``
        as the caller knows them (no read of the targets' frames)."""
        queues = [(topic, queue, self.queue(topic, queue)) for topic, queue in destinations]
        add = self.add
        offsets: list[tuple[str, int, int]] = []
        for (target_position, target_size), (mask, count) in zip(targets, index_info, strict=True):
            for topic, queue, index in queues:
                offset = add(
                    topic, queue, index, target_position, target_size, count, mask, store_ms
                )
                offsets.append((topic, queue, offset))
        return offsets

    # -- dropping a topic's indexes -------------------------------------------------------

    def drop(self, topic: str, data_dir: Path) -> list[int]:
        """Close and delete every index of ``topic``; returns the queue numbers dropped."""
        dropped = sorted(queue for name, queue in self.queues if name == topic)
        for queue in dropped:
            index = self.queues.pop((topic, queue))
            index.close()
            shutil.rmtree(index.directory, ignore_errors=True)
        if dropped:
            with contextlib.suppress(OSError):
                names.queue_dir(data_dir, topic, 0).parent.rmdir()
        return dropped
