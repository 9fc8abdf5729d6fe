"""SIGKILL a broker that publishes, delivers, acks and commits offsets; then check that no
acknowledged-to-publisher record is lost, nothing the consumer received comes back as new, and
committed offsets hold.

CI kills the broker 6 times; ``BRAID_LONG=1`` kills it 20 times."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .crash_child import open_broker

CHILD = Path(__file__).with_name("crash_child.py")
LONG = os.environ.get("BRAID_LONG") == "1"
KILLS = 20 if LONG else 6
TIME_BUDGET_S = 90


def run_child(data_dir: Path, first_seq: int, rng: random.Random) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir), str(first_seq)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    lines: list[str] = []

    def read() -> None:
        assert child.stdout is not None
        lines.extend(line.strip() for line in child.stdout)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    time.sleep(rng.uniform(0.05, 0.4))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join(5)
    return lines


async def drain_without_ack(data_dir: Path) -> tuple[dict[int, bool], int | None]:
    broker = open_broker(str(data_dir))
    queue, _ = await broker.declare_ack_queue("jobs")
    delivered: dict[int, bool] = {}
    queue.add_consumer(
        "checker", 0, lambda d: delivered.__setitem__(int(d.message.body), d.redelivered)
    )
    for _ in range(20):
        await asyncio.sleep(0)
    committed = broker.shard.offsets.fetch("g", "jobs", 0)
    await broker.close()
    await broker.shard.store.aclose()
    return delivered, committed.offset if committed else None


def test_sigkill_keeps_acks_deliveries_and_offsets_consistent(tmp_path: Path):
    rng = random.Random(3)
    data_dir = tmp_path / "broker"
    published: set[int] = set()
    received: set[int] = set()
    next_seq = 0
    kills = 0
    started = time.monotonic()
    while kills < KILLS and time.monotonic() - started < TIME_BUDGET_S:
        lines = run_child(data_dir, next_seq, rng)
        kills += 1
        last_commit = None
        for line in lines:
            verb, _, value = line.partition(" ")
            if verb == "pub":
                published.add(int(value))
            elif verb == "got":
                received.add(int(value))
            elif verb == "committed":
                last_commit = int(value)
        next_seq = max(published | {next_seq}) + 1
        delivered, committed = asyncio.run(drain_without_ack(data_dir))
        # Nothing the consumer already received is delivered again as new.
        as_new = [
            seq for seq, redelivered in delivered.items() if seq in received and not redelivered
        ]
        assert as_new == [], f"round {kills}: redelivered without the flag: {as_new[:10]}"
        # Nothing published and never received is lost.
        lost = sorted(published - received - set(delivered))
        assert lost == [], f"round {kills}: lost {lost[:10]}"
        if last_commit is not None:
            assert committed is not None
            assert committed >= last_commit
        # The checker's deliveries count as received from now on (it never acked them).
        received |= set(delivered)
    assert kills >= KILLS
    assert len(published) > 200, "too little traffic to test anything"
    print(f"{kills} kills, {len(published)} published, {len(received)} received")
