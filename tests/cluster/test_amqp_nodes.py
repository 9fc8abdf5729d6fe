"""AMQP queues known on every node of a real three-node cluster (docs/cluster.md section 8,
AMQP; tests/cluster/cluster_fixture.py), with pika:

- a durable queue declared and bound on node 1 whose shard node 2 owns is passive-declared on
  node 3 (the owner's message count), published to there through the default exchange and the
  bound exchange (confirmed), read with basic.get and consumed with acks (a remote consume);
- a transient queue of node 2's shard survives node 3's restart (a node drops only its own
  transient queues at start) and node 3 knows it afterwards;
- an `x-expires` queue of node 2 stays while a consumer on node 3 uses it, then expires;
- basic.get through a node that does not own the queue is answered by the owner (get-ok from
  the first get, the owner's count left, redelivered after a channel closed unacked);
- a get held for node 3 goes back to the queue when node 3 is killed, and an exclusive queue
  declared through node 1 in node 2's shard goes with its connection or with node 1 (killed);
- a reject-publish queue of node 2 (x-max-length 2) nacks, through node 1, exactly the
  publishes it refused (persistent and transient), as a single node does;
- node 2 stopped: a passive declare of its queue on node 1 is 404 with RabbitMQ's home-node
  text.

One cluster for the module; the tests run in order (the last one stops node 2; the kill tests
start the killed node again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aio_pika
import pika
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition as KafkaTopicPartition
from pika import BasicProperties
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, NackError
from pika.spec import Basic

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

        # basic.get asks the owner: its first answer is a message.
        def got_one() -> bytes | None:
            method, _, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                return None
            channel.basic_ack(method.delivery_tag)
            return bytes(body)

        first = got_one()
        assert first is not None
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


def confirms_of_five_publishes(channel: BlockingChannel, queue: str, mode: int) -> list[str]:
    """What the broker answered to each of five confirmed publishes to ``queue`` (pika's
    BlockingChannel waits for each one's confirm and raises ``NackError`` on a nack)."""
    answers = []
    for number in range(5):
        try:
            channel.basic_publish("", queue, b"%d" % number, BasicProperties(delivery_mode=mode))
            answers.append("ack")
        except NackError:
            answers.append("nack")
    return answers


def test_a_remote_reject_publish_queue_nacks_what_it_refused(cluster: Cluster) -> None:
    """A queue of node 2 at x-max-length 2, x-overflow reject-publish, published to through
    node 1: its refusal comes back in the forward's answer and nacks exactly the refused
    publishes, persistent and transient, as a single node does
    (tests/amqp/test_e2e_aio_pika.py test_reject_publish_overflow_nacks)."""
    arguments = {"x-max-length": 2, "x-overflow": "reject-publish"}
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for mode, kind in ((2, "persistent"), (1, "transient")):
            queue = cluster.name_owned_by(2, f"an.bounded.{kind}", QUEUE_TOPIC)
            channel.queue_declare(queue, durable=mode == 2, arguments=arguments)
            answers = confirms_of_five_publishes(channel, queue, mode)
            assert answers == ["ack", "ack", "nack", "nack", "nack"], kind
            assert passive_count(cluster, 2, queue) == 2, kind
            channel.queue_delete(queue)
    finally:
        connection.close()


def test_basic_get_through_a_node_that_does_not_own_the_queue_asks_the_owner(
    cluster: Cluster,
) -> None:
    """basic.get on node 3 of node 2's queue is answered from the owner, as RabbitMQ answers:
    get-ok while it holds messages (the first get included), with the owner's count left;
    a get not acked when its channel closes comes back redelivered; get-empty once none is
    left."""
    queue = cluster.name_owned_by(2, "an.get", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for number in range(3):
            publish_confirmed(channel, "", queue, f"g-{number}".encode())
    finally:
        connection.close()
    eventually(lambda: passive_count(cluster, 3, queue) == 3, "node 3 counts node 2's queue")

    connection = amqp(cluster[3])
    try:
        channel = connection.channel()
        method, _, body = channel.basic_get(queue, auto_ack=False)  # the first get
        assert method is not None, "get-empty while the owner holds 3"
        assert (bytes(body), method.message_count, method.redelivered) == (b"g-0", 2, False)
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None
        assert (bytes(body), method.message_count, method.redelivered) == (b"g-1", 1, False)
        channel.close()  # g-0 unacked: back to the owner's queue, redelivered

        channel = connection.channel()
        got = []
        for _ in range(2):
            method, _, body = channel.basic_get(queue, auto_ack=False)
            assert method is not None
            got.append((bytes(body), method.message_count, method.redelivered))
            channel.basic_ack(method.delivery_tag)
        assert got == [(b"g-0", 1, True), (b"g-2", 0, False)]
        assert channel.basic_get(queue, auto_ack=False) == (None, None, None)
    finally:
        connection.close()
    eventually(lambda: passive_count(cluster, 2, queue) == 0, "every get acked on node 2")


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
            return bool(closed.reply_code == 404)
        return False

    eventually(gone, "the queue to expire once its remote consumer left")


def get_one(channel: BlockingChannel, queue: str) -> tuple[Basic.GetOk, BasicProperties, bytes]:
    """The next message of ``queue`` by basic.get, acked (asked until one comes: a remote
    queue's get answers from a record fetched ahead)."""

    def got() -> tuple[Basic.GetOk, BasicProperties, bytes] | None:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        return None if method is None else (method, properties, bytes(body))

    result: tuple[Basic.GetOk, BasicProperties, bytes] = eventually(got, f"a message in {queue}")
    return result


def test_dead_letters_go_to_a_queue_of_another_node(cluster: Cluster) -> None:
    """Queues of node 2 dead-letter (rejected, expired by x-message-ttl or by a publish's
    expiration, over the delivery limit) through a DLX to a queue of node 3; node 1 reads them
    with x-death as on a single node."""
    source = cluster.name_owned_by(2, "an.dl.src", QUEUE_TOPIC)
    limited = cluster.name_owned_by(2, "an.dl.lim", QUEUE_TOPIC)
    expiring = cluster.name_owned_by(2, "an.dl.ttl", QUEUE_TOPIC)
    per_message = cluster.name_owned_by(2, "an.dl.exp", QUEUE_TOPIC)
    dead = cluster.name_owned_by(3, "an.dl.dead", QUEUE_TOPIC)
    dlx = "an.dlx"
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(dlx, "direct", durable=True)
        channel.queue_declare(dead, durable=True)
        channel.queue_bind(dead, dlx, "dead")
        dead_lettering = {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"}
        channel.queue_declare(source, durable=True, arguments=dead_lettering)
        channel.queue_declare(
            limited, durable=True, arguments={**dead_lettering, "x-delivery-limit": 1}
        )
        publish_confirmed(channel, "", source, b"rejected")
        # Nothing on node 2 touches this one: its owner must learn it to expire its records.
        channel.queue_declare(
            expiring, durable=True, arguments={**dead_lettering, "x-message-ttl": 300}
        )
        publish_confirmed(channel, "", expiring, b"expired")
        channel.queue_declare(per_message, durable=True, arguments=dead_lettering)
        channel.basic_publish(
            "",
            per_message,
            b"expiration",
            pika.BasicProperties(delivery_mode=2, expiration="300"),
            mandatory=True,
        )
        publish_confirmed(channel, "", limited, b"limited")
    finally:
        connection.close()

    consumer = amqp(cluster[3])
    try:
        channel = consumer.channel()
        method, _, body = get_one_unacked(channel, source)
        assert body == b"rejected"
        channel.basic_reject(method.delivery_tag, requeue=False)
        for _ in range(2):  # delivery 1 and 2 requeued: the second is over the limit of 1
            method, _, body = get_one_unacked(channel, limited)
            assert body == b"limited"
            channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        consumer.close()

    reader = amqp(cluster[1])
    try:
        channel = reader.channel()
        reasons = {}
        for _ in range(4):
            _, properties, body = get_one(channel, dead)
            headers = properties.headers or {}
            (death,) = headers["x-death"]
            reasons[body] = (death["reason"], death["queue"], death["count"])
            assert headers["x-first-death-reason"] == death["reason"]
    finally:
        reader.close()
    assert reasons == {
        b"rejected": ("rejected", source, 1),
        b"expired": ("expired", expiring, 1),
        b"expiration": ("expired", per_message, 1),
        b"limited": ("delivery_limit", limited, 1),
    }
    eventually(lambda: passive_count(cluster, 2, source) == 0, "node 2's queue emptied")


def get_one_unacked(
    channel: BlockingChannel, queue: str
) -> tuple[Basic.GetOk, BasicProperties, bytes]:
    """The next message of ``queue`` by basic.get, left unacked (asked until one comes)."""

    def got() -> tuple[Basic.GetOk, BasicProperties, bytes] | None:
        method, properties, body = channel.basic_get(queue, auto_ack=False)
        return None if method is None else (method, properties, bytes(body))

    result: tuple[Basic.GetOk, BasicProperties, bytes] = eventually(got, f"a message in {queue}")
    return result


def test_the_delayed_exchange_delivers_to_another_nodes_queue_once(cluster: Cluster) -> None:
    """An x-delayed-message exchange declared on node 1 and its queue on node 3: each record
    delivered once, not before its x-delay."""
    queue = cluster.name_owned_by(3, "an.delayed.q", QUEUE_TOPIC)
    exchange = "an.delayed"
    delay_ms = 800
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(
            exchange, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
        )
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, "k")
        started = time.monotonic()
        for number in range(3):
            channel.basic_publish(
                exchange,
                "k",
                f"late-{number}".encode(),
                pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay_ms}),
            )
        channel.basic_publish(exchange, "k", b"now", pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()

    consumer = amqp(cluster[3])
    try:
        channel = consumer.channel()
        arrived: list[tuple[bytes, float]] = []
        end = time.monotonic() + DEADLINE_S
        for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=0.2):
            if method is not None:
                arrived.append((bytes(body), time.monotonic() - started))
            if len(arrived) >= 4 and time.monotonic() - started > delay_ms / 1000 + 1.5:
                break  # (a while after the delay: a second copy would have come by now)
            if time.monotonic() > end:
                break
        channel.cancel()
    finally:
        consumer.close()
    bodies = [body for body, _ in arrived]
    assert sorted(bodies) == [b"late-0", b"late-1", b"late-2", b"now"]
    for body, at in arrived:
        if body.startswith(b"late"):
            assert at >= delay_ms / 1000, (body, at)


def test_requeue_by_a_remote_consumer_redelivers(cluster: Cluster) -> None:
    """basic.nack and basic.reject with requeue from node 3 on node 2's queue: redelivered
    with redelivered=True, through pika and aio-pika."""
    queue = cluster.name_owned_by(2, "an.rq", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        publish_confirmed(channel, "", queue, b"again")
    finally:
        connection.close()

    consumer = amqp(cluster[3])
    try:
        channel = consumer.channel()
        channel.basic_qos(prefetch_count=1)
        seen: list[tuple[bytes, bool]] = []
        end = time.monotonic() + DEADLINE_S
        for method, _, body in channel.consume(queue, inactivity_timeout=0.5):
            if method is not None:
                seen.append((bytes(body), bool(method.redelivered)))
                if len(seen) == 1:
                    channel.basic_nack(method.delivery_tag, requeue=True)
                elif len(seen) == 2:
                    channel.basic_reject(method.delivery_tag, requeue=True)
                else:
                    channel.basic_ack(method.delivery_tag)
                    break
            if time.monotonic() > end:
                break
        channel.cancel()
    finally:
        consumer.close()
    assert seen == [(b"again", False), (b"again", True), (b"again", True)]

    async def with_aio_pika() -> list[tuple[bytes, bool]]:
        url = cluster[3].amqp_url
        async with await aio_pika.connect(url) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1)
            publisher = await aio_pika.connect(cluster[1].amqp_url)
            async with publisher:
                confirmed = await publisher.channel(publisher_confirms=True)
                await confirmed.default_exchange.publish(
                    aio_pika.Message(b"aio", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                )
            remote = await channel.get_queue(queue)
            got: list[tuple[bytes, bool]] = []
            async with asyncio.timeout(DEADLINE_S), remote.iterator() as messages:
                async for message in messages:
                    got.append((message.body, bool(message.redelivered)))
                    if len(got) == 1:
                        await message.nack(requeue=True)
                    elif len(got) == 2:
                        await message.reject(requeue=True)
                    else:
                        await message.ack()
                        break
            return got

    assert asyncio.run(with_aio_pika()) == [(b"aio", False), (b"aio", True), (b"aio", True)]
    eventually(lambda: passive_count(cluster, 2, queue) == 0, "both acked on node 2")


def test_purge_and_delete_through_a_node_that_does_not_own_the_queue(cluster: Cluster) -> None:
    """queue.purge and queue.delete through node 3 of node 2's queue act on the owner (its
    counts in the answers, if-empty on its records, if-unused on its consumers, one of them
    node 1's); nodes 1 to 3 then find the queue gone."""
    queue = cluster.name_owned_by(2, "an.pd", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for number in range(4):
            publish_confirmed(channel, "", queue, f"p-{number}".encode())
    finally:
        connection.close()
    eventually(lambda: passive_count(cluster, 3, queue) == 4, "node 3 counts node 2's queue")

    other = amqp(cluster[3])
    try:
        channel = other.channel()
        assert channel.queue_purge(queue).method.message_count == 4
        assert passive_count(cluster, 2, queue) == 0
        channel.confirm_delivery()
        publish_confirmed(channel, "", queue, b"left")
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_delete(queue, if_empty=True)
        assert refused.value.reply_code == 406
    finally:
        other.close()
    assert passive_count(cluster, 2, queue) == 1

    consumer = amqp(cluster[1])  # a consumer on node 1 of node 2's queue: in use
    try:
        consumer.channel().basic_consume(queue, lambda *_: None)

        def consumers_seen_on_node_3() -> int:
            connection = amqp(cluster[3])
            try:
                declared = connection.channel().queue_declare(queue, passive=True)
                return int(declared.method.consumer_count)
            finally:
                connection.close()

        eventually(consumers_seen_on_node_3, "node 1's consumer counted by the owner")
        other = amqp(cluster[3])
        try:
            with pytest.raises(ChannelClosedByBroker) as refused:
                other.channel().queue_delete(queue, if_unused=True)
            assert refused.value.reply_code == 406
        finally:
            other.close()
    finally:
        consumer.close()  # (its unacked message goes back to the queue)
    eventually(lambda: passive_count(cluster, 2, queue) == 1, "the message back in the queue")

    deleter = amqp(cluster[3])
    try:
        assert deleter.channel().queue_delete(queue).method.message_count == 1
    finally:
        deleter.close()

    for node_id in (1, 2, 3):
        with pytest.raises(ChannelClosedByBroker) as missing:
            passive_count(cluster, node_id, queue)
        assert missing.value.reply_code == 404, node_id


def is_gone(cluster: Cluster, node_id: int, queue: str) -> bool:
    """Whether a passive declare of ``queue`` on node ``node_id`` is 404."""
    try:
        passive_count(cluster, node_id, queue)
    except ChannelClosedByBroker as closed:
        return bool(closed.reply_code == 404)
    return False


def test_the_owner_expires_and_cancels_for_queues_other_nodes_handle(cluster: Cluster) -> None:
    """The owner runs x-expires of a queue declared through node 1 (nothing on node 2 touches
    it), and a queue deleted through node 3 cancels the owner's own consumer (Basic.Cancel)."""
    expiring = cluster.name_owned_by(2, "an.exp.elsewhere", QUEUE_TOPIC)
    consumed = cluster.name_owned_by(2, "an.cancel", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.queue_declare(expiring, arguments={"x-expires": 500})
        channel.queue_declare(consumed, durable=True)
    finally:
        connection.close()

    owner = amqp(cluster[2])
    try:
        channel = owner.channel()
        cancelled: list[str] = []
        channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tag = channel.basic_consume(consumed, lambda *_: None)
        deleter = amqp(cluster[3])
        try:
            deleter.channel().queue_delete(consumed)
        finally:
            deleter.close()
        end = time.monotonic() + DEADLINE_S
        while not cancelled and time.monotonic() < end:
            owner.process_data_events(time_limit=0.1)
        assert cancelled == [tag]
    finally:
        owner.close()
    eventually(lambda: is_gone(cluster, 1, expiring), "the owner to expire the queue")


def test_a_kafka_topic_deleted_through_node_1_loses_its_records_on_every_node(
    cluster: Cluster,
) -> None:
    """DeleteTopics on node 1 of a topic whose partitions nodes 2 and 3 lead drops their
    records there: the topic created again under that name starts empty, as in Kafka."""
    topic = "an.kafka.deleted"
    partitions = 6
    bootstrap = f"127.0.0.1:{cluster[1].kafka_port}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
        (described,) = admin.describe_topics([topic])
        leaders = {p.get("leader", p.get("leader_id")) for p in described["partitions"]}
        assert {2, 3} <= leaders, leaders  # (partitions placed by name over 12 shards)
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            for partition in range(partitions):
                producer.send(topic, b"before", partition=partition).get(DEADLINE_S)
        finally:
            producer.close()
        every = [KafkaTopicPartition(topic, partition) for partition in range(partitions)]
        assert set(consumer.end_offsets(every).values()) == {1}

        admin.delete_topics([topic])
        # Created again once every node has followed the deletion (the name is free).
        eventually(
            lambda: admin.create_topics([NewTopic(topic, partitions, 1)]) is not None,
            "the topic created again",
        )
        ends = eventually(lambda: consumer.end_offsets(every), "the new topic's end offsets")
    finally:
        consumer.close()
        admin.close()
    assert ends == {partition: 0 for partition in every}


def test_a_get_held_for_a_node_that_died_goes_back_to_the_queue(cluster: Cluster) -> None:
    """A basic.get on node 3 of node 2's queue, not acked, then node 3 killed: once its lease
    is gone the owner puts the message back (redelivered), as a consumer's unacked deliveries
    go back when its stream breaks; node 1 then gets it. Node 3 is started again after."""
    queue = cluster.name_owned_by(2, "an.held", QUEUE_TOPIC)
    connection = amqp(cluster[2])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        publish_confirmed(channel, "", queue, b"held")
    finally:
        connection.close()
    eventually(lambda: passive_count(cluster, 3, queue) == 1, "node 3 counts node 2's queue")

    getter = amqp(cluster[3])
    method, _, body = getter.channel().basic_get(queue, auto_ack=False)
    assert method is not None
    assert bytes(body) == b"held"
    assert passive_count(cluster, 2, queue) == 0  # held by the owner for node 3
    cluster[3].kill9()

    def got_back() -> tuple[bytes, bool] | None:
        connection = amqp(cluster[1])
        try:
            method, _, body = connection.channel().basic_get(queue, auto_ack=True)
            return None if method is None else (bytes(body), bool(method.redelivered))
        finally:
            connection.close()

    try:
        assert eventually(got_back, "node 3's held get back in the queue") == (b"held", True)
    finally:
        cluster[3].start()


def test_an_exclusive_queue_of_another_nodes_shard_goes_with_its_connection(
    cluster: Cluster,
) -> None:
    """Exclusive queues declared through node 1 in node 2's shard: one is deleted when its
    connection closes, the other when node 1 is killed (its lease gone, the owner deletes
    it), as RabbitMQ deletes an exclusive queue with its connection. Node 1 is started again."""
    closed = cluster.name_owned_by(2, "an.excl.closed", QUEUE_TOPIC)
    killed = cluster.name_owned_by(2, "an.excl.killed", QUEUE_TOPIC)
    connection = amqp(cluster[1])
    connection.channel().queue_declare(closed, exclusive=True)
    eventually(lambda: not is_gone(cluster, 2, closed), "the owner knows the first")
    connection.close()
    eventually(lambda: is_gone(cluster, 2, closed), "the first gone with its connection")

    connection = amqp(cluster[1])
    connection.channel().queue_declare(killed, exclusive=True)
    eventually(lambda: not is_gone(cluster, 2, killed), "the owner knows the second")
    cluster[1].kill9()
    try:
        eventually(lambda: is_gone(cluster, 2, killed), "the second gone with node 1")
        assert is_gone(cluster, 3, killed)
    finally:
        cluster[1].start()


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
