"""One commit-log segment file: a fixed-size, memory-mapped, append-only byte range.

Layout: frames (see :mod:`core.log.record`) packed from offset 0; unwritten bytes are zero, so
a zero ``total_size`` marks the end of written data. A full segment is closed with a BLANK frame
(or ends exactly at its size). The file is named by its 20-digit base position in the log and
created sparse at its full size, so readers in another process can map it once.

Writes come from the single writer; reads may come from any thread or process. Not checksummed
itself: every frame carries its own CRC32C.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from core.log import record as rec


class Segment:
    """A mapped segment. ``write_offset`` is meaningful only for the writer."""

    __slots__ = ("base", "buf", "fd", "mm", "path", "size", "writable", "write_offset")

    def __init__(self, path: Path, base: int, size: int, *, writable: bool) -> None:
        self.path = path
        self.base = base
        self.size = size
        self.writable = writable
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        self.fd = os.open(path, flags, 0o644)
        if writable and os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        mapped = min(size, os.fstat(self.fd).st_size)
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(self.fd, mapped, access=access)
        self.buf = memoryview(self.mm)
        self.write_offset = 0

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        self.buf[offset : offset + len(data)] = data

    def sync(self) -> None:
        """fdatasync: on Linux this also writes back pages dirtied through the shared mapping."""
        os.fdatasync(self.fd)

    def zero_from(self, offset: int) -> int:
        """Erase everything from ``offset`` on (a torn tail); returns how many bytes held data."""
        end = self.scan_written_end(offset)
        if end > offset:
            self.buf[offset:end] = bytes(end - offset)
        return end - offset

    def scan_written_end(self, offset: int) -> int:
        """The end of non-zero bytes after ``offset`` (coarse: whole 64 KiB blocks)."""
        block = 1 << 16
        end = offset
        position = offset
        zero_block = bytes(block)
        while position < self.size:
            chunk = self.buf[position : min(position + block, self.size)]
            if chunk != zero_block[: len(chunk)]:
                end = position + len(chunk)
            elif end < position:
                break
            position += len(chunk)
        return end

    def frame_size_at(self, offset: int) -> int:
        """``total_size`` of the frame at ``offset``, 0 where nothing is written yet."""
        if offset + rec.PREFIX.size > len(self.buf):
            return 0
        return int.from_bytes(self.buf[offset : offset + 4], "little")

    def close(self) -> None:
        try:
            self.buf.release()
            self.mm.close()
        except BufferError:
            # A reader still holds a slice of the mapping; it is unmapped when that slice goes.
            pass
        finally:
            os.close(self.fd)

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, write_offset={self.write_offset})"
