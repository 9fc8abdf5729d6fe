"""``python -m bench log``: throughput of the log engine (core/log) against the raw disk.

One run measures, in a temporary directory on the filesystem given by ``--dir``:

1. raw sequential write bandwidth: ``os.write`` of ``--volume-mib`` in 1 MiB chunks, then fsync,
   five times spread over the run (start, before each round of the 1 KiB batched test, end),
   best kept;
2. ``async`` appends of 100-byte and 1 KiB records, one ``store.append`` per record and
   ``store.append_many`` batches of 100, each up to the same volume (or a time cap), timed up to
   and including the final flush, so the bytes are on disk exactly as the raw test's are. The
   1 KiB batched test, the one compared with raw, runs three times, each right after a raw run,
   and is treated as raw is: best kept (on this VM the page cache's cost per byte varies
   several-fold within a minute, for raw writes and the log alike);
3. ``sync`` appends (append + ``await wait_durable``) with 1 writer and with 64 concurrent writers
   (asyncio tasks), for a fixed time split into alternating rounds;
4. reads of what test 2 wrote: ``store.read`` over the queue in ``max_records`` batches (the
   writer's own frames, not CRC-checked again), the same with a ``LogReader`` (every frame
   CRC-checked), a full ``commitlog.scan`` (CRC-checked frames), and ``store.scan`` (decoded
   records), each bounded in records and time.

Every figure is printed beside the process CPU time it cost (all threads: the fsync worker
included). Targets come from the issue (2 cores); each is printed PASS or FAIL. The temporary
directory is removed at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.log import DURABILITY_ASYNC, DURABILITY_SYNC, LogConfig, LogReader, LogStore
from core.log import record as rec

MIB = 1 << 20
MB = 1_000_000  # MB/s figures are decimal, for the raw disk and the log alike
# Raw writes go in 1 MiB chunks: large enough that syscall cost is noise, as dd bs=1M.
RAW_CHUNK = MIB
# Same volume for the raw test and every async append test, so page-cache effects are alike.
DEFAULT_VOLUME_MIB = 256
QUICK_VOLUME_MIB = 32
# Half the volume: a test that writes its whole volume rolls into a second segment once, so
# the roll is measured but is one event among hundreds of thousands of appends.
DEFAULT_SEGMENT_MIB = 128
QUICK_SEGMENT_MIB = 16
RECORD_SIZES = (100, 1024)
BATCH = 100  # records per append_many call
# The 1 KiB batched test (compared with raw, as raw is measured) runs this many times.
COMPARED_ROUNDS = 3
SYNC_RECORD_SIZE = 100  # small records: the fsync, not the copy, is what group commit amortises
SYNC_WRITERS = 64
SYNC_ROUNDS = 3  # 1-writer and 64-writer rounds alternate, so disk drift hits both alike
READ_BATCH = 1000  # max_records per store.read, like a consumer's fetch
# Time caps (seconds): the whole run stays under 2 minutes on a slow disk.
DEFAULT_APPEND_SECONDS = 8.0
DEFAULT_SYNC_SECONDS = 3.0
DEFAULT_READ_SECONDS = 3.0
QUICK_APPEND_SECONDS = 1.5
QUICK_SYNC_SECONDS = 0.7
QUICK_READ_SECONDS = 1.0
MAX_READ_RECORDS = 2_000_000
# Loops look at the clock (and yield to the event loop) once per this many records.
CHECK_EVERY = 1024
TOPIC = "bench"

# Targets from the issue, measured on 2 cores.
TARGET_BATCHED_1K_OF_RAW = 0.50
TARGET_SINGLE_100B_PER_S = 200_000
TARGET_SYNC_SPEEDUP = 20.0
TARGET_SCAN_PER_S = 1_000_000


@dataclass
class Measure:
    name: str
    records: int
    wall: float  # seconds
    cpu: float  # process CPU seconds, all threads
    log_bytes: int = 0  # bytes written to the log (frames) or the file (raw)
    note: str = ""

    @property
    def per_second(self) -> float:
        return self.records / self.wall if self.wall else 0.0

    @property
    def per_cpu_second(self) -> float:
        """Records per CPU second: what a CPU-bound test would reach with a core to itself."""
        return self.records / self.cpu if self.cpu else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.log_bytes / MB / self.wall if self.wall else 0.0


@dataclass
class Target:
    description: str
    measured: str
    passed: bool


class Stopwatch:
    """Wall and process CPU time since creation."""

    def __init__(self) -> None:
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()

    def elapsed(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall_start, time.process_time() - self.cpu_start


@dataclass
class Settings:
    root: Path
    volume: int  # bytes
    segment_size: int
    append_seconds: float
    sync_seconds: float
    read_seconds: float


# -- the machine -------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def filesystem_of(path: Path) -> str:
    """``fstype device (mount point)`` of the mount holding ``path``, from /proc/self/mounts."""
    real = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                device, mount_point, fstype = line.split()[:3]
                mount_point = mount_point.replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best[0]):
                    best = (mount_point, device, fstype)
    except OSError:
        return "unknown"
    return f"{best[2]} {best[1]} ({best[0]})"


def header(settings: Settings, loop_name: str) -> list[str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cores = usable_cores()
    return [
        f"date: {now}",
        f"machine: {cpu_model()}, {cores} cores usable ({os.cpu_count()} online), "
        f"Linux {platform.release()}",
        f"python: {platform.python_implementation()} {platform.python_version()}, "
        f"event loop {loop_name}",
        f"directory: {settings.root.parent} on {filesystem_of(settings.root)}",
        f"load average at start: {load_average()} (other processes skew wall-clock figures; "
        "the CPU columns are steadier)",
        f"volume {settings.volume // MIB} MiB per write test, segment size "
        f"{settings.segment_size // MIB} MiB, time caps: append {settings.append_seconds:g} s, "
        f"sync {settings.sync_seconds:g} s, read {settings.read_seconds:g} s",
    ]


# -- the tests ---------------------------------------------------------------------------------


def raw_write_once(settings: Settings) -> tuple[float, float]:
    """Plain sequential os.write in 1 MiB chunks, then fsync: ``(wall, cpu)`` seconds."""
    chunk = os.urandom(RAW_CHUNK)
    path = settings.root / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        watch = Stopwatch()
        for _ in range(settings.volume // RAW_CHUNK):
            os.write(fd, chunk)
        os.fsync(fd)
        return watch.elapsed()
    finally:
        os.close(fd)
        path.unlink()


def raw_measure(settings: Settings, runs: list[tuple[float, float]]) -> Measure:
    """The best of the raw runs, which are spread over the whole bench (a shared or virtual disk
    changes speed over a minute). The best one: a noisy disk makes the log's share look worse,
    never better."""
    wall, cpu = min(runs)
    chunks = settings.volume // RAW_CHUNK
    return Measure(
        f"raw os.write {RAW_CHUNK // MIB} MiB chunks + fsync",
        chunks,
        wall,
        cpu,
        chunks * RAW_CHUNK,
        f"best of {len(runs)} spread over the run: "
        + ", ".join(f"{chunks * RAW_CHUNK / MB / w:.0f}" for w, _ in runs)
        + " MB/s",
    )


def frame_size_of(record_size: int) -> int:
    return len(rec.encode_record(TOPIC.encode(), 0, bytes(record_size), store_ms=0))


def open_store(settings: Settings, name: str, durability: str) -> LogStore:
    config = LogConfig(
        settings.root / name, segment_size=settings.segment_size, durability=durability
    )
    return LogStore(config)


async def append_async(
    store: LogStore, settings: Settings, record_size: int, batch: int
) -> Measure:
    """Append up to ``settings.volume`` bytes of records (or until the time cap), then flush.

    The loop yields to the event loop every CHECK_EVERY records so the async-durability flusher
    runs beside it, as it would in the broker.
    """
    body = os.urandom(record_size)
    bodies = [body] * batch
    frame_size = frame_size_of(record_size)
    planned = max(batch, settings.volume // frame_size // batch * batch)
    calls_per_check = max(1, CHECK_EVERY // batch)
    bytes_before = store.metrics["appended_bytes"]
    append = store.append
    append_many = store.append_many
    done = 0
    watch = Stopwatch()
    deadline = watch.wall_start + settings.append_seconds
    while done < planned:
        if batch == 1:
            count = min(CHECK_EVERY, planned - done)
            for _ in range(count):
                append(TOPIC, 0, body)
        else:
            calls = min(calls_per_check, (planned - done) // batch)
            for _ in range(calls):
                append_many(TOPIC, 0, bodies)
            count = calls * batch
        done += count
        await asyncio.sleep(0)
        if time.perf_counter() >= deadline:
            break
    flush_start = time.perf_counter()
    store.flush()
    flush = time.perf_counter() - flush_start
    wall, cpu = watch.elapsed()
    name = f"async {record_size} B, " + ("single append" if batch == 1 else f"append_many x{batch}")
    note = f"final flush {flush:.2f} s; {len(store.commitlog.segments)} segment(s)"
    if done < planned:
        note += f"; time cap hit ({done / planned:.0%} of volume)"
    return Measure(name, done, wall, cpu, store.metrics["appended_bytes"] - bytes_before, note)


@dataclass
class SyncTally:
    """What one writer count did over all its rounds."""

    records: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    fsyncs: int = 0
    log_bytes: int = 0


async def sync_round(store: LogStore, writers: int, seconds: float, tally: SyncTally) -> None:
    """``writers`` tasks, each appending and awaiting durability in a loop, for ``seconds``."""
    body = os.urandom(SYNC_RECORD_SIZE)
    fsyncs_before = store.metrics["fsyncs"]
    bytes_before = store.metrics["appended_bytes"]
    watch = Stopwatch()
    deadline = watch.wall_start + seconds

    async def writer() -> int:
        count = 0
        while time.perf_counter() < deadline:
            appended = store.append(TOPIC, 0, body)
            await store.wait_durable(appended.end)
            count += 1
        return count

    counts = await asyncio.gather(*(writer() for _ in range(writers)))
    wall, cpu = watch.elapsed()
    tally.records += sum(counts)
    tally.wall += wall
    tally.cpu += cpu
    tally.fsyncs += store.metrics["fsyncs"] - fsyncs_before
    tally.log_bytes += store.metrics["appended_bytes"] - bytes_before


async def sync_writers(settings: Settings) -> list[Measure]:
    """1 writer and SYNC_WRITERS writers in alternating rounds, so both see the same disk: the
    fsync latency of a shared or virtual disk drifts by several times within a minute."""
    counts = (1, SYNC_WRITERS)
    tallies = {writers: SyncTally() for writers in counts}
    async with (
        fresh_store(settings, "sync-1", DURABILITY_SYNC) as one,
        fresh_store(settings, f"sync-{SYNC_WRITERS}", DURABILITY_SYNC) as many,
    ):
        stores = {1: one, SYNC_WRITERS: many}
        for _ in range(SYNC_ROUNDS):
            for writers in counts:
                seconds = settings.sync_seconds / SYNC_ROUNDS
                await sync_round(stores[writers], writers, seconds, tallies[writers])
    out = []
    for writers, tally in tallies.items():
        fsyncs = max(tally.fsyncs, 1)
        note = (
            f"{tally.fsyncs} fsyncs, {tally.records / fsyncs:.1f} records and "
            f"{tally.wall / fsyncs * 1000:.2f} ms per fsync; {SYNC_ROUNDS} alternating rounds"
        )
        name = f"sync {SYNC_RECORD_SIZE} B, {writers} writer{'s' if writers > 1 else ''}"
        out.append(Measure(name, tally.records, tally.wall, tally.cpu, tally.log_bytes, note))
    return out


def read_queue(reader: LogReader, settings: Settings, frame_size: int, checked: bool) -> Measure:
    """``read`` from offset 0 in READ_BATCH batches (zero-copy QueueRecords).

    The read tests run on what the 100-byte single-append test wrote: every frame is
    ``frame_size`` bytes, so bytes are counted outside the timed loops. ``store.read`` reads the
    writer's own frames, which it does not CRC-check again (docs/storage.md); a ``LogReader``
    on the same directory (another process's view, or the writer after a restart) checks every
    frame, so both are measured.
    """
    offset = 0
    records = 0
    watch = Stopwatch()
    deadline = watch.wall_start + settings.read_seconds
    while records < MAX_READ_RECORDS and time.perf_counter() < deadline:
        got = reader.read(TOPIC, 0, offset, max_records=READ_BATCH)
        if not got:
            break
        records += len(got)
        offset = got[-1].next_offset
    wall, cpu = watch.elapsed()
    name = "LogReader.read" if checked else "store.read"
    note = "frames CRC-checked" if checked else "the writer's own frames: not CRC-checked again"
    return Measure(
        f"{name}, max_records={READ_BATCH}",
        records,
        wall,
        cpu,
        records * frame_size,
        f"QueueRecord per record; {note}",
    )


def scan_commitlog(store: LogStore, settings: Settings, frame_size: int) -> Measure:
    """``commitlog.scan`` from the start: (position, size, magic) per frame, CRC-checked."""
    records = 0
    watch = Stopwatch()
    deadline = watch.wall_start + settings.read_seconds
    for _ in store.commitlog.scan(store.commitlog.start_position):
        records += 1
        if records & (CHECK_EVERY - 1) == 0 and (
            records >= MAX_READ_RECORDS or time.perf_counter() >= deadline
        ):
            break
    wall, cpu = watch.elapsed()
    return Measure("commitlog.scan", records, wall, cpu, records * frame_size, "frames CRC-checked")


def scan_records(store: LogStore, settings: Settings, frame_size: int) -> Measure:
    """``store.scan``: every record decoded (for reference; no target)."""
    records = 0
    watch = Stopwatch()
    deadline = watch.wall_start + settings.read_seconds
    for _ in store.scan():
        records += 1
        if records & (CHECK_EVERY - 1) == 0 and (
            records >= MAX_READ_RECORDS or time.perf_counter() >= deadline
        ):
            break
    wall, cpu = watch.elapsed()
    return Measure(
        "store.scan (decoded Records)",
        records,
        wall,
        cpu,
        records * frame_size,
        "for reference, no target",
    )


# -- running -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_store(settings: Settings, name: str, durability: str) -> AsyncIterator[LogStore]:
    """A new store in its own directory, started; closed and deleted afterwards."""
    store = open_store(settings, name, durability)
    try:
        await store.start()
        yield store
    finally:
        await store.aclose()
        shutil.rmtree(settings.root / name, ignore_errors=True)


async def run_all(settings: Settings, progress: Callable[[Measure], None]) -> list[Measure]:
    results: list[Measure] = []
    raw_runs: list[tuple[float, float]] = []

    def done(measure: Measure) -> None:
        results.append(measure)
        progress(measure)

    raw_runs.append(raw_write_once(settings))
    for record_size in RECORD_SIZES:
        for batch in (1, BATCH):
            name = f"async-{record_size}-{batch}"
            if (record_size, batch) == (RECORD_SIZES[-1], BATCH):
                # The test compared with raw: in pairs right after a raw run, best of each kept
                # (the page cache's cost per byte on this VM varies several-fold over a minute).
                rounds = []
                for _ in range(COMPARED_ROUNDS):
                    raw_runs.append(raw_write_once(settings))
                    async with fresh_store(settings, name, DURABILITY_ASYNC) as store:
                        rounds.append(await append_async(store, settings, record_size, batch))
                done(best_of(rounds))
                continue
            async with fresh_store(settings, name, DURABILITY_ASYNC) as store:
                done(await append_async(store, settings, record_size, batch))
                if record_size == RECORD_SIZES[0] and batch == 1:
                    # Read back what the 100-byte single appends wrote: the most records.
                    frame = frame_size_of(record_size)
                    done(read_queue(store, settings, frame, checked=False))
                    with LogReader(store.data_dir) as reader:
                        done(read_queue(reader, settings, frame, checked=True))
                    done(scan_commitlog(store, settings, frame))
                    done(scan_records(store, settings, frame))
    for measure in await sync_writers(settings):
        done(measure)
    raw_runs.append(raw_write_once(settings))
    raw = raw_measure(settings, raw_runs)
    progress(raw)
    return [raw, *results]


def best_of(rounds: list[Measure]) -> Measure:
    """The fastest of ``rounds`` of one test, its note listing every round's MB/s."""
    best = max(rounds, key=lambda measure: measure.mb_per_second)
    every = ", ".join(f"{measure.mb_per_second:.0f}" for measure in rounds)
    best.note = f"best of {len(rounds)} after a raw run each: {every} MB/s; {best.note}"
    return best


def find(results: list[Measure], prefix: str) -> Measure | None:
    return next((m for m in results if m.name.startswith(prefix)), None)


def targets(results: list[Measure]) -> list[Target]:
    out: list[Target] = []
    raw = find(results, "raw")
    batched = find(results, f"async 1024 B, append_many x{BATCH}")
    if raw is not None and batched is not None and raw.mb_per_second:
        share = batched.mb_per_second / raw.mb_per_second
        out.append(
            Target(
                f"async 1 KiB append_many >= {TARGET_BATCHED_1K_OF_RAW:.0%} of raw bandwidth",
                f"{share:.0%} ({batched.mb_per_second:.0f} of {raw.mb_per_second:.0f} MB/s; "
                f"{batched.log_bytes / MB / batched.cpu:.0f} MB per CPU s)",
                share >= TARGET_BATCHED_1K_OF_RAW,
            )
        )
    single = find(results, "async 100 B, single")
    if single is not None:
        out.append(
            Target(
                f"async 100 B single appends >= {TARGET_SINGLE_100B_PER_S:,}/s",
                f"{single.per_second:,.0f}/s ({single.per_cpu_second:,.0f} per CPU s)",
                single.per_second >= TARGET_SINGLE_100B_PER_S,
            )
        )
    one = find(results, f"sync {SYNC_RECORD_SIZE} B, 1 writer")
    many = find(results, f"sync {SYNC_RECORD_SIZE} B, {SYNC_WRITERS} writers")
    if one is not None and many is not None and one.per_second:
        speedup = many.per_second / one.per_second
        out.append(
            Target(
                f"sync: {SYNC_WRITERS} writers >= {TARGET_SYNC_SPEEDUP:g}x one writer",
                f"{speedup:.1f}x ({many.per_second:,.0f} vs {one.per_second:,.0f}/s)",
                speedup >= TARGET_SYNC_SPEEDUP,
            )
        )
    for prefix in ("store.read", "commitlog.scan"):
        scan = find(results, prefix)
        if scan is not None:
            out.append(
                Target(
                    f"{prefix} >= {TARGET_SCAN_PER_S:,} records/s",
                    f"{scan.per_second:,.0f}/s ({scan.per_cpu_second:,.0f} per CPU s)",
                    scan.per_second >= TARGET_SCAN_PER_S,
                )
            )
    return out


def markdown_table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column == 0 or column == len(row) - 1 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if number == 0:
            lines.append(
                "|"
                + "|".join(
                    "-" * (w + 1) + ":" if 0 < i < len(widths) - 1 else "-" * (w + 2)
                    for i, w in enumerate(widths)
                )
                + "|"
            )
    return lines


def results_table(results: list[Measure]) -> list[str]:
    raw = find(results, "raw")
    raw_mb = raw.mb_per_second if raw is not None else 0.0
    rows = [
        [
            "test",
            "records",
            "records/s",
            "MB/s",
            "% of raw",
            "wall s",
            "CPU s",
            "CPU µs/record",
            "notes",
        ]
    ]
    for m in results:
        is_raw = m is raw
        rows.append(
            [
                m.name,
                f"{m.records:,}",
                "" if is_raw else f"{m.per_second:,.0f}",
                f"{m.mb_per_second:,.1f}",
                f"{m.mb_per_second / raw_mb:.0%}" if raw_mb and m.name.startswith("async") else "",
                f"{m.wall:.2f}",
                f"{m.cpu:.2f}",
                "" if is_raw or not m.records else f"{m.cpu / m.records * 1e6:.2f}",
                m.note,
            ]
        )
    return markdown_table(rows)


def targets_table(found: list[Target]) -> list[str]:
    rows = [["target", "measured", "result"]]
    rows += [[t.description, t.measured, "PASS" if t.passed else "FAIL"] for t in found]
    return markdown_table(rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench log",
        description="Throughput of core/log against the raw disk (bounded: under 2 minutes).",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="directory on the filesystem to test; a temporary directory is made and removed "
        "inside it (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="small volumes and short time caps")
    parser.add_argument("--volume-mib", type=int, help="bytes per write test, in MiB")
    parser.add_argument("--segment-mib", type=int, help="commit-log segment size, in MiB")
    parser.add_argument("--no-uvloop", action="store_true", help="use asyncio's default event loop")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 if a target is missed"
    )
    return parser.parse_args(argv)


def event_loop_runner(use_uvloop: bool) -> tuple[str, Callable[[Coroutine[Any, Any, Any]], Any]]:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return f"uvloop {importlib.metadata.version('uvloop')}", uvloop.run
    return "asyncio", asyncio.run


def raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    volume_mib = args.volume_mib or (QUICK_VOLUME_MIB if args.quick else DEFAULT_VOLUME_MIB)
    segment_mib = args.segment_mib or (QUICK_SEGMENT_MIB if args.quick else DEFAULT_SEGMENT_MIB)
    args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="braid-bench-log-", dir=args.dir))
    settings = Settings(
        root=root,
        volume=volume_mib * MIB,
        segment_size=segment_mib * MIB,
        append_seconds=QUICK_APPEND_SECONDS if args.quick else DEFAULT_APPEND_SECONDS,
        sync_seconds=QUICK_SYNC_SECONDS if args.quick else DEFAULT_SYNC_SECONDS,
        read_seconds=QUICK_READ_SECONDS if args.quick else DEFAULT_READ_SECONDS,
    )
    loop_name, run = event_loop_runner(not args.no_uvloop)
    for line in header(settings, loop_name):
        print(line)
    if args.quick:
        print("--quick: volumes this small may fit the disk's write cache; ratios are indicative")
    if "tmpfs" in filesystem_of(root).split()[0]:
        print("warning: tmpfs is memory, not a disk; pass --dir on the data filesystem")
    print(flush=True)

    def progress(measure: Measure) -> None:
        print(
            f"  {measure.name}: {measure.records:,} in {measure.wall:.2f} s",
            file=sys.stderr,
            flush=True,
        )

    # `timeout` and CI cancel with SIGTERM: unwind like Ctrl-C so the temporary files go.
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    started = time.perf_counter()
    try:
        results: list[Measure] = run(run_all(settings, progress))
    except KeyboardInterrupt:
        print("interrupted; temporary files removed", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(results_table(results)))
    print()
    found = targets(results)
    print("\n".join(targets_table(found)))
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average at end: {load_average()}")
    return 1 if args.strict and not all(t.passed for t in found) else 0
