"""TimerService: makes delayed records visible at their time, exactly once, across restarts.

The log is the source of truth (core/timers/__init__.py has the overview):

- ``__timers/0`` indexes every delayed record, in append order (the log's dispatcher puts a
  record with ``deliver_at_ms`` in the future there and nowhere else). A delayed LINK (a retry
  with back-off: ``store.link(..., deliver_at_ms=...)``) is a delayed record too.
- ``__timers/1`` (the *fired queue*) indexes every delayed record that has fired. A timer fires
  by one LINK record whose destinations are the record's own destinations **plus** ``__timers/1``,
  so becoming visible and being marked fired are one frame: after any crash the log holds both
  or neither. A delayed LINK fires the same way, the LINK itself being indexed (readers follow it
  to its target and add its headers).
- ``DATA_DIR/timers/`` holds derived data: the timer log and a checkpoint of the wheel
  (``timerlog.py``, ``wheel.py``, ``checkpoint.py``). On start the checkpoint is loaded, the
  ``__timers/0`` entries after it are inserted, and the fired-queue entries since its
  ``fired_floor`` are read into a set that filters what the wheel hands back. Without a usable
  checkpoint everything is rebuilt from the two queues.

Guarantees. A process crash (kill -9 at any instruction) loses no timer and makes none visible
twice. After an OS crash or power loss, a LINK the log had not yet fsync'ed is lost with the
rest of the log's unsynced tail, so its timers fire again: a reader that saw them before the
crash sees them once more (as with any record read before it was durable). Two rare shapes fire
in two LINK frames, visible first and marked second, so a crash between the two fires them again
once: a delayed LINK with several targets, and a record whose destination list leaves no room
in the frame for ``__timers/1``.

Firing is at ms precision from an in-memory window of the next few seconds (``lookahead_ms``),
filled a slot at a time from the wheel. The loop does bounded work per iteration and sleeps
until the earliest due time, a new ``__timers/0`` entry (index listener) or ``tick_ms``.

Thread-safety: event-loop thread only; fsyncs and the checkpoint write run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import struct
import time
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import NamedTuple

from core.clock import Clock, LoopClock
from core.log import LogStore
from core.log import record as rec
from core.log.consumequeue import ConsumeQueue
from core.log.names import TIMERS_TOPIC
from core.log.tags import tags_mask
from core.timers.checkpoint import (
    CheckpointError,
    TimerCheckpoint,
    read_checkpoint,
    write_checkpoint,
)
from core.timers.schedule import Due, TimerSchedule
from core.timers.timerlog import DEFAULT_ENTRIES_PER_FILE, TimerLog
from core.timers.wheel import DEFAULT_SLOT_MS, DEFAULT_SLOTS, SLOT_SIZE

log = logging.getLogger(__name__)

TIMERS_DIR = "timers"  # DATA_DIR/timers/: checkpoint, timerlog/
TIMERLOG_DIR = "timerlog"
SCHEDULED_QUEUE = 0  # __timers/0: every delayed record (written by the log's dispatcher)
FIRED_QUEUE = 1  # __timers/1: every delayed record that fired (written by this service)
FIRED_DESTINATION = (TIMERS_TOPIC, FIRED_QUEUE)

# The loop sleeps at most this long between looks at the clock (guards against clock jumps).
DEFAULT_TICK_MS = 100
# Slots are visited (loaded into memory) this far ahead of their time.
DEFAULT_LOOKAHEAD_MS = 2000
# RocketMQ flushes its timer checkpoint every second; replay after a crash covers at most this.
DEFAULT_CHECKPOINT_INTERVAL_MS = 5000
# Timers materialised in memory at most, besides one slot's worth (a burst due in one slot).
DEFAULT_MAX_WINDOW = 200_000
# Work per loop iteration before yielding to the event loop.
INGEST_BATCH = 1024
FIRE_BATCH = 1024
# Wheel-chain entries walked per iteration (a dense slot is loaded over several iterations).
VISIT_BUDGET = 2048
# Targets per LINK record (12 bytes each): 48 KiB bodies, and never more than a quarter segment.
MAX_LINK_TARGETS = 4096
# Lateness samples kept for the percentiles.
LATENESS_SAMPLES = 100_000
# Rebuild: fired positions sorted per chunk, then merged (bounded transient memory).
REBUILD_SORT_CHUNK = 1 << 18
_READ_BATCH = 1 << 14

# Offset of deliver_at_ms in a record frame (see core.log.record): total_size, magic, crc32c,
# flags, protocol, reserved, store_ms, born_ms come first.
DELIVER_AT_OFFSET = struct.calcsize("<IIIHBxqq")  # 32
_DELIVER_AT = struct.Struct("<q")
# Encoded size of one destination besides its name: u16 name length, u32 queue.
_DEST_OVERHEAD = struct.calcsize("<HI")
_MAX_DESTS_BYTES = 0xFFFF  # the frame's u16 dests_len

Destination = tuple[str, int]
_DESTS_LEN_FIELD = 17  # index of dests_len in record.HEADER's fields


class _Plan(NamedTuple):
    """Where a due timer record is indexed: its destinations (None: unknown, the record it
    points at is gone), the records a delayed LINK points at, and whether that LINK needs two
    steps (several targets: link them, then mark the LINK fired). ``info``: for a plain record,
    its ``(tag mask, record count)``, handed to the LINK so dispatch does not decode the record's
    header a second time. (A tuple, not a dataclass: one is built per fired timer.)"""

    where: tuple[Destination, ...] | None
    links: tuple[int, ...]
    split: bool
    info: tuple[int, int] | None = None


@dataclass
class TimerRecoveryReport:
    mode: str  # "checkpoint" or "rebuild"
    reason: str  # why a rebuild, or "" after a checkpoint load
    replayed: int  # __timers/0 entries inserted after the checkpoint (all of them on a rebuild)
    fired_since_checkpoint: int  # fired-queue entries read to filter the wheel
    pending: int
    duration_ms: float


class TimerService:
    """Fires delayed records. Recovers in the constructor; ``await start()`` runs it."""

    def __init__(
        self,
        store: LogStore,
        *,
        clock: Clock | None = None,
        tick_ms: int = DEFAULT_TICK_MS,
        slot_ms: int = DEFAULT_SLOT_MS,
        slots: int = DEFAULT_SLOTS,
        lookahead_ms: int = DEFAULT_LOOKAHEAD_MS,
        entries_per_file: int = DEFAULT_ENTRIES_PER_FILE,
        checkpoint_interval_ms: int | None = DEFAULT_CHECKPOINT_INTERVAL_MS,
        max_window: int = DEFAULT_MAX_WINDOW,
    ) -> None:
        if tick_ms < 1 or lookahead_ms < 0:
            raise ValueError("tick_ms must be positive and lookahead_ms not negative")
        self.store = store
        # The process's clock (core/clock.py): due times are wall-clock ms, as stored.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._wall_ms = self.clock.wall_ms
        self.tick_ms = tick_ms
        self.lookahead_ms = lookahead_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.max_window = max_window
        self.directory: Path = store.data_dir / TIMERS_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self._schedule = TimerSchedule(
            self.directory / TIMERLOG_DIR,
            slots=slots,
            slot_ms=slot_ms,
            entries_per_file=entries_per_file,
            start_slot=self._wall_ms() // slot_ms,
        )
        self._segment_size = store.commitlog.segment_size
        self._max_link_targets = max(1, min(MAX_LINK_TARGETS, self._segment_size // 4 // 12))
        self._owed_by_segment: dict[int, int] = {}
        self._pending = 0
        self._queue_entries = 0  # __timers/0 entries inserted into the schedule
        # After a restart: fired timers that a chain may still list, and until which slot.
        self._recovered_fired: set[int] | None = None
        self._recovered_floor = 0
        self._recovered_until_slot = 0
        self._dest_fits: dict[tuple[Destination, ...], bool] = {}
        # One shared tuple per single destination: consecutive timers group by identity first.
        self._targets: dict[Destination, tuple[Destination, ...]] = {}
        self._topic_names: dict[bytes, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._checkpoint_lock = asyncio.Lock()
        # The last image written, its write time zeroed: an idle shard's periodic checkpoint
        # would write the same again (a capture, an fsync'd file and a rename every interval).
        self._last_written: TimerCheckpoint | None = None
        self._wake: asyncio.Future[None] | None = None
        self._lateness: deque[int] = deque(maxlen=LATENESS_SAMPLES)
        self.metrics: dict[str, int] = {
            "scheduled": 0,  # __timers/0 entries inserted (replay included)
            "fired": 0,
            "links": 0,
            "unfireable": 0,  # records gone (retention) or corrupt when due
            "link_errors": 0,
            "split_fires": 0,  # delayed LINKs with several targets (two LINK records)
            "checkpoints": 0,
            "timerlog_files_deleted": 0,
        }
        self.recovery = self._recover()

    # -- public API ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start firing: registers the ``__timers/0`` index listener and the retention guard."""
        if self._task is not None:
            return
        if self._on_index not in self.store.index_listeners:
            self.store.index_listeners.append(self._on_index)
        if self.owes_segment not in self.store.retention_guards:
            self.store.retention_guards.append(self.owes_segment)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="braid-timers")

    async def stop(self) -> None:
        """Stop firing and write a final checkpoint. Call before closing the store."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._checkpoint_task is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint_task
            self._checkpoint_task = None
        with contextlib.suppress(ValueError):
            self.store.index_listeners.remove(self._on_index)
        if not self.store.closed:
            await self.checkpoint()
        self._stopped = True
        self._schedule.close()

    def pending_count(self) -> int:
        """Timers scheduled and not fired (records the service has not read yet included)."""
        return self._pending + self._unread_entries()

    def pending_by_destination(self) -> dict[Destination, tuple[int, int]]:
        """Pending timers per destination (a queue they become visible in): ``(count,
        earliest due ms)``. Read-only but for taking in what was scheduled since the loop
        last looked. Reads every pending timer's frame header: about as long as a restart's
        rebuild of that many timers takes, so it is for an operator's look, not a poll."""
        if not self._stopped:
            self._ingest(None)
        recovered = self._recovered_fired
        found: dict[Destination, tuple[int, int]] = {}
        for deliver_at, position in self._schedule.pending():
            if recovered is not None and position in recovered:
                continue  # fired before the restart; its chain is not visited again yet
            plan = self._plan(position)
            if plan is None or plan.where is None:
                continue  # its record is gone: it will not fire (counted as unfireable then)
            for destination in plan.where:
                if destination == FIRED_DESTINATION:
                    continue
                count, first_due = found.get(destination, (0, deliver_at))
                found[destination] = (count + 1, min(first_due, deliver_at))
        return found

    def owes_segment(self, start: int, end: int) -> bool:
        """Retention guard: True while ``[start, end)`` holds a pending timer's record (or a
        record a pending delayed LINK points at)."""
        if end <= start:
            return False
        if not self._stopped:
            self._ingest(None)  # count what was scheduled since the loop last looked
        first = start // self._segment_size
        last = (end - 1) // self._segment_size
        counts = self._owed_by_segment
        if any(counts.get(number) for number in range(first, last + 1)):
            return True
        # Stopped: records scheduled since are not counted; everything from the first is owed.
        unread_from = self._first_unread_position()
        return unread_from is not None and unread_from < end

    def lateness_percentiles(self) -> dict[str, float]:
        """Firing lateness (fire time minus due time, ms) over the last samples."""
        samples = sorted(self._lateness)
        if not samples:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0.0}

        def at(fraction: float) -> float:
            return float(samples[min(len(samples) - 1, int(fraction * len(samples)))])

        return {
            "p50": at(0.50),
            "p99": at(0.99),
            "max": float(samples[-1]),
            "samples": float(len(samples)),
        }

    def reset_lateness(self) -> None:
        self._lateness.clear()

    def stats(self) -> dict[str, object]:
        """Metrics for ``braid`` and the benchmark."""
        lateness = self.lateness_percentiles()
        return {
            **self.metrics,
            **{f"schedule_{k}": v for k, v in self._schedule.metrics.items()},
            "pending": self.pending_count(),
            "window": len(self._schedule.window),
            "open_slots": self._schedule.open_slots(),
            "timerlog_entries": self._schedule.timerlog.end - self._schedule.timerlog.start,
            "timerlog_files": self._schedule.timerlog.disk_files(),
            "lateness_p50_ms": lateness["p50"],
            "lateness_p99_ms": lateness["p99"],
            "lateness_max_ms": lateness["max"],
        }

    async def checkpoint(self, *, if_changed: bool = False) -> None:
        """Write a checkpoint: durable log first, then timer log, then the wheel image.
        ``if_changed``: not when the image is the one written last (the periodic ones)."""
        async with self._checkpoint_lock:
            image = self._capture()
            unchanged = dataclasses.replace(image, written_ms=0)
            if if_changed and unchanged == self._last_written:
                return
            log_end = self.store.commitlog.write_position
            fds = self._schedule.timerlog.take_dirty_fds()
            if not self.store.closed:
                await self.store.wait_durable(log_end)
            await asyncio.to_thread(TimerLog.sync_fds, fds)
            await asyncio.to_thread(write_checkpoint, self.directory, image)
            self._last_written = unchanged
            self.metrics["checkpoints"] += 1
            self.metrics["timerlog_files_deleted"] += self._schedule.timerlog.delete_before(
                image.timerlog_start
            )

    # -- log access ------------------------------------------------------------------------

    def _queue(self, queue: int) -> ConsumeQueue | None:
        return self.store.queue_index(TIMERS_TOPIC, queue)

    def _fired_entries(self) -> int:
        index = self._queue(FIRED_QUEUE)
        return 0 if index is None else index.next_entry

    def _unread_entries(self) -> int:
        index = self._queue(SCHEDULED_QUEUE)
        if index is None:
            return 0
        return max(0, index.next_entry - max(self._queue_entries, index.start_entry))

    def _first_unread_position(self) -> int | None:
        index = self._queue(SCHEDULED_QUEUE)
        if index is None:
            return None
        first = max(self._queue_entries, index.start_entry)
        return index.entry(first).position if first < index.next_entry else None

    @staticmethod
    def _entries(index: ConsumeQueue, first: int, end: int) -> Iterator[tuple[int, int]]:
        """``(commit-log position, frame size)`` of index entries ``[first, end)`` still there."""
        number = max(first, index.start_entry)
        while number < end:
            batch = index.raw_entries(number, min(_READ_BATCH, end - number))
            if not batch:
                return
            for entry in batch:
                yield entry[0], entry[1]
            number += len(batch)

    def _frame(self, position: int) -> tuple[memoryview, int] | None:
        try:
            buf, start, _size = self.store.commitlog.read_frame(position)
        except (KeyError, rec.CorruptRecordError) as error:
            log.error("timer record at %d unreadable: %r", position, error)
            return None
        return buf, start

    def _scan(self, position: int) -> tuple[int, tuple[int, ...]] | None:
        """``(deliver_at_ms, positions a delayed LINK points at)`` of a timer record."""
        found = self._frame(position)
        if found is None:
            return None
        buf, start = found
        deliver_at = int(_DELIVER_AT.unpack_from(buf, start + DELIVER_AT_OFFSET)[0])
        if not rec.FLAGS.unpack_from(buf, start + rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            return deliver_at, ()
        links = rec.decode_link_body(rec.body_slice(buf, start))
        return deliver_at, tuple(target for target, _size in links)

    def _plan(self, position: int) -> _Plan | None:
        """How to make the timer record at ``position`` visible (None: it is gone)."""
        try:
            # The frame's CRC was checked when it was scheduled (_scan) and readers check it
            # again; firing reads only its header (a verify per fired timer was ~10% of the CPU).
            buf, start = self.store.commitlog.frame_unchecked(position)
        except KeyError as error:
            log.error("timer record at %d unreadable: %r", position, error)
            return None
        _total, count, tags, own_targets = rec.index_fields(buf, start)
        if not rec.FLAGS.unpack_from(buf, start + rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            where = self._targets.get(own_targets[0]) if len(own_targets) == 1 else None
            if where is None:
                where = tuple(own_targets)
                if len(where) == 1:
                    self._targets[where[0]] = where
            return _Plan(where, (), False, (tags_mask(tags) if tags else 0, count))
        # A delayed LINK (a retry with back-off): it takes effect now, as if appended now.
        links = tuple(target for target, _ in rec.decode_link_body(rec.body_slice(buf, start)))
        named = rec.HEADER.unpack_from(buf, start)[_DESTS_LEN_FIELD] > 0
        if len(links) != 1:
            # Readers follow a LINK entry to one target: link the targets, then mark the LINK.
            return _Plan(tuple(own_targets) if named else None, links, split=True)
        if named:
            # The LINK itself is indexed (readers follow it and add its headers).
            return _Plan(tuple(own_targets), links, split=False)
        target = self._frame(links[0])
        if target is None:
            return _Plan(None, links, split=False)
        return _Plan(tuple(rec.index_fields(*target)[3]), links, split=False)

    def _count(self, position: int, links: tuple[int, ...], delta: int) -> None:
        """Count a timer in (1) or out (-1): pending, and what its segments owe (a delayed LINK
        also holds the segments of the records it points at)."""
        self._pending += delta
        counts = self._owed_by_segment
        for held in (position, *links):
            number = held // self._segment_size
            count = counts.get(number, 0) + delta
            if count:
                counts[number] = count
            else:
                counts.pop(number, None)

    # -- recovery --------------------------------------------------------------------------

    def _recover(self) -> TimerRecoveryReport:
        started = time.perf_counter()
        reason = ""
        checkpoint: TimerCheckpoint | None = None
        try:
            checkpoint = read_checkpoint(self.directory)
            reason = "no checkpoint" if checkpoint is None else self._unusable(checkpoint)
        except CheckpointError as error:
            reason = f"checkpoint unusable: {error}"
        if checkpoint is not None and not reason:
            replayed, fired = self._load_checkpoint(checkpoint)
            mode = "checkpoint"
        else:
            replayed, fired = self._rebuild(), 0
            mode = "rebuild"
        report = TimerRecoveryReport(
            mode,
            reason,
            replayed,
            fired,
            self.pending_count(),
            (time.perf_counter() - started) * 1000,
        )
        if mode == "rebuild" and (replayed or reason != "no checkpoint"):
            log.warning("timers rebuilt from the log (%s): %s", reason, report)
        else:
            log.info("timers recovered: %s", report)
        return report

    def _unusable(self, checkpoint: TimerCheckpoint) -> str:
        """Why a checkpoint cannot be continued from ("" if it can)."""
        schedule = self._schedule
        wanted = (schedule.slot_ms, schedule.slots, schedule.timerlog.entries_per_file)
        found = (checkpoint.slot_ms, checkpoint.slots, checkpoint.entries_per_file)
        if wanted != found:
            return f"wheel parameters changed from {found} to {wanted}"
        if len(checkpoint.wheel) != schedule.slots * SLOT_SIZE:
            return "wheel image has the wrong size"
        scheduled = self._queue(SCHEDULED_QUEUE)
        if checkpoint.queue_entries > (0 if scheduled is None else scheduled.next_entry):
            return "the __timers/0 queue is shorter than the checkpoint (log lost data?)"
        if checkpoint.fired_entries > self._fired_entries():
            return "the fired queue is shorter than the checkpoint (log lost data?)"
        if not schedule.timerlog.covers(checkpoint.timerlog_start, checkpoint.timerlog_end):
            return "timer-log files are missing"
        return ""

    def _load_checkpoint(self, checkpoint: TimerCheckpoint) -> tuple[int, int]:
        self._schedule.restore(
            checkpoint.wheel,
            checkpoint.resume_slot,
            checkpoint.timerlog_start,
            checkpoint.timerlog_end,
        )
        self._owed_by_segment = dict(checkpoint.segments)
        self._pending = checkpoint.pending
        # Fired since the floor: filter for the chains. Fired since the checkpoint: count out.
        fired: set[int] = set()
        fired_index = self._queue(FIRED_QUEUE)
        if fired_index is not None:
            for position, _ in self._entries(
                fired_index, checkpoint.fired_floor, fired_index.next_entry
            ):
                fired.add(position)
            for position, _ in self._entries(
                fired_index, checkpoint.fired_entries, fired_index.next_entry
            ):
                # A record gone meanwhile: so are the older segments its LINK held (retention
                # deletes oldest first); the counts left for them are pruned.
                scanned = self._scan(position)
                self._count(position, () if scanned is None else scanned[1], -1)
        if fired:
            self._recovered_fired = fired
            self._recovered_floor = checkpoint.fired_floor
            horizon = (self._wall_ms() + self.lookahead_ms) // self._schedule.slot_ms + 1
            self._recovered_until_slot = horizon
        self._queue_entries = checkpoint.queue_entries
        replayed = self._ingest(None)
        return replayed, len(fired)

    def _rebuild(self) -> int:
        """Insert every unfired entry of ``__timers/0``, from scratch."""
        self._schedule.reset(self._wall_ms() // self._schedule.slot_ms)
        self._owed_by_segment = {}
        self._pending = 0
        scheduled = self._queue(SCHEDULED_QUEUE)
        if scheduled is None:
            self._queue_entries = 0
            return 0
        fired = self._sorted_fired_positions()
        next_fired = next(fired, None)
        fired_mark = self._fired_entries()
        inserted = 0
        for position, size in self._entries(scheduled, scheduled.start_entry, scheduled.next_entry):
            # Both are commit-log positions; __timers/0 is in log order: a merge join.
            while next_fired is not None and next_fired < position:
                next_fired = next(fired, None)
            if next_fired == position:
                continue
            if self._insert(position, size, fired_mark):
                inserted += 1
        self._queue_entries = scheduled.next_entry
        return inserted

    def _sorted_fired_positions(self) -> Iterator[int]:
        index = self._queue(FIRED_QUEUE)
        if index is None:
            return iter(())
        chunks: list[array[int]] = []
        chunk: list[int] = []
        for position, _ in self._entries(index, index.start_entry, index.next_entry):
            chunk.append(position)
            if len(chunk) >= REBUILD_SORT_CHUNK:
                chunk.sort()
                chunks.append(array("Q", chunk))
                chunk = []
        chunk.sort()
        chunks.append(array("Q", chunk))
        return heapq.merge(*chunks)

    # -- ingesting -------------------------------------------------------------------------

    def _insert(self, position: int, size: int, fired_mark: int, *, fired: bool = False) -> bool:
        """Count a ``__timers/0`` entry in and put it on the wheel (``fired``: it fired before a
        restart, so it is only counted; recovery counts its firing out)."""
        scanned = self._scan(position)
        if scanned is None:
            self.metrics["unfireable"] += 1
            return False
        deliver_at, links = scanned
        self._count(position, links, 1)
        if not fired:
            self._schedule.insert(deliver_at, position, size, fired_mark)
            self.metrics["scheduled"] += 1
        return True

    def _fired_mark(self) -> int:
        mark = self._fired_entries()
        if self._recovered_fired is not None:
            mark = min(mark, self._recovered_floor)
        return mark

    def _ingest(self, limit: int | None) -> int:
        """Insert new ``__timers/0`` entries (at most ``limit``); returns how many were read."""
        index = self._queue(SCHEDULED_QUEUE)
        if index is None:
            return 0
        first = max(self._queue_entries, index.start_entry)
        end = index.next_entry if limit is None else min(index.next_entry, first + limit)
        if first >= end:
            return 0
        fired_mark = self._fired_mark()
        recovered = self._recovered_fired
        read = 0
        for position, size in self._entries(index, first, end):
            read += 1
            fired = recovered is not None and position in recovered
            self._insert(position, size, fired_mark, fired=fired)
        self._queue_entries = first + read
        return read

    # -- firing ----------------------------------------------------------------------------

    def _fits(self, destinations: tuple[Destination, ...]) -> bool:
        fits = self._dest_fits.get(destinations)
        if fits is None:
            size = sum(_DEST_OVERHEAD + len(topic.encode()) for topic, _ in destinations)
            fits = self._dest_fits[destinations] = size <= _MAX_DESTS_BYTES
        return fits

    def _link(
        self,
        frames: Sequence[tuple[int, int]],
        targets: tuple[Destination, ...],
        infos: Sequence[tuple[int, int]] | None,
    ) -> None:
        destinations = (*targets, FIRED_DESTINATION)
        positions = [position for position, _ in frames]
        if self._fits(destinations):
            # Sizes come from the timer log, index fields from _plan: one LINK for the batch,
            # dispatched without reading each record's header again.
            self.store.link_frames(frames, destinations, index_info=infos)
        else:
            # The destination list of this record leaves no room for the fired queue in one
            # frame: visible first, marked second. A crash in between fires it again.
            self.store.link(positions, targets)
            self.store.link(positions, [FIRED_DESTINATION])
            self.metrics["links"] += 1
        self.metrics["links"] += 1

    def _link_split(self, position: int, plan: _Plan) -> None:
        """A delayed LINK with several targets: link them as it says, then mark it fired. A
        crash in between fires it again (nothing uses such LINKs yet: the broker's retries
        have one target)."""
        self.store.link(plan.links, plan.where)
        self.store.link([position], [FIRED_DESTINATION])
        self.metrics["links"] += 2
        self.metrics["split_fires"] += 1

    def _fire_due(self, now: int) -> int:
        """Link the timers due at ``now``, in due order; returns how many were handled."""
        due = self._schedule.pop_due(now, FIRE_BATCH)
        if not due:
            return 0
        recovered = self._recovered_fired
        runs: list[tuple[object, Due, _Plan]] = []
        dropped: list[Due] = []
        for item in due:
            position = item[1]
            if recovered is not None and position in recovered:
                dropped.append(item)  # fired before the restart (never loaded: defensive)
                continue
            plan = self._plan(position)
            if plan is None or (plan.where is None and not plan.split):
                self.metrics["unfireable"] += 1
                self._count(position, () if plan is None else plan.links, -1)
                dropped.append(item)
                continue
            # Consecutive timers with the same destinations share a LINK (due order is kept).
            runs.append((plan.where if not plan.split else item, item, plan))
        self._schedule.fired(dropped, self._fired_mark())
        done: list[tuple[Due, _Plan]] = []
        try:
            for key, group in groupby(runs, key=lambda run: run[0]):
                batch = [(item, plan) for _, item, plan in group]
                if batch[0][1].split:
                    self._link_split(batch[0][0][1], batch[0][1])
                    done.extend(batch)
                    continue
                assert isinstance(key, tuple)
                for chunk_start in range(0, len(batch), self._max_link_targets):
                    chunk = batch[chunk_start : chunk_start + self._max_link_targets]
                    infos = [plan.info for _, plan in chunk if plan.info is not None]
                    self._link(
                        [(item[1], item[2]) for item, _ in chunk],
                        key,
                        infos if len(infos) == len(chunk) else None,
                    )
                    done.extend(chunk)
        except Exception:
            self.metrics["link_errors"] += 1
            linked = {id(item) for item, _ in done}
            self._schedule.push_back([item for _, item, _ in runs if id(item) not in linked])
            raise
        finally:
            fired_at = self._wall_ms()
            for item, plan in done:
                self._lateness.append(fired_at - item[0])
                self._count(item[1], plan.links, -1)
            self.metrics["fired"] += len(done)
            self._schedule.fired([item for item, _ in done], self._fired_mark())
        return len(due)

    # -- the loop --------------------------------------------------------------------------

    def _on_index(self, topic: str, queue: int, offset: int) -> None:
        if queue == SCHEDULED_QUEUE and topic == TIMERS_TOPIC:
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)

    def step(self) -> bool:
        """One round of work (ingest, visit slots, fire); True if more is waiting right now."""
        ingested = self._ingest(INGEST_BATCH)
        schedule = self._schedule
        now = self._wall_ms()
        walked = schedule.advance(
            (now + self.lookahead_ms) // schedule.slot_ms,
            self._fired_mark(),
            max_window=self.max_window,
            is_fired=self._recovered_fired.__contains__ if self._recovered_fired else None,
            budget=VISIT_BUDGET,
        )
        fired = self._fire_due(now)
        recovering = self._recovered_fired is not None
        if recovering and schedule.visited_every_chain_since(self._recovered_until_slot):
            self._recovered_fired = None  # every chain that could list them has been visited
        return ingested == INGEST_BATCH or fired == FIRE_BATCH or walked >= VISIT_BUDGET

    def _sleep_ms(self) -> int:
        schedule = self._schedule
        now = self._wall_ms()
        wait = self.tick_ms
        due = schedule.next_due()
        if due is not None:
            wait = min(wait, due - now)
        if len(schedule.window) < self.max_window:
            wait = min(wait, schedule.horizon * schedule.slot_ms - self.lookahead_ms - now)
        return max(wait, 0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = self.clock
        interval = self.checkpoint_interval_ms
        next_checkpoint = clock.now_ms() + (interval or 0)
        while True:
            try:
                busy = self.step()
            except Exception:
                log.exception("timer service step failed")
                busy = False
                await asyncio.sleep(self.tick_ms / 1000)
            if interval and clock.now_ms() >= next_checkpoint:
                next_checkpoint = clock.now_ms() + interval
                if self._checkpoint_task is None or self._checkpoint_task.done():
                    self._checkpoint_task = loop.create_task(self._checkpoint_logged())
            if busy:
                await asyncio.sleep(0)
                continue
            wait = self._sleep_ms()
            if wait <= 0:
                await asyncio.sleep(0)
                continue
            wake = self._wake = loop.create_future()
            handle = loop.call_later(wait / 1000, _resolve, wake)
            try:
                await wake
            finally:
                handle.cancel()
                self._wake = None

    async def _checkpoint_logged(self) -> None:
        try:
            await self.checkpoint(if_changed=True)
        except Exception:
            log.exception("timer checkpoint failed")

    def _capture(self) -> TimerCheckpoint:
        schedule = self._schedule
        fired_now = self._fired_entries()
        oldest = self.store.commitlog.start_position // self._segment_size
        for number in [n for n in self._owed_by_segment if n < oldest]:
            del self._owed_by_segment[number]  # deleted already (see _load_checkpoint)
        return TimerCheckpoint(
            slot_ms=schedule.slot_ms,
            slots=schedule.slots,
            entries_per_file=schedule.timerlog.entries_per_file,
            queue_entries=self._queue_entries,
            fired_entries=fired_now,
            fired_floor=min(schedule.fired_floor(fired_now), self._fired_mark()),
            timerlog_start=schedule.oldest_live_entry(),
            timerlog_end=schedule.timerlog.end,
            resume_slot=schedule.resume_slot(),
            written_ms=self._wall_ms(),
            pending=self._pending,
            segments=dict(self._owed_by_segment),
            wheel=bytes(schedule.wheel.buf),
        )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
