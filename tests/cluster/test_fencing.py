"""The storage fence with real processes (docs/cluster.md section 5.3-5.4, section 14's
test_fencing; issue 23: "a paused owner that wakes after takeover acknowledges nothing that is
then lost").

A subprocess owns shard 1 of a data root at epoch 1 (``claim_epoch``, then a LogStore opened
with ``log_fence``) and appends in a loop, writing each acknowledgement to its stdout pipe. It is
stopped with SIGSTOP; this process claims epoch 2, recovers the shard (a new owner after an
unclean stop: the recovered end sealed, writing from the next segment boundary), records the
seal, and writes records of its own; then SIGCONT. The woken owner acknowledges nothing more:
its waiters fail with StoreFenced, its later appends are refused. Every record it acknowledged
is read by the new owner, by a fresh LogReader, by Spark's Python decoder and after one more
unclean change of owner; what it wrote after waking lies past the seal and no reader returns
it; ``braid log verify`` finds the shard sound.

Two ways to stop it: the child stops itself with a write in flight (its group commit's fsync
under way) and appends right after it wakes, so both happen on every run; or this process
stops it at a moment of its choosing while four appenders run.

Run as ``python -m tests.cluster.test_fencing child SHARD_DIR MODE`` it is the subprocess.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from braid import logtool
from core.cluster import epochs
from core.cluster.epochs import EpochClaim
from core.cluster.layout import init
from core.log import Appended, LogConfig, LogReader, LogStore, StoreFenced

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0  # waits only: nothing below asserts how fast something happened
SEGMENT = 1 << 20
SHARD = 1
TOPIC = "orders"
NEW_TOPIC = "fresh"  # the new owner's own records
SELF_STOP_AFTER = 150  # acknowledgements before the child stops itself (mode "self")
WOKEN_RECORDS = 5  # what the child appends right after it wakes (mode "self")
APPENDERS = 4  # concurrent appenders (mode "external"), each to its own queue of TOPIC
EXTERNAL_STOP_AFTER = 200  # acknowledgements before this process stops the child


def config(shard_dir: Path) -> LogConfig:
    return LogConfig(
        shard_dir, segment_size=SEGMENT, index_entries_per_file=1024, retention_ms=None
    )


def claim(shard_dir: Path, epoch: int, node: str) -> None:
    epochs.claim_epoch(
        shard_dir,
        epoch,
        EpochClaim(node=node, incarnation=os.getpid(), claimed_ms=int(time.time() * 1000), start=0),
    )


# -- the subprocess: the old owner ----------------------------------------------------------


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def own(shard_dir: Path, mode: str) -> None:
    claim(shard_dir, 1, "old")
    store = LogStore(config(shard_dir), fence=epochs.log_fence(shard_dir, 1))
    say(f"open {store.commitlog.write_position}")
    if mode == "self":
        await append_then_stop_myself(store)
    else:
        await asyncio.gather(*(append_until_fenced(store, queue) for queue in range(APPENDERS)))
    try:
        store.append(TOPIC, 0, b"after the fence")
    except StoreFenced:
        say("refused")
    store.close()
    say("closed")


async def acknowledged(store: LogStore, queue: int, body: bytes) -> bool:
    """Append and wait until durable: "ack" or "fenced" on stdout, with the record's position."""
    return await settled(store, queue, body, store.append(TOPIC, queue, body))


async def settled(store: LogStore, queue: int, body: bytes, appended: Appended) -> bool:
    try:
        await store.wait_durable(appended.end)
    except StoreFenced:
        say(f"fenced {queue} {body.decode()} {appended.position}")
        return False
    say(f"ack {queue} {body.decode()} {appended.position}")
    return True


async def append_then_stop_myself(store: LogStore) -> None:
    for i in range(SELF_STOP_AFTER):
        assert await acknowledged(store, 0, b"old-%d" % i)
    # A write in flight: appended, its wait for the group commit not yet begun.
    body = b"old-%d" % SELF_STOP_AFTER
    in_flight = asyncio.create_task(settled(store, 0, body, store.append(TOPIC, 0, body)))
    say("stopping")
    os.kill(os.getpid(), signal.SIGSTOP)
    # Woken, before the event loop runs anything else: this owner writes on as before.
    woken = []
    for i in range(WOKEN_RECORDS):
        body = b"woken-%d" % i
        woken.append(settled(store, 0, body, store.append(TOPIC, 0, body)))
    results = await asyncio.gather(in_flight, *woken)
    assert not any(results), "a woken owner acknowledged a write"


async def append_until_fenced(store: LogStore, queue: int) -> None:
    i = 0
    while True:
        try:
            if not await acknowledged(store, queue, b"q%d-%d" % (queue, i)):
                return
        except StoreFenced:  # refused at the append: the store knew already
            return
        i += 1


def child_main(shard_dir: str, mode: str) -> None:
    asyncio.run(own(Path(shard_dir), mode))


# -- the test: the new owner ----------------------------------------------------------------


@dataclass
class OldOwner:
    """The subprocess and what it said, line by line, read on a thread as it comes."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def said(self, prefix: str) -> list[list[str]]:
        return [line.split()[1:] for line in list(self.lines) if line.split()[0] == prefix]

    async def wait_for(self, predicate: str, count: int = 1) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while len(self.said(predicate)) < count:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {count} {predicate!r} lines: {self.lines[-5:]}")
            await asyncio.sleep(0.005)

    async def wait_stopped(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while state(self.process.pid) != "T":
            if time.monotonic() > deadline:
                raise AssertionError(f"the old owner did not stop: {state(self.process.pid)}")
            await asyncio.sleep(0.005)


def state(pid: int) -> str:
    """The process state letter of /proc/PID/stat (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    return init(tmp_path / "root", 2).shard_dir(SHARD)


@pytest.fixture
def old_owner(request: pytest.FixtureRequest, shard_dir: Path) -> Iterator[OldOwner]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.cluster.test_fencing",
            "child",
            str(shard_dir),
            request.param,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    owner = OldOwner(process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            owner.lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield owner
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(DEADLINE_S)
        reader.join(DEADLINE_S)
        assert process.stdout is not None
        process.stdout.close()


def bodies(reader: LogReader, topic: str, queue: int) -> list[bytes]:
    return [bytes(r.body) for r in reader.read(topic, queue, 0, max_records=1_000_000)]


async def take_over(shard_dir: Path) -> LogStore:
    """Claim epoch 2 and open the shard as its new owner."""
    claim(shard_dir, 2, "new")
    fence = epochs.log_fence(shard_dir, 2)
    assert fence.start_at_segment_boundary  # epoch 1 never closed
    return LogStore(config(shard_dir), fence=fence)


async def finish(old: OldOwner) -> None:
    old.process.send_signal(signal.SIGCONT)
    await old.wait_for("closed")
    assert old.process.wait(DEADLINE_S) == 0


def check_readers(shard_dir: Path, queues: int, acked: set[bytes], seal: int) -> None:
    """A fresh LogReader, Spark's decoder and ``braid log verify`` after the takeover: every
    acknowledged record, nothing from past the seal."""
    from spark import decode

    with LogReader(shard_dir) as reader:
        assert reader.commitlog.seals == {0: seal}
        stored = [
            r
            for queue in range(queues)
            for r in reader.read(TOPIC, queue, 0, max_records=1_000_000)
        ]
        assert not [r for r in stored if seal <= r.position < SEGMENT]  # past the seal
        read = {bytes(r.body) for r in stored}
        assert acked <= read
        assert not [body for body in read if body.startswith(b"woken")]
        scanned = {bytes(record.body or b"") for record in reader.scan()}
        assert acked <= scanned
        assert not [body for body in scanned if body.startswith(b"woken")]
        decoded = {
            row["value"]
            for queue in range(queues)
            for batch in decode.read_range(reader, TOPIC, queue, 0, 1 << 62)
            for row in batch.to_pylist()
        }
        assert decoded == read
        assert bodies(reader, NEW_TOPIC, 0) == [b"new-%d" % i for i in range(10)]
    out = io.StringIO()
    assert logtool.verify(str(shard_dir.parent.parent), out=out) == logtool.EXIT_OK, out.getvalue()


@pytest.mark.parametrize("old_owner", ["self"], indirect=True)
async def test_an_owner_paused_with_a_write_in_flight_acknowledges_nothing_after_a_takeover(
    shard_dir: Path, old_owner: OldOwner
) -> None:
    await old_owner.wait_for("stopping")
    await old_owner.wait_stopped()
    acked = {parts[1].encode() for parts in old_owner.said("ack")}
    assert len(acked) == SELF_STOP_AFTER

    new = await take_over(shard_dir)
    seal = new.recovery.end_position
    assert new.recovery.sealed == {0: seal}
    assert new.commitlog.write_position == SEGMENT
    claimed = epochs.read_claim(shard_dir, 2)
    assert claimed is not None
    assert (claimed.start, claimed.sealed) == (SEGMENT, {0: seal})
    # Everything it wrote before the stop is the new owner's log: the acknowledged records and
    # the one in flight (never acknowledged; kept, as after a crash).
    before = bodies(new, TOPIC, 0)
    assert before == [b"old-%d" % i for i in range(SELF_STOP_AFTER + 1)]
    for i in range(5):
        await new.publish(NEW_TOPIC, 0, b"new-%d" % i)

    await finish(old_owner)
    fenced = old_owner.said("fenced")
    assert {parts[1] for parts in fenced} == {
        f"old-{SELF_STOP_AFTER}",
        *(f"woken-{i}" for i in range(WOKEN_RECORDS)),
    }
    assert {parts[1].encode() for parts in old_owner.said("ack")} == acked  # nothing more
    assert old_owner.said("refused")
    # It did write after waking: right after the in-flight record, past the seal.
    woken_at = [int(parts[2]) for parts in fenced if parts[1].startswith("woken")]
    assert min(woken_at) == seal

    # The new owner reads on as before; its next records overwrite the woken index entries.
    assert bodies(new, TOPIC, 0) == before
    for i in range(5, 10):
        await new.publish(NEW_TOPIC, 0, b"new-%d" % i)
    more = [b"new-old-queue-%d" % i for i in range(3)]
    for body in more:
        await new.publish(TOPIC, 0, body)
    assert bodies(new, TOPIC, 0) == before + more
    new.close()

    check_readers(shard_dir, 1, acked | set(more), seal)
    with LogReader(shard_dir) as reader:
        assert bodies(reader, TOPIC, 0) == before + more
    # One more unclean change of owner: the seal still bounds recovery.
    claim(shard_dir, 3, "third")
    third = LogStore(config(shard_dir), fence=epochs.log_fence(shard_dir, 3))
    assert bodies(third, TOPIC, 0) == before + more
    assert third.recovery.sealed == {SEGMENT: third.recovery.end_position}
    third.close()


@pytest.mark.parametrize("old_owner", ["external"], indirect=True)
async def test_an_owner_stopped_from_outside_under_load_loses_no_acknowledged_record(
    shard_dir: Path, old_owner: OldOwner
) -> None:
    await old_owner.wait_for("ack", EXTERNAL_STOP_AFTER)
    old_owner.process.send_signal(signal.SIGSTOP)
    await old_owner.wait_stopped()

    new = await take_over(shard_dir)
    seal = new.recovery.end_position
    for i in range(10):
        await new.publish(NEW_TOPIC, 0, b"new-%d" % i)
    await finish(old_owner)
    # Every appender ended fenced (a waiter failed or an append refused), none acknowledged
    # anything it wrote past the seal.
    acks = old_owner.said("ack")
    assert all(int(parts[2]) < seal for parts in acks)
    acked = {parts[1].encode() for parts in acks}
    assert len(acked) >= EXTERNAL_STOP_AFTER
    recovered = {
        bytes(r.body)
        for queue in range(APPENDERS)
        for r in new.read(TOPIC, queue, 0, max_records=1_000_000)
    }
    assert acked <= recovered
    new.close()
    check_readers(shard_dir, APPENDERS, acked, seal)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child_main(sys.argv[2], sys.argv[3])
