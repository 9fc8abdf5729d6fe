"""The JVM reader of the ``braid`` format: its jar, built offline and cached, and loading it.

``spark/java/`` holds a Spark DataSource V2 reader (``org.braidmq.spark.BraidSource``, short
name ``braid``) that reads the log as the Python source does, filling Spark's column vectors
directly (docs/spark.md says why that matters). It is compiled here with ``javac`` against the
jars inside the installed pyspark wheel (no Maven, no network), once per version of its sources
and of Spark: the jar is cached as ``braid-spark-<spark version>-<hash>.jar``, the hash over
every file of ``spark/java/``, in :func:`cache_dir`. :func:`load` adds it to a running session
(``ADD JAR``), which makes ``format("braid")`` resolve to it.

Several processes may build at once: each compiles into its own temporary directory and renames
its jar into place (atomic on one file system), so a reader never sees half a jar.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_SOURCES = Path(__file__).resolve().parent / "java"
SOURCE_CLASS = "org.braidmq.spark.BraidSource"
# Where jars are cached: this variable, else $XDG_CACHE_HOME/braidmq, else ~/.cache/braidmq.
CACHE_DIR_VARIABLE = "BRAID_SPARK_JAR_DIR"
# Spark 4 runs on Java 17 or later: class files for 17 load on any of them.
JAVA_RELEASE = "17"
# A cold javac over the ~40 Spark jars it needs takes 5-15 s on two cores; far above that, the
# machine is stuck and the Python reader is the better answer.
COMPILE_TIMEOUT_S = 600


class JvmReaderUnavailable(Exception):
    """Why the JVM reader cannot be used here (no JDK, Spark Connect, a failed build)."""


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "braidmq"


def source_files() -> list[Path]:
    """Every file of the Java sources (the .java files and the service registration)."""
    return sorted(path for path in JAVA_SOURCES.rglob("*") if path.is_file())


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def jar_name() -> str:
    """``braid-spark-<spark version>-<hash of the sources>.jar``."""
    digest = hashlib.sha256()
    digest.update(f"spark {spark_version()} release {JAVA_RELEASE}\n".encode())
    for path in source_files():
        digest.update(path.relative_to(JAVA_SOURCES).as_posix().encode() + b"\n")
        digest.update(path.read_bytes())
    return f"braid-spark-{spark_version()}-{digest.hexdigest()[:16]}.jar"


def javac() -> str | None:
    """The ``javac`` to build with: ``$JAVA_HOME/bin/javac``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "javac"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("javac")


def ensure_jar() -> Path:
    """The cached jar of the current sources, built first if missing. Raises
    :class:`JvmReaderUnavailable` saying why when it cannot be built."""
    target = cache_dir() / jar_name()
    if target.is_file():
        return target
    compiler = javac()
    if compiler is None:
        raise JvmReaderUnavailable("no javac (a JDK 17+) on PATH or in $JAVA_HOME to build it")
    jars = spark_jars()
    if not jars.is_dir():
        raise JvmReaderUnavailable(f"no Spark jars at {jars} to compile against")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise JvmReaderUnavailable(
            f"cannot create the jar cache {target.parent}: {error}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="braid-jar-", dir=target.parent) as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        sources = [str(path) for path in source_files() if path.suffix == ".java"]
        command = [
            compiler,
            "--release",
            JAVA_RELEASE,
            "-encoding",
            "UTF-8",
            "-nowarn",
            "-d",
            str(classes),
            "-cp",
            str(jars / "*"),
            *sources,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise JvmReaderUnavailable(f"javac failed to run: {error}") from None
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise JvmReaderUnavailable(f"javac failed ({compiler}): {first}")
        built = Path(work) / target.name
        _write_jar(built, classes)
        os.replace(built, target)
    return target


def _write_jar(jar: Path, classes: Path) -> None:
    """A jar is a zip with a manifest first; the service registration travels as a resource."""
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: braidmq\r\n\r\n"
        )
        for path in sorted(classes.rglob("*.class")):
            archive.write(path, path.relative_to(classes).as_posix())
        for path in source_files():
            if path.suffix != ".java":
                archive.write(path, path.relative_to(JAVA_SOURCES).as_posix())


def load(session: SparkSession) -> Path:
    """Add the JVM reader to ``session`` (``ADD JAR``; executors fetch it from the driver) and
    check that ``format("braid")`` now resolves to it. Raises :class:`JvmReaderUnavailable`
    saying why not: Spark Connect (no JVM on this side to add a jar to), no JDK, a failed
    build."""
    try:
        jsession = session._jsparkSession  # classic PySpark only
        jvm = session._jvm
    except AttributeError:
        raise JvmReaderUnavailable("Spark Connect has no local JVM to add a jar to") from None
    if jvm is None or jsession is None:
        raise JvmReaderUnavailable("Spark Connect has no local JVM to add a jar to")
    jar = ensure_jar()
    if not _resolves_to_jvm(session):
        session.sql(f"ADD JAR '{jar}'")
    if not _resolves_to_jvm(session):
        raise JvmReaderUnavailable(f"ADD JAR '{jar}' did not make format('braid') resolve to it")
    return jar


def _resolves_to_jvm(session: SparkSession) -> bool:
    """Whether Spark resolves the short name ``braid`` to the JVM reader in ``session``."""
    jvm: Any = session._jvm
    try:
        lookup = jvm.org.apache.spark.sql.execution.datasources.DataSource
        found = lookup.lookupDataSource("braid", session._jsparkSession.sessionState().conf())
        return bool(found.getName() == SOURCE_CLASS)
    except Exception:  # py4j wraps the JVM's ClassNotFoundException and its relatives
        return False
