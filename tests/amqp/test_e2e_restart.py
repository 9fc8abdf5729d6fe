"""Restarts between publish and consume: persistent messages, durable queues, exchanges and
bindings survive (a clean stop and a SIGKILL); transient queues do not; unacked messages come
back flagged redelivered."""

from __future__ import annotations

import pika
import pytest

from tests.braid_process import BraidProcess

MESSAGES = 300


def connect(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", braid.amqp_port))


def publish_confirmed(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("orders.eu", durable=True)
        channel.queue_bind("orders.eu", "orders", "eu")
        channel.queue_declare("scratch", durable=False)
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2, message_id="m")
        for i in range(MESSAGES):
            channel.basic_publish("orders", "eu", b"order %d" % i, persistent)
        # One delivered but never acked before the restart.
        method, _, body = channel.basic_get("orders.eu", auto_ack=False)
        assert body == b"order 0"
        assert not method.redelivered


def consume_all(braid: BraidProcess) -> list[tuple[bytes, bool]]:
    with connect(braid) as connection:
        channel = connection.channel()
        got = []
        while True:
            method, properties, body = channel.basic_get("orders.eu", auto_ack=True)
            if method is None:
                break
            assert properties.delivery_mode == 2
            assert properties.message_id == "m"
            got.append((body, method.redelivered))
        channel.basic_publish("orders", "eu", b"after restart")
        method, _, body = channel.basic_get("orders.eu", auto_ack=True)
        assert body == b"after restart"
        assert channel.queue_declare("fresh", exclusive=True).method.queue == "fresh"
        return got


def check(got: list[tuple[bytes, bool]]) -> None:
    assert [body for body, _ in got] == [b"order %d" % i for i in range(MESSAGES)]
    assert got[0][1], "the message delivered before the restart comes back redelivered"


def test_clean_restart_loses_no_persistent_message(fresh_braid: BraidProcess) -> None:
    publish_confirmed(fresh_braid)
    fresh_braid.restart()
    check(consume_all(fresh_braid))
    with connect(fresh_braid) as connection:
        channel = connection.channel()
        channel.queue_declare("orders.eu", durable=True, passive=True)
        channel.exchange_declare("orders", "direct", durable=True, passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            channel.queue_declare("scratch", passive=True)
        assert gone.value.reply_code == 404  # transient queues go with the restart


def test_kill9_loses_no_confirmed_message(fresh_braid: BraidProcess) -> None:
    publish_confirmed(fresh_braid)
    # An uncommitted transaction at the crash: its publish must never appear.
    uncommitted = connect(fresh_braid)
    channel = uncommitted.channel()
    channel.tx_select()
    channel.basic_publish("orders", "eu", b"uncommitted", pika.BasicProperties(delivery_mode=2))
    channel.queue_declare("orders.eu", durable=True, passive=True)  # the publish was handled
    fresh_braid.kill9()
    fresh_braid.start()
    check(consume_all(fresh_braid))
