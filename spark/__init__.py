"""spark/: a PySpark data source, format ``braid``, reading a BraidMQ log in place.

    from spark import register
    register(session)
    frame = session.read.format("braid").option("path", "/var/lib/braid").load()

It reads the files of a running or stopped broker read-only through :mod:`core.log`'s read API
(no broker connection), batch and structured streaming. ``docs/spark.md`` has the schema and
the options; :mod:`spark.jobs` has example jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark.schema import COLUMN_NAMES, FORMAT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["COLUMN_NAMES", "FORMAT", "register"]


def register(session: SparkSession, *, min_partitions: int | None = None) -> None:
    """Make ``format("braid")`` available in ``session`` (idempotent).

    Reads that do not set ``minPartitions`` are spread over ``min_partitions`` tasks, by default
    the session's ``defaultParallelism`` (its cores), as Spark's file sources are: a data
    source's planner cannot see the cluster, so it is told here."""
    from spark.source import with_default_min_partitions

    if min_partitions is None:
        min_partitions = _parallelism(session)
    session.dataSource.register(with_default_min_partitions(min_partitions))


def _parallelism(session: SparkSession) -> int | None:
    try:
        return int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: no default, reads say minPartitions
        return None
