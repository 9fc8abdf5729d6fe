"""Child process of the SIGKILL test: runs transactions until killed.

Usage: python kill_child.py DATA_DIR. Prints ``ready`` once open, then ``committed <id>`` after
each commit returned (durable), ``oneway <id>`` after each one-way commit (``durable=False``)
returned and ``rolled <id>`` after each rollback returned. Every
transaction puts ``<id>:a`` into a/0 and ``<id>:b`` into b/0 and c/0.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.log import LogConfig, LogStore
from core.transactions import TransactionService

WRITERS = 8


def config(data_dir: str) -> LogConfig:
    return LogConfig(
        Path(data_dir), segment_size=128 * 1024, index_entries_per_file=256, retention_ms=None
    )


async def main(data_dir: str) -> None:
    store = LogStore(config(data_dir))
    service = TransactionService(store)
    out = sys.stdout
    out.write("ready\n")
    out.flush()

    async def writer(number: int) -> None:
        sequence = 0
        while True:
            sequence += 1
            txn = service.begin("kill-test")
            await service.add(txn, "a", 0, f"{txn}:a".encode())
            await service.add(txn, "b", 0, f"{txn}:b".encode(), destinations=[("b", 0), ("c", 0)])
            if sequence % 5 == number % 5:
                await service.rollback(txn)
                out.write(f"rolled {txn}\n")
            elif sequence % 5 == (number + 2) % 5:
                await service.commit(txn, durable=False)
                out.write(f"oneway {txn}\n")
            else:
                await service.commit(txn)
                out.write(f"committed {txn}\n")
            out.flush()

    await asyncio.gather(*(writer(n) for n in range(WRITERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
