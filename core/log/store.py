"""LogStore: the writer side of the log engine, one per data directory (Kafka's ``Log``): the
public face that puts the storage parts together.

An append writes one frame to the CommitLog (:mod:`core.log.frames`), then one index entry per
destination queue (:mod:`core.log.index_writer`): store once, index many. Half messages are
indexed only in ``__half`` and delayed ones only in ``__timers`` until a LINK record makes them
visible where they belong. The other jobs, each in its module:

- durability, group commit and flushes: :mod:`core.log.durability`;
- checkpoints: :mod:`core.log.checkpoint`; recovery on open: :mod:`core.log.recovery`;
- retention: :mod:`core.log.retention`;
- a transaction's commit decision frame: ``core/transactions/decisions.py``;
- the storage fence of a shard owned by a cluster node (a newer owner stops this one's
  acknowledgements and writes): :mod:`core.log.fence`.

Thread-safety: appends and reads from the event-loop thread; fdatasync and background
checkpoints run in one worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import NamedTuple

from core.log import names
from core.log import record as rec
from core.log.checkpoint import Checkpoints
from core.log.config import DURABILITY_SYNC, LogConfig, LogMeta
from core.log.consumequeue import ConsumeQueue
from core.log.diskspace import DiskSpace
from core.log.durability import GroupCommit
from core.log.fence import Fence, StoreFenced
from core.log.frames import (
    CACHED_TOPICS,
    FrameHead,
    FrameWriter,
    ReferenceFrameWriter,
    store_ms_now,
)
from core.log.index_writer import IndexListener, IndexWriter
from core.log.openfiles import bounded_by_fd_limit
from core.log.reader import LogReader
from core.log.recovery import recover
from core.log.retention import Retention, RetentionGuard
from core.log.tags import tags_mask

__all__ = ["Appended", "IndexListener", "LogStore", "RetentionGuard", "now_ms"]

log = logging.getLogger(__name__)


class SegmentVerification:
    """The background check of sealed segments after an unclean start: ``state`` is
    ``not needed`` (a clean shutdown), ``running`` or ``done``; ``corrupt`` holds the first
    damaged frame found in each corrupt segment."""

    def __init__(self) -> None:
        self.state = "not needed"
        self.segments_verified = 0
        self.corrupt: list[rec.CorruptRecordError] = []


class Appended(NamedTuple):
    position: int
    end: int  # position after the frame: wait_durable(end) makes this append durable
    offsets: list[tuple[str, int, int]]  # (topic, queue, first offset) per index entry written


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def encoded_headers(headers: rec.Headers | bytes) -> bytes:
    """``headers`` as the frame stores them (a caller may pass them encoded already)."""
    if type(headers) is bytes:
        return headers
    return rec.encode_headers(headers) if headers else b""  # type: ignore[arg-type]


_new_tuple = tuple.__new__
_HALF_TOPIC = names.HALF_TOPIC


class LogStore(LogReader):
    """Open (and recover) a data directory for writing. Use one per directory."""

    def __init__(
        self,
        config: LogConfig,
        *,
        check_own_writes: bool = False,
        fast_paths: bool = True,
        fence: Fence | None = None,
    ) -> None:
        """``check_own_writes`` (or ``config.check_own_writes``): CRC-check on reads also the
        frames this store appended itself (by default they are trusted; see
        CommitLog.trust_from and docs/storage.md). ``fast_paths=False``: every frame takes the
        reference encoder and every entry the general dispatch (same bytes, more CPU: what
        the parity tests compare the fast paths with). ``fence``: the directory is a shard a
        cluster node owns (:mod:`core.log.fence`): checked at each fsync, a new segment after
        an unclean change of owner, the start recorded before the first write."""
        self.config = config
        self.check_own_writes = check_own_writes or config.check_own_writes
        self.fast_paths = fast_paths
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
        super().__init__(
            data_dir, _writable=True, max_open_files=bounded_by_fd_limit(config.max_open_files)
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="braid-fsync")
        self.frames = (FrameWriter if fast_paths else ReferenceFrameWriter)(self.commitlog)
        self.indexes = IndexWriter(self.commitlog, self._queues, self._open_queue)
        self.durability = GroupCommit(self.commitlog, self._queues, self._executor)
        self.checkpoints = Checkpoints(data_dir, self.commitlog, self._queues, self._executor)
        self.retention = Retention(config, self.commitlog, self._queues, self._skip_deleted_head)
        # The disk alarm: checked periodically (start) and at each reservation of blocks.
        self.disk_space = DiskSpace(data_dir, config.disk_free_limit_bytes)
        self.disk_space.check()
        self.commitlog.on_reserve = self.disk_space.on_reserve
        # The parts' hooks, under the names callers register with.
        self.index_listeners: list[IndexListener] = self.indexes.listeners
        self.retention_guards: list[RetentionGuard] = self.retention.guards
        # Called before each group commit picks the position it syncs to (see GroupCommit).
        self.before_sync: list[Callable[[], None]] = self.durability.before_sync
        # The frame heads of plain records and of half messages, by (topic, queue).
        self._plain_heads: dict[tuple[str, int], FrameHead] = {}
        self._half_heads: dict[tuple[str, int], FrameHead] = {}
        self._background: list[asyncio.Task[None]] = []
        self.closed = False
        self.verification = SegmentVerification()
        self.fence = fence
        try:
            self.recovery = recover(
                self.commitlog,
                self.indexes,
                self.durability,
                self.checkpoints,
                check_own_writes=self.check_own_writes,
                start_at_segment_boundary=fence is not None and fence.start_at_segment_boundary,
            )
            if fence is not None:
                if fence.record_start is not None:
                    fence.record_start(self.recovery.start_position, dict(self.recovery.sealed))
                # From here on (recovery's own flush is acknowledged to nobody).
                self.commitlog.fence_check = fence.is_fenced
                self.durability.on_fenced.append(self._stop_writers)
        except BaseException:
            self._executor.shutdown(wait=True)
            LogReader.close(self)
            raise

    @property
    def fenced(self) -> StoreFenced | None:
        """Why this store stopped acknowledging and writing (a newer owner), or None."""
        return self.durability.fenced

    @property
    def metrics(self) -> dict[str, int]:
        """Counters since this store opened, from its parts (a new dict at each read)."""
        return {
            "appends": self.frames.appends,
            "appended_bytes": self.frames.appended_bytes,
            "index_entries": self.indexes.entries,
            "fsyncs": self.durability.fsyncs,
            "checkpoints": self.checkpoints.written,
            "segments_deleted": self.retention.segments_deleted,
            "recovered_records": self.recovery.replayed_records,
            "truncated_bytes": self.recovery.truncated_bytes,
            "disk_alarms": self.disk_space.alarms,
            "corrupt_reads": self.corrupt_reads,
            "corrupt_frames_found": len(self.verification.corrupt),
        }

    # -- appending -------------------------------------------------------------------------

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
            # The common record: FrameWriter.write_plain, one entry in its own queue (a
            # ReferenceFrameWriter declines: then the general path below).
            head = self._plain_heads.get((topic, queue)) or self._plain_head(topic, queue)
            position = self.frames.write_plain(head, key, body, born_ms, protocol)
            if position >= 0:
                end = self.commitlog.write_position
                first = self.indexes.add(
                    topic, queue, head.index, position, end - position, 1, 0, head.store_ms
                )
                return _new_tuple(Appended, (position, end, [(topic, queue, first)]))
        elif (
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
        store_ms = store_ms_now()
        if deliver_at_ms > store_ms:
            flags |= rec.FLAG_DELAYED
        frames = self.frames
        encoded, body_part = rec.encode_record_parts(
            frames.topic_bytes(topic),
            queue,
            body,
            store_ms=store_ms,
            key=key,
            headers=encoded_headers(headers),
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
        position, size = frames.write(encoded, body_part)
        targets = destinations or (None if flags & rec.FLAG_LINK else ((topic, queue),))
        offsets = self.indexes.dispatch(
            position, size, flags, targets, tags_mask(tags) if tags else 0, record_count, store_ms
        )
        return Appended(position, position + size, offsets)

    def append_encoded(self, frame: bytes | bytearray | memoryview) -> Appended:
        """Append ``frame``, one record as :func:`core.log.record.encode_record` encodes it
        with every field final (a record another node forwarded, core/cluster/rpc/append.py),
        without decoding and encoding it again: its checksum is checked, its store time set to
        now (``FLAG_DELAYED`` when its ``deliver_at_ms`` is later), the checksum computed anew,
        and it is indexed as :meth:`append` indexes it (its destinations, else its own queue).
        Raises :class:`~core.log.record.CorruptRecordError` for a frame that does not check and
        ValueError for a half, a LINK or a frame of another length."""
        size = len(frame)
        if rec.verify_frame(memoryview(frame), 0, size) != size or size < rec.HEADER_SIZE:
            raise ValueError(f"not one record frame of {size} bytes")
        buf = bytearray(frame)
        store_ms = store_ms_now()
        flags = rec.stamp_frame(buf, store_ms)
        if flags & (rec.FLAG_HALF | rec.FLAG_LINK):
            raise ValueError("a half message or a LINK is not appended encoded")
        encoded = bytes(buf)
        _, record_count, tags, targets = rec.index_fields(encoded, 0)
        position, size = self.frames.write(encoded, b"")
        offsets = self.indexes.dispatch(
            position, size, flags, targets, tags_mask(tags) if tags else 0, record_count, store_ms
        )
        return Appended(position, position + size, offsets)

    def _plain_head(self, topic: str, queue: int) -> FrameHead:
        if len(self._plain_heads) >= CACHED_TOPICS:
            self._plain_heads.clear()  # see CACHED_TOPICS
        head = self._plain_heads[(topic, queue)] = FrameHead(
            queue, self.frames.topic_bytes(topic), self.indexes.queue(topic, queue)
        )
        return head

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
        core.transactions): FrameWriter.write_half, indexed in __half/0. None when it would roll
        the segment: then call :meth:`append`, which handles segment ends."""
        if not self.fast_paths:
            return None
        head = self._half_heads.get((topic, queue))
        if head is None:
            if len(self._half_heads) >= CACHED_TOPICS:
                self._half_heads.clear()  # see CACHED_TOPICS
            head = self._half_heads[(topic, queue)] = FrameHead(
                queue,
                self.frames.topic_bytes(topic),
                self.indexes.queue(_HALF_TOPIC, 0),
                rec.FLAG_HALF,
            )
        position = self.frames.write_half(head, key, headers, body, born_ms, protocol)
        if position < 0:
            return None
        end = self.commitlog.write_position
        first = self.indexes.add(
            _HALF_TOPIC, 0, head.index, position, end - position, 1, 0, head.store_ms
        )
        return _new_tuple(Appended, (position, end, [(_HALF_TOPIC, 0, first)]))

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
        they fit in the current segment (FrameWriter.write_many)."""
        written: tuple[Sequence[int], list[int]] | None = None
        index: ConsumeQueue | None = None
        if not client and key is not None and bodies:
            head = self._plain_heads.get((topic, queue)) or self._plain_head(topic, queue)
            written = self.frames.write_many(head, bodies, key, protocol)
            store_ms = head.store_ms
            index = head.index
        if written is None:
            store_ms = store_ms_now()
            written = self.frames.write_many_reference(
                topic, queue, bodies, store_ms, key, protocol, client
            )
            index = self.indexes.queue(topic, queue)
        assert index is not None
        positions, sizes = written
        if self.fast_paths:
            first = self.indexes.add_run(topic, queue, index, positions, sizes, store_ms)
        else:
            first = index.next_offset
            for position, size in zip(positions, sizes, strict=True):
                self.indexes.add(topic, queue, index, position, size, 1, 0, store_ms)
        count = len(sizes)
        offsets = list(zip(repeat(topic, count), repeat(queue), range(first, first + count)))
        return Appended(positions[0], positions[-1] + sizes[-1], offsets)

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
    ) -> Appended:
        """Index earlier records (by commit-log position) by appending one LINK record: into
        ``destinations``, or each into its own destinations when None. A few dozen bytes; bodies
        are not copied. With ``headers`` (one position only) readers of the destinations see the
        record with those headers added. Makes half messages and delayed records visible and
        moves records to retry and dead-letter queues; several positions link atomically. With
        ``deliver_at_ms`` in the future the LINK itself is delayed (a retry with back-off): it
        waits in ``__timers`` like any delayed record.

        A transaction's commit is a LINK that is a decision too: see
        ``core/transactions/decisions.py``."""
        targets = []
        for position in positions:
            buf, start = self.commitlog.frame_unchecked(position)
            targets.append((position, int.from_bytes(buf[start : start + 4], "little")))
        return self.link_frames(targets, destinations, headers=headers, deliver_at_ms=deliver_at_ms)

    def link_frames(
        self,
        targets: Sequence[tuple[int, int]],
        destinations: Sequence[tuple[str, int]] | None = None,
        *,
        headers: rec.Headers = (),
        deliver_at_ms: int = 0,
        index_info: Sequence[tuple[int, int]] | None = None,
    ) -> Appended:
        """:meth:`link` for callers that know each target's ``(position, frame size)`` already
        (a transaction remembers its halves, the timer log holds sizes): no read of the
        targets' frame headers.

        ``index_info`` (with explicit ``destinations``, no headers, not delayed): each target's
        ``(tag mask, record count)`` as the caller read them from the target's frame, which
        must be a record, not a LINK. The entries are then written straight away, without
        decoding each target's header again (the timer service fires thousands a second);
        recovery computes the same values from the frames."""
        if headers and len(targets) != 1:
            raise ValueError("a LINK with headers has exactly one target")
        if index_info is not None and (not destinations or headers or deliver_at_ms):
            raise ValueError("index_info needs destinations, and no headers or delay")
        body = rec.encode_link_body(targets)
        if index_info is None or not destinations or not self.fast_paths:
            return self.append(
                names.TRANSACTIONS_TOPIC,
                0,
                body,
                headers=headers,
                destinations=list(destinations) if destinations else None,
                flags=rec.FLAG_LINK,
                deliver_at_ms=deliver_at_ms,
            )
        store_ms = store_ms_now()
        head, body_part = rec.encode_record_parts(
            self.frames.topic_bytes(names.TRANSACTIONS_TOPIC),
            0,
            body,
            store_ms=store_ms,
            destinations=rec.encode_destinations(destinations),
            flags=rec.FLAG_LINK,
        )
        position, size = self.frames.write(head, body_part)
        offsets = self.indexes.link_known_targets(targets, destinations, index_info, store_ms)
        return Appended(position, position + size, offsets)

    def dispatch_frame(self, position: int, size: int) -> None:
        """Re-index one verified frame (recovery does, through the index writer)."""
        self.indexes.dispatch_frame(position, size)

    # -- durability ------------------------------------------------------------------------

    def is_sync(self, topic: str) -> bool:
        return self.config.durability_for(topic) == DURABILITY_SYNC

    async def wait_durable(self, end: int, topic: str | None = None) -> None:
        """Return once everything before ``end`` is durable at ``topic``'s durability."""
        if self.commitlog.flushed_position >= end:
            return
        if topic is not None and not self.is_sync(topic):
            return
        await self.durability.wait(end)

    def add_durable_waiter(self, end: int, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` once everything before ``end`` is durable (what
        :meth:`wait_durable` awaits; for a caller that creates its future before it knows
        ``end``, as the transaction service does for commits it writes at a turn's end)."""
        self.durability.add_waiter(end, future)

    async def publish(
        self, topic: str, queue: int, body: bytes | None, **fields: object
    ) -> Appended:
        """Append and wait until durable (at ``topic``'s durability)."""
        appended = self.append(topic, queue, body, **fields)  # type: ignore[arg-type]
        await self.wait_durable(appended.end, topic)
        return appended

    def flush(self) -> None:
        """Blocking: make everything appended so far durable, indexes included."""
        self.durability.flush()

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Blocking checkpoint: indexes are complete up to the recorded commit-log position."""
        self.checkpoints.write()

    async def checkpoint_async(self) -> None:
        try:
            await self.checkpoints.write_async()
        except StoreFenced as error:  # its fsync found a newer owner: no checkpoint written
            self.durability.fence(error)

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
            asyncio.create_task(
                self._every(self.config.disk_free_check_interval_ms, self.disk_space.check)
            ),
        ]
        if not self.recovery.clean_shutdown:
            # Recovery checked the frames after the checkpoint; after a crash the sealed
            # segments before it are checked too, in the background (issue 21 item 6: a flipped
            # byte went unnoticed until a consumer reached it).
            self._background.append(asyncio.create_task(self._verify_sealed_segments()))
        if self.config.durability != DURABILITY_SYNC or self.config.topic_durability:
            self._background.append(
                asyncio.create_task(
                    self._every(self.config.flush_interval_ms, self.durability.flush_async)
                )
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

    async def _verify_sealed_segments(self) -> None:
        """CRC-check every sealed segment, one at a time in a worker thread; what is found is
        logged and kept in :attr:`verification` (/health, /metrics)."""
        verification = self.verification
        verification.state = "running"
        commitlog = self.commitlog
        sealed = commitlog.segment_numbers()[:-1]  # the last one is being written
        if not sealed:
            verification.state = "done"
            return
        for number in sealed:
            if number not in commitlog.segments:  # deleted by retention meanwhile
                continue
            found = await asyncio.to_thread(self._verify_segment, number)
            verification.segments_verified += 1
            if found is not None:
                verification.corrupt.append(found)
                log.error(
                    "background verification: segment %s: %s (records there are skipped by "
                    "queues, refused to Kafka consumers with CORRUPT_MESSAGE)",
                    names.segment_name(number * commitlog.segment_size),
                    found,
                )
        verification.state = "done"
        log.info(
            "background verification: %d sealed segments checked, %d corrupt",
            verification.segments_verified,
            len(verification.corrupt),
        )

    def _verify_segment(self, number: int) -> rec.CorruptRecordError | None:
        start = number * self.commitlog.segment_size
        try:
            for _ in self.commitlog.scan(start, start + self.commitlog.segment_size):
                pass
        except rec.CorruptRecordError as error:
            return error
        except (KeyError, ValueError):  # closed by retention while checked
            return None
        return None

    async def _retention_async(self) -> None:
        self.enforce_retention()

    # -- retention -------------------------------------------------------------------------

    def enforce_retention(self, now: int | None = None) -> list[int]:
        """Delete whole sealed segments past the time or size limit, oldest first, unless a
        retention guard says a record in one is still owed. Returns deleted base positions.
        A fenced store deletes nothing (with a fence it is asked first: one stat a run)."""
        if self._found_fenced():
            return []
        return self.retention.enforce(now)

    def _found_fenced(self) -> bool:
        """Whether the store is fenced, asking the fence now if it has one and is not yet: for
        writes outside the group commit (retention, close) that no fsync check precedes."""
        if self.durability.fenced is not None:
            return True
        fence = self.fence
        if fence is None or not fence.is_fenced():
            return False
        self.durability.fence(StoreFenced(self.data_dir))
        return True

    def _stop_writers(self, error: StoreFenced) -> None:
        """on_fenced: the background tasks write (checkpoints, retention, flushes): stop them."""
        for task in self._background:
            task.cancel()

    # -- dropping a topic's indexes -------------------------------------------------------

    def drop_queues(self, topic: str) -> list[int]:
        """Delete every index of ``topic`` (a deleted Kafka topic or AMQP queue), so a topic
        declared again under that name starts empty at offset 0, as in Kafka and RabbitMQ.

        The records stay in the commit log until retention deletes their segments; only the
        index entries that made them readable go. A checkpoint follows at once: recovery
        replays from the checkpoint, and must not index the topic's older records again."""
        if self.durability.fenced is not None:
            raise StoreFenced(self.data_dir)
        dropped = self.indexes.drop(topic, self.data_dir)
        if not dropped:
            return []
        for queue in dropped:
            self._plain_heads.pop((topic, queue), None)  # its cached index is closed now
            self._half_heads.pop((topic, queue), None)
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
        if self.durability.task is not None:
            await asyncio.gather(self.durability.task, return_exceptions=True)
        self.close()

    def close(self) -> None:
        """Flush, checkpoint and mark a clean shutdown; a fenced store (with a fence, asked
        first) writes nothing: see :meth:`abandon`."""
        if self.closed:
            return
        try:
            fenced = self._found_fenced()
        except OSError:
            log.exception(
                "%s: cannot tell whether a newer owner exists: closing unwritten", self.data_dir
            )
            fenced = True
        if fenced:
            self.abandon()
            return
        try:
            self.durability.write_held_back()
            self.flush()
        except StoreFenced as error:  # the flush's fsync found a newer owner
            self.durability.fence(error)
            self.abandon()
            return
        self.closed = True
        self.durability.release_waiters()  # durable now (waiters of a group commit never run)
        self.checkpoint()
        (self.data_dir / names.CLEAN_SHUTDOWN_FILE).touch()
        self._executor.shutdown(wait=True)
        super().close()

    def abandon(self) -> None:
        """Close without writing anything more to the directory (no flush, checkpoint or
        clean-shutdown marker): for a store that is fenced, or whose node lost its lease and
        drops its shards (docs/cluster.md section 11). Waiters not yet released fail with
        StoreFenced; what was appended and not acknowledged is left to the next owner's
        recovery."""
        if self.closed:
            return
        self.closed = True
        self.durability.fence(
            self.durability.fenced or StoreFenced(self.data_dir, "abandoned by its owner")
        )
        self._executor.shutdown(wait=True)
        super().close()
