"""One business key across Kafka, AMQP and MQTT traffic.

Each record gets a correlation key: its first correlation header (``correlation-id``,
``x-correlation-id``, ``correlation-data``, ... case-insensitive; AMQP's correlation-id property
and MQTT 5's correlation data as the gateways store them) or else its key. Per protocol the
records are aggregated by that key, and the three are joined (full outer) on it; keys seen in at
least two protocols are written to ``OUT_DIR/crossprotocol`` (Parquet) with, per protocol, the
record count, the first producer time and the topics, and ``span_ms`` from the first to the last
protocol's first record: e.g. an order sent by a Kafka producer, handled by an AMQP worker and
confirmed to an MQTT device.

    python -m spark.jobs.crossprotocol DATA_DIR OUT_DIR
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark.jobs._common import header_value, job_session, parse_args, read_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COLUMNS = (
    "topic string, protocol string, key binary, "
    "headers array<struct<key:string,value:binary>>, timestamp timestamp"
)
CORRELATION_HEADERS = (
    "correlation-id",
    "correlation_id",
    "correlationid",
    "x-correlation-id",
    "correlation-data",
    "correlation_data",
)
PROTOCOLS = ("kafka", "amqp", "mqtt")


def correlate(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    keyed = frame.withColumn(
        "correlation",
        F.coalesce(F.expr(header_value(CORRELATION_HEADERS)), F.col("key").cast("string")),
    ).where(F.col("correlation").isNotNull() & (F.col("correlation") != ""))
    joined: DataFrame | None = None
    for protocol in PROTOCOLS:
        side = (
            keyed.where(F.col("protocol") == protocol)
            .groupBy("correlation")
            .agg(
                F.count(F.lit(1)).alias(f"{protocol}_records"),
                F.min("timestamp").alias(f"{protocol}_first"),
                F.sort_array(F.collect_set("topic")).alias(f"{protocol}_topics"),
            )
        )
        joined = side if joined is None else joined.join(side, "correlation", "full_outer")
    assert joined is not None
    firsts = [F.col(f"{protocol}_first") for protocol in PROTOCOLS]
    present = sum(
        (F.col(f"{protocol}_records").isNotNull().cast("int") for protocol in PROTOCOLS),
        F.lit(0),
    )
    span = F.greatest(*firsts).cast("double") - F.least(*firsts).cast("double")
    return (
        joined.withColumn("protocols", present)
        .where(F.col("protocols") >= 2)
        .withColumn("span_ms", F.round(span * 1000).cast("long"))
        .orderBy(F.desc("protocols"), "correlation")
    )


def run(spark: SparkSession, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = correlate(read_log(spark, data_dir, COLUMNS, dedupe="true"))
    table.write.mode("overwrite").parquet(str(out / "crossprotocol"))
    rows = [row.asDict() for row in spark.read.parquet(str(out / "crossprotocol")).collect()]
    rows.sort(key=lambda row: (-row["protocols"], row["correlation"]))
    return {"parquet": str(out / "crossprotocol"), "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args("join Kafka, AMQP and MQTT traffic on a shared key", argv)
    with job_session("braid-crossprotocol", args.master) as spark:
        result = run(spark, args.data_dir, args.out_dir)
    for row in result["rows"]:
        counts = " ".join(f"{p}={row[f'{p}_records'] or 0}" for p in PROTOCOLS)
        print(f"{row['correlation']:40} {counts} span={row['span_ms']} ms")
    print(f"{len(result['rows'])} keys in 2+ protocols; wrote {result['parquet']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
