"""The one clock of the process: monotonic time, wall time and one-shot timers, injected.

Everything that measures a timeout takes a :class:`Clock` instead of reading
``loop.time()`` or ``time.monotonic()`` itself: the gateways' keep-alive, heartbeat,
handshake and idle checks and the close timeout of a transport, the group coordinator's
join, sync and session deadlines, the transaction sweeper, the timer service's notion of
"now". :class:`LoopClock` runs timers on the running asyncio loop; :class:`ManualClock` runs
them only when a test calls :meth:`ManualClock.advance`, so timeout tests take no wall time
(uvicorn's ``MockLoop.run_later`` is the model).

Times are milliseconds: ``now_ms`` is monotonic (intervals, deadlines), ``wall_ms`` is the
Unix epoch (what is written to the log: a delayed record's due time survives a restart, a
monotonic reading does not).

Thread-safety: none; a clock belongs to the event-loop thread.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["Clock", "LoopClock", "ManualClock", "Timer"]

_monotonic = time.monotonic
_time_ns = time.time_ns

# ManualClock's wall time at its monotonic zero: 2026-01-01T00:00:00Z, so wall-clock values in
# tests look like real ones (a due time in the past of 1970 would be mistaken for "now").
MANUAL_WALL_EPOCH_MS: Final = 1_767_225_600_000


class Timer(Protocol):
    """A scheduled callback that can be cancelled (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic and wall time in milliseconds, and one-shot timers."""

    def now_ms(self) -> float: ...

    def wall_ms(self) -> int: ...

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer: ...


class LoopClock:
    """The monotonic clock asyncio's loop reads, with timers on the running loop. Looks the
    loop up for each timer, so it can be built before the loop runs (the group coordinator
    and the listeners are created at configuration time)."""

    def now_ms(self) -> float:
        # asyncio's loop.time() is time.monotonic(); reading it directly saves looking up the
        # loop, which a transaction does twice (begin and each half set its deadline).
        return _monotonic() * 1000.0

    def wall_ms(self) -> int:
        return _time_ns() // 1_000_000

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0.0) / 1000.0, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "due_ms")

    def __init__(self, due_ms: float, callback: Callable[[], None]) -> None:
        self.due_ms = due_ms
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to: for tests, and for anything replaying time.

    Timers due at the same instant fire in the order they were scheduled. Wall time moves with
    monotonic time, from ``MANUAL_WALL_EPOCH_MS`` at ``start_ms``.
    """

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now_ms = start_ms
        self._wall_offset_ms = MANUAL_WALL_EPOCH_MS - start_ms
        self._heap: list[tuple[float, int, _ManualTimer]] = []
        self._sequence = itertools.count()

    def now_ms(self) -> float:
        return self._now_ms

    def wall_ms(self) -> int:
        return int(self._now_ms + self._wall_offset_ms)

    def call_later(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(self._now_ms + max(delay_ms, 0.0), callback)
        heapq.heappush(self._heap, (timer.due_ms, next(self._sequence), timer))
        return timer

    def advance(self, delta_ms: float) -> int:
        """Move time forward by ``delta_ms``, firing every timer that falls due on the way
        (including timers those callbacks schedule inside the window). Returns how many fired."""
        target = self._now_ms + delta_ms
        fired = 0
        while self._heap and self._heap[0][0] <= target:
            due_ms, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now_ms = max(self._now_ms, due_ms)
            timer.callback()
            fired += 1
        self._now_ms = max(self._now_ms, target)
        return fired

    def pending(self) -> int:
        """The number of timers scheduled and not cancelled."""
        return sum(1 for _, _, timer in self._heap if not timer.cancelled)
