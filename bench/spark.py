"""``python -m bench spark``: batch reads of the ``braid`` format, JVM reader and Python source,
against Parquet.

One run, in a temporary directory (``--dir`` to choose where), for each of two logs of the same
``--records`` (default 5 million) distinct records of ``--value-size`` (100) bytes spread over
``--queues`` queues:

- ``one by one``: records published one at a time (``LogStore.append_many``: one frame each, as
  AMQP and MQTT publishes are stored);
- ``kafka batches``: records as a Kafka producer sends them, RecordBatches of
  ``--kafka-batch`` (10,000, librdkafka's ``batch.num.messages``) records built by aiokafka's
  RecordBatch builder (no compression, librdkafka's default) and stored as the broker stores a
  produced batch (``LogStore.append_batch``: one frame per batch);

1. writes the log, and the same rows (every column of the braid schema, as the source returns
   them) as Parquet with pyarrow, ``--parquet-files`` files, snappy, the usual Spark defaults;
2. starts one local SparkSession (``--master``, default ``local[2]``) with both readers
   registered by ``spark.register``: ``braid`` is the JVM reader, ``braid_python`` the Python
   source;
3. times, interleaved round by round, the same action on each reader and on Parquet:

   - value column, ``count(*)`` and ``sum(length(value))``: ``jvm value`` (Spark prunes the
     JVM reader to the value column by itself), ``python value`` (``.schema("value
     binary")``: a Python data source gets no column pruning, so it is told the columns, as the
     example jobs do) and ``parquet value`` (pruned by Spark);
   - every column, written to Spark's ``noop`` sink (each of the 15 columns of every row
     converted into Spark's rows, nothing else done with them): ``jvm all``, ``python all``,
     ``parquet all``.

Each query runs once to warm up, then ``--runs`` times; the best run counts (the machine is
shared: the best is the least disturbed). Rows/s, MB/s (of record payload, the values, for
every query), the ratio to Parquet (also paired within each round, see :func:`report`) and the
CPU seconds the query cost (JVM and Python workers, least of the runs; Linux only) are printed;
the target (issue 24) is at least 1.0 of Parquet for the JVM reader on every row.
The temporary directory is removed at the end unless ``--keep``; ``--data DIR`` writes the logs
and the Parquet copies to ``DIR`` once and reuses them on later runs of the same shape.
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MB = 1_000_000
DEFAULT_RECORDS = 5_000_000
DEFAULT_VALUE_SIZE = 100
DEFAULT_QUEUES = 4
DEFAULT_RUNS = 3
DEFAULT_MASTER = "local[2]"
APPEND_BATCH = 10_000  # records per append_many call
TOPIC = "bench"
TARGET_RATIO = 1.0  # the JVM reader's rows/s over Parquet's, from issue 24
KAFKA_BATCH = 10_000  # records per produced batch: librdkafka's batch.num.messages default
PYTHON_FORMAT = "braid_python"  # spark.PYTHON_FORMAT: the Python source, whatever braid is
DATASETS = ("one by one", "kafka batches")


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
    parser.add_argument("--kafka-batch", type=int, default=KAFKA_BATCH)
    parser.add_argument(
        "--datasets",
        default=",".join(DATASETS),
        help=f"which logs to read, of {', '.join(DATASETS)} (comma-separated)",
    )
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


def write_kafka_log(
    data_dir: Path, records: int, value_size: int, queues: int, batch_records: int
) -> float:
    """The same kind of records as :func:`write_log`, stored as a Kafka producer's batches."""
    from aiokafka.record.default_records import (  # type: ignore[import-untyped]
        DefaultRecordBatchBuilder,
    )

    from core.log import DURABILITY_ASYNC, LogConfig, LogStore

    store = LogStore(LogConfig(data_dir, durability=DURABILITY_ASYNC, retention_ms=None))
    started = time.perf_counter()
    noise = os.urandom(value_size + batch_records)
    now = int(time.time() * 1000)
    try:
        for number, first in enumerate(range(0, records, batch_records)):
            count = min(batch_records, records - first)
            builder = DefaultRecordBatchBuilder(
                magic=2,
                compression_type=0,
                is_transactional=False,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                batch_size=1 << 30,
            )
            for i in range(count):
                value = noise[i : i + value_size - 8] + (first + i).to_bytes(8, "big")
                builder.append(i, timestamp=now, key=None, value=value, headers=[])
            store.append_batch(TOPIC, number % queues, bytes(builder.build()), count)
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
    if register(spark, reader="jvm") != "jvm":
        raise RuntimeError("the JVM reader did not load")
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
    datasets = [name.strip() for name in args.datasets.split(",") if name.strip()]
    unknown = set(datasets) - set(DATASETS)
    if unknown:
        raise SystemExit(f"unknown datasets {sorted(unknown)}; choose from {DATASETS}")
    print(
        f"bench spark: {args.records:,} records of {args.value_size} bytes in {args.queues} "
        f"queues; {os.cpu_count()} CPUs; Python {platform.python_version()}; {args.master}"
    )
    paths = {name: prepare(args, work / name.replace(" ", "-"), name) for name in datasets}
    spark = start_session(args.master, args.driver_memory)
    all_timings: dict[str, dict[str, Timing]] = {}
    try:
        import pyspark

        print(f"PySpark {pyspark.__version__}")
        for name, (data_dir, parquet_dir) in paths.items():
            print(f"-- {name}")
            all_timings[name] = measure(
                queries(spark, args, data_dir, parquet_dir), args.runs, args.records
            )
    finally:
        spark.stop()
    failed = 0
    for name, timings in all_timings.items():
        print(f"\n== {name}")
        failed += report(timings)
    return 1 if failed else 0


def prepare(args: argparse.Namespace, work: Path, dataset: str) -> tuple[Path, Path]:
    """The log and its Parquet copy, written unless ``work`` holds them in the same shape."""
    data_dir, parquet_dir = work / "log", work / "parquet"
    shape = {
        "dataset": dataset,
        "records": args.records,
        "value_size": args.value_size,
        "queues": args.queues,
        "parquet_files": args.parquet_files,
        "kafka_batch": args.kafka_batch,
    }
    marker = work / "bench-spark.json"
    if marker.exists() and json.loads(marker.read_text()) == shape:
        print(f"{dataset}: reusing the log and the Parquet copy in {work}")
        return data_dir, parquet_dir
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(parquet_dir, ignore_errors=True)
    marker.unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if dataset == "kafka batches":
        seconds = write_kafka_log(
            data_dir, args.records, args.value_size, args.queues, args.kafka_batch
        )
    else:
        seconds = write_log(data_dir, args.records, args.value_size, args.queues)
    print(f"{dataset}: wrote the log in {seconds:.1f} s ({args.records / seconds:,.0f} records/s)")
    seconds = write_parquet(data_dir, parquet_dir, args.parquet_files)
    size = sum(path.stat().st_size for path in parquet_dir.iterdir())
    print(f"{dataset}: wrote the same rows as Parquet in {seconds:.1f} s ({size / MB:,.0f} MB)")
    marker.write_text(json.dumps(shape))
    return data_dir, parquet_dir


def queries(
    spark: SparkSession, args: argparse.Namespace, data_dir: Path, parquet_dir: Path
) -> dict[str, Query]:
    """Like for like: the same columns reach Spark and the same action forces them."""

    def braid(source: str, schema: str | None = None) -> Callable[[], DataFrame]:
        def query() -> DataFrame:
            reader = spark.read.format(source).option("path", str(data_dir))
            if args.max_records_per_partition:
                reader = reader.option(
                    "maxRecordsPerPartition", str(args.max_records_per_partition)
                )
            if schema is not None:
                reader = reader.schema(schema)
            return reader.load()

        return query

    def parquet() -> DataFrame:
        return spark.read.parquet(str(parquet_dir))

    plan = braid("braid")()._jdf.queryExecution().executedPlan().toString()
    if "braid(JVM)" not in plan:
        raise RuntimeError(f"format('braid') is not the JVM reader here:\n{plan}")
    print(f"braid plans {braid('braid')().rdd.getNumPartitions()} partitions")
    return {
        "jvm value": Query(braid("braid"), "value", "parquet value"),
        "python value": Query(braid(PYTHON_FORMAT, "value binary"), "value", "parquet value"),
        "parquet value": Query(parquet, "value", "parquet value"),
        "jvm all": Query(braid("braid"), "noop", "parquet all"),
        "python all": Query(braid(PYTHON_FORMAT), "noop", "parquet all"),
        "parquet all": Query(parquet, "noop", "parquet all"),
    }


def report(timings: dict[str, Timing]) -> int:
    """The table: best and median seconds, rows/s and payload MB/s of the best run; the ratio
    to the query's Parquet counterpart (best against best: the verdict); the median over rounds
    of the ratio within each round (queries of a round run back to back, so under the same
    load: steadier on a shared machine); the least CPU seconds a run cost, and the
    counterpart's over it (what the ratio tends to when other work takes the cores). Returns
    how many of the JVM reader's rows missed the target."""
    print(
        f"{'query':16} {'vs':14} {'best s':>7} {'median s':>8} {'rows/s':>11} {'MB/s':>7} "
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
            f"{name:16} {timing.baseline:14} {timing.best:7.2f} "
            f"{statistics.median(timing.seconds):8.2f} {timing.rows_per_s:11,.0f} "
            f"{timing.mb_per_s:7.1f} {ratio:6.2f} {paired:6.2f} {cpu} {cpu_ratio}"
        )
    print(f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    missed = 0
    for name, what in (("jvm value", "value column"), ("jvm all", "every column")):
        passed = ratios[name] >= TARGET_RATIO
        missed += not passed
        print(
            f"{'PASS' if passed else 'FAIL'}: JVM reader, {what}: {ratios[name]:.2f} x Parquet "
            f"(Python source {ratios[name.replace('jvm', 'python')]:.2f}; "
            f"target >= {TARGET_RATIO})"
        )
    return missed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
