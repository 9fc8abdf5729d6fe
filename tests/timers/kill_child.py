"""Child process of the SIGKILL test: runs a TimerService and keeps scheduling timers.

Usage: python kill_child.py DATA_DIR SEED. Prints ``ready`` once recovered and running, then
schedules timers due within 0.6 s to ``orders/0`` until it is killed.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.log import DURABILITY_ASYNC, LogConfig, LogStore
from core.log.store import now_ms
from core.timers import TimerService

DEST = ("orders", 0)
TIMER_OPTIONS: dict[str, int] = {
    "checkpoint_interval_ms": 40,
    "slot_ms": 100,
    "lookahead_ms": 200,
    "entries_per_file": 64,
}


def open_store(data_dir: str) -> LogStore:
    return LogStore(
        LogConfig(
            Path(data_dir),
            segment_size=128 * 1024,
            index_entries_per_file=128,
            retention_ms=None,
            durability=DURABILITY_ASYNC,
            flush_interval_ms=20,
            checkpoint_interval_ms=60,
        )
    )


async def main(data_dir: str, seed: int) -> None:
    rng = random.Random(seed)
    store = open_store(data_dir)
    timers = TimerService(store, **TIMER_OPTIONS)  # type: ignore[arg-type]
    await store.start()
    await timers.start()
    print("ready", timers.recovery.mode, flush=True)
    while True:
        for _ in range(rng.randrange(1, 8)):
            store.append(*DEST, b"t", deliver_at_ms=now_ms() + rng.randint(1, 600))
        await asyncio.sleep(rng.uniform(0.002, 0.02))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
