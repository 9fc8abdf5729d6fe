"""spark/: a PySpark data source, format ``braid``, reading a BraidMQ log in place.

    from spark import register
    register(session)
    frame = session.read.format("braid").option("path", "/var/lib/braid").load()

It reads the files of a running or stopped broker read-only through :mod:`core.log`'s read API
(no broker connection), batch and structured streaming. ``docs/spark.md`` has the schema and
the options; :mod:`spark.jobs` has example jobs.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from spark.schema import COLUMN_NAMES, FORMAT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["COLUMN_NAMES", "FORMAT", "register", "worker_python_problem"]

log = logging.getLogger(__name__)

# What Spark's Python workers import to run the braid source (spark.source's readers).
WORKER_MODULES = ("crc32c", "spark", "core.log")
# Spark's own default for the workers' interpreter when neither setting names one.
SPARK_DEFAULT_WORKER_PYTHON = "python3"


def register(session: SparkSession, *, min_partitions: int | None = None) -> None:
    """Make ``format("braid")`` available in ``session`` (idempotent).

    Reads that do not set ``minPartitions`` are spread over ``min_partitions`` tasks, by default
    the session's ``defaultParallelism`` (its cores), as Spark's file sources are: a data
    source's planner cannot see the cluster, so it is told here."""
    from spark.source import with_default_min_partitions

    if min_partitions is None:
        min_partitions = _parallelism(session)
    session.dataSource.register(with_default_min_partitions(min_partitions))
    worker = _local_worker_python(session)
    problem = worker_python_problem(worker) if worker is not None else None
    if problem is not None:
        log.warning("%s", problem)


def worker_python_problem(python: str) -> str | None:
    """None when ``python`` (the interpreter Spark starts its Python workers with) can import
    what the braid source needs; else what is wrong and how to fix it. A venv that is not
    activated is the usual case: ``python3`` on PATH is then another interpreter, and every
    read fails on the workers with ``ModuleNotFoundError``."""
    found = shutil.which(python)
    # Not realpath: a venv's bin/python is a link to the interpreter it was made from.
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return None
    fix = (
        f"set PYSPARK_PYTHON={sys.executable} in the environment before the session starts "
        "(or activate the virtual environment)"
    )
    if found is None:
        return f"Spark's Python workers run {python!r}, which is not on PATH: {fix}"
    check = subprocess.run(
        [found, "-c", "import " + ", ".join(WORKER_MODULES)],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",  # as a worker: nothing importable from where this process happens to run
    )
    if check.returncode == 0:
        return None
    error = (check.stderr.strip().splitlines() or ["it failed"])[-1]
    return (
        f"Spark's Python workers run {found}, which cannot read the braid format ({error}); "
        f"this process runs {sys.executable}: {fix}"
    )


def _local_worker_python(session: SparkSession) -> str | None:
    """The interpreter of a local session's Python workers; None for a cluster (its workers'
    machines are not this one) or Spark Connect."""
    try:
        context = session.sparkContext
        master = context.master
        python = context.pythonExec  # what PySpark took: $PYSPARK_PYTHON or ``python3``
    except Exception:
        return None
    if not (master or "").startswith("local"):
        return None
    return str(python or SPARK_DEFAULT_WORKER_PYTHON)


def _parallelism(session: SparkSession) -> int | None:
    try:
        return int(session.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext: no default, reads say minPartitions
        return None
