"""The CommitLog: every record body is written here exactly once.

A sequence of fixed-size :class:`~core.log.segment.Segment` files; a position is a byte offset
in the whole log, so the segment holding position ``p`` is ``p // segment_size`` (arithmetic, no
search). Named positions, as RocketMQ's MappedFile keeps them:

- ``write_position``: end of the last appended frame (writer only);
- ``flushed_position``: everything before it has been fdatasync'ed;
- ``start_position``: base of the oldest segment still on disk (retention moves it).

Seals (docs/cluster.md section 5.4, :mod:`core.log.fence`): ``seals`` maps a segment's base
position to the end of its valid bytes when an owner took the log over after an unclean stop;
what lies past a seal was written by a fenced owner, and scans and reads ignore it. Nobody
writes into a sealed segment. With a fence (``fence_check``), :meth:`sync_to` asks it after each
fsync and moves ``flushed_position`` only when it says not fenced.

One writer thread appends; ``sync_to`` may run in another thread (it only calls fdatasync).
Readers (this process or another, read-only) use :meth:`read_frame`, which verifies the CRC.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from crc32c import crc32c

from core.log import names
from core.log import record as rec
from core.log.fence import StoreFenced
from core.log.segment import DiskFullError, Segment, preallocate, pwrite_all, start_writeback

log = logging.getLogger(__name__)

_NO_SEGMENT = -(1 << 62)
_PAGE = 4096
# The writer reserves commit-log blocks this far ahead (see activate, segment.preallocate).
PREALLOCATE_BYTES = 16 << 20
# Writers start writeback every this many appended bytes (CommitLog.writeback_range).
WRITEBACK_BYTES = 1 << 20
# Frames of at least this many bytes are written with pwrite, not through the mapping (append).
PWRITE_BYTES = 32 * 1024
_NEVER_TRUSTED = 1 << 62


class CommitLog:
    def __init__(self, directory: Path, segment_size: int, *, writable: bool) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.writable = writable
        self.segments: dict[int, Segment] = {}  # segment number -> segment
        self.write_position = 0
        self.flushed_position = 0
        # The segment being appended to, cached for the store's in-place encoders: its base
        # position and mapping. A base far below any position means "none" (so the offset
        # ``write_position - active_base`` never looks like room in the segment).
        self.active_base = _NO_SEGMENT
        self.active_buf: memoryview | None = None
        self.active_fd = -1
        # In-place writers may fill the active segment up to this offset without calling
        # activate(): the end of its preallocated stretch (or of the segment).
        self.active_end = 0
        # Appended bytes before this position have had their writeback started (see
        # writeback_range): the writer asks every WRITEBACK_BYTES.
        self.writeback_position = 0
        # Frames in [trusted_start, write_position) were encoded by this process after
        # recovery (see trust_from): the read path skips their CRC check. Everything written
        # before this process opened the log, and everything a read-only reader sees, is checked.
        self.trusted_start = _NEVER_TRUSTED
        # Called each time the writer reserves a new stretch of blocks (every PREALLOCATE_BYTES
        # appended, and at each new segment), and when a reservation finds the disk full: the
        # store checks the free space then (core.log.diskspace), beside its periodic check.
        self.on_reserve: Callable[[bool], None] | None = None
        # Segment base position -> end of its valid bytes (see the module docstring); set by
        # the reader from the epoch files and by recovery when it seals.
        self.seals: dict[int, int] = {}
        # Whether a newer owner claimed the log (core.log.fence.Fence.is_fenced): asked once per
        # fsync by sync_to; None for a single node. Once it said yes, ``fenced`` stays True and
        # nothing is synced again.
        self.fence_check: Callable[[], bool] | None = None
        self.fenced = False
        self._sync_lock = threading.Lock()
        if writable:
            directory.mkdir(parents=True, exist_ok=True)
        self.refresh()

    # -- discovery -------------------------------------------------------------------------

    def refresh(self) -> None:
        """Map segment files that appeared and forget ones retention deleted."""
        on_disk: dict[int, Path] = {}
        if self.directory.exists():
            for path in self.directory.glob(f"*{names.SEGMENT_SUFFIX}"):
                base = names.number_of(path)
                if base % self.segment_size:
                    raise ValueError(f"{path} is not aligned to segment size {self.segment_size}")
                on_disk[base // self.segment_size] = path
        for number in list(self.segments):
            if number not in on_disk:
                if number * self.segment_size == self.active_base:
                    self._deactivate()
                self.segments.pop(number).close()
        for number, path in sorted(on_disk.items()):
            if number not in self.segments:
                self.segments[number] = Segment(
                    path, number * self.segment_size, self.segment_size, writable=self.writable
                )

    @property
    def start_position(self) -> int:
        return min(self.segments) * self.segment_size if self.segments else 0

    def segment_numbers(self) -> list[int]:
        return sorted(self.segments)

    def _segment(self, number: int) -> Segment:
        segment = self.segments.get(number)
        if segment is None:
            check = self.fence_check
            if check is not None and check():
                # A writer rolling into a new segment asks the fence first: a newer owner may
                # have started writing there (it starts at the segment boundary after the end
                # it recovered, which is where this writer rolls to). Once per segment.
                self.refuse_appends()
                raise StoreFenced(self.directory.parent)
            path = self.directory / names.segment_name(number * self.segment_size)
            segment = Segment(path, number * self.segment_size, self.segment_size, writable=True)
            self.segments[number] = segment
        return segment

    # -- writing ---------------------------------------------------------------------------

    def max_frame_size(self) -> int:
        return self.segment_size

    def append(self, frame: bytes | bytearray | memoryview) -> int:
        """Write one frame and return its position. Rolls to a new segment when needed.

        Every byte goes into blocks reserved first (:meth:`activate`), so a full disk is a
        :class:`~core.log.segment.DiskFullError` before the write, never a SIGBUS in it.

        A large frame (a Kafka batch, a big message) is written with pwrite rather than through
        the mapping, as append_many's staged batches are: the kernel then fills page-cache pages
        without zeroing each one in a page fault first (measured with a Kafka producer of 1 MB
        batches: that zeroing was 45% of the broker's CPU). Same pages as the mapping."""
        size = len(frame)
        self._make_room(size)
        position = self.write_position
        offset = position - self.active_base
        if size >= PWRITE_BYTES:
            pwrite_all(self.active_fd, frame, offset)
            self._written_to_file(position + size)
            return position
        buf = self.active_buf
        assert buf is not None
        buf[offset : offset + size] = frame
        self.write_position = position + size
        return position

    def _make_room(self, size: int) -> None:
        """Make the segment a frame of ``size`` bytes goes to the active one, with blocks
        reserved for it: the segment at ``write_position`` if the frame fits there (it fills
        the segment exactly or leaves room for a BLANK prefix, so a reader always finds a frame
        or a BLANK where written data continues), else the next one after closing this one
        with a BLANK frame. ValueError for a frame larger than a segment."""
        if self.activate(size):
            return
        if size > self.segment_size:
            raise ValueError(f"frame of {size} bytes exceeds segment size {self.segment_size}")
        number, offset = divmod(self.write_position, self.segment_size)
        remaining = self.segment_size - offset
        if remaining:
            self.activate(remaining)  # fits exactly; reserves the blocks up to the segment end
            buf = self.active_buf
            assert buf is not None
            buf[offset:] = rec.blank_frame(remaining)
        self.write_position = (number + 1) * self.segment_size
        if not self.activate(size):  # pragma: no cover - a frame up to a segment fits a new one
            raise ValueError(f"frame of {size} bytes does not fit a new segment")

    def append_parts(self, head: bytes, body: bytes | memoryview) -> int:
        """:meth:`append` of the frame ``head + body`` (core.log.record.encode_record_parts): a
        large one goes to the file with one pwritev, never joined in memory."""
        size = len(head) + len(body)
        if size < PWRITE_BYTES or not self.activate(size):
            return self.append(head + body if body else head)
        position = self.write_position
        offset = position - self.active_base
        written = os.pwritev(self.active_fd, (head, body), offset)
        if written < size:  # a short write: the rest with pwrite
            pwrite_all(self.active_fd, (head + body)[written:], offset + written)
        self._written_to_file(position + size)
        return position

    def _written_to_file(self, end: int) -> None:
        """Advance to ``end`` after a pwrite, starting writeback every WRITEBACK_BYTES (as
        append_many does; see core.log.segment.start_writeback)."""
        self.write_position = end
        if end - self.writeback_position >= WRITEBACK_BYTES:
            found = self.writeback_range()
            if found is not None:
                start_writeback(*found)

    def writable_buffer(self, number: int) -> memoryview:
        """The mapping of segment ``number`` (created if new), for a writer that encodes a frame
        in place; it must then advance ``write_position`` itself."""
        return self._segment(number).buf

    def activate(self, size: int) -> bool:
        """Point ``active_base``/``active_buf`` at the segment holding ``write_position`` if a
        frame of ``size`` bytes fits there (else False: :meth:`append` rolls)."""
        number, offset = divmod(self.write_position, self.segment_size)
        remaining = self.segment_size - offset
        if size != remaining and size + rec.PREFIX.size > remaining:
            return False
        segment = self._segment(number)
        base = number * self.segment_size
        active_end = self.active_end if base == self.active_base else offset
        if offset + size > active_end or size == remaining:
            # Blocks are reserved PREALLOCATE_BYTES ahead of the writer, not for the whole
            # segment at creation: a 1 GiB segment per store would take 1 GiB of disk at once.
            end = min(
                self.segment_size, -(-(offset + size) // PREALLOCATE_BYTES) * PREALLOCATE_BYTES
            )
            try:
                active_end = self._reserve(segment, active_end, offset + size, end)
            except DiskFullError:
                self._deactivate()  # the in-place writers must come back here, not write
                raise
        self.active_end = active_end
        self.active_buf = segment.buf
        self.active_fd = segment.fd
        self.active_base = base
        return True

    def _reserve(self, segment: Segment, start: int, needed: int, wanted: int) -> int:
        """Reserve ``segment``'s blocks from ``start`` up to ``wanted`` (at least
        ``needed``); returns the end reserved. Near a full disk it takes what the frame needs
        alone (whole pages), so the log's own writes (acks, offsets) can use the last blocks
        the disk alarm kept free; DiskFullError when even those are not there."""
        notify = self.on_reserve
        try:
            preallocate(segment.fd, start, wanted - start)
        except DiskFullError:
            if notify is not None:
                notify(True)
            wanted = min(wanted, -(-needed // _PAGE) * _PAGE)
            if wanted < needed:  # a frame that ends at the segment's last (unaligned) byte
                wanted = needed
            preallocate(segment.fd, start, wanted - start)  # raises when the disk is full
            return wanted
        if notify is not None:
            notify(False)
        return wanted

    def writeback_range(self) -> tuple[int, int, int] | None:
        """``(fd, offset, length)`` of the active segment's whole pages appended since the last
        call, to hand to :func:`core.log.segment.start_writeback`; None if there are none."""
        start = max(self.writeback_position, self.active_base)
        end = self.write_position & ~(_PAGE - 1)
        self.writeback_position = max(end, self.writeback_position)
        if end <= start or self.active_fd < 0:
            return None
        return self.active_fd, start - self.active_base, end - start

    def trust_from(self, position: int) -> None:
        """Frames this writer appends from ``position`` on skip the CRC check on reads (called
        once recovery has settled the end of the log, unless ``LogStore(check_own_writes=True)``).

        Why that is safe enough: their CRC was computed moments before from the same bytes this
        process copied into the shared mapping, so a check could only fail if memory were
        corrupted. What a check on read catches is corruption on disk (bit rot, a torn write
        before a crash), and that shows only when a page is read back from disk: always the
        case for a reader in another process or after a restart, which check every frame (the
        flipped-byte tests), and for this process only if the kernel evicted the page and read
        it again. Kafka brokers do not check record CRCs on fetch at all; RocketMQ only on
        recovery. ``braid log verify`` checks every frame of every segment."""
        self.trusted_start = position

    def _deactivate(self) -> None:
        self.active_base = _NO_SEGMENT
        self.active_buf = None
        self.active_fd = -1
        self.active_end = 0

    def append_frames(self, frames: list[bytes]) -> list[int]:
        """Write several frames with as few copies into the mapping as segment bounds allow:
        each run of frames that fits the current segment is joined and written at once."""
        positions: list[int] = []
        run: list[bytes] = []
        run_start = self.write_position
        cursor = run_start
        segment_size = self.segment_size
        for frame in frames:
            size = len(frame)
            remaining = segment_size - cursor % segment_size
            if size != remaining and size + rec.PREFIX.size > remaining:
                self._write_run(run_start, run)
                run = []
                positions.append(self.append(frame))  # rolls the segment
                cursor = run_start = self.write_position
                continue
            positions.append(cursor)
            run.append(frame)
            cursor += size
            if cursor % segment_size == 0:  # the frame filled the segment: no run spans two
                self._write_run(run_start, run)
                run = []
                run_start = cursor
        self._write_run(run_start, run)
        return positions

    def _write_run(self, start: int, frames: list[bytes]) -> None:
        """Write frames that fit the segment at ``start`` (== write_position) in one copy."""
        if not frames:
            return
        data = b"".join(frames)
        if not self.activate(len(data)):  # pragma: no cover - append_frames made it fit
            raise ValueError("a run of frames does not fit its segment")
        offset = start - self.active_base
        buf = self.active_buf
        assert buf is not None
        buf[offset : offset + len(data)] = data
        self.write_position = start + len(data)

    def sync_to(self, position: int) -> int:
        """Make everything before ``position`` durable; returns the new flushed position.

        With a ``fence_check``, it is asked after the fsyncs and before ``flushed_position``
        moves (section 5.3: what is released was on disk before the check found no newer
        owner); fenced, it raises :class:`~core.log.fence.StoreFenced`, now and at every later
        call, without syncing again."""
        with self._sync_lock:
            if self.fenced:
                raise StoreFenced(self.directory.parent)
            if position <= self.flushed_position:
                return self.flushed_position
            first = self.flushed_position // self.segment_size
            last = (position - 1) // self.segment_size
            for number in range(first, last + 1):
                segment = self.segments.get(number)
                if segment is not None:
                    segment.sync()
            check = self.fence_check
            if check is not None and check():
                self.fenced = True
                raise StoreFenced(self.directory.parent)
            self.flushed_position = position
            return position

    def refuse_appends(self) -> None:
        """After a fence (on the writer's thread): every later append raises StoreFenced. The
        cached segment is dropped, so the in-place writers go through :meth:`activate`, which
        refuses; replacing the method here keeps any check off the unfenced append path."""
        self.fenced = True
        self._deactivate()
        self.activate = self._refuse  # type: ignore[method-assign]

    def _refuse(self, size: int) -> bool:
        raise StoreFenced(self.directory.parent)

    # -- seals -----------------------------------------------------------------------------

    def seal(self, end: int) -> int:
        """Seal the segment holding ``end`` at ``end`` (the recovered end after an unclean
        ownership change) and return the base of that segment."""
        base = end - end % self.segment_size
        self.seals = {**self.seals, base: min(end, self.seals.get(base, end))}
        return base

    def first_unsealed(self, position: int) -> int:
        """``position``, or the next segment boundary whose segment carries no seal if the
        segment holding ``position`` has one: nobody writes into a sealed segment."""
        while self.seals:
            base = position - position % self.segment_size
            if base not in self.seals:
                break
            position = base + self.segment_size
        return position

    def _next_segment_after(self, number: int) -> int | None:
        """The number of the first segment on disk after ``number`` (segments after a seal may
        skip a number: the new owner starts at the next boundary)."""
        later = [n for n in self.segments if n > number]
        return min(later) if later else None

    # -- reading ---------------------------------------------------------------------------

    def read_frame(self, position: int) -> tuple[memoryview, int, int]:
        """``(segment buffer, offset in it, frame size)`` for the frame at ``position``.

        Raises :class:`~core.log.record.CorruptRecordError` if the frame fails verification and
        ``KeyError`` if its segment is gone (deleted by retention).
        """
        number, offset = divmod(position, self.segment_size)
        segment = self.segments.get(number)
        if segment is None:
            if not self.writable:
                self.refresh()
                segment = self.segments.get(number)
            if segment is None:
                raise KeyError(position)
        if self.seals and position >= self.seals.get(segment.base, position + 1):
            raise KeyError(position)  # past its segment's seal: a fenced owner's, not the log's
        try:
            size = rec.verify_frame(segment.buf, offset, len(segment.buf))
        except rec.CorruptRecordError as error:
            log.error("segment %s: %s", segment.path.name, error.reason)
            raise rec.CorruptRecordError(position, error.reason) from None
        return segment.buf, offset, size

    def segment_at(self, position: int) -> Segment | None:
        """The segment holding ``position`` (a reader maps new files first), None if gone."""
        segment = self.segments.get(position // self.segment_size)
        if segment is None and not self.writable:
            self.refresh()
            segment = self.segments.get(position // self.segment_size)
        return segment

    def frame_unchecked(self, position: int) -> tuple[memoryview, int]:
        """``(segment buffer, offset)`` of a frame this process already verified or wrote (no
        CRC check: for the dispatcher following a LINK). KeyError if its segment is gone."""
        number, offset = divmod(position, self.segment_size)
        return self.segments[number].buf, offset

    def scan(self, start: int, end: int | None = None) -> Iterator[tuple[int, int, int]]:
        """Yield ``(position, frame size, magic)`` of each frame from ``start`` (to ``end``); BLANK
        fillers are skipped. Stops at unwritten space. A corrupt frame raises CorruptRecordError.
        A sealed segment ends at its seal; the scan goes on with the next segment on disk.

        The inner loop runs once per frame over one segment with everything in locals and one
        prefix unpack per frame (the prefix used to be read three times per frame)."""
        segment_size = self.segment_size
        stop_at = end
        position = start
        unpack_prefix = rec.PREFIX.unpack_from
        record_magic = rec.RECORD_MAGIC
        blank_magic = rec.BLANK_MAGIC
        header_size = rec.HEADER_SIZE
        crc_start = rec.CRC_START
        seals = self.seals
        while stop_at is None or position < stop_at:
            number, offset = divmod(position, segment_size)
            base = number * segment_size
            seal = seals.get(base) if seals else None
            segment = self.segments.get(number)
            if segment is None:
                following = None if seal is None else self._next_segment_after(number)
                if following is None:
                    return
                position = following * segment_size
                continue
            buf = segment.buf
            limit = len(buf)
            segment_stop = limit if stop_at is None else min(limit, stop_at - base)
            if seal is not None:
                segment_stop = min(segment_stop, seal - base)
            while offset < segment_stop:
                if offset + 12 > limit:
                    break
                total, magic, crc = unpack_prefix(buf, offset)
                if total == 0:
                    break
                if magic == record_magic:
                    if total < header_size or offset + total > limit:
                        raise rec.CorruptRecordError(base + offset, f"bad size {total}")
                    if crc32c(buf[offset + crc_start : offset + total]) != crc:
                        raise rec.CorruptRecordError(base + offset, "crc32c mismatch")
                    yield base + offset, total, magic
                elif magic == blank_magic:
                    if total < crc_start or offset + total > limit:
                        raise rec.CorruptRecordError(base + offset, f"bad blank size {total}")
                else:
                    raise rec.CorruptRecordError(base + offset, f"bad magic 0x{magic:08x}")
                offset += total
            if stop_at is not None and base + offset >= stop_at:
                return
            if seal is not None:
                following = self._next_segment_after(number)
                if following is None:
                    return
                position = following * segment_size
                continue
            if offset < limit and (offset == 0 or number + 1 not in self.segments):
                return  # unwritten space in the last segment: the end of the log
            # A full segment, or zeros before the end of a sealed one (its tail never written).
            if number + 1 not in self.segments:
                return
            position = (number + 1) * segment_size

    # -- recovery and retention ------------------------------------------------------------

    def truncate_at(self, position: int) -> int:
        """Erase everything from ``position`` on (torn tail); returns the bytes erased."""
        number, offset = divmod(position, self.segment_size)
        erased = 0
        self._deactivate()
        self.trusted_start = max(self.trusted_start, position)
        for later in [n for n in self.segments if n > number]:
            segment = self.segments.pop(later)
            erased += segment.scan_written_end(0)
            segment.close()
            segment.path.unlink()
        if number in self.segments:
            erased += self.segments[number].zero_from(offset)
        self.write_position = position
        self.flushed_position = min(self.flushed_position, position)
        return erased

    def delete_segment(self, number: int) -> None:
        if number * self.segment_size == self.active_base:
            self._deactivate()
        segment = self.segments.pop(number)
        segment.close()
        segment.path.unlink(missing_ok=True)

    def close(self) -> None:
        self._deactivate()
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()
