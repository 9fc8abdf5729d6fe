"""What every example job shares: command line, session, reading the log."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# A job run by plain ``python -m`` (no spark-submit, no SPARK_MASTER) runs in-process on two
# cores: enough for the example data, and what the tests use.
DEFAULT_LOCAL_MASTER = "local[2]"


def parse_args(description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("data_dir", help="the broker's data directory (read-only is enough)")
    parser.add_argument("out_dir", help="where to write the results (created)")
    parser.add_argument(
        "--master",
        help="Spark master URL (default: $SPARK_MASTER, the spark-submit one, or local[2])",
    )
    return parser.parse_args(argv)


def session(app_name: str, master: str | None = None) -> SparkSession:
    """A session with the ``braid`` format registered. Under spark-submit the master it was
    given is kept; otherwise ``master``, $SPARK_MASTER or local[2]."""
    from pyspark.sql import SparkSession

    from spark import register

    builder = SparkSession.builder.appName(app_name)
    chosen = master or os.environ.get("SPARK_MASTER")
    if chosen is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        chosen = DEFAULT_LOCAL_MASTER  # not launched by spark-submit
    if chosen is not None:
        builder = builder.master(chosen)
    if chosen is not None and chosen.startswith("local"):
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        # The workers run this interpreter: PySpark takes $PYSPARK_PYTHON, else ``python3`` on
        # PATH, which from a venv that is not activated lacks crc32c and this package.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    spark = builder.getOrCreate()
    register(spark)
    return spark


@contextlib.contextmanager
def job_session(app_name: str, master: str | None = None) -> Iterator[SparkSession]:
    """:func:`session` for a job's ``main``: stopped at the end only if the job started it (a
    job called from a program that has a session leaves that session running)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = session(app_name, master)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def read_log(
    spark: SparkSession, data_dir: str | Path, columns: str | None = None, **options: str
) -> DataFrame:
    """The log as a DataFrame; ``columns`` (DDL, a subset of the braid schema) reads only those,
    which Spark converts row by row, so fewer is faster."""
    reader = spark.read.format("braid").option("path", str(data_dir))
    if columns is not None:
        reader = reader.schema(columns)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def header_value(name_list: Sequence[str]) -> str:
    """SQL for the first header whose name (case-insensitive) is one of ``name_list``, as a
    string, or null."""
    quoted = ", ".join("'" + name.lower().replace("'", "''") + "'" for name in name_list)
    matching = f"filter(headers, h -> lower(h.key) in ({quoted}))"
    return f"cast(try_element_at({matching}, 1).value as string)"
