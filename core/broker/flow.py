"""Back-pressure: one signal every front end turns into its protocol's flow control.

Pressure has named sources (``memory``, ``backlog:<queue>``, ...). While any is on, the broker is
*blocked*: publishes wait in :meth:`FlowControl.wait_unblocked` and listeners are told, so the
AMQP gateway sends connection.blocked, the MQTT gateway pauses reading its sockets and the Kafka
gateway sets ``throttle_time_ms``. Nothing is dropped: publishers are slowed, not refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

MEMORY = "memory"


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


class FlowControl:
    def __init__(self, memory_high_watermark_bytes: int | None = None) -> None:
        self.memory_high_watermark_bytes = memory_high_watermark_bytes
        self.reasons: set[str] = set()
        self._listeners: list[Callable[[bool, str], None]] = []
        self._unblocked = asyncio.Event()
        self._unblocked.set()

    @property
    def blocked(self) -> bool:
        return bool(self.reasons)

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
