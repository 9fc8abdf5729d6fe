"""``[limits] max_message_size`` for AMQP (issue 21 item 1): RabbitMQ 3.x's default of 128 MiB
(a 20 MiB message was refused at 16 MiB before), and a configured limit refused on the channel
with 406 and RabbitMQ's text while the connection's other channel goes on; pika against a real
``braid serve``."""

from __future__ import annotations

from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.braid_process import BraidProcess
from tests.management.test_rabbit_api import GUEST

MIB = 1024 * 1024


def connect(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )


def test_a_20_mib_message_goes_through_by_default(tmp_path: Path) -> None:
    with BraidProcess(tmp_path, listeners=("amqp", "http")) as braid:
        connection = connect(braid)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("big")
        body = bytes(range(256)) * (20 * MIB // 256)
        channel.basic_publish("", "big", body)
        got = channel.basic_get("big", auto_ack=True)
        assert got[2] == body
        connection.close()


def test_a_message_over_the_configured_size_is_refused_on_its_channel_only(
    tmp_path: Path,
) -> None:
    config = tmp_path / "braid.toml"
    config.write_text(f"[limits]\nmax_message_size = {MIB}\n")
    with BraidProcess(
        tmp_path, listeners=("amqp", "http"), extra_args=("--config", str(config))
    ) as braid:
        connection = connect(braid)
        other = connection.channel()
        other.queue_declare("small")
        refused = connection.channel()
        refused.basic_publish("", "small", b"x" * (MIB + 1))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            refused.queue_declare("small", passive=True)  # a round trip to see the close
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == (
            f"PRECONDITION_FAILED - message size {MIB + 1} is larger than configured max size {MIB}"
        )
        # The connection and its other channel go on; a message at the limit is taken.
        other.confirm_delivery()
        other.basic_publish("", "small", b"y" * MIB)
        assert other.basic_get("small", auto_ack=True)[2] == b"y" * MIB
        connection.close()


def test_the_size_must_be_in_rabbitmqs_range(tmp_path: Path) -> None:
    config = tmp_path / "braid.toml"
    config.write_text(f"[limits]\nmax_message_size = {512 * MIB + 1}\n")
    braid = BraidProcess(tmp_path, listeners=("amqp",), extra_args=("--config", str(config)))
    with pytest.raises(RuntimeError, match="did not start"):
        braid.start()
    assert "max_message_size must be 1..536870912" in braid.stderr()
