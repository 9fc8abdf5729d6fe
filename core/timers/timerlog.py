"""The timer log: an append-only file of fixed-width timer entries (RocketMQ 5's ``timerlog``).

Who writes it: only :class:`core.timers.schedule.TimerSchedule`, on the event-loop thread. Who
reads it: the same object (walking wheel-slot chains) and recovery. Not checksummed: it is derived
data, trusted only up to the entry count recorded in a durable checkpoint (``checkpoint.py``),
which is written after :meth:`TimerLog.sync`; anything after that count is overwritten. Rebuilt
from the ``__timers/0`` queue when the checkpoint is missing or unusable. ``sync`` may run in a
worker thread (it only calls fdatasync); everything else belongs to the event-loop thread.

Files: ``DATA_DIR/timers/timerlog/<20-digit first entry>.tlog``, each holding ``entries_per_file``
entries, created sparse at full size and memory-mapped (so pending timers live in the page cache,
not in Python objects). Entry ``n`` is in file ``n // entries_per_file`` at byte
``(n % entries_per_file) * 32``. Entry layout, little-endian, 32 bytes::

    offset size field
     0     8    deliver_at_ms  when the timer is due (ms since the epoch)
     8     8    position       commit-log position of the delayed record
    16     4    size           its frame size
    20     4    flags          ENTRY_WRITTEN, plus ENTRY_ROLLED for a copy made by a roll
    24     8    prev           entry number of the previous (older) entry of the same wheel-slot
                               chain, NO_ENTRY (-1) at the chain's oldest entry

Entries are never modified after they are written: a wheel slot points at the newest entry of its
chain and chains are walked backwards through ``prev``. Rolling a slot (see ``schedule.py``)
appends copies of the entries still pending, so whole old files become unreferenced and are
deleted (:meth:`TimerLog.delete_before`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

ENTRY = struct.Struct("<qQIIq")
ENTRY_SIZE = ENTRY.size  # 32
# 1Mi entries x 32 bytes = 32 MiB per file (RocketMQ's timerlog files are 100 MiB of 52-byte
# units); a million pending timers fill about one file.
DEFAULT_ENTRIES_PER_FILE = 1 << 20
NO_ENTRY = -1
SUFFIX = ".tlog"

# Entry flag bits.
ENTRY_WRITTEN = 0x1  # always set: an all-zero entry was never written
ENTRY_ROLLED = 0x2  # a copy appended when the slot holding the original was rolled


class TimerEntry(NamedTuple):
    deliver_at_ms: int
    position: int
    size: int
    flags: int
    prev: int


def file_name(first_entry: int) -> str:
    return f"{first_entry:020d}{SUFFIX}"


class _TimerLogFile:
    __slots__ = ("buf", "fd", "first_entry", "mm", "path")

    def __init__(self, path: Path, first_entry: int, byte_size: int) -> None:
        self.path = path
        self.first_entry = first_entry
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size < byte_size:
            os.ftruncate(self.fd, byte_size)
        self.mm = mmap.mmap(self.fd, byte_size, access=mmap.ACCESS_WRITE)
        self.buf = memoryview(self.mm)

    def close(self) -> None:
        try:
            self.buf.release()
            self.mm.close()
        except BufferError:
            pass
        finally:
            os.close(self.fd)


class TimerLog:
    """Append-only timer entries in memory-mapped files. ``start``/``end`` bound the live
    entry numbers: everything before ``start`` may be deleted, ``end`` is the next to write."""

    def __init__(self, directory: Path, entries_per_file: int = DEFAULT_ENTRIES_PER_FILE) -> None:
        if entries_per_file < 1:
            raise ValueError("entries_per_file must be positive")
        self.directory = directory
        self.entries_per_file = entries_per_file
        self.file_bytes = entries_per_file * ENTRY_SIZE
        self.files: dict[int, _TimerLogFile] = {}  # file number -> mapped file
        self.start = 0
        self.end = 0
        self.dirty_files: set[int] = set()
        self._dirty_hint = -1  # the file last added to dirty_files (saves a set insert per entry)
        directory.mkdir(parents=True, exist_ok=True)

    def file_numbers_on_disk(self) -> list[int]:
        return sorted(
            int(path.name.split(".", 1)[0]) // self.entries_per_file
            for path in self.directory.glob(f"*{SUFFIX}")
        )

    def covers(self, start: int, end: int) -> bool:
        """True if every file holding entries ``[start, end)`` is on disk."""
        if end <= start:
            return True
        present = set(self.file_numbers_on_disk())
        first = start // self.entries_per_file
        last = (end - 1) // self.entries_per_file
        return all(number in present for number in range(first, last + 1))

    def reset(self, start: int, end: int) -> None:
        """Keep entries ``[start, end)`` (as a checkpoint recorded them) and delete every file
        wholly outside; entries from ``end`` on are stale and get overwritten."""
        self.close()
        self.start = start
        self.end = end
        first = start // self.entries_per_file
        last = max(end - 1, start) // self.entries_per_file
        for number in self.file_numbers_on_disk():
            if number < first or number > last:
                (self.directory / file_name(number * self.entries_per_file)).unlink(missing_ok=True)

    # -- writing ---------------------------------------------------------------------------

    def _file(self, number: int) -> _TimerLogFile:
        mapped = self.files.get(number)
        if mapped is None:
            first = number * self.entries_per_file
            mapped = _TimerLogFile(self.directory / file_name(first), first, self.file_bytes)
            self.files[number] = mapped
        return mapped

    def append(self, deliver_at_ms: int, position: int, size: int, prev: int, flags: int) -> int:
        """Write one entry at ``end``; returns its entry number."""
        number = self.end
        file_number, slot = divmod(number, self.entries_per_file)
        mapped = self.files.get(file_number)
        if mapped is None:
            mapped = self._file(file_number)
        if file_number != self._dirty_hint:
            self.dirty_files.add(file_number)
            self._dirty_hint = file_number
        ENTRY.pack_into(
            mapped.buf,
            slot * ENTRY_SIZE,
            deliver_at_ms,
            position,
            size,
            flags | ENTRY_WRITTEN,
            prev,
        )
        self.end = number + 1
        return number

    # -- reading ---------------------------------------------------------------------------

    def mapped(self, file_number: int) -> memoryview:
        """The mapping of one file (entry ``n`` is in file ``n // entries_per_file``)."""
        return self._file(file_number).buf

    def read(self, number: int) -> TimerEntry:
        if not self.start <= number < self.end:
            raise IndexError(f"timer-log entry {number} outside [{self.start}, {self.end})")
        file_number, slot = divmod(number, self.entries_per_file)
        return TimerEntry._make(ENTRY.unpack_from(self._file(file_number).buf, slot * ENTRY_SIZE))

    # -- durability and reclaiming -----------------------------------------------------------

    def take_dirty_fds(self) -> list[int]:
        """File descriptors written since the last call (event-loop thread)."""
        fds = [self.files[n].fd for n in self.dirty_files if n in self.files]
        self.dirty_files = set()
        self._dirty_hint = -1
        return fds

    @staticmethod
    def sync_fds(fds: list[int]) -> None:
        """fdatasync (any thread). A file deleted meanwhile is skipped: it held no live entry."""
        for fd in fds:
            with contextlib.suppress(OSError):
                os.fdatasync(fd)

    def sync(self) -> None:
        self.sync_fds(self.take_dirty_fds())

    def delete_before(self, number: int) -> int:
        """Delete files whose entries all lie before ``number`` (never the file being written);
        returns how many were deleted."""
        number = min(number, self.end)
        self.start = max(self.start, number)
        keep_from = number // self.entries_per_file
        writing = self.end // self.entries_per_file
        deleted = 0
        for file_number in self.file_numbers_on_disk():
            if file_number >= keep_from or file_number >= writing:
                break
            mapped = self.files.pop(file_number, None)
            if mapped is not None:
                mapped.close()
            self.dirty_files.discard(file_number)
            self._dirty_hint = -1
            (self.directory / file_name(file_number * self.entries_per_file)).unlink(
                missing_ok=True
            )
            deleted += 1
        return deleted

    def disk_files(self) -> int:
        return len(self.file_numbers_on_disk())

    def close(self) -> None:
        for mapped in self.files.values():
            mapped.close()
        self.files.clear()
        self.dirty_files.clear()
        self._dirty_hint = -1
