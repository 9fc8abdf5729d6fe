"""SIGKILL a process running transactions at random moments: after restart every transaction is
visible at all its destinations exactly once or nowhere, and every acknowledged decision holds."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from core.log import LogStore
from core.transactions import TransactionService

from .kill_child import config

CHILD = Path(__file__).with_name("kill_child.py")
KILLS = 4


def run_until_killed(data_dir: Path, rng: random.Random) -> tuple[set[str], set[str], set[str]]:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(data_dir)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    said: dict[str, set[str]] = {"committed": set(), "oneway": set(), "rolled": set()}

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            kind, _, txn = line.strip().partition(" ")
            said[kind].add(txn)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    time.sleep(rng.uniform(0.05, 0.3))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    thread.join(5)
    return said["committed"], said["oneway"], said["rolled"]


def visible(store: LogStore, topic: str) -> Counter[str]:
    found: Counter[str] = Counter()
    offset = 0
    while batch := store.read(topic, 0, offset, max_records=4096):
        for record in batch:
            found[bytes(record.body).decode().rsplit(":", 1)[0]] += 1
        offset = batch[-1].next_offset
    return found


def test_sigkill_at_random_moments(tmp_path: Path):
    rng = random.Random(20261121)
    data_dir = tmp_path / "kill"
    all_committed: set[str] = set()
    all_one_way: set[str] = set()
    all_rolled: set[str] = set()
    for _ in range(KILLS):
        committed, one_way, rolled = run_until_killed(data_dir, rng)
        all_committed |= committed
        all_one_way |= one_way
        all_rolled |= rolled
        store = LogStore(config(str(data_dir)))
        service = TransactionService(store)
        pending = {p.txn_id for p in service.pending()}
        per_topic = {topic: visible(store, topic) for topic in ("a", "b", "c")}
        ids = set(per_topic["a"])
        for topic, found in per_topic.items():
            assert set(found) == ids, f"{topic}: a transaction is visible only in part"
            assert all(count == 1 for count in found.values()), f"{topic}: seen twice"
        assert all_committed <= ids, "an acknowledged commit is not visible"
        assert not ids & all_rolled, "a rolled-back transaction is visible"
        assert not ids & pending, "a pending transaction is visible"
        # A one-way commit lost with the process leaves its transaction open (check-back).
        assert all_one_way <= ids | pending, "a one-way commit is neither visible nor pending"
        assert all_committed
        assert all_one_way
        # Pending ones stay pending: the next restarts must keep them invisible too.
        store.close()
