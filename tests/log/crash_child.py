"""Child process of the crash test: appends in sync mode and reports every acknowledged record.

Usage: python crash_child.py DATA_DIR FIRST_SEQ. Prints ``ready <seq>`` once open, then one line
``ack <seq> <queue> <offset>`` per record after ``wait_durable`` returned, until killed.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.log import LogConfig, LogStore

QUEUES = 4
WRITERS = 8


def body_for(seq: int) -> bytes:
    generator = random.Random(seq)
    size = generator.choice((10, 100, 1000, 20_000))
    return generator.randbytes(size)


def store_config(data_dir: str) -> LogConfig:
    return LogConfig(
        Path(data_dir), segment_size=256 * 1024, index_entries_per_file=128, retention_ms=None
    )


async def main(data_dir: str, first_seq: int) -> None:
    store = LogStore(store_config(data_dir))
    await store.start()
    out = sys.stdout
    out.write(f"ready {first_seq}\n")
    out.flush()
    counter = iter(range(first_seq, 1 << 62))

    async def writer() -> None:
        while True:
            seq = next(counter)
            queue = seq % QUEUES
            appended = store.append(
                "crash",
                queue,
                body_for(seq),
                key=str(seq).encode(),
                headers=[("seq", str(seq).encode())],
            )
            await store.wait_durable(appended.end, "crash")
            out.write(f"ack {seq} {queue} {appended.offsets[0][2]}\n")
            out.flush()

    await asyncio.gather(*(writer() for _ in range(WRITERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
