"""The audit log: one line for every failed login and every denied operation.

Lines go to the logger ``braid.audit`` at WARNING (so they reach stderr with the default log
level, and can be routed on their own by the logger name), ``key=value`` pairs, values quoted
with ``repr`` so that a user name cannot forge a line. No password, hash or SCRAM proof is ever
written: only the user name (cut to 128 characters), the peer, the mechanism and the reason.

A client repeating the same denied operation (an MQTT 3.1.1 publisher whose publishes are
dropped, thousands a second) writes one line per ``repeat_interval_s`` for it, and the next
line says how many were left out. Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

audit_log = logging.getLogger("braid.audit")

REPEAT_INTERVAL_S: Final = 10.0
MAX_NAME_CHARS: Final = 128
# Distinct denials remembered for repeat suppression before the memory is cleared.
MAX_REMEMBERED: Final = 10_000


def _shown(value: str) -> str:
    return repr(value if len(value) <= MAX_NAME_CHARS else value[:MAX_NAME_CHARS] + "...")


class Audit:
    def __init__(
        self,
        *,
        repeat_interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repeat_interval_s = repeat_interval_s
        self.clock = clock
        self._last: dict[tuple[str, ...], tuple[float, int]] = {}
        self.login_failures = 0
        self.denials = 0

    def login_failed(
        self, protocol: str, peer: str, user: str, mechanism: str, reason: str
    ) -> None:
        self.login_failures += 1
        audit_log.warning(
            "login failed: protocol=%s peer=%s user=%s mechanism=%s reason=%s",
            protocol,
            _shown(peer),
            _shown(user),
            mechanism,
            reason,
        )

    def denied(
        self,
        protocol: str,
        peer: str,
        user: str,
        operation: str,
        vhost: str,
        resource: str,
        reason: str,
    ) -> None:
        self.denials += 1
        key = (protocol, peer, user, operation, vhost, resource)
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.repeat_interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return
        left_out = last[1] if last is not None else 0
        if len(self._last) >= MAX_REMEMBERED:
            self._last.clear()
        self._last[key] = (now, 0)
        audit_log.warning(
            "access denied: protocol=%s peer=%s user=%s operation=%s vhost=%s resource=%s "
            "reason=%s%s",
            protocol,
            _shown(peer),
            _shown(user or "(anonymous)"),
            _shown(operation),
            _shown(vhost),
            _shown(resource),
            reason,
            f" (and {left_out} more like it since the last line)" if left_out else "",
        )
