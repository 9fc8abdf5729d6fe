"""Timer benchmark: memory for N pending timers, scheduling rate, restart cost, firing lateness.

``await bench_timers(data_dir)`` (for ``python -m bench core``, whose sections run in one event
loop); ``run_bench_timers`` and ``python -m bench.timers [DIR [COUNT]]`` run it alone:

1. Append ``count`` delayed records (64-byte bodies) due between one hour and one year ahead, then
   let the service insert them all; report the append rate, the insert rate, the Python heap the
   service holds (tracemalloc) and the process RSS split into anonymous memory and mapped files.
2. Restart: stop (final checkpoint), reopen the store and the service (checkpoint load), then
   delete ``DATA_DIR/timers`` and reopen again (full rebuild from the log).
3. With those timers still pending, schedule a burst of ``burst`` timers due within
   ``burst_window_ms`` and report firing lateness p50/p99/max as a consumer observes it: a
   task in the same event loop, woken by the destination queue's index listener, reads the
   new records (``store.read``, CRC-checked) and takes its clock minus each record's own
   ``deliver_at_ms``. That includes the timer service's work, the LINK, the index write and
   the consumer's wait for the event loop; the service's own figure (clock at the LINK append
   minus due time) is reported beside it. Also the process CPU per fired timer over the burst
   and the 1-minute load average at its end (the machine is shared).

The log runs in ``async`` durability so the timer work, not fsync, is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import shutil
import struct
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from core.log import DURABILITY_ASYNC, LogConfig, LogStore
from core.log.store import now_ms
from core.timers.service import TIMERS_DIR, TimerService

BODY = b"x" * 64
HOUR_MS = 3_600_000
YEAR_MS = 365 * 24 * HOUR_MS
# The burst's due window opens this long after its first publish.
BURST_LEAD_MS = 2000
PUBLISH_BATCH = 100
# Lateness target of the issue: p99 <= 50 ms.
TARGET_LATENESS_P99_MS = 50
# deliver_at_ms in a record frame (see core.log.record): the consumer reads it from the header.
_DELIVER_AT = struct.Struct("<q")
_DELIVER_AT_OFFSET = 32


def _rss() -> dict[str, int]:
    """RssAnon / RssFile / VmRSS of this process in bytes (Linux; zeros elsewhere)."""
    out = {"rss": 0, "rss_anon": 0, "rss_file": 0}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                name = {"VmRSS": "rss", "RssAnon": "rss_anon", "RssFile": "rss_file"}.get(key)
                if name:
                    out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _open(data_dir: Path) -> LogStore:
    return LogStore(
        LogConfig(
            data_dir,
            segment_size=256 << 20,
            durability=DURABILITY_ASYNC,
            retention_ms=None,
        )
    )


async def _wait_fired(timers: TimerService, target: int, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if timers.metrics["fired"] >= target:
            return
        await asyncio.sleep(0.05)


async def _bench(
    data_dir: Path, count: int, burst: int, burst_window_ms: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    result: dict[str, Any] = {"count": count, "burst": burst, "burst_window_ms": burst_window_ms}
    store = _open(data_dir)
    timers = TimerService(store, checkpoint_interval_ms=None)

    # 1. Memory and scheduling rate for `count` pending timers. tracemalloc runs only while the
    # service inserts (it would slow the appends down); the insert rate comes from the rebuild.
    gc.collect()
    rss_before = _rss()
    now = now_ms()
    started = time.perf_counter()
    for _ in range(count):
        store.append("bench", 0, BODY, deliver_at_ms=now + rng.randint(HOUR_MS, YEAR_MS))
    append_s = time.perf_counter() - started
    rss_appended = _rss()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    heap_before = tracemalloc.get_traced_memory()[0]
    while timers.step():
        pass
    gc.collect()
    heap_after, heap_peak = tracemalloc.get_traced_memory()
    if not tracing:
        tracemalloc.stop()
    rss_after = _rss()
    result.update(
        {
            "pending": timers.pending_count(),
            "append_per_s": round(count / append_s),
            "timers_heap_bytes": heap_after - heap_before,
            "timers_heap_peak_bytes": heap_peak - heap_before,
            "log_rss_anon_delta_bytes": rss_appended["rss_anon"] - rss_before["rss_anon"],
            "rss_anon_delta_bytes": rss_after["rss_anon"] - rss_appended["rss_anon"],
            "rss_file_delta_bytes": rss_after["rss_file"] - rss_appended["rss_file"],
            "timerlog_bytes": sum(
                p.stat().st_blocks * 512 for p in (data_dir / TIMERS_DIR).rglob("*.tlog")
            ),
            "wheel_bytes": len(timers._schedule.wheel.buf),
        }
    )

    # 2. Restart: checkpoint load, then a full rebuild.
    await timers.stop()
    store.close()
    store = _open(data_dir)
    timers = TimerService(store, checkpoint_interval_ms=None)
    result["restart_checkpoint_ms"] = round(timers.recovery.duration_ms, 1)
    assert timers.pending_count() == count, (timers.pending_count(), count)
    await timers.stop()
    store.close()
    shutil.rmtree(data_dir / TIMERS_DIR)
    store = _open(data_dir)
    timers = TimerService(store, checkpoint_interval_ms=None)
    result["restart_rebuild_ms"] = round(timers.recovery.duration_ms, 1)
    insert_s = timers.recovery.duration_ms / 1000
    result["insert_per_s"] = round(count / insert_s)
    result["schedule_per_s"] = round(count / (append_s + insert_s))
    assert timers.pending_count() == count, (timers.pending_count(), count)

    # 3. A burst due within a few seconds, with the others still pending.
    await store.start()
    await timers.start()
    timers.reset_lateness()
    observed: list[int] = []
    arrived = asyncio.Event()

    def on_index(topic: str, queue: int, offset: int) -> None:
        if topic == "burst":
            arrived.set()

    store.index_listeners.append(on_index)

    async def consume() -> None:
        offset = 0
        while len(observed) < burst:
            await arrived.wait()
            arrived.clear()
            while batch := store.read("burst", 0, offset, max_records=1024):
                seen_ms = now_ms()
                for queued in batch:
                    due_ms = _DELIVER_AT.unpack_from(queued.frame, _DELIVER_AT_OFFSET)[0]
                    observed.append(seen_ms - due_ms)
                offset = batch[-1].next_offset

    consumer = asyncio.create_task(consume())
    # Producers publish in small batches and yield, as connections do; the window opens after
    # the last publish is expected to be in.
    first_due = now_ms() + BURST_LEAD_MS
    started = time.perf_counter()
    for start in range(0, burst, PUBLISH_BATCH):
        for _ in range(min(PUBLISH_BATCH, burst - start)):
            due = first_due + rng.randint(0, burst_window_ms)
            store.append("burst", 0, BODY, deliver_at_ms=due)
        await asyncio.sleep(0)
    result["burst_append_s"] = round(time.perf_counter() - started, 3)
    # CPU from the first due time on: firing (and consuming), not the appends.
    await asyncio.sleep(max(0.0, (first_due - now_ms()) / 1000))
    cpu_started = time.process_time()
    await _wait_fired(timers, burst, burst_window_ms / 1000 + 30)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(consumer), 10)
    consumer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await consumer
    result["burst_cpu_us_per_timer"] = round(
        (time.process_time() - cpu_started) / max(1, burst) * 1e6, 1
    )
    result["load_average"] = round(os.getloadavg()[0], 2)
    store.index_listeners.remove(on_index)
    lateness = timers.lateness_percentiles()
    observed.sort()

    def observed_at(fraction: float) -> float:
        if not observed:
            return 0.0
        return float(observed[min(len(observed) - 1, int(fraction * len(observed)))])

    result.update(
        {
            "consumed": len(observed),
            "observed_p50_ms": observed_at(0.50),
            "observed_p99_ms": observed_at(0.99),
            "observed_max_ms": float(observed[-1]) if observed else 0.0,
        }
    )
    fired_entries = store.queue_bounds("burst", 0)[1]
    result.update(
        {
            "burst_fired": timers.metrics["fired"],
            "burst_visible": fired_entries,
            "lateness_p50_ms": lateness["p50"],
            "lateness_p99_ms": lateness["p99"],
            "lateness_max_ms": lateness["max"],
            "links": timers.metrics["links"],
            "pending_after": timers.pending_count(),
        }
    )
    await timers.stop()
    await store.aclose()
    return result


async def bench_timers(
    data_dir: Path | str,
    count: int = 1_000_000,
    *,
    burst: int = 50_000,
    burst_window_ms: int = 3000,
    seed: int = 4,
) -> dict[str, Any]:
    """Run the timer benchmark in ``data_dir/timers-bench`` (removed afterwards). About a minute
    for a million timers (they are appended to a real log, then rebuilt once from it)."""
    path = Path(data_dir) / "timers-bench"
    shutil.rmtree(path, ignore_errors=True)
    try:
        return await _bench(path, count, burst, burst_window_ms, seed)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_bench_timers(
    data_dir: Path | str, count: int = 1_000_000, **options: Any
) -> dict[str, Any]:
    """:func:`bench_timers` in its own event loop."""
    return asyncio.run(bench_timers(data_dir, count, **options))


def format_results(result: dict[str, Any]) -> str:
    mib = 1 << 20
    return "\n".join(
        [
            f"timers: {result['count']:,} pending",
            f"  schedule {result['schedule_per_s']:,}/s "
            f"(append {result['append_per_s']:,}/s, insert {result['insert_per_s']:,}/s)",
            f"  python heap held by the service {result['timers_heap_bytes'] / mib:.2f} MiB "
            f"(peak while inserting {result['timers_heap_peak_bytes'] / mib:.2f} MiB)",
            f"  inserting: RSS anon +{result['rss_anon_delta_bytes'] / mib:.1f} MiB, "
            f"mapped files +{result['rss_file_delta_bytes'] / mib:.1f} MiB; "
            f"timer log {result['timerlog_bytes'] / mib:.1f} MiB on disk, "
            f"wheel {result['wheel_bytes'] / mib:.1f} MiB",
            f"  restart: checkpoint {result['restart_checkpoint_ms']:.0f} ms, "
            f"rebuild from the log {result['restart_rebuild_ms']:.0f} ms",
            f"  burst of {result['burst']:,} due within {result['burst_window_ms']} ms: "
            f"fired {result['burst_fired']:,}, consumed {result['consumed']:,}; lateness seen by "
            f"a consumer p50 {result['observed_p50_ms']:.0f} ms, "
            f"p99 {result['observed_p99_ms']:.0f} ms (target <= {TARGET_LATENESS_P99_MS}), "
            f"max {result['observed_max_ms']:.0f} ms",
            f"  at the LINK (service's own clock): p50 {result['lateness_p50_ms']:.0f} ms, "
            f"p99 {result['lateness_p99_ms']:.0f} ms, max {result['lateness_max_ms']:.0f} ms; "
            f"CPU {result['burst_cpu_us_per_timer']:.1f} µs per fired timer; "
            f"load average {result['load_average']:.2f}",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else Path("/tmp")
    count = int(args[1]) if len(args) > 1 else 1_000_000
    print(format_results(run_bench_timers(directory, count)))


if __name__ == "__main__":
    main()
