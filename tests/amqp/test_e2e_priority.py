"""Priority queues (``x-max-priority``, issue 17 item 9) with pika and kombu against a real
``braid serve``: higher priorities first among the ready messages, RabbitMQ's argument checks,
priorities kept across a restart, and the priority visible to a Kafka consumer as the record
header ``x-braid-priority`` (docs/mapping.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kombu
import pika
import pytest
from aiokafka import AIOKafkaConsumer
from pika.exceptions import ChannelClosedByBroker

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess


def connect(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", braid.amqp_port))


def publish_all(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    queue: str,
    priorities: list[int | None],
) -> None:
    channel.confirm_delivery()
    for number, priority in enumerate(priorities):
        properties = pika.BasicProperties(priority=priority, delivery_mode=2)
        channel.basic_publish("", queue, f"{number}:{priority}".encode(), properties)


def drain(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[str]:
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body.decode())


def test_higher_priorities_first(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = unique("prio")
        channel.queue_declare(queue, arguments={"x-max-priority": 10})
        # None counts as 0; 200 is above the maximum and counts as 10.
        publish_all(channel, queue, [1, None, 5, 200, 5, 0, 9, 1])
        assert drain(channel, queue) == [
            "3:200",
            "6:9",
            "2:5",
            "4:5",
            "0:1",
            "7:1",
            "1:None",
            "5:0",
        ]


def test_a_consumer_gets_the_backlog_by_priority(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = unique("prio-consume")
        channel.queue_declare(queue, arguments={"x-max-priority": 3})
        publish_all(channel, queue, [0, 1, 2, 3, 0, 3])
        channel.basic_qos(prefetch_count=1)
        received: list[str] = []
        for method, _properties, body in channel.consume(queue, inactivity_timeout=30):
            assert method is not None, f"no delivery after {received}"
            received.append(body.decode())
            channel.basic_ack(method.delivery_tag)
            if len(received) == 6:
                break
        channel.cancel()
        assert received == ["3:3", "5:3", "2:2", "1:1", "0:0", "4:0"]


def test_a_requeued_message_keeps_its_priority(braid: BraidProcess) -> None:
    """As RabbitMQ 3.10 (checked side by side): a nacked message goes back to the head of its
    own priority, behind a higher one published after it."""
    with connect(braid) as connection:
        channel = connection.channel()
        queue = unique("prio-requeue")
        channel.queue_declare(queue, arguments={"x-max-priority": 10})
        publish_all(channel, queue, [1, 9, 5])
        first, _properties, body = channel.basic_get(queue)
        assert first is not None
        assert body == b"1:9"
        second, _properties, body = channel.basic_get(queue)
        assert second is not None
        assert body == b"2:5"
        channel.basic_nack(second.delivery_tag, requeue=True)
        channel.basic_publish("", queue, b"3:7", pika.BasicProperties(priority=7))
        assert drain(channel, queue) == ["3:7", "2:5", "0:1"]


def test_a_plain_queue_stays_fifo(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = unique("fifo")
        channel.queue_declare(queue)
        publish_all(channel, queue, [1, 9, 5])
        assert drain(channel, queue) == ["0:1", "1:9", "2:5"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [(256, "{max_value_exceeded,256}"), (-1, "{value_negative,-1}"), ("high", "unacceptable_type")],
)
def test_max_priority_argument_is_checked(braid: BraidProcess, value: object, reason: str) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as closed:
            channel.queue_declare(unique("prio-bad"), arguments={"x-max-priority": value})
        assert closed.value.reply_code == 406
        assert "invalid arg 'x-max-priority'" in closed.value.reply_text
        assert reason in closed.value.reply_text


def test_redeclare_with_another_max_priority_is_refused(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = unique("prio-eq")
        channel.queue_declare(queue, arguments={"x-max-priority": 5})
        channel.queue_declare(queue, arguments={"x-max-priority": 5})
        with pytest.raises(ChannelClosedByBroker) as closed:
            channel.queue_declare(queue, arguments={"x-max-priority": 6})
        assert closed.value.reply_code == 406


def test_priorities_are_kept_across_a_restart(fresh_braid: BraidProcess) -> None:
    queue = unique("prio-durable")
    with connect(fresh_braid) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-max-priority": 10})
        publish_all(channel, queue, [2, 7, None, 7, 4])
        # One delivered and acked before the restart: the highest.
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        assert body == b"1:7"
    fresh_braid.restart()
    with connect(fresh_braid) as connection:
        assert drain(connection.channel(), queue) == ["3:7", "4:4", "0:2", "2:None"]


def test_kombu_priority(braid: BraidProcess) -> None:
    """kombu (Celery's transport) declares ``x-max-priority`` with ``Queue(max_priority=)``
    and publishes with ``priority=``."""
    name = unique("kombu-prio")
    with kombu.Connection(braid.amqp_url) as connection:
        queue = kombu.Queue(name, routing_key=name, max_priority=9)
        producer = connection.Producer()
        for priority in (1, 8, 4):
            producer.publish(
                {"priority": priority}, routing_key=name, priority=priority, declare=[queue]
            )
        simple = connection.SimpleQueue(queue)
        got = []
        for _ in range(3):
            message = simple.get(timeout=30)
            got.append(message.payload["priority"])
            message.ack()
        simple.close()
    assert got == [8, 4, 1]


def test_kafka_consumer_sees_the_priority(tmp_path: Path) -> None:
    with BraidProcess(tmp_path, listeners=("amqp", "kafka")) as braid:
        exchange = unique("prio-topic")
        with connect(braid) as connection:
            channel = connection.channel()
            channel.exchange_declare(exchange, "topic", durable=True)
            channel.confirm_delivery()
            channel.basic_publish(
                exchange, "orders.new", b"urgent", pika.BasicProperties(priority=7)
            )

        async def first_record_headers() -> dict[str, bytes]:
            consumer = AIOKafkaConsumer(
                exchange, bootstrap_servers=braid.kafka_bootstrap, auto_offset_reset="earliest"
            )
            await consumer.start()
            try:
                async with asyncio.timeout(60):
                    record = await consumer.getone()
            finally:
                await consumer.stop()
            assert record.value == b"urgent"
            return dict(record.headers)

        headers = asyncio.run(first_record_headers())
        assert headers["x-braid-priority"] == b"7"
