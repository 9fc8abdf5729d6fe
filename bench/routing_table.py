"""A micro-benchmark of :meth:`BindingTable.route` (no I/O): ``python -m bench routing``.

``bench_route(n, kind)`` builds one source with ``n`` bindings of one kind, each to its own
destination, and times publishes whose subject matches exactly one of them (the middle one):

==========  ==========================  ==========================
kind        binding ``i``               published subject
==========  ==========================  ==========================
exact       ``dev.<i>.temp``            ``dev.<n//2>.temp``
topic       ``dev.<i>.*.temp``          ``dev.<n//2>.room.temp``
mqtt        ``sensors/<i>/+/temp``      ``sensors/<n//2>/room/temp``
==========  ==========================  ==========================

The claim it checks: with a trie, the cost of a publish stays flat as ``n`` grows.
"""

from __future__ import annotations

import gc
import time
from typing import Literal

from core.routing.table import BindingTable, MatchKind

BenchKind = Literal["exact", "topic", "mqtt"]

_SOURCE = "bench"
_PATTERNS: dict[str, tuple[MatchKind, str, str]] = {
    # kind: (match kind, binding pattern, published subject); "{}" is the binding number
    "exact": (MatchKind.EXACT, "dev.{}.temp", "dev.{}.temp"),
    "topic": (MatchKind.TOPIC, "dev.{}.*.temp", "dev.{}.room.temp"),
    "mqtt": (MatchKind.MQTT, "sensors/{}/+/temp", "sensors/{}/room/temp"),
}


def build_bench_table(n_bindings: int, kind: BenchKind) -> tuple[BindingTable[int], str]:
    """The table of ``n_bindings`` bindings and the subject that matches binding ``n // 2``."""
    if n_bindings < 1:
        raise ValueError(f"n_bindings must be at least 1, not {n_bindings}")
    match_kind, pattern, subject = _PATTERNS[kind]
    table: BindingTable[int] = BindingTable()
    for number in range(n_bindings):
        table.add(_SOURCE, match_kind, pattern.format(number), number)
    return table, subject.format(n_bindings // 2)


def bench_route(
    n_bindings: int, kind: BenchKind = "topic", *, publishes: int = 20_000, repeat: int = 5
) -> float:
    """Seconds per ``route()`` call: the best of ``repeat`` runs of ``publishes`` calls each."""
    table, subject = build_bench_table(n_bindings, kind)
    expected = {n_bindings // 2}
    if table.route(_SOURCE, subject) != expected:
        raise RuntimeError(f"{kind}: {subject!r} did not route to {expected}")
    route = table.route
    calls = range(publishes)
    best = float("inf")
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            for _ in calls:
                route(_SOURCE, subject)
            best = min(best, time.perf_counter() - started)
    finally:
        if gc_was_enabled:
            gc.enable()
    return best / publishes


def main(argv: list[str] | None = None) -> int:
    """Print the cost of one route() call per kind for growing binding counts."""
    counts = [int(arg) for arg in argv] if argv else [1, 100, 10_000]
    kinds: tuple[BenchKind, ...] = ("exact", "topic", "mqtt")
    for kind in kinds:
        for count in counts:
            seconds = bench_route(count, kind)
            print(f"{kind:6s} {count:>8,} bindings: {seconds * 1e9:8.0f} ns per route()")
    return 0
