"""spark/: the ``braid`` format for Spark, reading a BraidMQ log in place.

    from spark import register
    register(session)
    frame = session.read.format("braid").option("path", "/var/lib/braid").load()

Two readers give the same rows: a JVM DataSource V2 reader (``spark/java/``, built offline and
loaded by :func:`register`, :mod:`spark.jvm`) and a Python data source (:mod:`spark.source`,
over :mod:`core.log`'s read API), the fallback where the JVM reader cannot run (no JDK, Spark
Connect), always registered as ``braid_python`` too. Both read the files of a running or stopped
broker read-only (no broker connection), batch and structured streaming. ``docs/spark.md`` has
the schema, the options and which reader runs when; :mod:`spark.jobs` has example jobs.
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

__all__ = [
    "COLUMN_NAMES",
    "FORMAT",
    "PYTHON_FORMAT",
    "READERS",
    "register",
    "worker_python_problem",
]

log = logging.getLogger(__name__)

# The Python source's second name: always this reader, even where ``braid`` is the JVM's.
PYTHON_FORMAT = "braid_python"
# register(reader=...): the JVM reader when it can be loaded, else the Python source (auto); or
# one of them for sure. BRAID_SPARK_READER gives the default.
READERS = ("auto", "jvm", "python")
READER_VARIABLE = "BRAID_SPARK_READER"
# The session setting the JVM reader takes its default minPartitions from (BraidScan.java).
MIN_PARTITIONS_CONF = "spark.braid.minPartitions"
# What Spark's Python workers import to run the braid source (spark.source's readers).
WORKER_MODULES = ("crc32c", "spark", "core.log")
# Spark's own default for the workers' interpreter when neither setting names one.
SPARK_DEFAULT_WORKER_PYTHON = "python3"


def register(
    session: SparkSession, *, min_partitions: int | None = None, reader: str | None = None
) -> str:
    """Make ``format("braid")`` available in ``session`` (idempotent); returns the reader it
    resolves to, ``"jvm"`` or ``"python"``.

    ``reader`` (default ``$BRAID_SPARK_READER``, else ``auto``): ``auto`` loads the JVM reader
    (building its jar on first use, :mod:`spark.jvm`) and falls back to the Python source, with
    one log line saying why, when it cannot (no JDK, Spark Connect); ``jvm`` raises instead;
    ``python`` registers only the Python source (a session where the JVM reader was loaded
    keeps it for ``braid``: ``braid_python`` is always the Python source).

    Reads that do not set ``minPartitions`` are spread over ``min_partitions`` tasks, by default
    the session's ``defaultParallelism`` (its cores), as Spark's file sources are: a data
    source's planner cannot see the cluster, so it is told here."""
    from spark.source import with_default_min_partitions, with_name

    choice = (reader or os.environ.get(READER_VARIABLE) or "auto").lower()
    if choice not in READERS:
        raise ValueError(f"reader must be one of {READERS}, not {choice!r}")
    explicit = min_partitions
    if min_partitions is None:
        min_partitions = _parallelism(session)
    python_source = with_default_min_partitions(min_partitions)
    session.dataSource.register(python_source)
    session.dataSource.register(with_name(python_source, PYTHON_FORMAT))
    used = "python"
    if choice != "python":
        from spark import jvm

        try:
            jar = jvm.load(session)
        except jvm.JvmReaderUnavailable as why:
            if choice == "jvm":
                raise
            log.warning("braid: reading with the Python source, not the JVM reader: %s", why)
        else:
            used = "jvm"
            log.info("braid: the JVM reader (%s) reads format('braid')", jar)
            if explicit is not None:
                session.conf.set(MIN_PARTITIONS_CONF, str(explicit))
    worker = _local_worker_python(session)
    problem = worker_python_problem(worker) if worker is not None else None
    if problem is not None:
        log.warning("%s", problem)
    return used


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
