"""What the client libraries' own suites (pika, aiormq, aio-pika) expect of a RabbitMQ broker,
reproduced with those clients against a real ``braid serve`` (issue 17, items 4, 5, 8, 11).

Each test names the suite test it reproduces; docs/amqp.md has the suites' counts."""

from __future__ import annotations

import time
import uuid

import aiormq
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess


def connect(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", braid.amqp_port))


def test_unknown_exchange_type_closes_only_the_channel(braid: BraidProcess) -> None:
    """pika's TestInvalidExchangeTypeRaisesConnectionClosed: 406 on the channel, as RabbitMQ
    3.11+; the connection lives on."""
    with connect(braid) as connection:
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as closed:
            channel.exchange_declare(unique("bad-type"), exchange_type="ZZwwInvalid")
        assert closed.value.reply_code == 406
        assert "unknown exchange type 'ZZwwInvalid'" in closed.value.reply_text
        assert connection.is_open
        connection.channel().exchange_declare(unique("good-type"), exchange_type="fanout")


def test_exclusive_queue_redeclared_without_exclusive_is_locked(braid: BraidProcess) -> None:
    """RabbitMQ's strict exclusive check on declare: the exclusive property must match, even
    on the connection that owns the queue (405), and a matching redeclare is fine."""
    with connect(braid) as connection:
        channel = connection.channel()
        name = channel.queue_declare("", exclusive=True).method.queue
        assert channel.queue_declare(name, exclusive=True).method.queue == name
        with pytest.raises(ChannelClosedByBroker) as closed:
            channel.queue_declare(name)
        assert closed.value.reply_code == 405
        assert "exclusive property value does not match" in closed.value.reply_text
        # Not locked for its owner's other uses.
        channel = connection.channel()
        channel.basic_consume(name, lambda *args: None, exclusive=True)


async def test_any_channel_number_up_to_65535(braid: BraidProcess) -> None:
    """aiormq's test_bad_channel: channel 65535 opens (channel_max counts open channels)."""
    connection = await aiormq.connect(braid.amqp_url)
    try:
        channel = await connection.channel(65535)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await channel.queue_bind(uuid.uuid4().hex, uuid.uuid4().hex)
        channel = await connection.channel(65534)
        declared = await channel.queue_declare(exclusive=True)
        assert declared.queue.startswith("amq.gen-")
    finally:
        await connection.close()


def test_unbinding_from_a_deleted_auto_delete_exchange_succeeds(braid: BraidProcess) -> None:
    """aio-pika's test_simple_publish_and_receive_to_bound_exchange: src -> dst (both
    auto-delete) -> queue; unbinding the queue deletes dst (its last binding as a source) and
    then src (its only binding went with dst), as RabbitMQ; unbinding src -> dst afterwards
    succeeds, as RabbitMQ's unbind with a missing end does."""
    with connect(braid) as connection:
        channel = connection.channel()
        src, dst = unique("auto-src"), unique("auto-dst")
        channel.exchange_declare(src, "direct", auto_delete=True)
        channel.exchange_declare(dst, "direct", auto_delete=True)
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, dst, "k")
        channel.exchange_bind(dst, src, "k")
        channel.basic_publish(src, "k", b"through both")
        _method, _properties, body = _get(channel, queue)
        assert body == b"through both"
        channel.queue_unbind(queue, dst, "k")
        channel.exchange_unbind(dst, src, "k")
        channel.queue_unbind(queue, dst, "k")
        for name in (src, dst):
            probe = connection.channel()
            with pytest.raises(ChannelClosedByBroker) as closed:
                probe.exchange_declare(name, passive=True)
            assert closed.value.reply_code == 404


def _get(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str
) -> tuple[object, object, bytes]:
    """basic.get until a message is there (a generous deadline, not a bound on the time)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, properties, body
        channel.connection.sleep(0.05)
    raise AssertionError(f"nothing arrived in {queue}")
