"""A log where one Kafka batch is stored once and indexed into an AMQP queue that took only some
of its records (issue 17, item 18), written by a real ``braid serve`` with aiokafka and aio-pika.

Exchange (topic) ``fleet``, queue ``fleet-trucks`` bound with ``truck.*``. Kafka produces to
``fleet`` partition 0: first a batch of three ``car.*`` records (offsets 0-2; the queue gets
none), then one gzip batch ``car.1, truck.1, car.2, truck.2`` (offsets 3-6): the queue's index
gets that batch as one entry of four offsets (0-3) with ``x-braid-batch-select`` naming the
trucks (deltas 1 and 3). Then AMQP publishes ``truck.9`` to ``fleet`` (offset 7 there, 4 in the
queue). So the queue shows three records, at offsets 1, 3 and 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aiokafka import AIOKafkaProducer

from tests.braid_process import BraidProcess

EXCHANGE = "fleet"
QUEUE = "fleet-trucks"
QUEUE_TOPIC = f"amq.queue.{QUEUE}"
BINDING = "truck.*"
CARS_FIRST = (b"car.a", b"car.b", b"car.c")
MIXED_BATCH = (b"car.1", b"truck.1", b"car.2", b"truck.2")


@dataclass(frozen=True)
class Shown:
    """A record as the queue's readers must show it."""

    offset: int  # in the queue
    key: bytes | None
    value: bytes


# What every reader of amq.queue.fleet-trucks/0 must show, in offset order.
QUEUE_ROWS = (
    Shown(1, b"truck.1", b"from truck.1"),
    Shown(3, b"truck.2", b"from truck.2"),
    Shown(4, None, b"from truck.9 over amqp"),
)
# And of fleet/0: every Kafka record (AMQP's publish too).
TOPIC_OFFSETS = tuple(range(len(CARS_FIRST) + len(MIXED_BATCH) + 1))


async def _send_one_batch(producer: AIOKafkaProducer, keys: tuple[bytes, ...]) -> None:
    """``keys`` as one RecordBatch (``create_batch``: no linger timing decides it)."""
    batch = producer.create_batch()
    for key in keys:
        assert batch.append(key=key, value=b"from " + key, timestamp=None) is not None
    delivered = await producer.send_batch(batch, EXCHANGE, partition=0)
    await delivered


async def write_fleet(braid: BraidProcess) -> None:
    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.bind(exchange, BINDING)
        producer = AIOKafkaProducer(
            bootstrap_servers=braid.kafka_bootstrap, acks="all", compression_type="gzip"
        )
        await producer.start()
        try:
            await _send_one_batch(producer, CARS_FIRST)
            await _send_one_batch(producer, MIXED_BATCH)
        finally:
            await producer.stop()
        await exchange.publish(aio_pika.Message(b"from truck.9 over amqp"), routing_key="truck.9")
    finally:
        await connection.close()
