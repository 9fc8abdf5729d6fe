"""The timer checkpoint: a durable image of the wheel and of how far the log was loaded into it.

Who writes it: :class:`core.timers.service.TimerService`, every ``checkpoint_interval_ms`` and on
stop, atomically (write a temporary file, fsync, rename, fsync the directory). It is written only
after the commit log is durable up to every record it refers to and the timer log is fsync'ed up to
``timerlog_end``, so on open it is a consistent state to continue from. Checksummed (CRC32C).
Pure encode/decode; thread-safe.

File ``DATA_DIR/timers/checkpoint``, little-endian::

    offset size field
     0     4    magic              CHECKPOINT_MAGIC
     4     4    crc32c             over bytes [8, end)
     8     2    version            FORMAT_VERSION
    10     2    reserved
    12     4    slot_ms            wheel parameters: must match the service's, or it rebuilds
    16     4    slots
    20     4    entries_per_file   timer-log entries per file
    24     8    queue_entries      entries of __timers/0 inserted into the wheel
    32     8    fired_entries      entries of __timers/1 (the fired queue) at the checkpoint
    40     8    fired_floor        from this fired-queue entry on, a fired timer may be in a chain
    48     8    timerlog_start     oldest timer-log entry any chain refers to
    56     8    timerlog_end       timer-log entries written (the next entry number)
    64     8    resume_slot        first wheel slot to visit again (oldest slot still open)
    72     8    written_ms         wall time of the checkpoint
    80     8    pending            timers scheduled and not fired
    88     4    segment_count      pairs that follow
    92     4    reserved
    96          segment_count x (i64 commit-log segment number, i64 timer references into it)
                slots x 32-byte wheel slots (see wheel.py)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from core.log.config import write_atomically

CHECKPOINT_MAGIC = 0xB4A1D7C1
FORMAT_VERSION = 1
HEADER = struct.Struct("<IIHxxIIIQQQQQqqqII")
HEADER_SIZE = HEADER.size  # 96
_PREFIX = struct.Struct("<II")
_SEGMENT = struct.Struct("<qq")
CHECKPOINT_FILE = "checkpoint"


class CheckpointError(Exception):
    """The checkpoint file is unusable (torn, corrupt, another version): rebuild instead."""


@dataclass
class TimerCheckpoint:
    slot_ms: int
    slots: int
    entries_per_file: int
    queue_entries: int
    fired_entries: int
    fired_floor: int
    timerlog_start: int
    timerlog_end: int
    resume_slot: int
    written_ms: int
    pending: int = 0
    # Commit-log segment number -> pending timers with a record in it (a delayed LINK counts in
    # its own segment and in those of the records it points at): the retention guard.
    segments: dict[int, int] = field(default_factory=dict)
    wheel: bytes = b""

    def encode(self) -> bytes:
        segments = [(n, c) for n, c in sorted(self.segments.items()) if c]
        body = bytearray(HEADER_SIZE)
        HEADER.pack_into(
            body,
            0,
            CHECKPOINT_MAGIC,
            0,
            FORMAT_VERSION,
            self.slot_ms,
            self.slots,
            self.entries_per_file,
            self.queue_entries,
            self.fired_entries,
            self.fired_floor,
            self.timerlog_start,
            self.timerlog_end,
            self.resume_slot,
            self.written_ms,
            self.pending,
            len(segments),
            0,
        )
        for number, count in segments:
            body += _SEGMENT.pack(number, count)
        body += self.wheel
        _PREFIX.pack_into(body, 0, CHECKPOINT_MAGIC, crc32c(memoryview(body)[_PREFIX.size :]))
        return bytes(body)

    @classmethod
    def decode(cls, raw: bytes) -> TimerCheckpoint:
        if len(raw) < HEADER_SIZE:
            raise CheckpointError(f"{len(raw)} bytes is shorter than the header")
        (
            magic,
            crc,
            version,
            slot_ms,
            slots,
            entries_per_file,
            queue_entries,
            fired_entries,
            fired_floor,
            timerlog_start,
            timerlog_end,
            resume_slot,
            written_ms,
            pending,
            segment_count,
            _reserved,
        ) = HEADER.unpack_from(raw, 0)
        if magic != CHECKPOINT_MAGIC:
            raise CheckpointError(f"bad magic 0x{magic:08x}")
        if crc32c(memoryview(raw)[_PREFIX.size :]) != crc:
            raise CheckpointError("crc32c mismatch")
        if version != FORMAT_VERSION:
            raise CheckpointError(f"format version {version}, expected {FORMAT_VERSION}")
        cursor = HEADER_SIZE
        segments: dict[int, int] = {}
        for _ in range(segment_count):
            number, count = _SEGMENT.unpack_from(raw, cursor)
            segments[number] = count
            cursor += _SEGMENT.size
        return cls(
            slot_ms,
            slots,
            entries_per_file,
            queue_entries,
            fired_entries,
            fired_floor,
            timerlog_start,
            timerlog_end,
            resume_slot,
            written_ms,
            pending,
            segments,
            raw[cursor:],
        )


def read_checkpoint(directory: Path) -> TimerCheckpoint | None:
    """The checkpoint in ``directory``; None if there is none. Raises CheckpointError."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    return TimerCheckpoint.decode(path.read_bytes())


def write_checkpoint(directory: Path, checkpoint: TimerCheckpoint) -> None:
    """Blocking: replace the checkpoint atomically."""
    write_atomically(directory / CHECKPOINT_FILE, checkpoint.encode())
