"""AMQP queues known on every node of a real three-node cluster (docs/cluster.md section 8,
AMQP; tests/cluster/cluster_fixture.py), with pika:

- a durable queue declared and bound on node 1 whose shard node 2 owns is passive-declared on
  node 3 (the owner's message count), published to there through the default exchange and the
  bound exchange (confirmed), read with basic.get and consumed with acks (a remote consume);
- a transient queue of node 2's shard survives node 3's restart (a node drops only its own
  transient queues at start) and node 3 knows it afterwards;
- an `x-expires` queue of node 2 stays while a consumer on node 3 uses it, then expires;
- node 2 stopped: a passive declare of its queue on node 1 is 404 with RabbitMQ's home-node
  text.

One cluster for the module; the tests run in order (the last one stops node 2).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, amqp, eventually, redis_server

__all__ = ["redis_server"]  # the module's Redis fixture (tests/cluster/test_node.py)

SHARDS = 12
QUEUE_TOPIC = "amq.queue."
EXCHANGE = "an.direct"
KEY = "an.key"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("amqpnodes"), redis_server.url, shards=SHARDS) as c:
        yield c


def passive_count(cluster: Cluster, node_id: int, queue: str) -> int:
    """The message count a passive declare of ``queue`` on node ``node_id`` answers."""
    connection = amqp(cluster[node_id])
    try:
        result = connection.channel().queue_declare(queue, passive=True)
        return int(result.method.message_count)
    finally:
        connection.close()


def publish_confirmed(channel: BlockingChannel, exchange: str, key: str, body: bytes) -> None:
    """One persistent, mandatory publish that must be confirmed (pika raises otherwise)."""
    channel.basic_publish(
        exchange,
        key,
        body,
        pika.BasicProperties(delivery_mode=2),
        mandatory=True,
    )


def test_a_queue_declared_on_node_1_is_used_through_node_3(cluster: Cluster) -> None:
    queue = cluster.name_owned_by(2, "an.q", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(EXCHANGE, "direct", durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, EXCHANGE, KEY)
        for number in range(3):
            publish_confirmed(channel, "", queue, f"n1-{number}".encode())
    finally:
        connection.close()

    # Node 3's gateway never saw the declaration: it learns the queue from the core.
    eventually(lambda: passive_count(cluster, 3, queue) == 3, "node 3 counts node 2's queue")

    connection = amqp(cluster[3])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for number in range(2):
            publish_confirmed(channel, "", queue, f"n3-default-{number}".encode())
            publish_confirmed(channel, EXCHANGE, KEY, f"n3-bound-{number}".encode())
        expected = {b"n1-0", b"n1-1", b"n1-2", b"n3-default-0", b"n3-default-1"}
        expected |= {b"n3-bound-0", b"n3-bound-1"}

        # basic.get answers from a record taken ahead from the owner: asked until one comes.
        def got_one() -> bytes | None:
            method, _, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                return None
            channel.basic_ack(method.delivery_tag)
            return bytes(body)

        first = eventually(got_one, "basic.get on node 3")
        received = [first]
        channel.basic_qos(prefetch_count=3)
        end = time.monotonic() + DEADLINE_S
        for method, _, body in channel.consume(queue, inactivity_timeout=1.0):
            if method is not None:
                received.append(bytes(body))
                channel.basic_ack(method.delivery_tag)
            if len(received) >= len(expected) or time.monotonic() > end:
                break
        channel.cancel()
    finally:
        connection.close()
    assert sorted(received) == sorted(expected)
    # Every one acked on the owner: none left there.
    eventually(lambda: passive_count(cluster, 2, queue) == 0, "node 2's queue drained")


def test_a_transient_queue_of_node_2_survives_node_3s_restart(cluster: Cluster) -> None:
    queue = cluster.name_owned_by(2, "an.t", QUEUE_TOPIC)
    connection = amqp(cluster[2])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=False)
        publish_confirmed(channel, "", queue, b"kept")
    finally:
        connection.close()
    eventually(lambda: passive_count(cluster, 3, queue) == 1, "node 3 knows it")

    cluster[3].stop()
    cluster[3].start()

    assert passive_count(cluster, 2, queue) == 1
    eventually(lambda: passive_count(cluster, 3, queue) == 1, "restarted node 3 knows it")


def test_a_redeclare_on_the_owner_keeps_what_another_node_stored(cluster: Cluster) -> None:
    """A queue declared through node 3 (owner: node 2), published to with confirms there, then
    declared again (not passive) on its owner: the same queue, its messages still in it."""
    queue = cluster.name_owned_by(2, "an.re", QUEUE_TOPIC)
    connection = amqp(cluster[3])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for number in range(5):
            publish_confirmed(channel, "", queue, f"kept-{number}".encode())
    finally:
        connection.close()
    owner = amqp(cluster[2])
    try:
        declared = owner.channel().queue_declare(queue, durable=True)
        assert declared.method.message_count == 5
    finally:
        owner.close()
    assert passive_count(cluster, 2, queue) == 5
    assert passive_count(cluster, 1, queue) == 5


def test_x_expires_counts_consumers_of_other_nodes(cluster: Cluster) -> None:
    """Only the owner expires a queue, and a consumer attached through another node keeps it
    in use (RabbitMQ's home node sees every consumer); once that consumer goes, it expires."""
    queue = cluster.name_owned_by(2, "an.exp", QUEUE_TOPIC)
    expires_ms = 600
    owner = amqp(cluster[2])
    consumer = amqp(cluster[3])
    try:
        owner.channel().queue_declare(queue, arguments={"x-expires": expires_ms})
        eventually(lambda: passive_count(cluster, 3, queue) == 0, "node 3 knows it")
        channel = consumer.channel()
        channel.basic_consume(queue, lambda *_: None)
        # Several unused periods pass with the consumer attached from node 3. (Asked through
        # node 1: a declare on the owner itself would count as a use and restart the period.)
        for _ in range(4):
            consumer.sleep(expires_ms / 1000)
            assert passive_count(cluster, 1, queue) == 0  # a 404 would raise here
        channel.close()
    finally:
        consumer.close()
        owner.close()

    def gone() -> bool:
        try:
            passive_count(cluster, 1, queue)
        except ChannelClosedByBroker as closed:
            return closed.reply_code == 404
        return False

    eventually(gone, "the queue to expire once its remote consumer left")


def test_passive_declare_of_a_stopped_owners_queue_is_404_home_node(cluster: Cluster) -> None:
    queue = cluster.name_owned_by(2, "an.down", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        connection.channel().queue_declare(queue, durable=True)
    finally:
        connection.close()

    cluster[2].stop()

    connection = amqp(cluster[1])
    try:
        with pytest.raises(ChannelClosedByBroker) as closed:
            connection.channel().queue_declare(queue, passive=True)
    finally:
        connection.close()
    assert closed.value.reply_code == 404
    text = str(closed.value.reply_text)
    assert text.startswith("NOT_FOUND - home node '"), text
    assert text.endswith(f"of durable queue '{queue}' in vhost '/' is down or inaccessible"), text
