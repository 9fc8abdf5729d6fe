"""Traffic per protocol, topic and minute: records, bytes, p50/p99 payload size.

Writes ``OUT_DIR/traffic`` (Parquet) and ``OUT_DIR/traffic.png`` (records and bytes per minute
and protocol). A record is counted once, in its home queue (``dedupe``): an AMQP message fanned
out to five queues is one published message, not five. Minutes are broker time
(``store_timestamp``, UTC).

    python -m spark.jobs.traffic DATA_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark.jobs._common import job_session, parse_args, read_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COLUMNS = "topic string, protocol string, store_timestamp timestamp, value binary"


def traffic(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    size = F.coalesce(F.length("value"), F.lit(0))
    return (
        frame.withColumn("minute", F.date_trunc("minute", "store_timestamp"))
        .withColumn("size", size)
        .groupBy("protocol", "topic", "minute")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.sum("size").alias("bytes"),
            F.percentile_approx("size", 0.5).alias("p50_bytes"),
            F.percentile_approx("size", 0.99).alias("p99_bytes"),
        )
        .orderBy("minute", "protocol", "topic")
    )


def run(spark: SparkSession, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = traffic(read_log(spark, data_dir, COLUMNS, dedupe="true"))
    table.write.mode("overwrite").parquet(str(out / "traffic"))
    rows = [row.asDict() for row in spark.read.parquet(str(out / "traffic")).collect()]
    chart(rows, out / "traffic.png")
    return {"parquet": str(out / "traffic"), "chart": str(out / "traffic.png"), "rows": rows}


def per_minute(rows: list[dict[str, Any]]) -> dict[str, list[tuple[datetime, int, int]]]:
    """``protocol -> [(minute, records, bytes)]`` for every minute from the first minute with
    traffic to the last, whatever the protocol: a minute in which a protocol had no traffic
    is a zero, so its line drops to the axis instead of being drawn straight across the gap."""
    totals: dict[str, dict[datetime, list[int]]] = {}
    for row in rows:
        counts = totals.setdefault(row["protocol"], {}).setdefault(row["minute"], [0, 0])
        counts[0] += row["records"]
        counts[1] += row["bytes"]
    if not totals:
        return {}
    seen = [minute for minutes in totals.values() for minute in minutes]
    first, last = min(seen), max(seen)
    span = [
        first + timedelta(minutes=i) for i in range(int((last - first).total_seconds()) // 60 + 1)
    ]
    return {
        protocol: [(minute, *minutes.get(minute, (0, 0))) for minute in span]
        for protocol, minutes in sorted(totals.items())
    }


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Records and bytes per minute, one line per protocol, zeros where it had no traffic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    per = per_minute(rows)
    figure, (records_axis, bytes_axis) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for protocol, series in per.items():
        times = [minute for minute, _, _ in series]
        records_axis.plot(times, [records for _, records, _ in series], marker="o", label=protocol)
        bytes_axis.plot(times, [size for _, _, size in series], marker="o", label=protocol)
    minutes_seen = sorted({row["minute"] for row in rows})
    if minutes_seen:
        margin = timedelta(minutes=1)
        bytes_axis.set_xlim(minutes_seen[0] - margin, minutes_seen[-1] + margin)
        if minutes_seen[-1] - minutes_seen[0] < timedelta(minutes=10):
            bytes_axis.xaxis.set_major_locator(mdates.MinuteLocator())  # type: ignore[no-untyped-call]
    formatter = mdates.DateFormatter("%m-%d %H:%M")  # type: ignore[no-untyped-call]
    bytes_axis.xaxis.set_major_formatter(formatter)
    records_axis.set_ylim(bottom=0)
    bytes_axis.set_ylim(bottom=0)
    records_axis.set_ylabel("records / minute")
    bytes_axis.set_ylabel("payload bytes / minute")
    bytes_axis.set_xlabel("minute (UTC, broker time)")
    records_axis.set_title("BraidMQ traffic by protocol")
    if per:
        records_axis.legend()
    else:
        records_axis.text(0.5, 0.5, "no records", ha="center", transform=records_axis.transAxes)
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "traffic", argv)
    with job_session("braid-traffic", args.master) as spark:
        result = run(spark, args.data_dir, args.out_dir)
    for row in result["rows"]:
        print(
            f"{row['minute']:%Y-%m-%d %H:%M}  {row['protocol']:8} {row['topic']:30} "
            f"{row['records']:>10} records {row['bytes']:>12} bytes "
            f"p50={row['p50_bytes']} p99={row['p99_bytes']}"
        )
    print(f"wrote {result['parquet']} and {result['chart']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
