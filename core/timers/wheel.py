"""The timer wheel: one fixed-width record per slot, pointing at a chain in the timer log
(RocketMQ 5's ``timerwheel``).

Time is cut into slots of ``slot_ms``; absolute slot ``s`` covers ``[s * slot_ms, (s+1) * slot_ms)``
and lives at wheel index ``s % slots``, so one revolution of the wheel (a *round*) is
``slots * slot_ms`` (65,536 one-second slots: about 18.2 hours). A chain may mix rounds: entries
due in a later round stay in it and are copied forward ("rolled") each time their index comes
round, which is how a timer a year ahead needs no other structure.

Slot layout, little-endian, 32 bytes::

    offset size field
     0     8    slot_no   smallest absolute slot (deliver_at_ms // slot_ms) of the chain's entries
     8     8    first     timer-log entry number of the chain's oldest entry
    16     8    last      timer-log entry number of its newest entry (walk back through ``prev``)
    24     8    entries   entries in the chain; 0 means the slot is empty (other fields ignored)

The live wheel is a ``bytearray`` (2 MiB for 65,536 slots) owned by the event-loop thread; a
checkpoint stores a copy of it (``checkpoint.py``). Derived data, rebuilt from the log if lost.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

SLOT = struct.Struct("<qqqq")
SLOT_SIZE = SLOT.size  # 32
# RocketMQ's default timerPrecisionMs is 1000; the in-memory window fires at ms precision anyway.
DEFAULT_SLOT_MS = 1000
# 65,536 slots of one second: an 18.2-hour round, 2 MiB of wheel.
DEFAULT_SLOTS = 1 << 16
_COUNT_OFFSET = struct.calcsize("<qqq")


class Slot(NamedTuple):
    slot_no: int
    first: int
    last: int
    entries: int


EMPTY = Slot(0, 0, 0, 0)


class TimerWheel:
    def __init__(self, slots: int = DEFAULT_SLOTS, slot_ms: int = DEFAULT_SLOT_MS) -> None:
        if slots < 1 or slot_ms < 1:
            raise ValueError("slots and slot_ms must be positive")
        self.slots = slots
        self.slot_ms = slot_ms
        self.buf = bytearray(slots * SLOT_SIZE)

    def slot_of(self, deliver_at_ms: int) -> int:
        """The absolute slot a due time falls in."""
        return deliver_at_ms // self.slot_ms

    def index_of(self, slot_no: int) -> int:
        return slot_no % self.slots

    def get(self, index: int) -> Slot:
        return Slot._make(SLOT.unpack_from(self.buf, index * SLOT_SIZE))

    def entries(self, index: int) -> int:
        return int.from_bytes(
            self.buf[index * SLOT_SIZE + _COUNT_OFFSET : (index + 1) * SLOT_SIZE], "little"
        )

    def put(self, index: int, slot: Slot) -> None:
        SLOT.pack_into(self.buf, index * SLOT_SIZE, *slot)

    def clear(self, index: int) -> None:
        SLOT.pack_into(self.buf, index * SLOT_SIZE, 0, 0, 0, 0)

    def load(self, raw: bytes | memoryview) -> None:
        if len(raw) != len(self.buf):
            raise ValueError(f"wheel image of {len(raw)} bytes, expected {len(self.buf)}")
        self.buf[:] = raw

    def oldest_entry(self) -> int | None:
        """The smallest ``first`` over non-empty slots: timer-log entries before it are dead."""
        fields = memoryview(self.buf).cast("q")
        oldest: int | None = None
        for first, count in zip(fields[1::4], fields[3::4], strict=True):
            if count and (oldest is None or first < oldest):
                oldest = first
        return oldest

    def chains(self) -> int:
        fields = memoryview(self.buf).cast("q")
        return sum(1 for count in fields[3::4] if count)
