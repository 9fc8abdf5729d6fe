"""Child process of the ack/offset crash test. Prints, line by line:

``pub SEQ`` after a publish is durable; ``got SEQ`` when delivered; ``acking SEQ`` before the ack;
``committed N`` after an offset commit returned. Runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.broker import BrokerConfig, Node
from core.delivery import Delivery
from core.log import LogConfig, LogStore


def open_broker(data_dir: str) -> Node:
    store = LogStore(LogConfig(Path(data_dir), segment_size=256 * 1024, index_entries_per_file=256))
    return Node(store, BrokerConfig())


async def main(data_dir: str, first_seq: int) -> None:
    broker = open_broker(data_dir)
    await broker.shard.store.start()
    await broker.start()
    queue, _ = await broker.declare_ack_queue("jobs")
    out = sys.stdout
    acked = 0

    def deliver(delivery: Delivery) -> None:
        nonlocal acked
        seq = int(delivery.message.body or b"-1")
        out.write(f"got {seq}\n")
        out.write(f"acking {seq}\n")
        delivery.ack()
        acked += 1

    queue.add_consumer("c", 20, deliver)
    out.write("ready\n")
    out.flush()

    async def producer() -> None:
        seq = first_seq
        while True:
            await broker.publish("jobs", str(seq).encode())
            out.write(f"pub {seq}\n")
            seq += 1

    async def committer() -> None:
        n = 0
        while True:
            await asyncio.sleep(0.005)
            n += 1
            await broker.shard.offsets.commit("g", [("jobs", 0, n, -1, "")])
            out.write(f"committed {n}\n")
            out.flush()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(0.002)
            out.flush()

    await asyncio.gather(producer(), committer(), flusher())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
