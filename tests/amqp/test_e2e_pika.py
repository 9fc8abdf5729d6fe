"""pika's BlockingConnection against a real ``braid serve``: properties preserved, errors with
RabbitMQ's reply codes (the connection survives channel errors), cancel notifications."""

from __future__ import annotations

import datetime
import decimal
import time

import pika
import pytest
from pika.exceptions import (
    AMQPConnectionError,
    ChannelClosedByBroker,
    UnroutableError,
)

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess


def connect(braid: BraidProcess, **kwargs: object) -> pika.BlockingConnection:
    credentials = kwargs.pop("credentials", pika.PlainCredentials("guest", "guest"))
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", braid.amqp_port, credentials=credentials, **kwargs)
    )


def test_properties_and_headers_round_trip(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = channel.queue_declare(unique("props"), exclusive=True).method.queue
        properties = pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            headers={
                "int": 7,
                "big": 1 << 40,
                "neg": -3,
                "text": "héllo",
                "flag": True,
                "dec": decimal.Decimal("3.14"),
                "when": datetime.datetime(2026, 11, 21, 12, 0, 0, tzinfo=datetime.UTC),
                "nested": {"a": [1, "b", {"c": None}]},
                "bytes": b"\x00\xff",
            },
            delivery_mode=2,
            priority=5,
            correlation_id="corr",
            reply_to="replies",
            expiration="60000",
            message_id="m-1",
            timestamp=1_700_000_000,
            type="event",
            user_id="guest",
            app_id="tests",
        )
        channel.basic_publish("", queue, b"\x00body\xff", properties)
        method, got, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        assert body == b"\x00body\xff"
        assert method.exchange == ""
        assert method.routing_key == queue
        for name in (
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "type",
            "user_id",
            "app_id",
        ):
            assert getattr(got, name) == getattr(properties, name), name
        assert got.headers == properties.headers


def process_until(connection, seen: list, count: int, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Pump pika's I/O until ``count`` deliveries arrived (a loaded machine may need more than
    one short pass), then a little longer so extra deliveries would show up too."""
    deadline = time.monotonic() + timeout
    while len(seen) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    connection.process_data_events(time_limit=0.1)


def test_consume_ack_nack_recover(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        queue = channel.queue_declare(unique("consume"), exclusive=True).method.queue
        for i in range(6):
            channel.basic_publish("", queue, b"%d" % i)
        channel.basic_qos(prefetch_count=3)
        seen: list[tuple[int, bytes, bool]] = []

        def on_message(ch, method, props, body):  # type: ignore[no-untyped-def]
            seen.append((method.delivery_tag, body, method.redelivered))

        tag = channel.basic_consume(queue, on_message)
        process_until(connection, seen, 3)
        assert [body for _, body, _ in seen] == [b"0", b"1", b"2"]  # prefetch 3
        channel.basic_ack(seen[1][0], multiple=True)  # acks 0 and 1
        channel.basic_nack(seen[2][0], requeue=True)
        seen.clear()
        process_until(connection, seen, 3)
        assert sorted((body, redelivered) for _, body, redelivered in seen) == [
            (b"2", True),
            (b"3", False),
            (b"4", False),
        ]
        seen.clear()
        channel.basic_recover(requeue=True)
        process_until(connection, seen, 3)
        assert sorted(body for _, body, _ in seen) == [b"2", b"3", b"4"]
        assert all(redelivered for _, _, redelivered in seen)
        channel.basic_cancel(tag)
        for delivery_tag, _, _ in seen:  # still acknowledgeable after basic.cancel
            channel.basic_ack(delivery_tag)
        _method, _, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"5"
        assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_channel_errors_keep_the_connection(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as missing:
            channel.queue_declare(unique("missing"), passive=True)
        assert missing.value.reply_code == 404
        assert "NOT_FOUND - no queue" in missing.value.reply_text

        channel = connection.channel()
        name = unique("durable")
        channel.queue_declare(name, durable=True)
        with pytest.raises(ChannelClosedByBroker) as inequivalent:
            channel.queue_declare(name, durable=False)
        assert inequivalent.value.reply_code == 406
        assert "inequivalent arg 'durable'" in inequivalent.value.reply_text

        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as reserved:
            channel.exchange_declare("amq.mine", "direct")
        assert reserved.value.reply_code == 403

        channel = connection.channel()
        channel.basic_ack(99)
        with pytest.raises(ChannelClosedByBroker) as unknown_tag:
            channel.queue_declare(name, passive=True)  # the next call sees the close
        assert unknown_tag.value.reply_code == 406

        channel = connection.channel()
        channel.basic_publish(unique("no-such-exchange"), "k", b"x")
        with pytest.raises(ChannelClosedByBroker) as no_exchange:
            channel.queue_declare(name, passive=True)
        assert no_exchange.value.reply_code == 404

        channel = connection.channel()  # still fine
        assert channel.queue_declare(name, passive=True).method.queue == name
        channel.queue_delete(name)


def test_exclusive_queue_is_locked_to_its_connection(braid: BraidProcess) -> None:
    with connect(braid) as owner, connect(braid) as other:
        name = owner.channel().queue_declare(unique("mine"), exclusive=True).method.queue
        with pytest.raises(ChannelClosedByBroker) as locked:
            other.channel().queue_declare(name, passive=True)
        assert locked.value.reply_code == 405
    with connect(braid) as later, pytest.raises(ChannelClosedByBroker) as gone:
        later.channel().queue_declare(name, passive=True)
    assert gone.value.reply_code == 404


def test_bad_credentials_are_refused(braid: BraidProcess) -> None:
    with pytest.raises(AMQPConnectionError) as refused:
        connect(braid, credentials=pika.PlainCredentials("guest", "wrong"))
    assert "ACCESS_REFUSED" in repr(refused.value) or "403" in repr(refused.value)


def test_mandatory_publish_is_returned(braid: BraidProcess) -> None:
    with connect(braid) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(UnroutableError):
            channel.basic_publish("amq.direct", unique("nowhere"), b"x", mandatory=True)


def test_queue_delete_cancels_consumers(braid: BraidProcess) -> None:
    with connect(braid) as consumer_conn, connect(braid) as admin:
        channel = consumer_conn.channel()
        name = unique("doomed")
        channel.queue_declare(name)
        cancelled: list[object] = []
        channel.add_on_cancel_callback(cancelled.append)
        channel.basic_consume(name, lambda *args: None)
        admin.channel().queue_delete(name)
        process_until(consumer_conn, cancelled, 1)
        assert len(cancelled) == 1


def test_unacked_messages_return_when_the_connection_closes(braid: BraidProcess) -> None:
    name = unique("returned")
    with connect(braid) as admin:
        admin.channel().queue_declare(name)
        admin.channel().basic_publish("", name, b"once")
    with connect(braid) as first:
        method, _, body = first.channel().basic_get(name, auto_ack=False)
        assert body == b"once"
        assert not method.redelivered
    with connect(braid) as second:
        channel = second.channel()
        method, _, body = channel.basic_get(name, auto_ack=True)
        assert body == b"once"
        assert method.redelivered
        channel.queue_delete(name)
