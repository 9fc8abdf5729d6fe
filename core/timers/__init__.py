"""core/timers: delayed delivery. A record can become visible at any future time (ms precision,
a year ahead or more), survives restarts and crashes, fires exactly once, and a million pending
timers cost a few MiB of memory. Model: RocketMQ 5's TimerMessageStore (timer wheel + timer log).

How a timer travels:

1. A producer appends a record with ``deliver_at_ms`` in the future. The log stores it once, with
   FLAG_DELAYED, and indexes it only into ``__timers/0`` (:mod:`core.log.store`).
2. :class:`TimerService` (woken by an index listener) reads the new ``__timers/0`` entry, reads
   the record's ``deliver_at_ms`` and appends a 32-byte entry to the timer log, on the chain of
   its wheel slot (``timerlog.py``, ``wheel.py``, ``schedule.py``). Nothing per timer stays in
   Python memory.
3. A few seconds before a slot's time, its chain is walked and its timers enter an in-memory heap;
   each fires at its ms. Firing is one LINK record (:meth:`LogStore.link`) naming the record's own
   destinations plus ``__timers/1``, the fired queue: visible and marked fired in one frame.
4. Checkpoints (``DATA_DIR/timers/checkpoint``) hold the wheel image, the timer-log bounds and how
   far both queues were read. Restart = load the checkpoint, insert the ``__timers/0`` entries after
   it, filter out whatever ``__timers/1`` says fired since. No checkpoint: rebuild from the queues.

Using it (the Broker)::

    timers = TimerService(store)     # recovers (reads the checkpoint and the log's tail)
    await timers.start()             # fires; registers its index listener and retention guard
    timers.pending_count(), timers.owes_segment(start, end), timers.stats()
    await timers.stop()              # final checkpoint; before store.aclose()

Files::

    DATA_DIR/timers/checkpoint                         wheel image + progress (checkpoint.py)
    DATA_DIR/timers/timerlog/00000000000000000000.tlog  32-byte timer entries (timerlog.py)

Public API: :class:`TimerService`, ``DELAY_LEVELS_MS`` and :func:`deliver_at_for_level`
(RocketMQ's 18 delay levels), ``FIRED_DESTINATION``.
"""

from core.timers.levels import (
    DELAY_LEVELS_MS,
    MAX_DELAY_LEVEL,
    delay_for_level,
    deliver_at_for_level,
)
from core.timers.service import (
    FIRED_DESTINATION,
    FIRED_QUEUE,
    SCHEDULED_QUEUE,
    TimerRecoveryReport,
    TimerService,
)

__all__ = [
    "DELAY_LEVELS_MS",
    "FIRED_DESTINATION",
    "FIRED_QUEUE",
    "MAX_DELAY_LEVEL",
    "SCHEDULED_QUEUE",
    "TimerRecoveryReport",
    "TimerService",
    "delay_for_level",
    "deliver_at_for_level",
]
