"""Queue, binding and channel limits, decided in the core (``core/limits``) for every protocol
(issue 21 item 1): RabbitMQ's vhost ``max-queues`` and user ``max-channels`` set through the
management API, ``[limits] max_queues`` and ``max_bindings_per_destination`` from the config
file; what pika, the management API and a Kafka admin client (confluent-kafka) see when
refused, and that the others go on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.braid_process import BraidProcess
from tests.limits.test_connection_limits import amqp, make_user
from tests.management.test_rabbit_api import GUEST, api

DEADLINE_S = 30


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("amqp", "kafka", "http")) as process:
        yield process


def configured(tmp_path: Path, text: str) -> BraidProcess:
    config = tmp_path / "braid.toml"
    config.write_text(text)
    return BraidProcess(tmp_path, listeners=("amqp", "http"), extra_args=("--config", str(config)))


def declare_refused(connection: pika.BlockingConnection, queue: str) -> tuple[int, str]:
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare(queue)
    return closed.value.reply_code, closed.value.reply_text


def admin(braid: BraidProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": braid.kafka_bootstrap, "log_level": 0})


def kafka_error(future: object) -> KafkaError | None:
    try:
        future.result(timeout=DEADLINE_S)  # type: ignore[attr-defined]
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def test_vhost_max_queues_counts_amqp_queues_and_kafka_partitions(braid: BraidProcess) -> None:
    put = api(braid, "PUT", "vhost-limits/%2F/max-queues", {"value": 4})
    assert put.status_code == 204, put.text
    connection = amqp(braid, *GUEST)
    channel = connection.channel()
    channel.queue_declare("q1")
    channel.queue_declare("q2")
    kafka = admin(braid)
    # Each partition is a queue: 2 more would make 5.
    three = NewTopic("t", num_partitions=3, replication_factor=1)
    refused = kafka_error(kafka.create_topics([three], request_timeout=DEADLINE_S)["t"])
    assert refused is not None
    assert refused.code() == KafkaError.POLICY_VIOLATION
    assert refused.str() == (
        "cannot create topic 't' with 3 partitions: queue limit in vhost '/' (4) is reached"
    )
    one = NewTopic("t", num_partitions=1, replication_factor=1)
    assert kafka_error(kafka.create_topics([one], request_timeout=DEADLINE_S)["t"]) is None
    grow = kafka.create_partitions([NewPartitions("t", 3)], request_timeout=DEADLINE_S)["t"]
    grown = kafka_error(grow)
    assert grown is not None
    assert grown.code() == KafkaError.POLICY_VIOLATION
    assert "cannot add 2 partitions to topic 't'" in grown.str()
    # 4 now (q1, q2, t's one partition, and one more queue).
    channel.queue_declare("q3")
    assert declare_refused(connection, "q4") == (
        406,
        "PRECONDITION_FAILED - cannot declare queue 'q4': queue limit in vhost '/' (4) is reached",
    )
    # Redeclaring a queue there is makes none; the management API's PUT is refused the same.
    channel.queue_declare("q1")
    put_queue = api(braid, "PUT", "queues/%2F/q4", {"durable": True})
    assert put_queue.status_code == 400
    assert "queue limit in vhost '/' (4) is reached" in put_queue.text
    # The refused channel was the only one closed: this one publishes on.
    channel.basic_publish("", "q1", b"still here")
    assert channel.basic_get("q1", auto_ack=True)[2] == b"still here"
    # One gone, one more may be made; no limit, no count.
    channel.queue_delete("q2")
    channel.queue_declare("q4")
    assert api(braid, "DELETE", "vhost-limits/%2F/max-queues").status_code == 204
    channel.queue_declare("q5")
    connection.close()
    assert "queue limit in vhost '/' (4) is reached" in braid.stderr()


def test_node_max_queues_from_the_config_file(tmp_path: Path) -> None:
    with configured(tmp_path, "[limits]\nmax_queues = 2\n") as braid:
        connection = amqp(braid, *GUEST)
        channel = connection.channel()
        channel.queue_declare("a")
        channel.exchange_declare("x", "topic")  # an exchange is not a queue
        channel.queue_declare("b")
        assert declare_refused(connection, "c") == (
            406,
            "PRECONDITION_FAILED - cannot declare queue 'c': queues cluster limit (2) is reached",
        )
        channel.queue_bind("a", "x", "k")
        connection.close()


def test_bindings_per_destination_from_the_config_file(tmp_path: Path) -> None:
    with configured(tmp_path, "[limits]\nmax_bindings_per_destination = 3\n") as braid:
        connection = amqp(braid, *GUEST)
        channel = connection.channel()
        channel.exchange_declare("x", "direct")
        channel.queue_declare("q")
        for key in ("a", "b", "c"):
            channel.queue_bind("q", "x", key)
        channel.queue_bind("q", "x", "b")  # bound already: changes nothing, not refused
        refused = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            refused.queue_bind("q", "x", "d")
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == (
            "PRECONDITION_FAILED - cannot bind to queue 'q' in vhost '/': "
            "binding limit per queue or exchange (3) is reached"
        )
        # Exchange-to-exchange bindings count for the destination exchange.
        channel.exchange_declare("y", "fanout")
        for source in ("amq.direct", "amq.topic", "amq.fanout"):
            channel.exchange_bind("y", source, "k")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            connection.channel().exchange_bind("y", "x", "k")
        assert "cannot bind to exchange 'y'" in closed.value.reply_text
        # Another queue is not limited by q's bindings; q's routes work on.
        channel.queue_declare("other")
        channel.queue_bind("other", "x", "d")
        channel.basic_publish("x", "c", b"to q")
        assert channel.basic_get("q", auto_ack=True)[2] == b"to q"
        # An unbind makes room again.
        channel.queue_unbind("q", "x", "a")
        channel.queue_bind("q", "x", "d")
        # The management API's binding is refused in the same words (a 400).
        post = api(braid, "POST", "bindings/%2F/e/x/q/q", {"routing_key": "e"})
        assert post.status_code == 400
        assert "binding limit per queue or exchange (3) is reached" in post.text
        connection.close()


def test_user_max_channels_counts_every_connection_of_the_user(braid: BraidProcess) -> None:
    make_user(braid, "carol", "c-secret")
    put = api(braid, "PUT", "user-limits/carol/max-channels", {"value": 2})
    assert put.status_code == 204, put.text
    first = amqp(braid, "carol", "c-secret")
    kept = first.channel()
    second = amqp(braid, "carol", "c-secret")
    second.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        second.channel()
    assert closed.value.reply_code == 530
    assert closed.value.reply_text == (
        "NOT_ALLOWED - number of channels opened for user 'carol' has reached the maximum "
        "allowed user limit of (2)"
    )
    # Her other connection and other users go on; the closed connection's channel is free.
    kept.queue_declare("carol-q")
    guest = amqp(braid, *GUEST)
    for _ in range(3):
        guest.channel()
    guest.close()
    first.channel()
    first.close()
