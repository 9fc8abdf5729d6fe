"""The JVM reader honours epoch seals (docs/cluster.md section 5, "Readers."): on a cluster
shard whose old owner woke after an unclean takeover and wrote past the seal, the old owner's
records there are no rows, batch or streamed, and the JVM reader gives the rows the Python
source gives.

The shard is built as tests/log/test_fence.py builds one, in one process: two LogStores on one
directory stand for the paused old owner (epoch 1) and the new one (epoch 2), with the claims
and fences a node uses (core/cluster/epochs.py). The old owner's entries past the seal sit at
the tail of queue ``t/1`` (all of it) and inside queue ``t/0``: the new owner overwrote the
first of them with its own record (in the next segment), so the rest come after a run of
another segment and their offsets continue the chain. A claim being written (a file that does
not parse) lies in ``epochs/`` too: it is skipped."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from braid.cli import main
from core.cluster import epochs
from core.log import LogReader, LogStore, StoreFenced
from core.log.fence import sealed_bounds
from spark import PYTHON_FORMAT
from tests.log.conftest import SMALL_SEGMENT, small_config
from tests.log.test_fence import claim

from .logdata import kafka_batch

SHARD = 1
TIMEOUT_S = 60
ACKED = [b"acked %d" % i for i in range(30)]
MINE_T0 = b"the new owner on t/0"
MINE_T2 = [b"new %d" % i for i in range(5)]
# What the readers must show: (topic, queue, offset, value).
EXPECTED = {
    *(("t", 0, offset, body) for offset, body in enumerate([*ACKED, b"in flight"])),
    ("t", 0, 31, MINE_T0),
    *(("t", 2, offset, body) for offset, body in enumerate(MINE_T2)),
}


async def write_past_a_seal(shard: Path) -> int:
    """The old owner's records, a takeover sealing them, the old owner waking and writing past
    the seal, then the new owner's records; returns the seal."""
    old = LogStore(small_config(shard), fence=claim(shard, 1))
    for body in ACKED:
        await old.publish("t", 0, body)
    in_flight = old.append("t", 0, b"in flight")  # written, never acknowledged
    end = old.commitlog.write_position

    new = LogStore(small_config(shard), fence=claim(shard, 2))  # the old owner is paused
    assert new.recovery.sealed == {0: end}
    assert new.commitlog.write_position == SMALL_SEGMENT

    # The old owner wakes and writes on before its next fsync finds epoch 2: t/0 gets the
    # offsets after "in flight" (31-35, a Kafka batch of 3 last), t/1 its first three.
    woken = [
        old.append("t", 0, b"woken 0"),
        old.append("t", 0, b"woken 1"),
        old.append_batch("t", 0, kafka_batch([(1, b"k", b"woken batch", [])] * 3), 3),
        *(old.append("t", 1, b"woken t1 %d" % i) for i in range(3)),
    ]
    assert all(appended.position >= end for appended in woken)
    results = await asyncio.gather(
        old.wait_durable(in_flight.end),
        *(old.wait_durable(appended.end) for appended in woken),
        return_exceptions=True,
    )
    assert all(isinstance(result, StoreFenced) for result in results)
    old.close()

    # The new owner's first t/0 record takes offset 31, over the slot of "woken 0"; the old
    # owner's entries for offsets 32-35 stay behind it, pointing past the seal.
    mine = await new.publish("t", 0, MINE_T0)
    assert mine.position >= SMALL_SEGMENT
    for body in MINE_T2:
        await new.publish("t", 2, body)
    new.close()
    return end


@pytest.fixture(scope="module")
def sealed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sealed") / "root"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["cluster", "init", str(root), "--shards", "2"]) == 0, out.getvalue()
    shard = root / "shards" / f"{SHARD:04d}"
    end = asyncio.run(write_past_a_seal(shard))
    # A later claim whose claimer is still writing it: no JSON yet.
    (shard / "epochs" / epochs.epoch_name(3)).write_text('{"node": "3", "sea')
    assert sealed_bounds(shard) == {0: end}
    with LogReader(shard) as reader:
        # What the log holds past the seal: entries the readers must skip.
        assert reader.queue_bounds("t", 0) == (0, 36)
        assert reader.queue_bounds("t", 1) == (0, 3)
    return root


@pytest.fixture(scope="module")
def jvm_loaded(spark: SparkSession) -> None:
    from spark import register

    assert register(spark, reader="jvm") == "jvm"


def rows(frame: DataFrame) -> list[tuple[str, int, int, bytes]]:
    picked = frame.select("shard", "topic", "queue", "offset", "value").collect()
    assert {row.shard for row in picked} == {SHARD}
    return sorted((row.topic, row.queue, row.offset, bytes(row.value)) for row in picked)


def test_a_batch_read_drops_what_the_old_owner_wrote_past_the_seal(
    spark: SparkSession, jvm_loaded: None, sealed_root: Path
) -> None:
    on_jvm = spark.read.format("braid").option("path", str(sealed_root)).load()
    assert "braid(JVM)" in on_jvm._jdf.queryExecution().executedPlan().toString()
    in_python = spark.read.format(PYTHON_FORMAT).option("path", str(sealed_root)).load()
    assert rows(on_jvm) == sorted(EXPECTED)
    assert rows(on_jvm) == rows(in_python)
    assert on_jvm.count() == len(EXPECTED)


def test_a_stream_drops_what_the_old_owner_wrote_past_the_seal(
    spark: SparkSession, jvm_loaded: None, sealed_root: Path
) -> None:
    name = "sealed_stream_jvm"
    query = (
        spark.readStream.format("braid")
        .option("path", str(sealed_root))
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(TIMEOUT_S)
    assert query.exception() is None
    assert rows(spark.table(name)) == sorted(EXPECTED)
