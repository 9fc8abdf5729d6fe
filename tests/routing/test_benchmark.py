"""The benchmark helper runs and routes correctly (timings are the lead's, in bench/)."""

from __future__ import annotations

import pytest

from bench.routing_table import BenchKind, bench_route, build_bench_table


@pytest.mark.parametrize("kind", ["exact", "topic", "mqtt"])
def test_bench_route_returns_seconds_per_publish(kind: BenchKind) -> None:
    seconds = bench_route(100, kind, publishes=50, repeat=2)
    assert 0 < seconds < 1


@pytest.mark.parametrize("kind", ["exact", "topic", "mqtt"])
def test_the_bench_subject_matches_one_binding(kind: BenchKind) -> None:
    table, subject = build_bench_table(1000, kind)
    assert table.route("bench", subject) == {500}
    assert len(table) == 1000


def test_at_least_one_binding() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bench_route(0, "topic")
