"""Spark on a cluster's data root (docs/cluster.md section 2, issue 22): one ``load()`` reads
every ``shards/NNNN/`` of a root made by ``braid cluster init``, with the ``shard`` column;
``dedupe`` drops the copies a shard holds of records whose home is another (``FLAG_COPY``);
streams keep an offset per shard and queue, pick up shards written after they started, and a
checkpoint written on a single-node directory resumes once that directory was adopted. The
JVM reader and the Python source each, on the same data.

The root: shard 1 is a real ``braid serve`` on ``ROOT/shards/0001`` (MQTT publishes), shards 2
and 3 are written with LogStore (shard 3 holds copies flagged ``FLAG_COPY``, plain and a Kafka
batch), shard 0 is never written (no log yet: skipped)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from braid.cli import main
from core.cluster import layout
from core.log import LogStore
from core.log import record as rec
from spark import PYTHON_FORMAT, readers
from spark.options import OptionError
from spark.readers import DataRoot
from spark.source import (
    ROOT_OFFSETS_FORMAT,
    cap_offsets,
    cap_shard_offsets,
    decode_offsets,
    encode_offsets,
)
from tests.braid_process import BraidProcess

from .logdata import kafka_batch, small_config

SHARDS = 4
MQTT_RECORDS = 30
TIMEOUT_S = 60
# Rows per shard of the module's root without and with dedupe (shard 0 holds no log).
ROWS = {1: MQTT_RECORDS, 2: 20, 3: 12}
DEDUPED = {1: MQTT_RECORDS, 2: 20, 3: 4}
SOURCES = ("braid", PYTHON_FORMAT)  # the JVM reader (loaded by jvm_loaded), the Python source


def braid_main(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(args))
    return code, out.getvalue()


def init_root(root: Path, shards: int = SHARDS) -> None:
    code, out = braid_main("cluster", "init", str(root), "--shards", str(shards))
    assert code == 0, out


def shard_dir(root: Path, shard: int) -> Path:
    return root / "shards" / f"{shard:04d}"


def publish_mqtt(braid: BraidProcess) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="shard-one", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    try:
        infos = [
            client.publish(f"sensors/s{i % 3}/t", b"reading %d" % i, qos=1)
            for i in range(MQTT_RECORDS)
        ]
        for info in infos:
            info.wait_for_publish(TIMEOUT_S)
    finally:
        client.disconnect()
        client.loop_stop()


def write_shard_two(directory: Path) -> None:
    store = LogStore(small_config(directory))
    for number in range(20):
        store.append("orders", number % 2, b"order %d" % number)
    store.close()


def write_shard_three(directory: Path) -> None:
    """5 plain copies and a Kafka batch of 3 copied records (FLAG_COPY), 2 plain records and a
    Kafka batch of 2 of its own: 12 rows, 4 of them records whose home is this shard."""
    store = LogStore(small_config(directory))
    for number in range(5):
        store.append("sensors", 0, b"copy %d" % number, flags=rec.FLAG_COPY, protocol=3)
    store.append_batch(
        "clicks", 0, kafka_batch([(1, b"k", b"copied click", [])] * 3), 3, flags=rec.FLAG_COPY
    )
    store.append("audit", 0, b"own 0")
    store.append("audit", 0, b"own 1")
    store.append_batch("clicks", 1, kafka_batch([(1, b"k", b"own click", [])] * 2), 2)
    store.close()


@pytest.fixture(scope="module")
def cluster_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("cluster")
    root = base / "root"
    init_root(root)
    # A shard directory is what `braid serve --data-dir` takes: new until written, then a
    # single-node directory inside the root.
    assert layout.detect(shard_dir(root, 1)) == "new"
    config = base / "braid.toml"
    config.write_text("[log]\nsegment_size = 65536\n")
    with BraidProcess(
        base, listeners=("mqtt",), data_dir=shard_dir(root, 1), extra_args=("--config", str(config))
    ) as braid:
        publish_mqtt(braid)
    assert layout.detect(shard_dir(root, 1)) == "single"
    write_shard_two(shard_dir(root, 2))
    write_shard_three(shard_dir(root, 3))
    return root


@pytest.fixture(scope="module")
def jvm_loaded(spark: SparkSession) -> None:
    from spark import register

    assert register(spark, reader="jvm") == "jvm"


def read(spark: SparkSession, source: str, path: Path, **options: str) -> DataFrame:
    reader = spark.read.format(source).option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def per_shard(frame: DataFrame) -> dict[int | None, int]:
    return {row.shard: row["count"] for row in frame.groupBy("shard").count().collect()}


def sorted_rows(frame: DataFrame) -> list[tuple]:
    return sorted((tuple(row) for row in frame.collect()), key=lambda row: repr(row))


# -- batch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_a_root_reads_every_shard_with_its_number(
    spark: SparkSession, jvm_loaded: None, cluster_root: Path, source: str
) -> None:
    frame = read(spark, source, cluster_root)
    assert frame.columns[-1] == "shard"
    assert per_shard(frame) == ROWS
    mqtt_rows = frame.where("shard = 1").select("topic", "protocol", "value").collect()
    assert {(row.topic, row.protocol) for row in mqtt_rows} == {("sensors", "mqtt")}
    assert sorted(bytes(row.value) for row in mqtt_rows) == sorted(
        b"reading %d" % i for i in range(MQTT_RECORDS)
    )
    # Copies are rows (they are in the shard's queues) and say so in their flags.
    copies = frame.where((F.col("flags").bitwiseAND(rec.FLAG_COPY)) != 0)
    assert per_shard(copies) == {3: ROWS[3] - DEDUPED[3]}
    # A shard's directory read on its own is a single-node directory: no shard number.
    alone = read(spark, source, shard_dir(cluster_root, 2))
    assert per_shard(alone) == {None: ROWS[2]}
    assert sorted_rows(alone.drop("shard")) == sorted_rows(frame.where("shard = 2").drop("shard"))


def test_both_readers_give_the_same_rows_and_partitions(
    spark: SparkSession, jvm_loaded: None, cluster_root: Path
) -> None:
    for options in ({}, {"dedupe": "true"}, {"maxRecordsPerPartition": "7"}):
        on_jvm = read(spark, "braid", cluster_root, **options)
        in_python = read(spark, PYTHON_FORMAT, cluster_root, **options)
        assert "braid(JVM)" in on_jvm._jdf.queryExecution().executedPlan().toString()
        assert sorted_rows(on_jvm) == sorted_rows(in_python)
        assert on_jvm.rdd.getNumPartitions() == in_python.rdd.getNumPartitions()
    # A filter on the shard is pushed down to the JVM reader; the rows are the same.
    pruned = read(spark, "braid", cluster_root).where("shard = 3").select("value", "shard")
    assert sorted_rows(pruned) == sorted_rows(
        read(spark, PYTHON_FORMAT, cluster_root).where("shard = 3").select("value", "shard")
    )


@pytest.mark.parametrize("source", SOURCES)
def test_dedupe_counts_each_record_once_over_the_shards(
    spark: SparkSession, jvm_loaded: None, cluster_root: Path, source: str
) -> None:
    frame = read(spark, source, cluster_root, dedupe="true")
    assert per_shard(frame) == DEDUPED
    assert frame.where((F.col("flags").bitwiseAND(rec.FLAG_COPY)) != 0).count() == 0
    values = {bytes(row.value) for row in frame.where("shard = 3").collect()}
    assert values == {b"own 0", b"own 1", b"own click"}


# -- streaming ---------------------------------------------------------------------------------


def append(directory: Path, topic: str, bodies: list[bytes], queue: int = 0) -> None:
    store = LogStore(small_config(directory))
    for body in bodies:
        store.append(topic, queue, body)
    store.close()


@pytest.mark.parametrize("source", SOURCES)
def test_a_stream_keeps_an_offset_per_shard_and_finds_new_shards(
    spark: SparkSession, jvm_loaded: None, tmp_path: Path, source: str
) -> None:
    root = tmp_path / "root"
    init_root(root, 3)
    append(shard_dir(root, 1), "events", [b"one %d" % i for i in range(5)])
    name = f"root_stream_{source}"
    query = (
        read_stream(spark, source, root)
        .select("shard", "topic", "offset", "value")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert stream_rows(spark, name) == {(1, "events", i, b"one %d" % i) for i in range(5)}
        # After the first batch: a record in a shard that had no log, and one more in shard 1.
        append(shard_dir(root, 0), "events", [b"zero 0"])
        append(shard_dir(root, 1), "events", [b"one 5"])
        query.processAllAvailable()
        end = end_offset(query)
    finally:
        query.stop()
    rows = stream_rows(spark, name)
    assert rows == {(1, "events", i, b"one %d" % i) for i in range(6)} | {
        (0, "events", 0, b"zero 0")
    }
    assert len(spark.table(name).collect()) == 7  # exactly once
    assert end == {
        "format": ROOT_OFFSETS_FORMAT,
        "shards": {"0000": {"events": {"0": 1}}, "0001": {"events": {"0": 6}}},
    }


def read_stream(spark: SparkSession, source: str, path: Path, **options: str) -> DataFrame:
    reader = spark.readStream.format(source).option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def end_offset(query: StreamingQuery) -> dict:
    """The last micro-batch's end offset (the progress holds it as JSON, or as its text)."""
    offset = query.lastProgress["sources"][0]["endOffset"]
    return json.loads(offset) if isinstance(offset, str) else offset


def stream_rows(spark: SparkSession, name: str) -> set[tuple]:
    return {
        (row.shard, row.topic, row.offset, bytes(row.value)) for row in spark.table(name).collect()
    }


@pytest.mark.parametrize("source", SOURCES)
def test_a_single_node_checkpoint_resumes_on_the_root_that_adopted_it(
    spark: SparkSession, jvm_loaded: None, tmp_path: Path, source: str
) -> None:
    """A stream's offsets on a single-node directory are what they always were; once the
    directory is adopted as shard 0 of a root, the same checkpoint resumes there (its offsets
    are shard 0's) and goes on over every shard."""
    data_dir, out, checkpoint = tmp_path / "d", tmp_path / "out", tmp_path / "checkpoint"
    append(data_dir, "events", [b"before %d" % i for i in range(4)])

    def run() -> dict:
        query = (
            read_stream(spark, source, data_dir)
            .select("shard", "topic", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(TIMEOUT_S)
        return end_offset(query)

    assert run() == {"events": {"0": 4}}  # the single-node format, unchanged
    code, output = braid_main("cluster", "init", str(data_dir), "--adopt", "--shards", "2")
    assert code == 0, output
    append(shard_dir(data_dir, 0), "events", [b"after 4"])
    append(shard_dir(data_dir, 1), "events", [b"elsewhere 0"])
    assert run() == {
        "format": ROOT_OFFSETS_FORMAT,
        "shards": {"0000": {"events": {"0": 5}}, "0001": {"events": {"0": 1}}},
    }
    rows = {
        (row.shard, row.offset, bytes(row.value)) for row in spark.read.parquet(str(out)).collect()
    }
    assert rows == {
        *((None, i, b"before %d" % i) for i in range(4)),  # read before the adoption
        (0, 4, b"after 4"),
        (1, 0, b"elsewhere 0"),
    }
    assert spark.read.parquet(str(out)).count() == 6  # exactly once


# -- offsets and layout, without Spark ---------------------------------------------------------


def test_offsets_keep_the_single_node_form_and_version_a_roots() -> None:
    single = DataRoot("/d")
    root = DataRoot("/r", shards=4)
    adopted = DataRoot("/r", shards=4, legacy_shard=0)
    offsets = {"orders": {"0": 3, "1": 5}}
    assert encode_offsets({None: offsets}, single) == offsets
    assert decode_offsets(offsets, single) == {None: offsets}
    by_shard = {2: offsets, 0: {"t": {"0": 1}}, 3: {}}
    encoded = encode_offsets(by_shard, root)
    assert encoded == {"format": 2, "shards": {"0000": {"t": {"0": 1}}, "0002": offsets}}
    assert list(encoded["shards"]) == ["0000", "0002"]  # ascending, empty shards left out
    assert decode_offsets(encoded, root) == {0: {"t": {"0": 1}}, 2: offsets}
    # A topic named "format" is still a single-node offset (its value is a queue map).
    assert decode_offsets({"format": {"0": 1}}, single) == {None: {"format": {"0": 1}}}
    # Written before an adoption: the adopted shard's; a root that adopted none refuses it.
    assert decode_offsets(offsets, adopted) == {0: offsets}
    with pytest.raises(OptionError, match="adopted none"):
        decode_offsets(offsets, root)
    with pytest.raises(OptionError, match="single-node data directory"):
        decode_offsets(encoded, single)
    with pytest.raises(OptionError, match="format 3"):
        decode_offsets({"format": 3, "shards": {}}, root)


def test_a_cap_is_shared_over_the_queues_of_every_shard() -> None:
    start = {0: {"t": {"0": 0}}, 1: {"t": {"0": 10}}}
    end = {0: {"t": {"0": 30}}, 1: {"t": {"0": 20}, "u": {"0": 10}}}
    capped = cap_shard_offsets(start, end, 20)
    # Backlogs 30, 10 and 10 (u/0 of shard 1 starts at 0): shares 12, 4 and 4.
    assert capped == {0: {"t": {"0": 12}}, 1: {"t": {"0": 14}, "u": {"0": 4}}}
    assert end == {0: {"t": {"0": 30}}, 1: {"t": {"0": 20}, "u": {"0": 10}}}  # not changed
    assert cap_shard_offsets(start, end, 1000) == end
    # A single node's cap is the same arithmetic over its one shard.
    assert cap_offsets(start[0], end[0], 7) == {"t": {"0": 7}}


def test_the_layout_names_are_core_clusters(tmp_path: Path) -> None:
    """spark/ may not import core.cluster: it repeats the few names it reads."""
    assert readers.CLUSTER_FILE == layout.CLUSTER_FILE
    assert readers.PENDING_FILE == layout.PENDING_FILE
    assert readers.SHARDS_DIR == layout.SHARDS_DIR
    assert readers.CLUSTER_FORMAT == layout.FORMAT
    made = layout.init(tmp_path / "r", 3)
    found = readers.data_root(str(tmp_path / "r"))
    assert (found.shards, found.legacy_shard) == (made.shards, made.legacy_shard)
    for shard in range(3):
        assert readers.shard_dir(str(tmp_path / "r"), shard) == str(made.shard_dir(shard))
    assert not readers.data_root(str(tmp_path / "elsewhere")).is_root
    # An unfinished init is refused rather than read as a single node.
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(tmp_path / "r" / layout.CLUSTER_FILE, unfinished / layout.PENDING_FILE)
    with pytest.raises(readers.NotAReadableRoot, match="did not finish"):
        readers.data_root(str(unfinished))
