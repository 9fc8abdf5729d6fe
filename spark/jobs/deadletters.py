"""Dead-letter report: records in dead-letter topics (``%DLQ%<group>``, RocketMQ's name) or
carrying dead-letter headers (AMQP's ``x-death``, ``x-first-death-reason``), counted by reason,
the queue they died in and their original address.

Writes ``OUT_DIR/deadletters`` (Parquet) and prints the table. A dead-lettered record is a LINK
to the original (see core.deadletter): it is seen in the dead-letter topic and in every queue
bound to it, so rows are counted once per (record, death), not once per queue.

    python -m spark.jobs.deadletters DATA_DIR OUT_DIR
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
    "topic string, headers array<struct<key:string,value:binary>>, origin_address string, "
    "subject string, protocol string, store_timestamp timestamp, value binary, position bigint"
)
DLQ_TOPIC_LIKE = "%DLQ%%"  # SQL LIKE: topics starting with RocketMQ's %DLQ% prefix
DEATH_HEADERS = ("x-death", "x-first-death-reason", "x-death-reason")
# AMQP's x-death as core.deadletter writes it: a JSON list of tables, newest first.
X_DEATH_SCHEMA = (
    "array<struct<queue:string,reason:string,count:bigint,time:bigint,"
    "exchange:string,`routing-keys`:array<string>>>"
)


def dead_letters(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    names = ", ".join(f"'{name}'" for name in DEATH_HEADERS)
    dead = frame.where(
        F.col("topic").like(DLQ_TOPIC_LIKE)
        | F.expr(f"exists(headers, h -> lower(h.key) in ({names}))")
    )
    x_death_raw = F.expr(header_value(["x-death"]))
    newest = F.try_element_at(F.from_json(x_death_raw, X_DEATH_SCHEMA), F.lit(1))
    original_address = F.when(
        newest["exchange"].isNotNull(),
        F.concat_ws("/", newest["exchange"], F.try_element_at(newest["routing-keys"], F.lit(1))),
    ).otherwise(F.col("origin_address"))
    return (
        dead.withColumn("x_death", x_death_raw)
        .withColumn(
            "reason",
            F.coalesce(
                newest["reason"],
                F.expr(header_value(["x-first-death-reason", "x-death-reason"])),
                F.lit("unknown"),
            ),
        )
        .withColumn("died_in", F.coalesce(newest["queue"], F.lit("")))
        .withColumn("original_address", original_address)
        .dropDuplicates(["position", "x_death", "reason"])
        .groupBy("reason", "died_in", "original_address")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.sum(F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
            F.sort_array(F.collect_set("protocol")).alias("protocols"),
            F.min("store_timestamp").alias("first_seen"),
            F.max("store_timestamp").alias("last_seen"),
        )
        .orderBy(F.desc("records"), "reason", "original_address")
    )


def run(spark: SparkSession, data_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = dead_letters(read_log(spark, data_dir, COLUMNS))
    table.write.mode("overwrite").parquet(str(out / "deadletters"))
    rows = [row.asDict() for row in spark.read.parquet(str(out / "deadletters")).collect()]
    rows.sort(key=lambda row: (-row["records"], row["reason"], row["original_address"]))
    return {"parquet": str(out / "deadletters"), "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args("dead-letter report", argv)
    with job_session("braid-deadletters", args.master) as spark:
        result = run(spark, args.data_dir, args.out_dir)
    print(f"{'reason':20} {'died in':24} {'original address':40} {'records':>8}")
    for row in result["rows"]:
        print(
            f"{row['reason']:20} {row['died_in']:24} {row['original_address']:40} "
            f"{row['records']:>8}"
        )
    print(f"wrote {result['parquet']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
