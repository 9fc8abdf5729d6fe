# Spark master, worker and job driver for the `braid` data source.
# The Spark distribution comes from the apache/spark image; the Python side needs 3.11 (the
# project's minimum) with the source's dependencies, so it is laid over python:3.11 with Java 17.
# Build context: the repository root (see docker-compose.yml).
ARG SPARK_VERSION=4.3.0
FROM apache/spark:${SPARK_VERSION} AS distribution

FROM python:3.11-slim-bookworm
ARG SPARK_VERSION=4.3.0
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/*
COPY --from=distribution /opt/spark /opt/spark
# What spark/ imports: PySpark (same version as the cluster), Arrow, the record codecs, charts.
RUN pip install --no-cache-dir "pyspark==${SPARK_VERSION}" "pyarrow>=15" numpy "crc32c>=2.4" \
    "aiokafka>=0.12" "cramjam>=2.8" "matplotlib>=3.8"

WORKDIR /opt/braid
COPY core ./core
COPY spark ./spark

ENV SPARK_HOME=/opt/spark \
    PYTHONPATH=/opt/braid \
    PYSPARK_PYTHON=python3 \
    PATH=/opt/spark/bin:/opt/spark/sbin:$PATH \
    SPARK_NO_DAEMONIZE=1
# Runs as root: ./results is a bind mount the host owns (a demo setup, not a hardened one).
RUN mkdir -p /results
ENTRYPOINT ["/usr/bin/tini", "--"]
