"""Crash safety: SIGKILL a sync-mode writer at random moments; acknowledged records survive.

CI kills the writer 6 times; ``BRAID_LONG=1`` kills it 20 times (each kill starts a Python
child and re-checks every record acknowledged so far)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from core.log import LogReader, LogStore, names

from .crash_child import QUEUES, body_for, store_config

CHILD = Path(__file__).with_name("crash_child.py")
LONG = os.environ.get("BRAID_LONG") == "1"
KILLS = 20 if LONG else 6
TIME_BUDGET_S = 90


def _run_child_until_killed(
    data_dir: Path, first_seq: int, rng: random.Random
) -> list[tuple[int, int, int]]:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), str(first_seq)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acks: list[tuple[int, int, int]] = []
    ready = child.stdout.readline()
    assert ready.startswith("ready"), ready

    def reader() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "ack":
                acks.append((int(parts[1]), int(parts[2]), int(parts[3])))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(rng.uniform(0.02, 0.4))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join(5)
    return acks


def test_sigkill_never_loses_acknowledged_records(tmp_path: Path):
    rng = random.Random(20261121)
    data_dir = tmp_path / "crash"
    acked: dict[tuple[int, int], int] = {}
    next_seq = 0
    started = time.monotonic()
    kills = 0
    while kills < KILLS and time.monotonic() - started < TIME_BUDGET_S:
        # Offsets each queue must continue at: whatever recovery keeps (acked or not).
        if data_dir.exists():
            store = LogStore(store_config(str(data_dir)))
            resume_at = {q: store.queue_bounds("crash", q)[1] for q in range(QUEUES)}
            store.close()
        else:
            resume_at = dict.fromkeys(range(QUEUES), 0)
        acks = _run_child_until_killed(data_dir, next_seq, rng)
        kills += 1
        first_ack_per_queue: dict[int, int] = {}
        for seq, queue, offset in acks:
            assert (queue, offset) not in acked, "an offset was handed out twice"
            acked[(queue, offset)] = seq
            first_ack_per_queue.setdefault(queue, offset)
            first_ack_per_queue[queue] = min(first_ack_per_queue[queue], offset)
        for queue, first in first_ack_per_queue.items():
            assert first >= resume_at[queue]
        if acks:
            next_seq = max(seq for seq, _, _ in acks) + 1000
        # Recover in this process and check every acknowledged record byte for byte.
        store = LogStore(store_config(str(data_dir)))
        assert store.verify() == []
        for (queue, offset), seq in acked.items():
            (got,) = store.read("crash", queue, offset, max_records=1)
            record = got.record()
            assert got.offset == offset
            assert record.body == body_for(seq)
            assert record.key == str(seq).encode()
            assert record.headers == [("seq", str(seq).encode())]
        # Every queue is dense: offsets 0..next-1 all readable, none torn.
        for queue in range(QUEUES):
            start, end = store.queue_bounds("crash", queue)
            records = store.read("crash", queue, start, max_records=10**7)
            assert [r.offset for r in records] == list(range(start, end))
            for r in records:
                seq = int(r.record().key)
                assert r.record().body == body_for(seq)
        store.close()
    assert kills >= KILLS, f"only {kills} kills within {TIME_BUDGET_S}s"
    assert len(acked) > 100, "the child acknowledged too little to test anything"
    print(f"{kills} kills, {len(acked)} acknowledged records checked")


def test_recovery_truncates_garbage_tail_at_random_places(tmp_path: Path):
    """Kafka's writeNonsenseToFile: garbage after the last good frame is cut, the prefix kept."""
    rng = random.Random(7)
    for round_number in range(10):
        data_dir = tmp_path / f"g{round_number}"
        store = LogStore(store_config(str(data_dir)))
        bodies = [body_for(i) for i in range(60)]
        ends = []
        for i, body in enumerate(bodies):
            ends.append(store.append("g", 0, body, key=str(i).encode()).end)
        store.flush()
        write_position = store.commitlog.write_position
        store.close()
        (data_dir / names.CLEAN_SHUTDOWN_FILE).unlink()
        (data_dir / names.CHECKPOINT_FILE).unlink()
        # Tear the tail: overwrite bytes somewhere inside the last few records with garbage.
        cut = rng.randrange(ends[-5], write_position)
        segment_size = store.commitlog.segment_size
        path = (
            data_dir / names.COMMITLOG_DIR / names.segment_name(cut // segment_size * segment_size)
        )
        with path.open("r+b") as handle:
            handle.seek(cut % segment_size)
            handle.write(rng.randbytes(min(64, segment_size - cut % segment_size)))
        survivors = sum(1 for end in ends if end <= cut)
        reopened = LogStore(store_config(str(data_dir)))
        assert reopened.queue_bounds("g", 0) == (0, survivors)
        got = reopened.read("g", 0, 0, max_records=1000)
        assert [r.record().body for r in got] == bodies[:survivors]
        assert reopened.verify() == []
        appended = reopened.append("g", 0, b"continues")
        assert appended.offsets == [("g", 0, survivors)]
        reopened.close()
        again = LogReader(data_dir)
        assert [bytes(r.body) for r in again.read("g", 0, survivors)] == [b"continues"]
        again.close()
