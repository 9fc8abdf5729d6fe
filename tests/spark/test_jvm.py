"""The JVM reader and the Python source give the same answers (issue 24): identical rows, counted
and hashed over every column, on a log a real broker wrote from all three protocols (Kafka
batches in every codec, a Kafka transaction committed and one aborted, delayed records, a dead
letter, a batch routed into an AMQP queue record by record, segments rolling), and both refuse
a corrupt frame with the same error. Also how the jar is built and when the Python source is
used instead."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from paho.mqtt.enums import CallbackAPIVersion
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from core.log import LogReader
from spark import PYTHON_FORMAT, jvm
from spark.schema import COLUMN_NAMES
from tests.braid_process import BraidProcess
from tests.cli.fleet import write_fleet

SEGMENT_SIZE = 64 * 1024
TIMEOUT_S = 30
CODECS = ("gzip", "snappy", "lz4", "zstd", None)


async def produce_kafka(braid: BraidProcess) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 2, 1)])
    finally:
        await admin.close()
    for number, codec in enumerate(CODECS):
        producer = AIOKafkaProducer(
            bootstrap_servers=braid.kafka_bootstrap, acks="all", compression_type=codec
        )
        await producer.start()
        try:
            batch = producer.create_batch()
            for i in range(40):
                value = None if i == 7 else (f"order {number}/{i} " * 5).encode()
                headers = [("trace", f"t{i}".encode())] if i % 3 == 0 else []
                batch.append(key=f"k{i}".encode(), value=value, timestamp=None, headers=headers)
            await (await producer.send_batch(batch, "orders", partition=number % 2))
        finally:
            await producer.stop()
    # Kafka transactions: one committed, one aborted.
    producer = AIOKafkaProducer(
        bootstrap_servers=braid.kafka_bootstrap, transactional_id="cross-check", acks="all"
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait("orders", b"committed in a transaction", partition=0)
        await producer.begin_transaction()
        await producer.send_and_wait("orders", b"aborted in a transaction", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    # A delayed record (x-delay, ms): visible once its timer fires.
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            "orders", b"delayed over kafka", partition=1, headers=[("x-delay", b"300")]
        )
    finally:
        await producer.stop()


async def publish_amqp(braid: BraidProcess) -> None:
    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange("events", aio_pika.ExchangeType.TOPIC)
        dead = await channel.declare_exchange("dead", aio_pika.ExchangeType.FANOUT)
        graveyard = await channel.declare_queue("graveyard")
        await graveyard.bind(dead)
        work = await channel.declare_queue("work", arguments={"x-dead-letter-exchange": "dead"})
        await work.bind(exchange, "job.*")
        # Enough bytes to roll several 64 KiB segments.
        for i in range(600):
            await exchange.publish(
                aio_pika.Message(
                    b"event %d " % i + b"x" * 150,
                    headers={"n": i, "correlation-id": f"c{i}"},
                    correlation_id=f"c{i}",
                ),
                routing_key=f"job.{i % 5}" if i % 10 == 0 else f"event.{i % 7}",
            )
        # A dead letter: rejected without requeue, moved with x-death headers.
        message = await work.get(timeout=TIMEOUT_S)
        await message.reject(requeue=False)
        # A delayed message.
        delayed = await channel.declare_exchange(
            "later", "x-delayed-message", arguments={"x-delayed-type": "topic"}
        )
        await delayed.publish(
            aio_pika.Message(b"delayed over amqp", headers={"x-delay": 300}), routing_key="k"
        )
        # AMQP transactions: one committed, one rolled back.
        tx_channel = await connection.channel(publisher_confirms=False)
        tx_exchange = await tx_channel.get_exchange("events")
        transaction = tx_channel.transaction()
        await transaction.select()
        await tx_exchange.publish(
            aio_pika.Message(b"committed tx"), routing_key="event.tx", mandatory=False
        )
        await transaction.commit()
        await tx_exchange.publish(
            aio_pika.Message(b"rolled back tx"), routing_key="event.tx", mandatory=False
        )
        await transaction.rollback()
    finally:
        await connection.close()


def publish_mqtt(braid: BraidProcess) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="cross", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    try:
        infos = [
            client.publish(f"devices/d{i % 3}/temperature", b'{"t": %d}' % i, qos=i % 2)
            for i in range(50)
        ]
        infos.append(client.publish("$delayed/1/devices/late", b"delayed over mqtt", qos=1))
        infos.append(client.publish("devices/d0/state", b"retained", qos=1, retain=True))
        for info in infos:
            info.wait_for_publish(TIMEOUT_S)
    finally:
        client.disconnect()
        client.loop_stop()


def wait_for_delayed(data_dir: Path) -> None:
    """Until every delayed record fired (each is then indexed in its topic)."""
    deadline = time.monotonic() + TIMEOUT_S
    wanted = {b"delayed over kafka", b"delayed over amqp", b"delayed over mqtt"}
    while True:
        with LogReader(data_dir) as reader:
            seen = set()
            for topic, queue in reader.queues():
                first, after = reader.queue_bounds(topic, queue)
                for entry in reader.read(topic, queue, first, max_records=after - first + 1):
                    body = bytes(entry.body)  # a Kafka batch holds its record's value as is
                    seen.update(want for want in wanted if want in body)
        if seen == wanted:
            return
        assert time.monotonic() < deadline, f"delayed records never fired: {wanted - seen}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def three_protocols(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("three")
    config = path / "braid.toml"
    config.write_text(f"[log]\nsegment_size = {SEGMENT_SIZE}\n")
    with BraidProcess(
        path,
        listeners=("amqp", "mqtt", "kafka"),
        extra_args=("--config", str(config)),
    ) as braid:
        asyncio.run(produce_kafka(braid))
        asyncio.run(publish_amqp(braid))
        asyncio.run(write_fleet(braid))
        publish_mqtt(braid)
        wait_for_delayed(braid.data_dir)
    with LogReader(braid.data_dir) as reader:
        assert len(reader.commitlog.segments) >= 3  # segments rolled
    return braid.data_dir


def read(spark: SparkSession, source: str, data_dir: Path, **options: str) -> DataFrame:
    reader = spark.read.format(source).option("path", str(data_dir))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def fingerprint(frame: DataFrame) -> tuple[int, int]:
    """Rows and the sum of a 64-bit hash over every column of each row (order-independent)."""
    hashed = F.xxhash64(*frame.columns).cast("decimal(38,0)")
    row = frame.agg(F.count(F.lit(1)), F.sum(hashed)).first()
    assert row is not None
    return int(row[0]), int(row[1] or 0)


def sorted_rows(frame: DataFrame) -> list[tuple]:
    return sorted(
        (tuple(row) for row in frame.collect()),
        key=lambda row: tuple(str(value) for value in row),
    )


@pytest.fixture(scope="module")
def jvm_loaded(spark: SparkSession) -> None:
    from spark import register

    assert register(spark, reader="jvm") == "jvm"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"includeSystem": "true"},
        {"dedupe": "true"},
        {"verifyChecksums": "false", "maxRecordsPerPartition": "97"},
        {"topics": "orders,amq.queue.fleet-trucks", "startingOffsets": "3"},
    ],
    ids=["all", "system", "dedupe", "nocrc-small-partitions", "selection"],
)
def test_jvm_and_python_rows_are_identical(
    spark: SparkSession, jvm_loaded: None, three_protocols: Path, options: dict[str, str]
) -> None:
    on_jvm = read(spark, "braid", three_protocols, **options)
    in_python = read(spark, PYTHON_FORMAT, three_protocols, **options)
    assert "braid(JVM)" in on_jvm._jdf.queryExecution().executedPlan().toString()
    assert tuple(on_jvm.columns) == tuple(in_python.columns) == COLUMN_NAMES
    rows, digest = fingerprint(on_jvm)
    assert (rows, digest) == fingerprint(in_python)
    assert rows > 100
    assert sorted_rows(on_jvm) == sorted_rows(in_python)
    # The same partitions: planning is the same arithmetic.
    assert on_jvm.rdd.getNumPartitions() == in_python.rdd.getNumPartitions()


def test_what_the_log_holds_reaches_both(
    spark: SparkSession, jvm_loaded: None, three_protocols: Path
) -> None:
    frame = read(spark, "braid", three_protocols)
    values = {bytes(row.value) for row in frame.select("value").collect() if row.value}
    for wanted in (
        b"committed in a transaction",
        b"delayed over kafka",
        b"delayed over amqp",
        b"delayed over mqtt",
        b"committed tx",
    ):
        assert wanted in values
    assert b"rolled back tx" not in values
    protocols = {row.protocol for row in frame.select("protocol").distinct().collect()}
    assert {"kafka", "amqp", "mqtt"} <= protocols
    dead = frame.where("topic = 'amq.queue.graveyard'").collect()
    assert len(dead) == 1
    assert any(header.key == "x-death" for header in dead[0].headers)


def test_pruned_and_filtered_reads_agree(
    spark: SparkSession, jvm_loaded: None, three_protocols: Path
) -> None:
    """Column pruning and pushed-down filters read less, never other rows."""
    queries = [
        lambda f: f.where("topic = 'orders' and offset >= 45 and offset < 70").select(
            "offset", "key"
        ),
        lambda f: f.where("queue = 1").select("topic", "value", "timestamp"),
        lambda f: f.where(F.col("topic").isin("amq.queue.work", "devices")).select("headers"),
        lambda f: f.where(F.col("store_timestamp") >= F.lit(middle)).select("offset", "topic"),
        lambda f: f.where(F.col("store_timestamp") < F.lit(middle)).select("offset", "topic"),
        lambda f: f.groupBy("topic").agg(F.count(F.lit(1)), F.sum(F.length("value"))),
    ]
    times = (
        read(spark, PYTHON_FORMAT, three_protocols)
        .agg(F.min("store_timestamp"), F.max("store_timestamp"))
        .first()
    )
    assert times is not None
    middle = times[0] + (times[1] - times[0]) / 2
    for query in queries:
        on_jvm = query(read(spark, "braid", three_protocols))
        in_python = query(read(spark, PYTHON_FORMAT, three_protocols))
        assert sorted_rows(on_jvm) == sorted_rows(in_python)
    plan = (
        read(spark, "braid", three_protocols)
        .where("topic = 'orders' and offset >= 45")
        .select("value")
        ._jdf.queryExecution()
        .executedPlan()
        .toString()
    )
    assert "braid(JVM)" in plan
    assert " value" in plan
    assert "headers" not in plan  # only the value column is built


def flip_byte(data_dir: Path, position: int) -> None:
    segment = data_dir / "commitlog" / f"{position // SEGMENT_SIZE * SEGMENT_SIZE:020d}.log"
    with segment.open("r+b") as stream:
        stream.seek(position % SEGMENT_SIZE)
        byte = stream.read(1)
        stream.seek(position % SEGMENT_SIZE)
        stream.write(bytes([byte[0] ^ 0x01]))


def test_a_corrupt_frame_fails_both_with_the_same_error(
    spark: SparkSession, jvm_loaded: None, three_protocols: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "corrupt"
    shutil.copytree(three_protocols, copy)
    with LogReader(copy) as reader:
        ((_, _, position),) = [
            (topic, queue, entry.position)
            for topic, queue in reader.queues()
            if topic == "orders" and queue == 0
            for entry in reader.read(topic, queue, 0, max_records=1)
        ]
    flip_byte(copy, position + 200)  # inside the stored Kafka batch
    errors = []
    for source in ("braid", PYTHON_FORMAT):
        with pytest.raises(Exception) as raised:  # noqa: PT011 (py4j and PySpark wrap it)
            read(spark, source, copy).where("topic = 'orders'").collect()
        errors.append(str(raised.value))
    for error in errors:
        assert f"corrupt record at commit-log position {position}: crc32c mismatch" in error
    # The other topics still read, the same on both (the Python source gets no pushed-down
    # filters: the topic is an option for it).
    devices = read(spark, "braid", copy, topics="devices").count()
    assert devices == read(spark, PYTHON_FORMAT, copy, topics="devices").count() > 0
    assert read(spark, "braid", copy).where("topic = 'devices'").count() == devices


def test_the_jar_is_cached_by_the_hash_of_its_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    jar = jvm.ensure_jar()
    assert jar.parent == tmp_path / "cache"
    assert jar.name == jvm.jar_name()
    assert jvm.ensure_jar() == jar  # cached: not rebuilt
    import zipfile

    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
    assert "org/braidmq/spark/BraidSource.class" in names
    assert "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister" in names
    assert json.dumps(sorted(names))  # a readable listing


def test_without_a_jdk_the_python_source_reads_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm.CACHE_DIR_VARIABLE, str(tmp_path / "empty-cache"))
    monkeypatch.setattr(jvm, "javac", lambda: None)
    with pytest.raises(jvm.JvmReaderUnavailable, match="no javac"):
        jvm.ensure_jar()


def test_register_falls_back_to_the_python_source_with_one_log_line(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from spark import register

    def unavailable(session: SparkSession) -> Path:
        raise jvm.JvmReaderUnavailable("no javac (a JDK 17+) on PATH or in $JAVA_HOME to build it")

    monkeypatch.setattr(jvm, "load", unavailable)
    with caplog.at_level("WARNING", logger="spark"):
        assert register(spark) == "python"
    (line,) = [r.getMessage() for r in caplog.records if "Python source" in r.getMessage()]
    assert "not the JVM reader: no javac" in line
    with pytest.raises(jvm.JvmReaderUnavailable):
        register(spark, reader="jvm")
    assert register(spark, reader="python") == "python"


def test_the_java_sources_compile_without_warnings(tmp_path: Path) -> None:
    """The Java is kept as the Python is: every javac lint on, warnings are errors."""
    import subprocess

    compiler = jvm.javac()
    assert compiler is not None, "a JDK 17+ is needed to build the JVM reader"
    sources = [str(path) for path in jvm.source_files() if path.suffix == ".java"]
    lint = ["-Werror", "-Xlint:all", "-Xlint:-serial", "-Xlint:-path"]
    target = ["-d", str(tmp_path), "-cp", str(jvm.spark_jars() / "*")]
    done = subprocess.run(
        [compiler, "--release", jvm.JAVA_RELEASE, *lint, *target, *sources],
        capture_output=True,
        text=True,
        timeout=jvm.COMPILE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_streams_read_the_same_micro_batches(
    spark: SparkSession, jvm_loaded: None, three_protocols: Path
) -> None:
    """``readStream`` through each reader, ``availableNow`` capped at 97 records a trigger: the
    same offsets end each micro-batch (the same arithmetic shares the cap out over queues), so
    the same rows arrive in the same micro-batches."""
    results = {}
    for source in ("braid", PYTHON_FORMAT):
        name = f"stream_{source}"
        query = (
            spark.readStream.format(source)
            .option("path", str(three_protocols))
            .option("maxRecordsPerTrigger", "97")
            .load()
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        progress = [
            (p["numInputRows"], json.dumps(p["sources"][0]["endOffset"], sort_keys=True))
            for p in query.recentProgress
            if p["numInputRows"]
        ]
        results[source] = (progress, sorted_rows(spark.table(name)))
    assert results["braid"] == results[PYTHON_FORMAT]
    progress, rows = results["braid"]
    assert max(count for count, _ in progress) <= 97
    assert len(rows) == sum(count for count, _ in progress) > 100
