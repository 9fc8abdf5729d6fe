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


def register(session: SparkSession) -> None:
    """Make ``format("braid")`` available in ``session`` (idempotent)."""
    from spark.source import BraidDataSource

    session.dataSource.register(BraidDataSource)
