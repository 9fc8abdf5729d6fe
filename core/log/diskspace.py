"""The disk alarm: free space on the volume holding the log against ``disk_free_limit_bytes``
(RabbitMQ's ``disk_free_limit``, default its ``50MB``: 50,000,000 bytes).

Checked every ``disk_free_check_interval_ms`` by the store's background task, each time the
commit log reserves a new stretch of blocks (every 16 MiB appended and at each new segment,
``CommitLog.on_reserve``) and at once when a reservation finds the disk full. Below the limit the
alarm is on and its listeners are told; the broker's flow control turns it into each protocol's
answer (``core/broker/flow.py``: AMQP publishers blocked, MQTT 5 PUBACK 0x97, MQTT 3.1.1 not
read, Kafka KAFKA_STORAGE_ERROR). It goes off by itself once a check finds the space back.

Why an absolute limit and not a fraction of the volume: RabbitMQ's default is absolute (50 MB),
and what the limit must cover is what the broker may still write with publishers stopped (the
acks, offsets and timers of consumers that go on, a checkpoint), which does not grow with the
volume. Set it above the largest burst that can land between two checks.

Free space is ``f_bavail`` (what an unprivileged writer can still use), as ``df`` shows.
The event-loop thread only; a check is one statvfs(2), a few microseconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# RabbitMQ's disk_free_limit.absolute default ("50MB" is 50,000,000 bytes in its units).
DEFAULT_DISK_FREE_LIMIT_BYTES = 50_000_000
# RabbitMQ checks every 10 s at most, faster when close to the limit; statvfs is cheap enough
# here to check every second and at every 16 MiB appended as well.
DEFAULT_DISK_FREE_CHECK_INTERVAL_MS = 1000


def free_bytes_of(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s volume."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class DiskSpace:
    """The disk alarm of one data directory. ``limit_bytes`` None: never on."""

    def __init__(self, directory: Path, limit_bytes: int | None) -> None:
        self.directory = directory
        self.limit_bytes = limit_bytes
        self.free_bytes = -1  # unknown until the first check
        self.alarm = False
        self.alarms = 0  # times the alarm went on since the store opened
        self._listeners: list[Callable[[bool], None]] = []

    def add_listener(self, listener: Callable[[bool], None]) -> None:
        """``listener(alarm)`` on every change of the alarm."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[bool], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def check(self) -> bool:
        """Measure the free space and set the alarm; returns it."""
        try:
            self.free_bytes = free_bytes_of(self.directory)
        except OSError as error:  # the directory went away or the volume is gone: keep state
            log.warning("disk alarm: cannot measure free space of %s: %s", self.directory, error)
            return self.alarm
        limit = self.limit_bytes
        self._set(limit is not None and self.free_bytes < limit, "below disk_free_limit_bytes")
        return self.alarm

    def on_reserve(self, full: bool) -> None:
        """``CommitLog.on_reserve``: a reservation of blocks, or one that found the disk full
        (the alarm goes on then; a later check turns it off when space is back). Called in
        the middle of an append: the listeners run after it, in the event loop's next turn,
        so none of them acts on the log while a frame is half written."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool, a test): at once
            self._reserved(full)
            return
        loop.call_soon(self._reserved, full)

    def _reserved(self, full: bool) -> None:
        if full:
            self.free_bytes = 0
            self._set(True, "no space left to reserve blocks for the log")
        else:
            self.check()

    def _set(self, alarm: bool, why: str) -> None:
        if alarm == self.alarm:
            return
        self.alarm = alarm
        if alarm:
            self.alarms += 1
            log.warning(
                "disk alarm: %d bytes free on %s, %s (%s): publishers stopped until space is freed",
                self.free_bytes,
                self.directory,
                why,
                self.limit_bytes,
            )
        else:
            log.warning(
                "disk alarm cleared: %d bytes free on %s (disk_free_limit_bytes %s): "
                "publishers resume",
                self.free_bytes,
                self.directory,
                self.limit_bytes,
            )
        for listener in list(self._listeners):
            try:
                listener(alarm)
            except Exception:
                log.exception("disk alarm listener failed")
