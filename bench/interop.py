"""``python -m bench interop``: throughput and p99 latency of the nine publisher x consumer pairs
{aiokafka, aio-pika, paho-mqtt}^2 through one ``braid serve``, all at the same offered load.

Each pair gets its own topic (an AMQP topic exchange); the publisher sends ``--rate`` records/s
for ``--seconds`` in 10 ms ticks, each payload carrying its send time; the consumer (Kafka:
partition 0 from the end; AMQP: a queue bound ``k.*``; MQTT: ``<topic>/k/+`` QoS 1) records the
arrival. Throughput = records / (last arrival - first send); p50/p99 of send -> arrival.
The clients are those of tests/interop (the same code the matrix test checks), with the
publishers keeping each tick's records in flight together and the consumers taking what has
arrived, so the figures are the broker's paths rather than one client round trip per record.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import queue
import struct
import tempfile
import time
from pathlib import Path

import aio_pika

from tests.braid_process import BraidProcess
from tests.interop.test_matrix import (
    PROTOCOLS,
    TIMEOUT,
    AmqpConsumer,
    AmqpPublisher,
    KafkaConsumer,
    KafkaPublisher,
    MqttConsumer,
    MqttPublisher,
    Out,
    declare_topic_exchange,
    unique,
)

_STAMP = struct.Struct(">d")
# (arrival time, payload) of each record a consumer received since it was last asked.
Arrivals = list[tuple[float, bytes]]


# The clients of tests/interop, used the way a throughput-minded application uses them: the
# publishers keep a tick's records in flight together (aio-pika: concurrent publishes on a
# confirm channel; paho: QoS 1 publishes, then one wait for all PUBACKs) instead of one round
# trip per record, and the consumers stamp arrivals as they come and take what is there.


class BenchKafkaConsumer(KafkaConsumer):
    async def arrivals(self) -> Arrivals:
        batches = await self.consumer.getmany(timeout_ms=200)
        now = time.perf_counter()
        return [(now, r.value or b"") for records in batches.values() for r in records]


class BenchAmqpConsumer(AmqpConsumer):
    async def arrivals(self) -> Arrivals:
        first = await asyncio.wait_for(self.messages.get(), TIMEOUT)
        got = [first]
        while not self.messages.empty():
            got.append(self.messages.get_nowait())
        now = time.perf_counter()
        await got[-1].ack(multiple=True)
        return [(now, m.body) for m in got]


class BenchMqttConsumer(MqttConsumer):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        await super().start(braid, topic)
        stamped: queue.Queue[tuple[float, bytes]] = queue.Queue()
        self.stamped = stamped
        # Stamped in paho's network thread, the moment the PUBLISH is read.
        self.client.on_message = lambda _c, _u, m: stamped.put(
            (time.perf_counter(), bytes(m.payload))
        )

    async def arrivals(self) -> Arrivals:
        got = [await asyncio.to_thread(self.stamped.get, timeout=TIMEOUT)]
        while not self.stamped.empty():
            got.append(self.stamped.get_nowait())
        return got


class BenchAmqpPublisher(AmqpPublisher):
    async def send(self, messages: list[Out]) -> None:
        await asyncio.gather(
            *(self.exchange.publish(aio_pika.Message(m.payload), m.key) for m in messages)
        )


class BenchMqttPublisher(MqttPublisher):
    async def send(self, messages: list[Out]) -> None:
        infos = [
            self.client.publish(f"{self.topic}/{m.key.replace('.', '/')}", m.payload, qos=1)
            for m in messages
        ]

        def acknowledged() -> None:
            for info in infos:
                info.wait_for_publish(TIMEOUT)
                if not info.is_published():
                    raise RuntimeError(f"mqtt publish not acknowledged: rc {info.rc}")

        await asyncio.to_thread(acknowledged)


BenchConsumer = BenchKafkaConsumer | BenchAmqpConsumer | BenchMqttConsumer
CONSUMERS: dict[str, type[BenchConsumer]] = {
    "kafka": BenchKafkaConsumer,
    "amqp": BenchAmqpConsumer,
    "mqtt": BenchMqttConsumer,
}
PUBLISHERS: dict[str, type[KafkaPublisher | BenchAmqpPublisher | BenchMqttPublisher]] = {
    "kafka": KafkaPublisher,
    "amqp": BenchAmqpPublisher,
    "mqtt": BenchMqttPublisher,
}


async def run_pair(
    braid: BraidProcess,
    publisher_name: str,
    consumer_name: str,
    rate: int,
    seconds: float,
    size: int,
) -> tuple[float, float, float, int]:
    topic = unique(f"bench-{publisher_name}2{consumer_name}")
    await declare_topic_exchange(braid, topic)
    consumer = CONSUMERS[consumer_name]()
    publisher = PUBLISHERS[publisher_name]()
    await consumer.start(braid, topic)
    await publisher.start(braid, topic)
    total = int(rate * seconds)
    pad = b"x" * max(0, size - _STAMP.size)
    received: list[float] = []
    latencies: list[float] = []

    async def consume() -> None:
        while len(received) < total:
            for arrived, payload in await consumer.arrivals():
                received.append(arrived)
                latencies.append(arrived - _STAMP.unpack_from(payload)[0])

    task = asyncio.create_task(consume())
    start = time.perf_counter()
    sent = 0
    tick = 0.01
    try:
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * rate) + 1)
            if due > sent:
                batch = [
                    Out(_STAMP.pack(time.perf_counter()) + pad, "k.bench")
                    for _ in range(due - sent)
                ]
                await publisher.send(batch)
                sent = due
            await asyncio.sleep(tick)
        await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
        await publisher.stop()
        await consumer.stop()
    latencies.sort()
    elapsed = received[-1] - start
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    return len(received) / elapsed, p50, p99, len(received)


async def run(rate: int, seconds: float, size: int) -> list[tuple[str, str, float, float, float]]:
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        BraidProcess(Path(tmp), listeners=("amqp", "mqtt", "kafka")) as braid,
    ):
        for publisher_name in PROTOCOLS:
            for consumer_name in PROTOCOLS:
                throughput, p50, p99, _ = await run_pair(
                    braid, publisher_name, consumer_name, rate, seconds, size
                )
                rows.append((publisher_name, consumer_name, throughput, p50, p99))
                print(
                    f"{publisher_name:>5} -> {consumer_name:<5} {throughput:8.0f} rec/s "
                    f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms",
                    flush=True,
                )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench interop", description=__doc__)
    parser.add_argument("--rate", type=int, default=2000, help="offered records/s per pair")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per pair")
    parser.add_argument("--size", type=int, default=256, help="payload bytes")
    args = parser.parse_args(argv)
    print(
        f"interop: {args.rate} rec/s x {args.seconds} s per pair, {args.size} B payloads; "
        f"{platform.python_implementation()} {platform.python_version()} on {platform.machine()}"
    )
    rows = asyncio.run(run(args.rate, args.seconds, args.size))
    print("\n| publisher | consumer | records/s | p50 ms | p99 ms |\n|---|---|---:|---:|---:|")
    for publisher_name, consumer_name, throughput, p50, p99 in rows:
        print(f"| {publisher_name} | {consumer_name} | {throughput:.0f} | {p50:.2f} | {p99:.2f} |")
    return 0
