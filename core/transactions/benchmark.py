"""Throughput of transactional publishes (half + commit) against plain publishes, in one run.

``bench_half_commit(data_dir, n)`` opens one store (sync durability, group commit) in
``data_dir`` and runs these phases with the same ``concurrency`` producers (asyncio tasks) and
the same 100-byte bodies, each storing ``n`` records:

- ``plain``: ``store.append`` + ``await store.wait_durable`` per record (a durable publish);
- ``txn1``: one record per transaction: ``begin``, ``await add`` (durable half), ``await commit``
  (op record + LINK, durable): two durable round trips per record where a plain publish has one;
- ``txn10``: ten records per transaction: ten ``await add``, one ``await commit``;
- ``oneway1``: one record per transaction, durable half, ``commit(durable=False)`` (RocketMQ's
  producer: its EndTransaction is one-way, a lost commit is recovered by check-back);
- ``tx1``: one record per transaction, ``add_nowait`` and a durable commit (AMQP ``tx``,
  Kafka: only the commit is acknowledged).

Figures are records per second, wall time; ``ratio(phase)`` is the phase's rate over the plain
rate (the issue's target: >= 0.5). No check-back runs: every transaction commits at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from core.log import LogConfig, LogStore
from core.transactions.service import TransactionService

BODY_SIZE = 100
DEFAULT_CONCURRENCY = 32
_TOPIC = "bench-txn"


@dataclass(frozen=True)
class HalfCommitResult:
    records: int
    concurrency: int
    per_s: dict[str, float]  # phase -> records per second

    def ratio(self, phase: str) -> float:
        return self.per_s[phase] / self.per_s["plain"]

    def summary(self) -> str:
        parts = [f"plain {self.per_s['plain']:,.0f}/s"]
        parts += [
            f"{phase} {rate:,.0f}/s ({self.ratio(phase):.0%})"
            for phase, rate in self.per_s.items()
            if phase != "plain"
        ]
        return f"{self.records} records, {self.concurrency} producers: " + ", ".join(parts)


async def _run(concurrency: int, units: int, unit: object) -> float:
    """Run ``units`` calls of ``unit()`` over ``concurrency`` tasks; returns seconds taken."""
    remaining = iter(range(units))

    async def worker() -> None:
        for _ in remaining:
            await unit()  # type: ignore[operator]

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def bench_half_commit_async(
    data_dir: Path | str,
    n: int,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    body_size: int = BODY_SIZE,
) -> HalfCommitResult:
    if n < 10:
        raise ValueError("n must be at least 10")
    store = LogStore(LogConfig(Path(data_dir), retention_ms=None))
    service = TransactionService(store)
    await service.start()
    body = b"x" * body_size
    try:

        async def plain() -> None:
            appended = store.append(_TOPIC, 0, body)
            await store.wait_durable(appended.end, _TOPIC)

        async def txn1() -> None:
            txn = service.begin("bench")
            await service.add(txn, _TOPIC, 1, body)
            await service.commit(txn)

        async def txn10() -> None:
            txn = service.begin("bench")
            for _ in range(10):
                await service.add(txn, _TOPIC, 2, body)
            await service.commit(txn)

        async def oneway1() -> None:
            txn = service.begin("bench")
            await service.add(txn, _TOPIC, 3, body)
            await service.commit(txn, durable=False)

        async def tx1() -> None:
            txn = service.begin("bench")
            service.add_nowait(txn, _TOPIC, 4, body)
            await service.commit(txn)

        await _run(concurrency, min(n, 1000), plain)  # warm up: segment pages, code paths
        per_s: dict[str, float] = {}
        for phase, unit, size in (
            ("plain", plain, 1),
            ("txn1", txn1, 1),
            ("txn10", txn10, 10),
            ("oneway1", oneway1, 1),
            ("tx1", tx1, 1),
        ):
            units = n // size
            per_s[phase] = units * size / await _run(concurrency, units, unit)
        # The one-way commits are durable by now too (anything later waited for an fsync).
        await store.wait_durable(store.commitlog.write_position)
    finally:
        await service.aclose()
        await store.aclose()
    return HalfCommitResult(n, concurrency, per_s)


def bench_half_commit(
    data_dir: Path | str,
    n: int,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    body_size: int = BODY_SIZE,
) -> HalfCommitResult:
    """Run the benchmark on a fresh event loop (see the module docstring)."""
    return asyncio.run(
        bench_half_commit_async(data_dir, n, concurrency=concurrency, body_size=body_size)
    )


if __name__ == "__main__":
    import sys
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    producers = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_CONCURRENCY
    with tempfile.TemporaryDirectory(prefix="braid-txn-bench-") as directory:
        print(bench_half_commit(directory, count, concurrency=producers).summary())
