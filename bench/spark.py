"""``python -m bench spark``: batch read throughput of the ``braid`` Spark source against Parquet.

One run, in a temporary directory (``--dir`` to choose where):

1. writes ``--records`` (default 5 million) records of ``--value-size`` (100) random bytes to a
   fresh log with ``LogStore.append_many`` batches, spread over ``--queues`` queues;
2. writes the same rows (every column of the braid schema, as the source returns them) as
   Parquet with pyarrow, ``--parquet-files`` files, snappy, the usual Spark defaults;
3. starts one local SparkSession (``--master``, default ``local[2]``; the ``braid`` source is
   registered with ``spark.register``, so reads are spread over the session's cores) and times,
   interleaved round by round, the same action on both sides of each comparison:

   - value column, ``count(*)`` and ``sum(length(value))`` (an aggregate that forces every
     value to be read): ``braid value`` (``.schema("value binary")``: a Python data source
     gets no column pruning from Spark, so it is told the columns, as the example jobs do)
     against ``parquet value`` (Spark prunes Parquet to ``value`` by itself);
   - ``braid value, no CRC``: the same with ``verifyChecksums=false``;
   - every column, written to Spark's ``noop`` sink (each of the 15 columns of every row
     converted into Spark's rows, nothing else done with them): ``braid all`` against
     ``parquet all``;
   - ``braid all, value query``: the full schema with the value aggregate, against ``parquet
     value``: what not declaring the columns costs (not like for like: Parquet reads one
     column, braid hands Spark fifteen);
   - ``arrow floor``: a Python data source that decodes nothing and yields the same number of
     prebuilt 100-byte-value Arrow batches in as many partitions, with the value aggregate:
     what Spark's Python data source path itself costs on this machine, the bound for any
     decoder.

Each query runs once to warm up, then ``--runs`` times; the best run counts (the machine is
shared: the best is the least disturbed). Rows/s, MB/s (of record payload, the 500 MB of values,
for every query), the ratio to its Parquet counterpart (also paired within each round, see
:func:`report`) and the CPU seconds the query cost (JVM and Python workers, least of the runs;
Linux only) are printed; the target is a ratio of at least 0.5.
The temporary directory is removed at the end unless ``--keep``; ``--data DIR`` writes the log
and the Parquet copy to ``DIR`` once and reuses them on later runs with the same ``--records``,
``--value-size``, ``--queues`` and ``--parquet-files``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

MB = 1_000_000
DEFAULT_RECORDS = 5_000_000
DEFAULT_VALUE_SIZE = 100
DEFAULT_QUEUES = 4
DEFAULT_RUNS = 3
DEFAULT_MASTER = "local[2]"
APPEND_BATCH = 10_000  # records per append_many call
TOPIC = "bench"
TARGET_RATIO = 0.5  # braid rows/s over Parquet rows/s, from the issue


FLOOR_FORMAT = "braid_bench_floor"


class FloorSource(DataSource):  # type: ignore[misc]
    """Rows without decoding: ``records`` rows of ``value_size`` bytes in ``partitions`` tasks."""

    @classmethod
    def name(cls) -> str:
        return FLOOR_FORMAT

    def schema(self) -> str:
        return "value binary"

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorReader(
            int(self.options["records"]),
            int(self.options["value_size"]),
            int(self.options["partitions"]),
        )


class FloorReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, records: int, value_size: int, partitions: int) -> None:
        self.records, self.value_size, self.count = records, value_size, partitions

    def partitions(self) -> list[InputPartition]:
        share = -(-self.records // self.count)
        bounds = [(n * share, min(self.records, (n + 1) * share)) for n in range(self.count)]
        return [InputPartition(stop - start) for start, stop in bounds]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from spark.decode import DEFAULT_BATCH_ROWS  # batches as large as the source's

        rows: int = partition.value
        value = os.urandom(self.value_size)
        full = pa.RecordBatch.from_arrays(
            [pa.array([value] * DEFAULT_BATCH_ROWS, pa.binary())], names=["value"]
        )
        while rows > 0:
            batch = full if rows >= DEFAULT_BATCH_ROWS else full.slice(0, rows)
            rows -= batch.num_rows
            yield batch


@dataclass
class Query:
    """A DataFrame to read, how to force it (``value``: the value aggregate; ``noop``: every
    column written to the noop sink) and the query it is compared with."""

    frame: Callable[[], DataFrame]
    action: str
    baseline: str


@dataclass
class Timing:
    name: str
    seconds: list[float]
    rows: int
    value_bytes: int
    cpu_seconds: list[float] = field(default_factory=list)
    baseline: str = ""

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.best

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.best / MB


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench spark", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--value-size", type=int, default=DEFAULT_VALUE_SIZE)
    parser.add_argument("--queues", type=int, default=DEFAULT_QUEUES)
    parser.add_argument("--parquet-files", type=int, default=DEFAULT_QUEUES)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--master", default=DEFAULT_MASTER)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--max-records-per-partition",
        type=int,
        help="braid partition size (default: the source's default)",
    )
    parser.add_argument("--dir", help="parent of the temporary directory (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--data",
        help="directory for the log and the Parquet copy: written once, reused by later runs "
        "of the same shape, never removed",
    )
    return parser.parse_args(argv)


def write_log(data_dir: Path, records: int, value_size: int, queues: int) -> float:
    from core.log import DURABILITY_ASYNC, LogConfig, LogStore

    store = LogStore(LogConfig(data_dir, durability=DURABILITY_ASYNC, retention_ms=None))
    started = time.perf_counter()
    noise = os.urandom(value_size + APPEND_BATCH)
    try:
        for first in range(0, records, APPEND_BATCH):
            count = min(APPEND_BATCH, records - first)
            # Distinct values: a sliding window over random bytes, the record number at the end.
            bodies = [
                noise[i : i + value_size - 8] + (first + i).to_bytes(8, "big") for i in range(count)
            ]
            store.append_many(TOPIC, (first // APPEND_BATCH) % queues, bodies, key=None)
    finally:
        store.close()
    return time.perf_counter() - started


def write_parquet(data_dir: Path, parquet_dir: Path, files: int) -> float:
    """The log's rows, every column, as Parquet (what an export job would have written)."""
    import pyarrow.parquet as pq

    from core.log import LogReader
    from spark import decode
    from spark.schema import arrow_schema

    started = time.perf_counter()
    parquet_dir.mkdir(parents=True)
    reader = LogReader(data_dir)
    schema = arrow_schema()
    writers = [
        pq.ParquetWriter(parquet_dir / f"part-{n:05d}.parquet", schema, compression="snappy")
        for n in range(files)
    ]
    try:
        batches = (
            batch
            for topic, queue in reader.queues()
            for batch in decode.read_range(reader, topic, queue, 0, 1 << 62)
        )
        for number, batch in enumerate(batches):
            writers[number % files].write_batch(batch)
    finally:
        for writer in writers:
            writer.close()
        reader.close()
    return time.perf_counter() - started


def start_session(master: str, driver_memory: str) -> SparkSession:
    from pyspark.sql import SparkSession

    from spark import register

    repo = str(Path(__file__).resolve().parents[1])
    paths = [repo, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))  # for Python workers
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-spark")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(FloorSource)
    return spark


def children_cpu_seconds() -> float | None:
    """CPU seconds (user + system) used so far by this process's descendants that are still
    running, and by the children they reaped: the JVM and Spark's Python workers. None where
    there is no /proc."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    parents: dict[int, int] = {}
    used: dict[int, int] = {}
    for name in names:
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(name)] = int(fields[1])
        used[int(name)] = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, pending = 0, list(children.get(os.getpid(), []))
    while pending:
        pid = pending.pop()
        total += used[pid]
        pending.extend(children.get(pid, []))
    return total / ticks


def measure(queries: dict[str, Query], runs: int, expected_rows: int) -> dict[str, Timing]:
    """Every query once per round, in the same order, round 0 a warm-up. A ``noop`` write
    returns nothing, so the rows of its frame are counted once beforehand (a count reads no
    column: it checks the row count, not the timing)."""
    from pyspark.sql import functions as F

    timings = {
        name: Timing(name, [], 0, 0, baseline=query.baseline) for name, query in queries.items()
    }
    for name, query in queries.items():
        if query.action == "noop" and (rows := query.frame().count()) != expected_rows:
            raise AssertionError(f"{name}: {rows} rows, expected {expected_rows}")
    value_bytes = 0
    for round_number in range(runs + 1):
        for name, query in queries.items():
            frame = query.frame()
            cpu_before = children_cpu_seconds()
            started = time.perf_counter()
            if query.action == "noop":
                frame.write.format("noop").mode("overwrite").save()
                rows = expected_rows
            else:
                aggregate = frame.agg(F.count(F.lit(1)), F.sum(F.length("value")))
                ((rows, value_bytes),) = aggregate.collect()
            elapsed = time.perf_counter() - started
            cpu_after = children_cpu_seconds()
            if rows != expected_rows:
                raise AssertionError(f"{name}: {rows} rows, expected {expected_rows}")
            timing = timings[name]
            timing.rows = rows
            if round_number:
                timing.seconds.append(elapsed)
                if cpu_before is not None and cpu_after is not None:
                    timing.cpu_seconds.append(cpu_after - cpu_before)
            print(
                f"  {'warm-up' if not round_number else f'run {round_number}'} {name}: "
                f"{elapsed:.2f} s",
                flush=True,
            )
    for timing in timings.values():  # the same records: the payload every query read
        timing.value_bytes = value_bytes
    return timings


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.data:
        return _run(args, Path(args.data))
    parent = Path(args.dir) if args.dir else None
    work = Path(tempfile.mkdtemp(prefix="bench-spark-", dir=parent))
    try:
        return _run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> int:
    data_dir, parquet_dir = work / "log", work / "parquet"
    print(
        f"bench spark: {args.records:,} records of {args.value_size} bytes in {args.queues} "
        f"queues; {os.cpu_count()} CPUs; Python {platform.python_version()}; {args.master}"
    )
    shape = {
        "records": args.records,
        "value_size": args.value_size,
        "queues": args.queues,
        "parquet_files": args.parquet_files,
    }
    marker = work / "bench-spark.json"
    if marker.exists() and json.loads(marker.read_text()) == shape:
        print(f"reusing the log and the Parquet copy in {work}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(parquet_dir, ignore_errors=True)
        marker.unlink(missing_ok=True)
        seconds = write_log(data_dir, args.records, args.value_size, args.queues)
        print(f"wrote the log in {seconds:.1f} s ({args.records / seconds:,.0f} records/s)")
        seconds = write_parquet(data_dir, parquet_dir, args.parquet_files)
        size = sum(path.stat().st_size for path in parquet_dir.iterdir())
        print(f"wrote the same rows as Parquet in {seconds:.1f} s ({size / MB:,.0f} MB)")
        marker.write_text(json.dumps(shape))

    spark = start_session(args.master, args.driver_memory)
    try:
        import pyspark

        print(f"PySpark {pyspark.__version__}")

        def braid(schema: str | None = None, **options: str) -> Callable[[], DataFrame]:
            def query() -> DataFrame:
                reader = spark.read.format("braid").option("path", str(data_dir))
                if args.max_records_per_partition:
                    reader = reader.option(
                        "maxRecordsPerPartition", str(args.max_records_per_partition)
                    )
                if schema is not None:
                    reader = reader.schema(schema)
                for name, value in options.items():
                    reader = reader.option(name, value)
                return reader.load()

            return query

        braid_partitions = braid()().rdd.getNumPartitions()
        print(f"braid plans {braid_partitions} partitions")

        def parquet() -> DataFrame:
            return spark.read.parquet(str(parquet_dir))

        def floor() -> DataFrame:
            return (
                spark.read.format(FLOOR_FORMAT)
                .option("records", str(args.records))
                .option("value_size", str(args.value_size))
                .option("partitions", str(braid_partitions))
                .load()
            )

        # Like for like: the same columns reach Spark and the same action forces them.
        queries = {
            "braid value": Query(braid("value binary"), "value", "parquet value"),
            "parquet value": Query(parquet, "value", "parquet value"),
            "braid value, no CRC": Query(
                braid("value binary", verifyChecksums="false"), "value", "parquet value"
            ),
            "braid all": Query(braid(), "noop", "parquet all"),
            "parquet all": Query(parquet, "noop", "parquet all"),
            "braid all, value query": Query(braid(), "value", "parquet value"),
            "arrow floor": Query(floor, "value", "parquet value"),
        }
        timings = measure(queries, args.runs, args.records)
    finally:
        spark.stop()
    return report(timings)


def report(timings: dict[str, Timing]) -> int:
    """The table: best and median seconds, rows/s and payload MB/s of the best run; the ratio
    to the query's Parquet counterpart (best against best: the verdict); the median over rounds
    of the ratio within each round (queries of a round run back to back, so under the same
    load: steadier on a shared machine); the least CPU seconds a run cost, and the
    counterpart's over it (what the ratio tends to when other work takes the cores)."""
    print()
    print(
        f"{'query':24} {'vs':14} {'best s':>7} {'median s':>8} {'rows/s':>11} {'MB/s':>7} "
        f"{'ratio':>6} {'paired':>6} {'cpu s':>6} {'vs cpu':>6}"
    )
    ratios: dict[str, float] = {}
    for name, timing in timings.items():
        base = timings[timing.baseline]
        ratio = ratios[name] = timing.rows_per_s / base.rows_per_s
        paired = statistics.median(
            theirs / own for theirs, own in zip(base.seconds, timing.seconds, strict=True)
        )
        cpu = cpu_ratio = f"{'-':>6}"
        if timing.cpu_seconds and base.cpu_seconds:
            cpu = f"{min(timing.cpu_seconds):6.2f}"
            cpu_ratio = f"{min(base.cpu_seconds) / max(min(timing.cpu_seconds), 1e-9):6.2f}"
        print(
            f"{name:24} {timing.baseline:14} {timing.best:7.2f} "
            f"{statistics.median(timing.seconds):8.2f} {timing.rows_per_s:11,.0f} "
            f"{timing.mb_per_s:7.1f} {ratio:6.2f} {paired:6.2f} {cpu} {cpu_ratio}"
        )
    print(f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    for name, what in (("braid value", "value column"), ("braid all", "every column")):
        verdict = "PASS" if ratios[name] >= TARGET_RATIO else "FAIL"
        print(
            f"{verdict}: braid, {what}: {ratios[name]:.2f} x Parquet, same columns and action "
            f"(target >= {TARGET_RATIO})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
