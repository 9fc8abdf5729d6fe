"""LogStore: the writer side of the log engine (CommitLog + per-queue indexes).

An append writes one frame to the CommitLog, then the dispatcher writes one index entry per
destination queue (store once, index many). Half messages are indexed only in ``__half`` and
delayed ones only in ``__timers`` until a LINK record makes them visible where they belong.

Durability: in ``sync`` mode :meth:`wait_durable` resolves after the fdatasync that covers the
append; concurrent waiters share one fdatasync (group commit). In ``async`` mode a background task
flushes every ``flush_interval_ms``. Recovery is in :mod:`core.log.recovery`.

Thread-safety: appends and reads from the event-loop thread; fdatasync runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate, repeat
from typing import NamedTuple

from crc32c import crc32c

from core.log import names
from core.log import record as rec
from core.log.commitlog import WRITEBACK_BYTES
from core.log.config import DURABILITY_SYNC, LogConfig, LogMeta, write_atomically
from core.log.consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueue
from core.log.reader import LogReader
from core.log.segment import pwrite_all, start_writeback
from core.log.tags import tags_mask

log = logging.getLogger(__name__)

# Called with (segment start position, segment end position): True if a record in that range is
# still owed to a consumer, a timer or a transaction, which blocks deleting the segment.
RetentionGuard = Callable[[int, int], bool]
# Called with (topic, queue, first offset) after each index entry is written.
IndexListener = Callable[[str, int, int], None]


class LinkDecision(NamedTuple):
    """The record fields of a LINK that is a decision too (``LogStore.link(decision=...)``).
    ``headers`` may arrive encoded (:func:`core.log.record.encode_headers`)."""

    key: bytes
    client: str
    tags: Sequence[str]
    headers: rec.Headers | bytes


class TargetIndex(NamedTuple):
    """What a LINK's dispatch reads from one target's frame to index it, when the caller knows
    it already (it appended the target): tag mask, record count, and the target's own
    destinations (its ``destinations``, or its own (topic, queue))."""

    tag_mask: int
    record_count: int
    destinations: Sequence[tuple[str, int]]


class Appended(NamedTuple):
    position: int
    end: int  # position after the frame: wait_durable(end) makes this append durable
    offsets: list[tuple[str, int, int]]  # (topic, queue, first offset) per index entry written


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _encoded_headers(headers: rec.Headers | bytes) -> bytes:
    if type(headers) is bytes:
        return headers
    return rec.encode_headers(headers) if headers else b""  # type: ignore[arg-type]


_time_ns = time.time_ns
# append_many batches of at least this many bytes are written with pwrite, not the mapping.
_STAGE_BYTES = 32 * 1024


_new_tuple = tuple.__new__
_HALF_TOPIC = names.HALF_TOPIC
_TRANSACTIONS_TOPIC = names.TRANSACTIONS_TOPIC
_TRANSACTIONS_TOPIC_BYTES = _TRANSACTIONS_TOPIC.encode()
# One target of a LINK body (see core.log.record.encode_link_body).
_LINK_TARGET = struct.Struct("<QI")
# Header bytes [12, 72) of a frame: everything after the prefix (total_size, magic, crc32c).
_HEAD_TAIL = struct.Struct("<" + rec.HEADER.format[4:])


_frame_structs: dict[tuple[int, int, int, int], struct.Struct] = {}


def _frame_struct(
    head_len: int, key_len: int, body_len: int, headers_len: int = -1
) -> struct.Struct:
    """A whole frame as one Struct: prefix, head, key, then headers when ``headers_len`` is not
    negative, and body (all but the prefix as bytes)."""
    layout = (head_len, key_len, body_len, headers_len)
    found = _frame_structs.get(layout)
    if found is None:
        if len(_frame_structs) >= 4096:
            _frame_structs.clear()  # body lengths vary without bound; keep the cache small
        headers = f"{headers_len}s" if headers_len >= 0 else ""
        found = _frame_structs[layout] = struct.Struct(
            f"{rec.PREFIX.format}{head_len}s{key_len}s{headers}{body_len}s"
        )
    return found


def _decision_head(
    layout: tuple[int, int, int, int, int, int, int],
) -> tuple[tuple[int, int, int, int, int, int, int], bytes, int, struct.Struct]:
    """The head of a decision LINK frame (see LogStore.append_decision) for ``layout``:
    (store_ms, then the lengths of key, headers, tags, client, destinations and body), its
    CRC32C, and the Struct packing the whole frame."""
    store_ms, key_len, headers_len, tags_len, client_len, dests_len, body_len = layout
    head = (
        _HEAD_TAIL.pack(
            rec.FLAG_LINK | rec.FLAG_LINK_INDEXED,
            rec.PROTOCOL_INTERNAL,
            store_ms,
            store_ms,  # born_ms
            0,  # deliver_at_ms
            0,  # queue
            1,  # record_count
            len(_TRANSACTIONS_TOPIC_BYTES),
            0,  # subject
            key_len,
            headers_len,
            tags_len,
            client_len,
            0,  # address
            dests_len,
            body_len,
        )
        + _TRANSACTIONS_TOPIC_BYTES
    )
    # The fields after the head go in as one string (joined, then checksummed in one call).
    rest_len = key_len + headers_len + tags_len + client_len + dests_len + body_len
    frame = _decision_structs.get(rest_len)
    if frame is None:
        if len(_decision_structs) >= 4096:
            _decision_structs.clear()  # id and group lengths vary without bound
        frame = _decision_structs[rest_len] = struct.Struct(
            f"{rec.PREFIX.format}{len(head)}s{rest_len}s"
        )
    return layout, head, crc32c(head), frame


# Decision frame Structs by the length of what follows the head (the head's length is fixed).
_decision_structs: dict[int, struct.Struct] = {}


class _QueueWriter:
    """Hot-path state of one (topic, queue) for plain records (no headers, tags, routing fields):
    its index, and the encoded head of a frame (header bytes after the prefix, then the topic)
    for the last (store_ms, born_ms, protocol, key length, body length) seen, with the head's
    CRC32C. Appends within one millisecond share the head, so a frame costs one crc32c over the
    key and body continued from the head's CRC and one pack_into of the whole frame (``frame``:
    prefix, head, key, body), not a 19-field pack, three copies and a CRC over the frame as
    mapped."""

    __slots__ = (
        "body_len",
        "born_ms",
        "crc",
        "flags",
        "frame",
        "frame_head",
        "head",
        "head_end",
        "headers_len",
        "index",
        "key_len",
        "protocol",
        "queue",
        "store_ms",
        "topic_bytes",
    )

    def __init__(self, queue: int, topic_bytes: bytes, index: ConsumeQueue, flags: int = 0) -> None:
        self.queue = queue
        self.topic_bytes = topic_bytes
        self.index = index
        # A writer of half messages (FLAG_HALF, encoded headers; ``index`` is __half/0) sets
        # both; a plain one keeps 0 and -1 (its frames have no headers field to pack).
        self.flags = flags
        self.headers_len = -1
        self.head = b""
        self.crc = 0
        self.store_ms = self.born_ms = self.protocol = self.key_len = self.body_len = -1
        # Where the key starts in a frame.
        self.head_end = rec.CRC_START + _HEAD_TAIL.size + len(topic_bytes)
        # Prefix (total_size, magic, crc32c) and head in one pack_into, once the CRC is known.
        self.frame_head = struct.Struct(f"{rec.PREFIX.format}{self.head_end - rec.CRC_START}s")
        self.frame = self.frame_head

    def refresh(
        self,
        store_ms: int,
        born_ms: int,
        protocol: int,
        key_len: int,
        body_len: int,
        headers_len: int = -1,
    ) -> None:
        """Make the head fit a frame of this millisecond and these fields (LogStore.append
        inlines this test for a plain record, its hottest path)."""
        if (
            store_ms != self.store_ms
            or body_len != self.body_len
            or key_len != self.key_len
            or headers_len != self.headers_len
            or born_ms != self.born_ms
            or protocol != self.protocol
        ):
            self.set_head(store_ms, born_ms, protocol, key_len, body_len, headers_len)

    def set_head(
        self,
        store_ms: int,
        born_ms: int,
        protocol: int,
        key_len: int,
        body_len: int,
        headers_len: int = -1,
    ) -> None:
        head = (
            _HEAD_TAIL.pack(
                self.flags,
                protocol,
                store_ms,
                born_ms or store_ms,
                0,  # deliver_at_ms
                self.queue,
                1,  # record_count
                len(self.topic_bytes),
                0,  # subject
                key_len,
                max(headers_len, 0),
                0,  # tags
                0,  # client
                0,  # address
                0,  # destinations
                body_len,
            )
            + self.topic_bytes
        )
        self.head = head
        self.crc = crc32c(head)
        self.frame = _frame_struct(len(head), key_len, body_len, headers_len)
        self.headers_len = headers_len
        self.store_ms = store_ms
        self.born_ms = born_ms
        self.protocol = protocol
        self.key_len = key_len
        self.body_len = body_len


class LogStore(LogReader):
    """Open (and recover) a data directory for writing. Use one per directory."""

    def __init__(self, config: LogConfig, *, check_own_writes: bool = False) -> None:
        """``check_own_writes`` (or ``config.check_own_writes``): CRC-check on reads also the
        frames this store appended itself (by default they are trusted; see
        CommitLog.trust_from and docs/storage.md)."""
        self.config = config
        self.check_own_writes = check_own_writes or config.check_own_writes
        data_dir = config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        meta = LogMeta.load(data_dir)
        if meta is None:
            meta = LogMeta(config.segment_size, config.index_entries_per_file)
            meta.store(data_dir)
        elif meta.segment_size != config.segment_size:
            log.warning(
                "%s was created with segment size %d; keeping it", data_dir, meta.segment_size
            )
        super().__init__(data_dir, _writable=True)
        self._encoded_topics: dict[str, bytes] = {}
        # Decision LINK tags -> (encoded, index mask): a commit's tags never change.
        self._decision_tags: dict[Sequence[str], tuple[bytes, int]] = {}
        self._writers: dict[tuple[str, int], _QueueWriter] = {}
        # The last decision LINK head (see append_decision).
        self._decision_head: tuple[tuple[int, ...], bytes, int, struct.Struct] | None = None
        self._half_writers: dict[tuple[str, int], _QueueWriter] = {}
        self._staging = memoryview(bytearray())  # see _append_many_in_place
        self.index_listeners: list[IndexListener] = []
        self.retention_guards: list[RetentionGuard] = []
        # Called before each group commit picks the position it syncs to: appends a caller
        # holds back until the end of a loop turn (coalesced transaction commits) get written
        # first, so they share that fsync.
        self.before_sync: list[Callable[[], None]] = []
        self.metrics: dict[str, int] = {
            "appends": 0,
            "appended_bytes": 0,
            "index_entries": 0,
            "fsyncs": 0,
            "checkpoints": 0,
            "segments_deleted": 0,
            "recovered_records": 0,
            "truncated_bytes": 0,
        }
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._group_commit_task: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="braid-fsync")
        self._last_checkpoint: tuple[int, dict[str, int]] | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_seq = 0
        self._checkpoint_written_seq = 0
        self.closed = False
        from core.log.recovery import recover

        self.recovery = recover(self)

    # -- appending -------------------------------------------------------------------------

    def _topic_bytes(self, topic: str) -> bytes:
        encoded = self._encoded_topics.get(topic)
        if encoded is None:
            encoded = self._encoded_topics[topic] = topic.encode()
            if len(encoded) > rec.MAX_TOPIC_BYTES:
                raise ValueError("topic name too long")
        return encoded

    def append(
        self,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        key: bytes | None = b"",
        headers: rec.Headers | bytes = (),
        tags: Sequence[str] = (),
        subject: str = "",
        client: str = "",
        address: str = "",
        destinations: Sequence[tuple[str, int]] | None = None,
        protocol: int = rec.PROTOCOL_INTERNAL,
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        flags: int = 0,
        record_count: int = 1,
    ) -> Appended:
        """Append one record and index it. Not yet durable: await :meth:`wait_durable`.
        ``headers`` may arrive encoded (:func:`core.log.record.encode_headers`): a caller that
        adds the same headers to many records encodes them once."""
        if (
            body is not None
            and key is not None
            and record_count == 1
            and not (headers or tags or subject or client or address or destinations)
            and not (flags or deliver_at_ms)
        ):
            # The common record, encoded straight into the mapping and indexed inline: this
            # path is most of the broker's publish CPU, so it avoids calls and repeated lookups
            # (see _QueueWriter).
            writer = self._writers.get((topic, queue))
            if writer is None:
                writer = self._writer(topic, queue)
            store_ms = _time_ns() // 1_000_000
            key_len = len(key)
            body_len = len(body)
            if (
                store_ms != writer.store_ms
                or body_len != writer.body_len
                or key_len != writer.key_len
                or born_ms != writer.born_ms
                or protocol != writer.protocol
            ):
                writer.set_head(store_ms, born_ms, protocol, key_len, body_len)
            head_end = writer.head_end
            total = head_end + key_len + body_len
            commitlog = self.commitlog
            position = commitlog.write_position
            start = position - commitlog.active_base
            room = commitlog.active_end - start - total
            # It fits the active stretch if it ends exactly at its end or leaves room for a
            # BLANK prefix; otherwise activate() checks the segment, preallocates or says roll.
            if room >= rec.PREFIX.size or room == 0 or commitlog.activate(total):
                start = position - commitlog.active_base
                buf = commitlog.active_buf
                assert buf is not None
                crc = crc32c(key, writer.crc) if key_len else writer.crc
                crc = crc32c(body, crc)
                if type(body) is bytes and type(key) is bytes:
                    writer.frame.pack_into(
                        buf, start, total, rec.RECORD_MAGIC, crc, writer.head, key, body
                    )
                else:  # struct packs bytes only: a memoryview body is copied on its own
                    head_at = start + head_end
                    buf[head_at : head_at + key_len] = key
                    buf[head_at + key_len : start + total] = body
                    writer.frame_head.pack_into(
                        buf, start, total, rec.RECORD_MAGIC, crc, writer.head
                    )
                commitlog.write_position = position + total
                # ConsumeQueue.append, inlined (same entry, same cursor fields).
                index = writer.index
                at = index.tail_at
                if at < index.tail_end:
                    first = index.next_offset
                    ENTRY.pack_into(index.tail_buf, at, position, total, 1, 0, store_ms, first)
                    index.tail_at = at + ENTRY_SIZE
                    index.next_entry += 1
                    index.next_offset = first + 1
                else:
                    first = index.append(position, total, 1, 0, store_ms)
                metrics = self.metrics
                metrics["appends"] += 1
                metrics["appended_bytes"] += total
                metrics["index_entries"] += 1
                if self.index_listeners:
                    for listener in self.index_listeners:
                        listener(topic, queue, first)
                return _new_tuple(Appended, (position, position + total, [(topic, queue, first)]))
        if (
            flags == rec.FLAG_HALF
            and type(headers) is bytes
            and type(body) is bytes
            and type(key) is bytes
            and record_count == 1
            and not (tags or subject or client or address or destinations or deliver_at_ms)
        ):
            appended = self.append_half(topic, queue, body, key, headers, protocol, born_ms)
            if appended is not None:
                return appended
        store_ms = now_ms()
        if deliver_at_ms > store_ms:
            flags |= rec.FLAG_DELAYED
        head, body_part = rec.encode_record_parts(
            self._topic_bytes(topic),
            queue,
            body,
            store_ms=store_ms,
            key=key,
            headers=_encoded_headers(headers),
            tags=rec.encode_tags(tags) if tags else b"",
            subject=subject.encode() if subject else b"",
            client=client.encode() if client else b"",
            address=address.encode() if address else b"",
            destinations=rec.encode_destinations(destinations) if destinations else b"",
            flags=flags,
            protocol=protocol,
            born_ms=born_ms,
            deliver_at_ms=deliver_at_ms,
            record_count=record_count,
        )
        position = self.commitlog.append_parts(head, body_part)
        size = len(head) + len(body_part)
        self.metrics["appends"] += 1
        self.metrics["appended_bytes"] += size
        targets = destinations or (None if flags & rec.FLAG_LINK else ((topic, queue),))
        offsets = self._dispatch(
            position, size, flags, targets, tags_mask(tags) if tags else 0, record_count, store_ms
        )
        return Appended(position, position + size, offsets)

    def append_half(
        self,
        topic: str,
        queue: int,
        body: bytes,
        key: bytes,
        headers: bytes,
        protocol: int = rec.PROTOCOL_INTERNAL,
        born_ms: int = 0,
    ) -> Appended | None:
        """``append(topic, queue, body, key=key, headers=headers, flags=FLAG_HALF, ...)`` for a
        half message with encoded headers and no other fields (a transaction's hot path, see
        core.transactions): encoded straight into the mapping like a plain record, indexed in
        __half/0. None when it would roll the segment: then call :meth:`append`, which handles
        segment ends."""
        writer = self._half_writers.get((topic, queue))
        if writer is None:
            writer = self._half_writers[(topic, queue)] = _QueueWriter(
                queue,
                self._topic_bytes(topic),
                self._queue_for_write(names.HALF_TOPIC, 0),
                rec.FLAG_HALF,
            )
        store_ms = _time_ns() // 1_000_000
        key_len = len(key)
        headers_len = len(headers)
        body_len = len(body)
        writer.refresh(store_ms, born_ms, protocol, key_len, body_len, headers_len)
        total = writer.head_end + key_len + headers_len + body_len
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - total
        if not (room >= rec.PREFIX.size or room == 0 or commitlog.activate(total)):
            return None
        buf = commitlog.active_buf
        assert buf is not None
        crc = crc32c(key, writer.crc) if key_len else writer.crc
        crc = crc32c(body, crc32c(headers, crc))
        writer.frame.pack_into(
            buf,
            position - commitlog.active_base,
            total,
            rec.RECORD_MAGIC,
            crc,
            writer.head,
            key,
            headers,
            body,
        )
        commitlog.write_position = position + total
        first = writer.index.append(position, total, 1, 0, store_ms)
        metrics = self.metrics
        metrics["appends"] += 1
        metrics["appended_bytes"] += total
        metrics["index_entries"] += 1
        if self.index_listeners:
            for listener in self.index_listeners:
                listener(_HALF_TOPIC, 0, first)
        return _new_tuple(Appended, (position, position + total, [(_HALF_TOPIC, 0, first)]))

    def _writer(self, topic: str, queue: int) -> _QueueWriter:
        writer = self._writers[(topic, queue)] = _QueueWriter(
            queue, self._topic_bytes(topic), self._queue_for_write(topic, queue)
        )
        return writer

    def append_many(
        self,
        topic: str,
        queue: int,
        bodies: Sequence[bytes | memoryview],
        *,
        key: bytes | None = b"",
        protocol: int = rec.PROTOCOL_INTERNAL,
        client: str = "",
    ) -> Appended:
        """Append several plain records to one queue, encoded straight into the mapping when
        they fit in the current segment."""
        if not client and key is not None and bodies:
            fast = self._append_many_in_place(topic, queue, bodies, key, protocol)
            if fast is not None:
                return fast
        store_ms = now_ms()
        topic_bytes = self._topic_bytes(topic)
        client_bytes = client.encode()
        frames = [
            rec.encode_record(
                topic_bytes,
                queue,
                body,
                store_ms=store_ms,
                key=key,
                client=client_bytes,
                protocol=protocol,
            )
            for body in bodies
        ]
        positions = self.commitlog.append_frames(frames)
        index = self._queue_for_write(topic, queue)
        offsets = []
        for position, frame in zip(positions, frames, strict=True):
            offsets.append((topic, queue, index.append(position, len(frame), 1, 0, store_ms)))
        count = len(frames)
        self.metrics["appends"] += count
        self.metrics["index_entries"] += count
        self.metrics["appended_bytes"] += sum(len(frame) for frame in frames)
        if self.index_listeners:
            for _, _, offset in offsets:
                for listener in self.index_listeners:
                    listener(topic, queue, offset)
        return Appended(positions[0], positions[-1] + len(frames[-1]), offsets)

    def _append_many_in_place(
        self,
        topic: str,
        queue: int,
        bodies: Sequence[bytes | memoryview],
        key: bytes,
        protocol: int,
    ) -> Appended | None:
        """The batch encoded frame after frame (heads shared while body lengths repeat, see
        _QueueWriter) and indexed with one ConsumeQueue.append_run. None when the batch would
        roll the segment: the general path handles segment ends.

        A large batch is encoded into a staging buffer and written with one pwrite rather than
        through the mapping: the kernel then fills page-cache pages it does not have to zero
        first, and no page fault is taken per page (measured: 0.3 against 0.45 ns of CPU per
        byte). The pages are the mapping's (one page cache), so readers and a crash see the
        same bytes either way."""
        writer = self._writers.get((topic, queue))
        if writer is None:
            writer = self._writer(topic, queue)
        store_ms = _time_ns() // 1_000_000
        key_len = len(key)
        head_end = writer.head_end
        fixed = head_end + key_len
        whole_key = type(key) is bytes
        lengths = list(map(len, bodies))
        count = len(lengths)
        # Every frame the same size (a producer's batch usually is): one head for all, frame
        # positions as a range, and a loop of one CRC and one pack per frame.
        uniform = whole_key and lengths.count(lengths[0]) == count
        sizes: list[int]
        if uniform:
            sizes = [fixed + lengths[0]] * count
            need = sizes[0] * count
        else:
            sizes = [fixed + length for length in lengths]
            need = sum(sizes)
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - need
        if not (room >= rec.PREFIX.size or room == 0) and not commitlog.activate(need):
            return None
        offset = position - commitlog.active_base
        buf: memoryview | None
        if need >= _STAGE_BYTES:
            if len(self._staging) < need:
                self._staging = memoryview(bytearray(max(need, 2 * len(self._staging))))
            buf = self._staging
            cursor = 0
        else:
            buf = commitlog.active_buf
            cursor = offset
        assert buf is not None
        pack_frame_head = writer.frame_head.pack_into
        magic = rec.RECORD_MAGIC
        head = writer.head
        crc = writer.crc
        pack_frame = writer.frame.pack_into
        head_total = -1  # frame size the current head and crc were made for
        if uniform:
            total = sizes[0]
            body_len = total - fixed
            writer.refresh(store_ms, 0, protocol, key_len, body_len)
            head = writer.head
            crc = crc32c(key, writer.crc) if key_len else writer.crc
            pack_frame = writer.frame.pack_into
            for body in bodies:
                if type(body) is bytes:
                    pack_frame(buf, cursor, total, magic, crc32c(body, crc), head, key, body)
                else:  # struct packs bytes only: a memoryview body is copied on its own
                    end = cursor + total
                    if key_len:
                        at = cursor + head_end
                        buf[at : at + key_len] = key
                    buf[end - body_len : end] = body
                    pack_frame_head(buf, cursor, total, magic, crc32c(body, crc), head)
                cursor += total
        else:
            for body, total in zip(bodies, sizes, strict=True):
                if total != head_total:
                    head_total = total
                    body_len = total - fixed
                    writer.refresh(store_ms, 0, protocol, key_len, body_len)
                    head = writer.head
                    crc = writer.crc
                    pack_frame = writer.frame.pack_into
                    if key_len:
                        crc = crc32c(key, crc)
                end = cursor + total
                if whole_key and type(body) is bytes:
                    pack_frame(buf, cursor, total, magic, crc32c(body, crc), head, key, body)
                else:  # struct packs bytes only: a memoryview body is copied on its own
                    if key_len:
                        at = cursor + head_end
                        buf[at : at + key_len] = key
                    buf[end - body_len : end] = body
                    pack_frame_head(buf, cursor, total, magic, crc32c(body, crc), head)
                cursor = end
        if buf is self._staging:
            pwrite_all(commitlog.active_fd, buf[:need], offset)
        commitlog.write_position = position + need
        if position + need - commitlog.writeback_position >= WRITEBACK_BYTES:
            found = commitlog.writeback_range()
            if found is not None:
                start_writeback(*found)
        end = position + need
        positions: Sequence[int]
        if uniform:
            positions = range(position, end, sizes[0])
        else:
            positions = list(accumulate(sizes, initial=position))
            positions.pop()
        first = writer.index.append_run(positions, sizes, store_ms)
        metrics = self.metrics
        metrics["appends"] += count
        metrics["index_entries"] += count
        metrics["appended_bytes"] += need
        if self.index_listeners:
            for offset in range(first, first + count):
                for listener in self.index_listeners:
                    listener(topic, queue, offset)
        offsets = list(zip(repeat(topic, count), repeat(queue), range(first, first + count)))
        return Appended(position, end, offsets)

    def append_batch(
        self,
        topic: str,
        queue: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int = 0,
        client: str = "",
        address: str = "",
        flags: int = 0,
        destinations: Sequence[tuple[str, int]] | None = None,
        headers: rec.Headers = (),
        tags: Sequence[str] = (),
        deliver_at_ms: int = 0,
    ) -> Appended:
        """Store a Kafka RecordBatch as one batch record, indexed once (and into each of the
        routed ``destinations``; ``headers`` and ``tags`` are the batch record's, not its
        records')."""
        return self.append(
            topic,
            queue,
            batch,
            destinations=destinations,
            headers=headers,
            tags=tags,
            deliver_at_ms=deliver_at_ms,
            born_ms=born_ms,
            client=client,
            address=address,
            protocol=rec.PROTOCOL_KAFKA,
            flags=flags | rec.FLAG_BATCH,
            record_count=record_count,
        )

    def link(
        self,
        positions: Sequence[int],
        destinations: Sequence[tuple[str, int]] | None = None,
        *,
        headers: rec.Headers = (),
        deliver_at_ms: int = 0,
        decision: LinkDecision | None = None,
    ) -> Appended:
        """Index earlier records (by commit-log position) by appending one LINK record: into
        ``destinations``, or each into its own destinations when None. A few dozen bytes; bodies
        are not copied. With ``headers`` (one position only) readers of the destinations see the
        record with those headers added. Makes half messages and delayed records visible and
        moves records to retry and dead-letter queues; several positions link atomically. With
        ``deliver_at_ms`` in the future the LINK itself is delayed (a retry with back-off): it
        waits in ``__timers`` like any delayed record.

        With ``decision`` the LINK is also a record of ``__transactions/0`` (``FLAG_LINK_INDEXED``)
        carrying the decision's key, client, tags and headers: a transaction's commit is then one
        frame, so deciding and making the halves visible cannot be torn apart by a crash, and
        the commit costs one append. ``headers`` must be empty then."""
        targets = []
        for position in positions:
            buf, start = self.commitlog.frame_unchecked(position)
            targets.append((position, int.from_bytes(buf[start : start + 4], "little")))
        return self.link_frames(
            targets,
            destinations,
            headers=headers,
            deliver_at_ms=deliver_at_ms,
            decision=decision,
        )

    def link_frames(
        self,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]] | None = None,
        *,
        headers: rec.Headers = (),
        deliver_at_ms: int = 0,
        decision: LinkDecision | None = None,
        index_info: Sequence[tuple[int, int]] | None = None,
        known_targets: Sequence[TargetIndex] | None = None,
    ) -> Appended:
        """:meth:`link` for callers that know each target's ``(position, frame size)`` already
        (a transaction remembers its halves, the timer log holds sizes): no read of the
        targets' frame headers.

        ``known_targets`` (with a decision): each target's :class:`TargetIndex` as the caller
        appended it (a record, not a LINK); dispatch indexes from it instead of decoding each
        target's header (a transaction's commit: about a fifth of its cost).

        ``index_info`` (with explicit ``destinations``, no headers, not delayed): each target's
        ``(tag mask, record count)`` as the caller read them from the target's frame, which
        must be a record, not a LINK. Dispatch then writes the entries straight away, without
        decoding each target's header again (the timer service fires thousands a second);
        recovery computes the same values from the frames."""
        if headers and (len(targets) != 1 or decision is not None):
            raise ValueError("a LINK with headers has exactly one target and no decision")
        if decision is not None and deliver_at_ms:
            raise ValueError("a decision takes effect when appended: it cannot be delayed")
        if index_info is not None:
            if not destinations or headers or deliver_at_ms or decision is not None:
                raise ValueError("index_info needs destinations, and no headers, delay or decision")
            return self._append_link_known(targets, destinations, index_info)
        if decision is None:
            return self.append(
                names.TRANSACTIONS_TOPIC,
                0,
                rec.encode_link_body(targets),
                headers=headers,
                destinations=list(destinations) if destinations else None,
                flags=rec.FLAG_LINK,
                deliver_at_ms=deliver_at_ms,
            )
        if known_targets is not None and len(known_targets) != len(targets):
            raise ValueError("known_targets must describe every target")
        return self.append_decision(targets, decision, known_targets, destinations)

    def _append_link_known(
        self,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]],
        index_info: Sequence[tuple[int, int]],
    ) -> Appended:
        """A plain LINK into ``destinations`` whose targets' index fields the caller gave."""
        store_ms = now_ms()
        frame = rec.encode_record(
            self._topic_bytes(names.TRANSACTIONS_TOPIC),
            0,
            rec.encode_link_body(targets),
            store_ms=store_ms,
            destinations=rec.encode_destinations(destinations),
            flags=rec.FLAG_LINK,
        )
        position = self.commitlog.append(frame)
        size = len(frame)
        self.metrics["appends"] += 1
        self.metrics["appended_bytes"] += size
        queues = [
            (topic, queue, self._queue_for_write(topic, queue)) for topic, queue in destinations
        ]
        listeners = self.index_listeners
        offsets: list[tuple[str, int, int]] = []
        # The entries _index_link_targets writes for this frame, in the same order.
        for (target_position, target_size), (mask, count) in zip(targets, index_info, strict=True):
            for topic, queue, index in queues:
                offset = index.append(target_position, target_size, count, mask, store_ms)
                offsets.append((topic, queue, offset))
                for listener in listeners:
                    listener(topic, queue, offset)
        self.metrics["index_entries"] += len(offsets)
        return Appended(position, position + size, offsets)

    def append_decision(
        self,
        targets: Sequence[tuple[int, int]],
        decision: LinkDecision,
        known_targets: Sequence[TargetIndex] | None = None,
        destinations: Sequence[tuple[str, int]] | None = None,
    ) -> Appended:
        """``link_frames(targets, destinations, decision=decision, known_targets=...)`` without
        its argument checks (``known_targets``, when given, describes every target): a
        transaction's commit, as hot as a publish.

        Appends a decision LINK and indexes it without parsing back the frame just encoded
        (the general path re-reads it: about a third of a transaction's commit cost). The index
        entries are the ones :meth:`_dispatch_link` writes when recovery replays the frame.

        The frame is :func:`core.log.record.encode_record`'s. A commit per transaction makes
        this as hot as a publish, so, like a plain record (see _QueueWriter), the head is
        shared while the field lengths and the millisecond repeat, and the frame is packed
        into the mapping in one call."""
        store_ms = _time_ns() // 1_000_000
        tags = decision.tags
        cached = self._decision_tags.get(tags)
        if cached is None:
            cached = self._decision_tags[tags] = (rec.encode_tags(tags), tags_mask(tags))
        tag_bytes, own_mask = cached
        key = decision.key
        headers = _encoded_headers(decision.headers)
        client = decision.client.encode()
        body = (
            _LINK_TARGET.pack(*targets[0]) if len(targets) == 1 else rec.encode_link_body(targets)
        )
        dests = rec.encode_destinations(destinations) if destinations else b""
        layout = (
            store_ms,
            len(key),
            len(headers),
            len(tag_bytes),
            len(client),
            len(dests),
            len(body),
        )
        head = self._decision_head
        if head is None or head[0] != layout:
            head = self._decision_head = _decision_head(layout)
        _, head_bytes, head_crc, frame_struct = head
        size = frame_struct.size
        rest = b"".join((key, headers, tag_bytes, client, dests, body))
        crc = crc32c(rest, head_crc)
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - size
        if room >= rec.PREFIX.size or room == 0 or commitlog.activate(size):
            buf = commitlog.active_buf
            assert buf is not None
            frame_struct.pack_into(
                buf, position - commitlog.active_base, size, rec.RECORD_MAGIC, crc, head_bytes, rest
            )
            commitlog.write_position = position + size
        else:  # the frame rolls the segment: append() writes the BLANK and rolls
            frame = frame_struct.pack(size, rec.RECORD_MAGIC, crc, head_bytes, rest)
            position = commitlog.append(frame)
        metrics = self.metrics
        metrics["appends"] += 1
        metrics["appended_bytes"] += size
        listeners = self.index_listeners
        queues = self._queues
        own = queues.get((_TRANSACTIONS_TOPIC, 0)) or self._queue_for_write(_TRANSACTIONS_TOPIC, 0)
        first = own.append(position, size, 1, own_mask, store_ms)
        offsets = [(_TRANSACTIONS_TOPIC, 0, first)]
        for listener in listeners:
            listener(_TRANSACTIONS_TOPIC, 0, first)
        if known_targets is None:
            metrics["index_entries"] += 1
            offsets += self._index_link_targets(
                position, size, targets, destinations, False, store_ms
            )
            return Appended(position, position + size, offsets)
        # The entries _index_link_targets writes for this frame, in the same order.
        for (target_position, target_size), known in zip(targets, known_targets, strict=True):
            for topic_name, queue in destinations or known.destinations:
                index = queues.get((topic_name, queue)) or self._queue_for_write(topic_name, queue)
                offset = index.append(
                    target_position, target_size, known.record_count, known.tag_mask, store_ms
                )
                offsets.append((topic_name, queue, offset))
                for listener in listeners:
                    listener(topic_name, queue, offset)
        metrics["index_entries"] += len(offsets)
        return _new_tuple(Appended, (position, position + size, offsets))

    # -- dispatch: index entries -----------------------------------------------------------

    def _queue_for_write(self, topic: str, queue: int) -> ConsumeQueue:
        index = self._queues.get((topic, queue))
        if index is None:
            index = self._queues[(topic, queue)] = self._open_queue(topic, queue)
        return index

    def _dispatch(
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
        names no destinations (its own (topic, queue), or per link target)."""
        if flags & rec.FLAG_HALF:
            targets = ((names.HALF_TOPIC, 0),)
        elif flags & rec.FLAG_DELAYED:
            targets = ((names.TIMERS_TOPIC, 0),)
        elif flags & rec.FLAG_LINK:
            return self._dispatch_link(position, size, targets, store_ms)
        assert targets is not None
        return self._index(position, size, targets, tag_mask, record_count, store_ms)

    def _index(
        self,
        position: int,
        size: int,
        targets: Sequence[tuple[str, int]],
        tag_mask: int,
        record_count: int,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        offsets = []
        for topic, queue in targets:
            index = self._queue_for_write(topic, queue)
            offset = index.append(position, size, record_count, tag_mask, store_ms)
            offsets.append((topic, queue, offset))
            for listener in self.index_listeners:
                listener(topic, queue, offset)
        self.metrics["index_entries"] += len(targets)
        return offsets

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
            offsets += self._index(
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
        offsets += self._index_link_targets(
            position,
            size,
            rec.decode_link_body(rec.body_slice(frame, 0)),
            destinations,
            has_headers,
            store_ms,
        )
        return offsets

    def _index_link_targets(
        self,
        position: int,
        size: int,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]] | None,
        has_headers: bool,
        store_ms: int,
    ) -> list[tuple[str, int, int]]:
        """Index each ``(position, size)`` target of the LINK at ``position`` into
        ``destinations``, or its own; ``has_headers``: the entries point at the LINK itself."""
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
                offsets += self._index(position, size, where, mask, record_count, store_ms)
            else:
                offsets += self._index(
                    target_position, target_size, where, mask, record_count, store_ms
                )
        return offsets

    def dispatch_frame(self, position: int, size: int) -> None:
        """Re-index one verified frame (recovery)."""
        buf, start, _ = self.commitlog.read_frame(position)
        record = rec.decode_record(buf, start, position)
        self._dispatch(
            position,
            size,
            record.flags,
            record.destinations
            or (None if record.flags & rec.FLAG_LINK else record.index_targets()),
            tags_mask(record.tags) if record.tags else 0,
            record.record_count,
            record.store_ms,
        )

    # -- durability ------------------------------------------------------------------------

    def is_sync(self, topic: str) -> bool:
        return self.config.durability_for(topic) == DURABILITY_SYNC

    async def wait_durable(self, end: int, topic: str | None = None) -> None:
        """Return once everything before ``end`` is durable at ``topic``'s durability."""
        if self.commitlog.flushed_position >= end:
            return
        if topic is not None and not self.is_sync(topic):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_durable_waiter(end, future)
        await future

    def add_durable_waiter(self, end: int, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` once everything before ``end`` is durable (what
        :meth:`wait_durable` awaits; for a caller that creates its future before it knows
        ``end``, as the transaction service does for commits it writes at a turn's end)."""
        if self.commitlog.flushed_position >= end:
            if not future.done():
                future.set_result(None)
            return
        self._waiters.append((end, future))
        if self._group_commit_task is None:
            self._group_commit_task = asyncio.get_running_loop().create_task(self._group_commit())

    async def _group_commit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                for write_held_back in self.before_sync:
                    write_held_back()
                target = self.commitlog.write_position
                await loop.run_in_executor(self._executor, self.commitlog.sync_to, target)
                self.metrics["fsyncs"] += 1
                while self._waiters and self._waiters[0][0] <= target:
                    _, future = self._waiters.popleft()
                    if not future.done():
                        future.set_result(None)
        except BaseException as error:
            while self._waiters:
                _, future = self._waiters.popleft()
                if not future.done():
                    future.set_exception(error)
            raise
        finally:
            self._group_commit_task = None

    async def publish(
        self, topic: str, queue: int, body: bytes | None, **fields: object
    ) -> Appended:
        """Append and wait until durable (at ``topic``'s durability)."""
        appended = self.append(topic, queue, body, **fields)  # type: ignore[arg-type]
        await self.wait_durable(appended.end, topic)
        return appended

    def flush(self) -> None:
        """Blocking: make everything appended so far durable, indexes included."""
        self.commitlog.sync_to(self.commitlog.write_position)
        self.metrics["fsyncs"] += 1
        for index in self._queues.values():
            index.sync()

    # -- checkpoints -----------------------------------------------------------------------

    def _capture_checkpoint(self) -> tuple[int, dict[str, int], list[int], int]:
        self._checkpoint_seq += 1
        counts = {
            f"{names.encode_topic_dir(t)}/{q}": i.next_entry for (t, q), i in self._queues.items()
        }
        dirty: list[int] = []
        for index in self._queues.values():
            for number in index.take_dirty():
                index_file = index.files.get(number)
                if index_file is not None:
                    dirty.append(index_file.fd)
        return self.commitlog.write_position, counts, dirty, self._checkpoint_seq

    def _write_checkpoint(
        self, position: int, counts: dict[str, int], dirty_fds: list[int], seq: int
    ) -> None:
        # One at a time (a blocking checkpoint from close() or drop_queues() can meet one the
        # background task is writing in the executor: they shared checkpoint.tmp), and never an
        # older capture over a newer one; a newer one also waits until the older one's index
        # files are synced, since its capture did not list them again.
        with self._checkpoint_lock:
            self.commitlog.sync_to(position)
            for fd in dirty_fds:
                # A file closed by retention meanwhile: its entries are gone anyway.
                with contextlib.suppress(OSError):
                    os.fdatasync(fd)
            if seq < self._checkpoint_written_seq:
                return
            payload = {"position": position, "queues": counts, "written_ms": now_ms()}
            write_atomically(self.data_dir / names.CHECKPOINT_FILE, json.dumps(payload).encode())
            self._checkpoint_written_seq = seq
            self._last_checkpoint = (position, counts)
            self.metrics["checkpoints"] += 1

    def checkpoint(self) -> None:
        """Blocking checkpoint: indexes are complete up to the recorded commit-log position."""
        self._write_checkpoint(*self._capture_checkpoint())

    async def checkpoint_async(self) -> None:
        position, counts, dirty, seq = self._capture_checkpoint()
        if self._last_checkpoint == (position, counts) and not dirty:
            return
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._write_checkpoint, position, counts, dirty, seq
        )

    # -- background tasks ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the periodic flush (async durability), checkpoint and retention tasks."""
        self._background = [
            asyncio.create_task(
                self._every(self.config.checkpoint_interval_ms, self.checkpoint_async)
            ),
            asyncio.create_task(
                self._every(self.config.retention_check_interval_ms, self._retention_async)
            ),
        ]
        if self.config.durability != DURABILITY_SYNC or self.config.topic_durability:
            self._background.append(
                asyncio.create_task(self._every(self.config.flush_interval_ms, self._flush_async))
            )

    async def _every(self, interval_ms: int, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("background task %s failed", getattr(action, "__name__", action))

    async def _flush_async(self) -> None:
        target = self.commitlog.write_position
        if target > self.commitlog.flushed_position:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self.commitlog.sync_to, target
            )
            self.metrics["fsyncs"] += 1

    async def _retention_async(self) -> None:
        self.enforce_retention()

    # -- retention -------------------------------------------------------------------------

    def enforce_retention(self, now: int | None = None) -> list[int]:
        """Delete whole sealed segments past the time or size limit, oldest first, unless a
        retention guard says a record in one is still owed. Returns deleted base positions."""
        now = now_ms() if now is None else now
        deleted: list[int] = []
        commitlog = self.commitlog
        while True:
            numbers = commitlog.segment_numbers()
            active = commitlog.write_position // commitlog.segment_size
            sealed = [n for n in numbers if n < active]
            if not sealed:
                break
            oldest = sealed[0]
            total = sum(1 for _ in numbers) * commitlog.segment_size
            too_big = (
                self.config.retention_bytes is not None and total > self.config.retention_bytes
            )
            too_old = False
            if self.config.retention_ms is not None:
                # Every record of a segment is older than the first record of the next one.
                newest = self._first_store_ms(oldest + 1)
                too_old = newest is not None and newest < now - self.config.retention_ms
            if not (too_big or too_old):
                break
            start = oldest * commitlog.segment_size
            end = start + commitlog.segment_size
            if any(guard(start, end) for guard in self.retention_guards):
                log.info("retention: segment %d still holds owed records; kept", start)
                break
            commitlog.delete_segment(oldest)
            deleted.append(start)
            self.metrics["segments_deleted"] += 1
            log.info("retention: deleted segment %s", names.segment_name(start))
        if deleted:
            for index in self._queues.values():
                self._skip_deleted_head(index)
                index.delete_files_before(index.start_entry)
        return deleted

    def _first_store_ms(self, number: int) -> int | None:
        segment = self.commitlog.segments.get(number)
        if segment is None or segment.frame_size_at(0) == 0:
            return None
        header = rec.HEADER.unpack_from(segment.buf, 0)
        return int(header[5]) if header[1] == rec.RECORD_MAGIC else None

    # -- dropping a topic's indexes -------------------------------------------------------

    def drop_queues(self, topic: str) -> list[int]:
        """Delete every index of ``topic`` (a deleted Kafka topic or AMQP queue), so a topic
        declared again under that name starts empty at offset 0, as in Kafka and RabbitMQ.

        The records stay in the commit log until retention deletes their segments; only the
        index entries that made them readable go. A checkpoint follows at once: recovery
        replays from the checkpoint, and must not index the topic's older records again."""
        dropped = sorted(queue for name, queue in self._queues if name == topic)
        if not dropped:
            return []
        for queue in dropped:
            index = self._queues.pop((topic, queue))
            self._writers.pop((topic, queue), None)  # its cached index is the one closed here
            self._half_writers.pop((topic, queue), None)
            index.close()
            shutil.rmtree(index.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            names.queue_dir(self.data_dir, topic, 0).parent.rmdir()
        self.checkpoint()
        return dropped

    # -- shutdown --------------------------------------------------------------------------

    async def aclose(self) -> None:
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._background = []
        if self._group_commit_task is not None:
            await asyncio.gather(self._group_commit_task, return_exceptions=True)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for write_held_back in self.before_sync:
            write_held_back()
        self.flush()
        while self._waiters:  # durable now (waiters of a group commit that never ran)
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
        self.checkpoint()
        (self.data_dir / names.CLEAN_SHUTDOWN_FILE).touch()
        self._executor.shutdown(wait=True)
        super().close()
