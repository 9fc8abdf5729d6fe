"""Per-queue index (RocketMQ's ConsumeQueue, with RocketMQ 5's batch entries).

One directory per (topic, queue) holding fixed-size files of fixed-width entries, each file named
by the 20-digit number of its first entry. Entry layout, little-endian, 40 bytes::

    offset size field
     0     8    position      commit-log position of the frame
     8     4    size          frame size (never 0: a zero entry marks the end of written data)
    12     4    record_count  1, or the number of records in a batch frame
    16     8    tag_mask      Bloom mask of the record's tags (core.log.tags), 0 when untagged
    24     8    store_ms      when the entry was written (visibility time; monotonic per queue)
    32     8    first_offset  queue offset of the entry's first record

Entry ``n`` lives in file ``n // entries_per_file`` at byte ``(n % entries_per_file) * 40``.
Offsets are per record; an unbatched queue has ``first_offset == n`` so lookup is arithmetic, a
batched one is binary-searched on ``first_offset``. Derived data: not checksummed, rebuilt from
the CommitLog on recovery. One writer; readers in any process.

Entries are written and read through the files' mappings. A mapping holds a descriptor, so a
store maps at most ``max_open_files`` index files at once, least recently used unmapped first
(:mod:`core.log.openfiles`), and the number of queues does not bound the process's other
descriptors (issue 21 item 3).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from core.log import names
from core.log.openfiles import OpenFiles
from core.log.segment import DiskFullError, preallocate, sync_path

ENTRY = struct.Struct("<QIIQqQ")
ENTRY_SIZE = ENTRY.size  # 40
_SIZE_FIELD = struct.Struct("<I")
# An entry seen as five little-endian u64 words (position, size + record_count, tag_mask,
# store_ms, first_offset) or ten u32: append_run fills a whole run of entries with a few strided
# C-level copies into a template instead of one ENTRY.pack_into per entry. Native order must be
# little-endian for that (else: one pack per entry).
_WORDS_PER_ENTRY = 5
_HALVES_PER_ENTRY = 10
_ARRAY_RUNS = sys.byteorder == "little" and array("Q").itemsize == 8 and array("I").itemsize == 4
_run_templates: dict[int, bytes] = {}  # count -> that many entries of record_count 1, else 0
_NO_BUFFER = memoryview(b"")
_PWRITE_RUN_BYTES = 2048  # append_run writes runs this long with pwrite, shorter ones in place
# Index files are created sparse (a queue may never fill its 10 MiB) and their blocks reserved
# as the append cursor reaches them (see core.log.segment.preallocate): as much again as the
# file has reserved, from one page up to this many bytes at a time, so the many queues that
# hold a few entries take a page each (10,000 MQTT topics took 2.5 GB at 256 KiB each).
PREALLOCATE_BYTES = 256 * 1024
_PAGE = 4096


class IndexEntry(NamedTuple):
    position: int
    size: int
    record_count: int
    tag_mask: int
    store_ms: int
    first_offset: int


class _IndexFile:
    """One index file, mapped while it is in use: at most ``open_files.limit`` of a store's
    are mapped at once (see core/log/openfiles.py). ``buf`` maps it again when it was unmapped;
    ``on_unmap`` tells the owning queue, which drops its append cursor into the mapping."""

    __slots__ = (
        "_view",
        "byte_size",
        "first_entry",
        "mm",
        "on_unmap",
        "open_files",
        "path",
        "writable",
    )

    def __init__(
        self,
        path: Path,
        first_entry: int,
        byte_size: int,
        *,
        writable: bool,
        open_files: OpenFiles,
        on_unmap: Callable[[_IndexFile], None] | None = None,
    ) -> None:
        self.path = path
        self.first_entry = first_entry
        self.byte_size = byte_size
        self.writable = writable
        self.open_files = open_files
        # Weakly: a queue -> file -> queue cycle would leave the file's mapping views to the
        # garbage collector, and CPython 3.11 crashes clearing a memoryview with an export.
        self.on_unmap = weakref.WeakMethod(on_unmap) if on_unmap is not None else None
        self.mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._map()

    def _map(self) -> memoryview:
        mm = self.mm
        if mm is None or mm.closed:
            self.open_files.make_room()
            writable = self.writable
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY, 0o644)
            try:
                size = os.fstat(fd).st_size
                if writable and size < self.byte_size:
                    os.ftruncate(fd, self.byte_size)
                    size = self.byte_size
                # mmap keeps a dup of the descriptor: the file's one descriptor from now on.
                mm = self.mm = mmap.mmap(
                    fd,
                    min(self.byte_size, size),
                    access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ,
                )
            finally:
                os.close(fd)
            self.open_files.add(self)
        view = self._view = memoryview(mm)
        return view

    @property
    def buf(self) -> memoryview:
        """The mapping (mapped again if it was unmapped). Use it at once: a later mapping of
        another file may unmap this one (a slice taken from it keeps it mapped)."""
        view = self._view
        if view is None:
            return self._map()
        self.open_files.touch(self)
        return view

    def unmap(self) -> bool:
        """Unmap and close the descriptor; False (still mapped) while a slice is held."""
        callback = self.on_unmap() if self.on_unmap is not None else None
        if callback is not None:
            callback(self)
        view = self._view
        if view is not None:
            try:
                view.release()
            except BufferError:  # exported whole (a numpy array over it): not yet
                return False
            self._view = None
        mm = self.mm
        if mm is None or mm.closed:
            return True
        try:
            mm.close()
        except BufferError:  # a reader's slice: unmapped at a later eviction
            return False
        return True

    def close(self) -> None:
        self.open_files.discard(self)
        self.on_unmap = None
        self.unmap()


class ConsumeQueue:
    """The index of one queue. ``start_entry``/``next_entry`` bound the entries present."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        queue: int,
        entries_per_file: int,
        *,
        writable: bool,
        open_files: OpenFiles | None = None,
    ) -> None:
        """``open_files``: the bound on mapped index files, shared by the queues of a store; a
        private one when not given."""
        self.directory = directory
        self.open_files = open_files if open_files is not None else OpenFiles()
        self.topic = topic
        self.queue = queue
        self.entries_per_file = entries_per_file
        self.file_bytes = entries_per_file * ENTRY_SIZE
        self.writable = writable
        self.files: dict[int, _IndexFile] = {}  # file number -> file
        self.start_entry = 0
        self.next_entry = 0
        self.next_offset = 0
        self.dirty_files: set[int] = set()
        # The append cursor: the mapping of the file holding entry ``next_entry`` and the byte
        # offsets of that entry and of the file's end. ``tail_at == tail_end`` means "not set":
        # the slow path in :meth:`append` finds (or creates) the file. The store's plain-append
        # path writes entries through these fields directly (one pack_into, no method call).
        self.tail_buf = _NO_BUFFER
        self.tail_at = 0
        self.tail_end = 0
        self._tail_file: _IndexFile | None = None  # the file tail_buf maps
        # A descriptor of the tail file for fallocate and pwrite (the mapping's own dup is not
        # reachable from Python), opened when first needed and closed with the cursor: with
        # the mapping's, at most two per mapped file.
        self._tail_fd = -1
        # Entries from here to next_entry were appended since take_dirty last reported them.
        self._clean_entry = 0
        if writable:
            directory.mkdir(parents=True, exist_ok=True)
        self.refresh()

    # -- discovery -------------------------------------------------------------------------

    def refresh(self) -> None:
        """Map new files, drop deleted ones and find the end of written entries."""
        self._drop_tail()
        numbers: set[int] = set()
        if self.directory.exists():
            for path in self.directory.glob(f"*{names.INDEX_SUFFIX}"):
                first = names.number_of(path)
                number = first // self.entries_per_file
                numbers.add(number)
                if number not in self.files:
                    self.files[number] = _IndexFile(
                        path,
                        first,
                        self.file_bytes,
                        writable=self.writable,
                        open_files=self.open_files,
                        on_unmap=self._unmapped,
                    )
        for number in list(self.files):
            if number not in numbers:
                self._close_file(self.files.pop(number))
        if not self.files:
            self.start_entry = self.next_entry
            return
        first_file = min(self.files)
        self.start_entry = max(self.start_entry, first_file * self.entries_per_file)
        last = max(self.files)
        self.next_entry = last * self.entries_per_file + self._count_in(self.files[last])
        if self.next_entry > self.start_entry:
            tail = self.entry(self.next_entry - 1)
            self.next_offset = tail.first_offset + tail.record_count
        elif self.next_entry == 0:
            self.next_offset = 0

    def _count_in(self, index_file: _IndexFile) -> int:
        """Entries written in a file: binary search for the first zero ``size`` field."""
        capacity = len(index_file.buf) // ENTRY_SIZE
        low, high = 0, capacity
        while low < high:
            middle = (low + high) // 2
            (size,) = _SIZE_FIELD.unpack_from(index_file.buf, middle * ENTRY_SIZE + 8)
            if size:
                low = middle + 1
            else:
                high = middle
        return low

    # -- writing ---------------------------------------------------------------------------

    def _drop_tail(self) -> None:
        self.tail_buf = _NO_BUFFER
        self.tail_at = self.tail_end = 0
        self._tail_file = None
        if self._tail_fd >= 0:
            os.close(self._tail_fd)
            self._tail_fd = -1

    def _tail_descriptor(self) -> int:
        fd = self._tail_fd
        if fd < 0:
            assert self._tail_file is not None
            fd = self._tail_fd = os.open(self._tail_file.path, os.O_RDWR)
        return fd

    def _open_tail(self) -> None:
        """Point the append cursor at entry ``next_entry`` (creating its file if needed)."""
        self._drop_tail()  # the previous tail file's descriptor goes with it
        number, slot = divmod(self.next_entry, self.entries_per_file)
        index_file = self.files.get(number)
        if index_file is None:
            first = number * self.entries_per_file
            index_file = _IndexFile(
                self.directory / names.index_file_name(first),
                first,
                self.file_bytes,
                writable=True,
                open_files=self.open_files,
                on_unmap=self._unmapped,
            )
            self.files[number] = index_file
        self.tail_buf = index_file.buf
        self.tail_at = self.tail_end = slot * ENTRY_SIZE
        self._tail_file = index_file
        self._grow_tail(self.tail_at + ENTRY_SIZE)

    def _grow_tail(self, end: int) -> None:
        """Preallocate the tail file up to ``end`` (rounded up to PREALLOCATE_BYTES, at most the
        file's end) and let the cursor run that far. The cursor stops at the end of what is
        preallocated, so the first append past it comes back here (the hot path only compares
        ``tail_at`` with ``tail_end``)."""
        stretch = min(PREALLOCATE_BYTES, max(_PAGE, self.tail_end))
        chunk_end = min(self.file_bytes, -(-end // stretch) * stretch)
        if chunk_end > self.tail_end:
            fd = self._tail_descriptor()
            try:
                preallocate(fd, self.tail_end, chunk_end - self.tail_end)
            except DiskFullError:
                # Near a full disk: only the page(s) this write needs (the commit log does the
                # same); DiskFullError again when even they are not there. The frame is in the
                # commit log then, unindexed until recovery indexes it again.
                chunk_end = min(self.file_bytes, -(-end // _PAGE) * _PAGE)
                preallocate(fd, self.tail_end, chunk_end - self.tail_end)
            self.tail_end = chunk_end

    def append(
        self, position: int, size: int, record_count: int, tag_mask: int, store_ms: int
    ) -> int:
        """Add an entry; returns the queue offset of its first record."""
        at = self.tail_at
        if at >= self.tail_end:
            self._open_tail()
            at = self.tail_at
        first_offset = self.next_offset
        ENTRY.pack_into(
            self.tail_buf, at, position, size, record_count, tag_mask, store_ms, first_offset
        )
        self.tail_at = at + ENTRY_SIZE
        self.next_entry += 1
        self.next_offset = first_offset + record_count
        return first_offset

    def append_run(self, positions: Sequence[int], sizes: Sequence[int], store_ms: int) -> int:
        """Add one entry per frame of a run of untagged single records (``append_many``);
        returns the queue offset of the first. Written with one copy when the run fits in the
        current file (measured: 60-70 ns per entry, against 200 for one ENTRY.pack_into each)."""
        count = len(positions)
        at = self.tail_at
        if at >= self.tail_end:
            self._open_tail()
            at = self.tail_at
        first_offset = self.next_offset
        end = at + count * ENTRY_SIZE
        if end > self.tail_end:
            self._grow_tail(end)
        if not _ARRAY_RUNS or end > self.tail_end:
            for position, size in zip(positions, sizes, strict=True):
                self.append(position, size, 1, 0, store_ms)
            return first_offset
        template = _run_templates.get(count)
        if template is None:
            template = ENTRY.pack(0, 0, 1, 0, 0, 0) * count
            if len(_run_templates) < 256:
                _run_templates[count] = template
        run = bytearray(template)
        words = memoryview(run).cast("Q")
        words[0::_WORDS_PER_ENTRY] = array("Q", positions)
        halves = memoryview(run).cast("I")
        halves[2::_HALVES_PER_ENTRY] = array("I", sizes)  # the size field; record_count stays 1
        words[3::_WORDS_PER_ENTRY] = array("Q", (store_ms,)) * count
        words[4::_WORDS_PER_ENTRY] = array("Q", list(range(first_offset, first_offset + count)))
        words.release()
        halves.release()
        if len(run) >= _PWRITE_RUN_BYTES:
            # Like the commit log's staged batches: the kernel fills fresh page-cache pages
            # without zeroing them first or taking a fault per page; same pages as the mapping.
            if os.pwrite(self._tail_descriptor(), run, at) != len(run):
                self.tail_buf[at:end] = run  # a short write: the whole run again, in place
        else:
            self.tail_buf[at:end] = run
        self.tail_at = end
        self.next_entry += count
        self.next_offset = first_offset + count
        return first_offset

    def take_dirty(self) -> set[int]:
        """Numbers of the files written since the last call (for a checkpoint or a flush to
        fdatasync), and forget them. The tail file counts when entries were appended to it."""
        dirty = self.dirty_files
        if self.next_entry > self._clean_entry:
            first = self._clean_entry // self.entries_per_file
            dirty.update(range(first, (self.next_entry - 1) // self.entries_per_file + 1))
        self._clean_entry = self.next_entry
        self.dirty_files = set()
        return dirty

    def truncate(self, entry_count: int) -> None:
        """Keep the first ``entry_count`` entries (numbered globally) and erase the rest."""
        if entry_count >= self.next_entry:
            return
        self._drop_tail()
        keep_number, keep_slot = divmod(entry_count, self.entries_per_file)
        for number in [n for n in self.files if n > keep_number]:
            removed = self.files.pop(number)
            self._close_file(removed)
            removed.path.unlink(missing_ok=True)
        index_file = self.files.get(keep_number)
        if index_file is not None:
            start = keep_slot * ENTRY_SIZE
            end = self._count_in(index_file) * ENTRY_SIZE
            if end > start:
                index_file.buf[start:end] = bytes(end - start)
            self.dirty_files.add(keep_number)
        self.next_entry = entry_count
        self._clean_entry = min(self._clean_entry, entry_count)
        if self.next_entry > self.start_entry:
            tail = self.entry(self.next_entry - 1)
            self.next_offset = tail.first_offset + tail.record_count
        else:
            self.start_entry = self.next_entry
            if entry_count == 0:
                self.next_offset = 0

    def sync(self) -> None:
        for number in self.take_dirty():
            index_file = self.files.get(number)
            if index_file is not None:
                sync_path(index_file.path)

    def _close_file(self, index_file: _IndexFile) -> None:
        if index_file is self._tail_file:
            self._drop_tail()
        index_file.close()

    def _unmapped(self, index_file: _IndexFile) -> None:
        """``index_file`` is being unmapped to make room: the append cursor into it goes (the
        next append maps it again)."""
        if index_file is self._tail_file:
            self._drop_tail()

    def delete_files_before(self, entry: int) -> int:
        """Delete index files whose entries all lie before ``entry``; returns files deleted."""
        deleted = 0
        self._drop_tail()
        for number in sorted(self.files):
            if (number + 1) * self.entries_per_file > entry or number == max(self.files):
                break
            removed = self.files.pop(number)
            self._close_file(removed)
            removed.path.unlink(missing_ok=True)
            deleted += 1
        self.start_entry = max(self.start_entry, entry)
        return deleted

    # -- reading ---------------------------------------------------------------------------

    def entry(self, number: int) -> IndexEntry:
        file_number, slot = divmod(number, self.entries_per_file)
        return IndexEntry._make(ENTRY.unpack_from(self.files[file_number].buf, slot * ENTRY_SIZE))

    def entries(self, first: int, count: int) -> list[IndexEntry]:
        """Up to ``count`` consecutive entries from ``first`` (fewer at a file end or the tail)."""
        return [IndexEntry._make(item) for item in self.raw_entries(first, count)]

    def raw_entries(self, first: int, count: int) -> list[tuple[int, int, int, int, int, int]]:
        """Like :meth:`entries`, as plain tuples in ENTRY's field order (the read hot path)."""
        last = min(first + count, self.next_entry)
        out: list[tuple[int, int, int, int, int, int]] = []
        number = first
        while number < last:
            file_number, slot = divmod(number, self.entries_per_file)
            buf = self.files[file_number].buf
            stop = min(last - number, self.entries_per_file - slot)
            out.extend(ENTRY.iter_unpack(buf[slot * ENTRY_SIZE : (slot + stop) * ENTRY_SIZE]))
            number += stop
        return out

    def iter_entries(self, first: int, count: int) -> Iterator[tuple[int, int, int, int, int, int]]:
        """Like :meth:`raw_entries`, as an iterator (``count`` must not pass ``next_entry``)."""
        file_number, slot = divmod(first, self.entries_per_file)
        if slot + count <= self.entries_per_file:
            buf = self.files[file_number].buf
            return ENTRY.iter_unpack(buf[slot * ENTRY_SIZE : (slot + count) * ENTRY_SIZE])
        return iter(self.raw_entries(first, count))

    @property
    def start_offset(self) -> int:
        if self.start_entry >= self.next_entry:
            return self.next_offset
        return self.entry(self.start_entry).first_offset

    def entry_for_offset(self, offset: int) -> int:
        """The entry holding queue ``offset`` (the first entry after it if it fell in a gap);
        ``next_entry`` when ``offset`` is at or past the end."""
        if offset >= self.next_offset:
            return self.next_entry
        low, high = self.start_entry, self.next_entry
        if low <= offset < high:
            guess = self.entry(offset)
            if guess.first_offset <= offset < guess.first_offset + guess.record_count:
                return offset
        while low < high:
            middle = (low + high) // 2
            item = self.entry(middle)
            if item.first_offset + item.record_count <= offset:
                low = middle + 1
            else:
                high = middle
        return low

    def entry_for_time(self, timestamp_ms: int) -> int:
        """The first entry stored at or after ``timestamp_ms`` (``next_entry`` if none)."""
        low, high = self.start_entry, self.next_entry
        while low < high:
            middle = (low + high) // 2
            if self.entry(middle).store_ms < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return low

    def close(self) -> None:
        self._drop_tail()
        for index_file in self.files.values():
            self._close_file(index_file)
        self.files.clear()
