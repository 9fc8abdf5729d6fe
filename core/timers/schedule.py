"""TimerSchedule: the timer wheel + timer log on disk, and the near-term window in memory.

No asyncio and no commit log here (the service feeds it and fires what it hands out), so the
scheduling rules are testable on their own. Owned by the event-loop thread.

Rules (RocketMQ 5's TimerMessageStore, with the firing moved into memory for ms precision):

- **Insert**: a timer due in absolute slot ``t`` is appended to the timer log and to the chain of
  wheel index ``t % slots``. A timer whose slot was already *visited* (late or near-term) goes to
  the chain of ``max(t, oldest open slot)`` and straight into the window.
- **Visit**: ``advance`` visits slots in order, a little ahead of time (``lookahead``). Visiting
  slot ``s`` walks its chain, a bounded number of entries per call so a dense slot never stalls
  the loop: entries due in slot ``<= s`` enter the window (a heap ordered by
  ``(deliver_at_ms, position)``), so only the next seconds are materialised as Python objects.
  The slot is *open* from the start of the walk until every loaded timer has fired. Entries due
  in a later round stay in the chain.
- **Roll**: when an open slot's last timer fires (or at the end of the walk, if nothing was due),
  the entries of later rounds are copied to a fresh chain and the old chain is dropped. Every
  chain is thus at most one round old, and timer-log files older than every chain are deleted.
- An open slot keeps its chain until done, so a checkpoint of the wheel still lists every timer
  loaded into the window but not fired; recovery visits again from the oldest open slot and skips
  what the log says already fired (each open slot remembers the fired-queue length when it
  opened: ``fired_mark``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from pathlib import Path

from core.timers.timerlog import ENTRY, ENTRY_ROLLED, ENTRY_SIZE, NO_ENTRY, TimerEntry, TimerLog
from core.timers.wheel import SLOT, SLOT_SIZE, TimerWheel

# A timer in the window: (deliver_at_ms, commit-log position, frame size, open slot it counts in).
Due = tuple[int, int, int, int]
# Chain entries walked per ``advance`` call: about 2 ms of work.
DEFAULT_VISIT_BUDGET = 2048


class _OpenSlot:
    __slots__ = ("fired_mark", "later", "remaining", "walked", "walking")

    def __init__(self, remaining: int, fired_mark: int, *, walking: bool = False) -> None:
        self.remaining = remaining  # loaded timers not fired yet
        self.fired_mark = fired_mark  # fired-queue length when the slot opened
        self.walking = walking  # its chain walk is not finished: it cannot close yet
        # Entry numbers of the chain's later-round entries the walk passed, and how many chain
        # entries it walked: the roll copies those (and whatever was appended since) instead of
        # walking a dense chain again in one go, which stalled firing for tens of ms. None: the
        # slot was opened without a walk (a late insert), the roll walks the chain.
        self.later: list[int] | None = [] if walking else None
        self.walked = 0


class _Walk:
    """A visit in progress: walking a chain from its newest entry back."""

    __slots__ = ("index", "left", "next_entry", "seen", "slot_no", "state")

    def __init__(self, slot_no: int, index: int, state: _OpenSlot, last: int, entries: int):
        self.slot_no = slot_no
        self.index = index
        self.state = state
        self.next_entry = last
        self.left = entries  # entries still to walk
        self.seen = entries  # chain length the walk has accounted for


class TimerSchedule:
    def __init__(
        self,
        directory: Path,
        *,
        slots: int,
        slot_ms: int,
        entries_per_file: int,
        start_slot: int,
    ) -> None:
        self.wheel = TimerWheel(slots, slot_ms)
        self.timerlog = TimerLog(directory, entries_per_file)
        self.horizon = start_slot  # first slot whose visit has not finished
        self.window: list[Due] = []  # heap
        self._open: dict[int, _OpenSlot] = {}  # open slot -> its state
        self._open_index: dict[int, int] = {}  # wheel index -> open slot using that chain
        self._walk: _Walk | None = None
        # The last horizon a catch-up jump set (more than a round behind): every wheel index is
        # visited again by horizon jumped_to + slots. -1: no jump since the last restore.
        self.jumped_to = -1
        self.metrics = {"rolled": 0, "visited": 0, "inserted": 0}

    # -- state ----------------------------------------------------------------------------

    @property
    def slot_ms(self) -> int:
        return self.wheel.slot_ms

    @property
    def slots(self) -> int:
        return self.wheel.slots

    def resume_slot(self) -> int:
        """Where visiting must start again after a restart: the oldest open slot."""
        return min(self._open) if self._open else self.horizon

    def fired_floor(self, fired_now: int) -> int:
        """Fired-queue entries from here on may name timers still listed in a chain."""
        marks = [state.fired_mark for state in self._open.values()]
        return min([fired_now, *marks])

    def open_slots(self) -> int:
        return len(self._open)

    def walking(self) -> bool:
        return self._walk is not None

    def visited_every_chain_since(self, slot_no: int) -> bool:
        """True once every chain that slots up to ``slot_no`` use was visited after a restore."""
        if self.jumped_to >= 0 and self.horizon < self.jumped_to + self.wheel.slots:
            return False
        return self.horizon > slot_no

    def restore(self, wheel_image: bytes | memoryview, horizon: int, start: int, end: int) -> None:
        self.wheel.load(wheel_image)
        self.timerlog.reset(start, end)
        self.horizon = horizon
        self.window.clear()
        self._open.clear()
        self._open_index.clear()
        self._walk = None
        self.jumped_to = -1

    def reset(self, horizon: int) -> None:
        """Forget everything (a rebuild follows)."""
        self.restore(bytes(len(self.wheel.buf)), horizon, 0, 0)

    # -- inserting --------------------------------------------------------------------------

    def _append(
        self, index: int, slot_no: int, deliver_at_ms: int, position: int, size: int, flags: int
    ) -> None:
        buf = self.wheel.buf
        offset = index * SLOT_SIZE
        chain_slot, first, last, entries = SLOT.unpack_from(buf, offset)
        if entries:
            number = self.timerlog.append(deliver_at_ms, position, size, last, flags)
            SLOT.pack_into(buf, offset, min(chain_slot, slot_no), first, number, entries + 1)
        else:
            number = self.timerlog.append(deliver_at_ms, position, size, NO_ENTRY, flags)
            SLOT.pack_into(buf, offset, slot_no, number, number, 1)

    def insert(self, deliver_at_ms: int, position: int, size: int, fired_mark: int) -> None:
        """Schedule one timer (its record already in the ``__timers`` queue)."""
        due_slot = deliver_at_ms // self.wheel.slot_ms
        horizon = self.horizon
        self.metrics["inserted"] += 1
        if due_slot >= horizon:
            # The common case: due after the slots already visited. (Due in the slot being
            # walked: the walk picks up entries appended meanwhile before it finishes.)
            self._append(due_slot % self.wheel.slots, due_slot, deliver_at_ms, position, size, 0)
            return
        target = max(due_slot, self.resume_slot())
        index = self.wheel.index_of(target)
        self._append(index, target, deliver_at_ms, position, size, 0)
        if target >= horizon:
            return  # loaded when its slot is visited
        holder = self._open_index.get(index)
        if holder is not None and holder != target:
            return  # the chain is still open for an earlier round: loaded when that one is done
        heapq.heappush(self.window, (deliver_at_ms, position, size, target))
        state = self._open.get(target)
        if state is None:
            self._open[target] = _OpenSlot(1, fired_mark)
            self._open_index[index] = target
        else:
            state.remaining += 1

    # -- visiting and rolling ---------------------------------------------------------------

    def _chain(self, index: int) -> Iterator[TimerEntry]:
        """The entries of a chain, newest first."""
        _slot_no, _first, number, entries = SLOT.unpack_from(self.wheel.buf, index * SLOT_SIZE)
        for _ in range(entries):
            entry = self.timerlog.read(number)
            yield entry
            number = entry.prev

    def advance(
        self,
        until_slot: int,
        fired_mark: int,
        *,
        max_window: int,
        is_fired: Callable[[int], bool] | None = None,
        budget: int = DEFAULT_VISIT_BUDGET,
    ) -> int:
        """Visit slots up to ``until_slot`` while the window holds fewer than ``max_window``
        timers, walking at most about ``budget`` chain entries; returns how many were walked
        (``budget`` or more: call again). More than a round behind (a long downtime), only the
        last round is visited: it reaches every chain once, and everything overdue fires."""
        oldest_useful = until_slot - self.wheel.slots + 1
        if self._walk is None and self.horizon < oldest_useful:
            self.horizon = self.jumped_to = oldest_useful
        walked = 0
        while walked < budget:
            walk = self._walk
            if walk is None:
                if self.horizon > until_slot or len(self.window) >= max_window:
                    break
                walk = self._walk = self._start_walk(self.horizon, fired_mark)
                if walk is None:
                    self.horizon += 1
                    continue
            walked += 1 + self._walk_some(walk, budget - walked, is_fired)
            if walk.left == 0:
                self._walk = None
                self.horizon = walk.slot_no + 1
        return walked

    def visit(
        self, slot_no: int, fired_mark: int, is_fired: Callable[[int], bool] | None = None
    ) -> int:
        """Visit one slot to the end at once; returns how many timers it loaded."""
        walk = self._start_walk(slot_no, fired_mark)
        if walk is None:
            return 0
        before = len(self.window)
        while walk.left:
            self._walk_some(walk, 1 << 30, is_fired)
        return len(self.window) - before

    def _start_walk(self, slot_no: int, fired_mark: int) -> _Walk | None:
        index = self.wheel.index_of(slot_no)
        self.metrics["visited"] += 1
        if index in self._open_index:
            return None  # open for an earlier round: visited again when that one is done
        _chain_slot, _first, last, entries = SLOT.unpack_from(self.wheel.buf, index * SLOT_SIZE)
        if not entries:
            return None
        state = _OpenSlot(0, fired_mark, walking=True)
        self._open[slot_no] = state
        self._open_index[index] = slot_no
        return _Walk(slot_no, index, state, last, entries)

    def _walk_some(self, walk: _Walk, budget: int, is_fired: Callable[[int], bool] | None) -> int:
        """Walk up to ``budget`` entries; at the chain's end, take in entries appended during the
        walk, then finish the visit. Returns the entries walked."""
        slot_ms = self.wheel.slot_ms
        slot_no = walk.slot_no
        window = self.window
        timerlog = self.timerlog
        per_file = timerlog.entries_per_file
        steps = min(budget, walk.left)
        number = walk.next_entry
        loaded = 0
        later = walk.state.later
        assert later is not None
        for _ in range(steps):
            if not timerlog.start <= number < timerlog.end:
                raise IndexError(f"timer-log entry {number} outside the log")
            file_number, slot = divmod(number, per_file)
            deliver_at, position, size, _flags, prev = ENTRY.unpack_from(
                timerlog.mapped(file_number), slot * ENTRY_SIZE
            )
            if deliver_at // slot_ms > slot_no:
                later.append(number)
            elif not (is_fired and is_fired(position)):
                heapq.heappush(window, (deliver_at, position, size, slot_no))
                loaded += 1
            number = prev
        walk.next_entry = number
        walk.left -= steps
        walk.state.remaining += loaded
        if walk.left == 0:
            _chain_slot, _first, last, entries = SLOT.unpack_from(
                self.wheel.buf, walk.index * SLOT_SIZE
            )
            if entries > walk.seen:
                walk.next_entry = last
                walk.left = entries - walk.seen
                walk.seen = entries
            else:
                self._finish(walk)
        return steps

    def _finish(self, walk: _Walk) -> None:
        walk.state.walking = False
        walk.state.walked = walk.seen
        if walk.state.remaining == 0:
            self._close(walk.slot_no)

    def _close(self, slot_no: int) -> None:
        state = self._open.pop(slot_no)
        index = self.wheel.index_of(slot_no)
        del self._open_index[index]
        self._roll(index, slot_no, state)

    def _entry(self, number: int) -> tuple[int, int, int, int, int]:
        """The raw fields of timer-log entry ``number`` (no TimerEntry object)."""
        timerlog = self.timerlog
        if not timerlog.start <= number < timerlog.end:
            raise IndexError(f"timer-log entry {number} outside the log")
        file_number, slot = divmod(number, timerlog.entries_per_file)
        fields: tuple[int, int, int, int, int] = ENTRY.unpack_from(
            timerlog.mapped(file_number), slot * ENTRY_SIZE
        )
        return fields

    def _roll(self, index: int, slot_no: int, state: _OpenSlot | None = None) -> None:
        """Replace the chain by copies of its entries due after ``slot_no``."""
        slot_ms = self.wheel.slot_ms
        _chain_slot, _first, number, entries = SLOT.unpack_from(self.wheel.buf, index * SLOT_SIZE)
        if state is not None and state.later is not None:
            # The walk listed the later-round entries it passed; only entries appended to the
            # chain since (at its head) are read here.
            numbers = list(state.later)
            fresh = max(0, entries - state.walked)
        else:
            numbers = []
            fresh = entries
        for _ in range(fresh):
            deliver_at, _position, _size, _flags, prev = self._entry(number)
            if deliver_at // slot_ms > slot_no:
                numbers.append(number)
            number = prev
        numbers.sort()  # oldest first (entry numbers grow along a chain): the copy keeps order
        self.wheel.clear(index)
        for number in numbers:
            deliver_at, position, size, _flags, _prev = self._entry(number)
            self._append(index, deliver_at // slot_ms, deliver_at, position, size, ENTRY_ROLLED)
        self.metrics["rolled"] += len(numbers)

    # -- firing -----------------------------------------------------------------------------

    def next_due(self) -> int | None:
        return self.window[0][0] if self.window else None

    def pop_due(self, now_ms: int, limit: int) -> list[Due]:
        """Up to ``limit`` timers due at ``now_ms``, earliest first."""
        out: list[Due] = []
        window = self.window
        while window and window[0][0] <= now_ms and len(out) < limit:
            out.append(heapq.heappop(window))
        return out

    def push_back(self, items: list[Due]) -> None:
        """Return popped timers that could not fire (they fire on a later attempt)."""
        for item in items:
            heapq.heappush(self.window, item)

    def fired(self, items: list[Due], fired_mark: int) -> None:
        """Timers that fired: close slots whose last timer this was, and roll their chains."""
        for item in items:
            slot_no = item[3]
            state = self._open[slot_no]
            state.remaining -= 1
            if state.remaining or state.walking:
                continue
            self._close(slot_no)
            if slot_no + self.wheel.slots < self.horizon:
                # The slot stayed open a whole round: visit its index's latest round now.
                rounds = (self.horizon - 1 - slot_no) // self.wheel.slots
                self.visit(slot_no + rounds * self.wheel.slots, fired_mark)

    # -- listing (read-only) ------------------------------------------------------------------

    def pending(self) -> Iterator[tuple[int, int]]:
        """``(deliver_at_ms, position)`` of every timer inserted and not fired, in no order
        (the management API's pending delays). Walks every chain once: each chain holds at most
        one round of timers, and a chain of an open slot also lists the timers of its round
        that fired already, told apart here as they are at the roll: a timer of an open slot's
        round is pending while it is in the window or not yet walked."""
        buf = self.wheel.buf
        slot_ms = self.wheel.slot_ms
        in_window = {item[1] for item in self.window}
        not_walked = self._not_walked()
        for index in range(self.wheel.slots):
            _chain_slot, _first, number, entries = SLOT.unpack_from(buf, index * SLOT_SIZE)
            open_slot = self._open_index.get(index)
            for _ in range(entries):
                deliver_at, position, _size, _flags, prev = self._entry(number)
                if (
                    open_slot is None
                    or deliver_at // slot_ms > open_slot
                    or position in in_window
                    or number in not_walked
                ):
                    yield deliver_at, position
                number = prev

    def _not_walked(self) -> set[int]:
        """Entry numbers of the chain being walked that the walk has not reached yet."""
        walk = self._walk
        if walk is None:
            return set()
        found: set[int] = set()
        _chain_slot, _first, number, entries = SLOT.unpack_from(
            self.wheel.buf, walk.index * SLOT_SIZE
        )
        for _ in range(entries - walk.seen):  # appended at the head since the walk began
            found.add(number)
            number = self._entry(number)[4]
        number = walk.next_entry
        for _ in range(walk.left):
            found.add(number)
            number = self._entry(number)[4]
        return found

    # -- reclaiming -------------------------------------------------------------------------

    def oldest_live_entry(self) -> int:
        oldest = self.wheel.oldest_entry()
        return self.timerlog.end if oldest is None else oldest

    def close(self) -> None:
        self.timerlog.close()
