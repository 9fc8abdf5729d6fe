"""Login slow-down: after a few failed logins from one address, its next attempts wait.

Without it, a client guessing passwords is answered as fast as the broker can hash (881 wrong
AMQP passwords a second were answered before this module). After ``failures_before_delay``
failures from one host (remembered for ``forget_after_s`` after the last one), each further
attempt from that host takes a slot: the first waits nothing, each next one ``delay`` after
the one before, the delay doubling with every failure from ``first_delay_s`` up to
``max_delay_s`` (fail2ban's and OpenSSH's ``MaxStartups`` idea: bound the rate, not the number
of connections). Parallel attempts queue for distinct slots, so opening many connections does
not buy more guesses; an attempt whose slot is more than ``max_wait_s`` away is refused at once
without checking the password. A successful login from the host forgets its failures.

Keyed by host (the peer address without its port). At most ``max_addresses`` hosts are
remembered (the least recently failed are forgotten first), so a flood from many addresses
costs bounded memory. The clock is injected (tests drive a manual one). Not thread-safe.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# Defaults (the [auth] settings, docs/configuration.md).
FAILURES_BEFORE_DELAY: Final = 3  # a typo or two costs nothing
FIRST_DELAY_S: Final = 0.1
MAX_DELAY_S: Final = 5.0  # then at most one guess per 5 s per host
MAX_WAIT_S: Final = 30.0  # longer than a client's connect timeout: refuse instead of holding
FORGET_AFTER_S: Final = 60.0
MAX_ADDRESSES: Final = 100_000  # ~100 bytes each: ~10 MB at most

REFUSE: Final = -1.0  # what delay_before_attempt returns for "refuse now"


@dataclass(slots=True)
class _Host:
    failures: int = 0
    last_failure: float = 0.0
    next_slot: float = 0.0


def host_of(peer: str) -> str:
    """The host part of ``host:port`` or ``[v6]:port`` (the whole string when there is no
    port)."""
    if peer.startswith("["):
        end = peer.find("]")
        return peer[1:end] if end > 0 else peer
    if peer.count(":") == 1:
        return peer.rsplit(":", 1)[0]
    return peer


class LoginThrottle:
    def __init__(
        self,
        *,
        failures_before_delay: int = FAILURES_BEFORE_DELAY,
        first_delay_s: float = FIRST_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
        max_wait_s: float = MAX_WAIT_S,
        forget_after_s: float = FORGET_AFTER_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_before_delay = failures_before_delay
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.max_wait_s = max_wait_s
        self.forget_after_s = forget_after_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._hosts: OrderedDict[str, _Host] = OrderedDict()
        self.refused = 0  # attempts refused without a check (a metric)
        self.delayed = 0  # attempts made to wait

    def _current(self, host: str, now: float) -> _Host | None:
        state = self._hosts.get(host)
        if state is not None and now - state.last_failure > self.forget_after_s:
            del self._hosts[host]
            return None
        return state

    def delay_before_attempt(self, host: str) -> float:
        """Seconds this attempt must wait before its password is checked (its slot is taken
        now), or :data:`REFUSE`."""
        now = self.clock()
        state = self._current(host, now)
        if state is None or state.failures < self.failures_before_delay:
            return 0.0
        steps = state.failures - self.failures_before_delay
        delay = min(self.first_delay_s * (2 ** min(steps, 32)), self.max_delay_s)
        start = max(now, state.next_slot)
        if start - now > self.max_wait_s:
            self.refused += 1
            return REFUSE
        state.next_slot = start + delay
        if start > now:
            self.delayed += 1
        return start - now

    def failed(self, host: str) -> None:
        now = self.clock()
        state = self._current(host, now)
        if state is None:
            state = self._hosts[host] = _Host()
            while len(self._hosts) > self.max_addresses:
                self._hosts.popitem(last=False)
        else:
            self._hosts.move_to_end(host)
        state.failures += 1
        state.last_failure = now

    def succeeded(self, host: str) -> None:
        self._hosts.pop(host, None)

    def failures(self, host: str) -> int:
        state = self._current(host, self.clock())
        return 0 if state is None else state.failures
