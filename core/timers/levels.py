"""RocketMQ's 18 delay levels, a special case of arbitrary delivery times.

RocketMQ 4 (``messageDelayLevel`` in the broker config, default
``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``) numbers them from 1; level 0 means
no delay and a level above 18 is treated as 18 (``ScheduleMessageService``). Pure; thread-safe.
"""

from __future__ import annotations

_SECOND = 1000
_MINUTE = 60 * _SECOND
_HOUR = 60 * _MINUTE

DELAY_LEVELS_MS: tuple[int, ...] = (
    1 * _SECOND,
    5 * _SECOND,
    10 * _SECOND,
    30 * _SECOND,
    1 * _MINUTE,
    2 * _MINUTE,
    3 * _MINUTE,
    4 * _MINUTE,
    5 * _MINUTE,
    6 * _MINUTE,
    7 * _MINUTE,
    8 * _MINUTE,
    9 * _MINUTE,
    10 * _MINUTE,
    20 * _MINUTE,
    30 * _MINUTE,
    1 * _HOUR,
    2 * _HOUR,
)
MAX_DELAY_LEVEL = len(DELAY_LEVELS_MS)  # 18


def delay_for_level(level: int) -> int:
    """The delay of a level in ms: 0 for level 0, the 18th level's for anything above 18."""
    if level < 0:
        raise ValueError(f"delay level must be >= 0, not {level}")
    if level == 0:
        return 0
    return DELAY_LEVELS_MS[min(level, MAX_DELAY_LEVEL) - 1]


def deliver_at_for_level(level: int, now: int) -> int:
    """The ``deliver_at_ms`` of a record published at ``now`` (ms) with a delay level."""
    return now + delay_for_level(level)
