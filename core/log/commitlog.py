"""The CommitLog: every record body is written here exactly once.

A sequence of fixed-size :class:`~core.log.segment.Segment` files; a position is a byte offset
in the whole log, so the segment holding position ``p`` is ``p // segment_size`` (arithmetic, no
search). Named positions, as RocketMQ's MappedFile keeps them:

- ``write_position``: end of the last appended frame (writer only);
- ``flushed_position``: everything before it has been fdatasync'ed;
- ``start_position``: base of the oldest segment still on disk (retention moves it).

One writer thread appends; ``sync_to`` may run in another thread (it only calls fdatasync).
Readers (this process or another, read-only) use :meth:`read_frame`, which verifies the CRC.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from crc32c import crc32c

from core.log import names
from core.log import record as rec
from core.log.segment import Segment, preallocate, pwrite_all, start_writeback

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
            path = self.directory / names.segment_name(number * self.segment_size)
            segment = Segment(path, number * self.segment_size, self.segment_size, writable=True)
            self.segments[number] = segment
        return segment

    # -- writing ---------------------------------------------------------------------------

    def max_frame_size(self) -> int:
        return self.segment_size

    def append(self, frame: bytes | bytearray | memoryview) -> int:
        """Write one frame and return its position. Rolls to a new segment when needed.

        A large frame (a Kafka batch, a big message) is written with pwrite rather than through
        the mapping, as append_many's staged batches are: the kernel then fills page-cache pages
        without zeroing each one in a page fault first (measured with a Kafka producer of 1 MB
        batches: that zeroing was 45% of the broker's CPU). Same pages as the mapping."""
        size = len(frame)
        if size >= PWRITE_BYTES and self.activate(size):
            position = self.write_position
            pwrite_all(self.active_fd, frame, position - self.active_base)
            self._written_to_file(position + size)
            return position
        position = self.write_position
        number, offset = divmod(position, self.segment_size)
        remaining = self.segment_size - offset
        # A frame fits if it fills the segment exactly or leaves room for a BLANK prefix, so a
        # reader always finds either a frame or a BLANK where written data continues.
        if size != remaining and size + rec.PREFIX.size > remaining:
            if size > self.segment_size:
                raise ValueError(f"frame of {size} bytes exceeds segment size {self.segment_size}")
            if remaining:
                self._segment(number).write(offset, rec.blank_frame(remaining))
            number += 1
            offset = 0
            position = number * self.segment_size
        self._segment(number).write(offset, frame)
        self.write_position = position + size
        return position

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
        if base != self.active_base:
            self.active_end = offset
        if offset + size > self.active_end or size == remaining:
            # Blocks are reserved PREALLOCATE_BYTES ahead of the writer, not for the whole
            # segment at creation: a 1 GiB segment per store would take 1 GiB of disk at once.
            end = min(
                self.segment_size, -(-(offset + size) // PREALLOCATE_BYTES) * PREALLOCATE_BYTES
            )
            preallocate(segment.fd, self.active_end, end - self.active_end)
            self.active_end = end
        self.active_buf = segment.buf
        self.active_fd = segment.fd
        self.active_base = base
        return True

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
        """Write several frames with as few copies into the mapping as segment bounds allow."""
        positions: list[int] = []
        pending: list[bytes] = []
        pending_start = self.write_position
        cursor = self.write_position
        for frame in frames:
            size = len(frame)
            offset = cursor % self.segment_size
            remaining = self.segment_size - offset
            if size != remaining and size + rec.PREFIX.size > remaining:
                self._flush_pending(pending_start, pending)
                pending = []
                self.write_position = cursor
                position = self.append(frame)
                positions.append(position)
                cursor = pending_start = self.write_position
                continue
            positions.append(cursor)
            pending.append(frame)
            cursor += size
        self._flush_pending(pending_start, pending)
        self.write_position = cursor
        return positions

    def _flush_pending(self, start: int, frames: list[bytes]) -> None:
        if frames:
            number, offset = divmod(start, self.segment_size)
            self._segment(number).write(offset, b"".join(frames))

    def sync_to(self, position: int) -> int:
        """Make everything before ``position`` durable; returns the new flushed position."""
        with self._sync_lock:
            if position <= self.flushed_position:
                return self.flushed_position
            first = self.flushed_position // self.segment_size
            last = (position - 1) // self.segment_size
            for number in range(first, last + 1):
                segment = self.segments.get(number)
                if segment is not None:
                    segment.sync()
            self.flushed_position = position
            return position

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
        while stop_at is None or position < stop_at:
            number, offset = divmod(position, segment_size)
            segment = self.segments.get(number)
            if segment is None:
                return
            buf = segment.buf
            limit = len(buf)
            base = number * segment_size
            segment_stop = limit if stop_at is None else min(limit, stop_at - base)
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
