"""Back-pressure: one signal every front end turns into its protocol's flow control.

Pressure has named sources (``memory``, ``backlog:<queue>``, ``disk``, ...). While any is on,
the broker is *blocked*: publishes wait in :meth:`FlowControl.wait_unblocked` and listeners are
told, so the AMQP gateway sends connection.blocked, the MQTT gateway pauses reading its sockets
and the Kafka gateway sets ``throttle_time_ms``. Nothing is dropped: publishers are slowed, not
refused.

``disk`` is the disk alarm (core/log/diskspace.py, RabbitMQ's disk_free_limit): a blocked
publisher of its own. Protocols that can refuse a publish and have the client retry answer it
instead of waiting (:attr:`FlowControl.disk_alarm`): MQTT 5 PUBACK 0x97 Quota exceeded, Kafka
KAFKA_STORAGE_ERROR (retriable); AMQP (connection.blocked, as RabbitMQ's disk alarm) and MQTT
3.1.1 (not read) wait.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable

from core.log.diskspace import DiskSpace

log = logging.getLogger(__name__)

MEMORY = "memory"
DISK = "disk"


def anonymous_memory_bytes() -> int:
    """Resident anonymous memory of this process (excludes the mapped log files, which are
    page cache the kernel can write back and drop)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# Descriptors kept free for the log beyond its share (a checkpoint's files, a new segment, the
# accept that learns a connection must be refused); the index files' share is a quarter of the
# limit (core/log/openfiles.py).
RESERVED_DESCRIPTORS = 32
# How often the open descriptors are counted (/proc/self/fd: ~1 ms at 10,000); between counts
# each admitted connection is added to the last count.
DESCRIPTOR_COUNT_INTERVAL_S = 0.1


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class DescriptorBudget:
    """Whether a new connection may take a descriptor (issue 21 item 3): not while fewer than a
    quarter of the soft RLIMIT_NOFILE plus RESERVED_DESCRIPTORS would be left, so the log (its
    index files, checkpoints, segments) always finds the descriptors it needs and the gateways
    refuse a connection cleanly (AMQP: closed, MQTT: CONNACK 0x89 / 0x03, Kafka: closed)
    instead of accept() failing with EMFILE."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counted_at = -DESCRIPTOR_COUNT_INTERVAL_S
        self._open = 0
        self.refused = 0

    def limit(self) -> int:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 1 << 62
        return int(soft) - int(soft) // 4 - RESERVED_DESCRIPTORS

    def may_open_connection(self) -> bool:
        now = self._clock()
        if now - self._counted_at >= DESCRIPTOR_COUNT_INTERVAL_S:
            self._open = open_descriptors()
            self._counted_at = now
        if self._open >= self.limit():
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "near the descriptor limit (%d open, connections allowed up to %d): new "
                    "connections refused (%d so far)",
                    self._open,
                    self.limit(),
                    self.refused,
                )
            return False
        self._open += 1
        return True


class FlowControl:
    def __init__(self, memory_high_watermark_bytes: int | None = None) -> None:
        self.memory_high_watermark_bytes = memory_high_watermark_bytes
        self.descriptors = DescriptorBudget()
        self.reasons: set[str] = set()
        self._listeners: list[Callable[[bool, str], None]] = []
        self._unblocked = asyncio.Event()
        self._unblocked.set()

    @property
    def blocked(self) -> bool:
        return bool(self.reasons)

    @property
    def disk_alarm(self) -> bool:
        """The disk alarm is on (publishers blocked for free disk space)."""
        return DISK in self.reasons

    def watch_disk(self, disk_space: DiskSpace) -> None:
        """Block publishers while ``disk_space``'s alarm is on (from now on, and now)."""
        disk_space.add_listener(lambda alarm: self.set_pressure(DISK, alarm))
        self.set_pressure(DISK, disk_space.alarm)

    def add_listener(self, listener: Callable[[bool, str], None]) -> None:
        """``listener(blocked, reason)`` on every change between blocked and unblocked."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[bool, str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def set_pressure(self, reason: str, on: bool) -> None:
        was_blocked = self.blocked
        if on:
            self.reasons.add(reason)
        else:
            self.reasons.discard(reason)
        if was_blocked == self.blocked:
            return
        if self.blocked:
            self._unblocked.clear()
            log.warning("flow control: publishers blocked (%s)", ", ".join(sorted(self.reasons)))
        else:
            self._unblocked.set()
            log.info("flow control: publishers unblocked")
        for listener in list(self._listeners):
            try:
                listener(self.blocked, ", ".join(sorted(self.reasons)) or reason)
            except Exception:
                log.exception("flow-control listener failed")

    async def wait_unblocked(self) -> None:
        if self.reasons:
            await self._unblocked.wait()

    def check_memory(self) -> None:
        if self.memory_high_watermark_bytes is None:
            return
        used = anonymous_memory_bytes()
        self.set_pressure(MEMORY, used > self.memory_high_watermark_bytes)
