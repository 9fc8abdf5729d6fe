"""Virtual hosts against a real ``braid serve`` with an ``[amqp]`` config: each vhost is its own
namespace of exchanges, queues and bindings (aio-pika, pika); Connection.Open of an unknown
vhost, or of one the user has no access to, is 530 with RabbitMQ's texts; durable entities of
every vhost survive a restart; a Kafka client reaches vhost ``staging``'s exchange ``E`` as topic
``amq.vhost.staging.E``, an MQTT client as ``amq.vhost.staging.E/a/b``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq.exceptions
import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess

TIMEOUT_S = 10.0
CONFIG = """
[amqp]
vhosts = ["/", "staging", "dev-2"]

[amqp.users.guest]
password = "guest"
vhosts = ["/", "staging"]

[amqp.users.app]
password = "app-secret"
vhosts = ["staging"]

[amqp.users.admin]
password = "admin-secret"
vhosts = ["*"]
"""


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "braid.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    tmp_path = tmp_path_factory.mktemp("vhosts")
    config = write_config(tmp_path)
    with BraidProcess(
        tmp_path, listeners=("amqp", "kafka", "mqtt"), extra_args=("--config", str(config))
    ) as process:
        yield process


def url(braid: BraidProcess, vhost: str, user: str = "guest", password: str = "guest") -> str:
    path = "%2F" if vhost == "/" else vhost
    return f"amqp://{user}:{password}@127.0.0.1:{braid.amqp_port}/{path}"


def pika_connect(
    braid: BraidProcess, vhost: str, user: str = "guest", password: str = "guest"
) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, vhost, credentials, connection_attempts=1
        )
    )


async def drain(queue: AbstractQueue, count: int) -> list[AbstractIncomingMessage]:
    got: list[AbstractIncomingMessage] = []
    async with asyncio.timeout(TIMEOUT_S), queue.iterator() as iterator:
        async for message in iterator:
            await message.ack()
            got.append(message)
            if len(got) == count:
                break
    return got


async def nothing_more(queue: AbstractQueue) -> bool:
    await asyncio.sleep(0.2)
    return await queue.get(no_ack=True, fail=False) is None


# -- Connection.Open ----------------------------------------------------------------------------


def open_refused(braid: BraidProcess, vhost: str, user: str, password: str) -> str:
    """The Connection.Close pika got for opening ``vhost``: ``"<code> <text>"``."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika_connect(braid, vhost, user, password)
    (closed,) = refused.value.args
    assert isinstance(closed, str)
    return closed


def test_open_of_an_unknown_vhost_is_530_not_found(braid: BraidProcess) -> None:
    closed = open_refused(braid, "nope", "guest", "guest")
    assert "(530) 'NOT_ALLOWED - vhost nope not found'" in closed
    # Existence is checked before permissions, as RabbitMQ does.
    closed = open_refused(braid, "/staging", "admin", "admin-secret")
    assert "(530) 'NOT_ALLOWED - vhost /staging not found'" in closed


def test_open_without_access_is_530_refused(braid: BraidProcess) -> None:
    closed = open_refused(braid, "/", "app", "app-secret")
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'app'\"" in closed
    closed = open_refused(braid, "dev-2", "guest", "guest")
    assert "NOT_ALLOWED - access to vhost 'dev-2' refused for user 'guest'" in closed
    # Who has access gets in: "app" to staging, "admin" ("*") to every vhost.
    with pika_connect(braid, "staging", "app", "app-secret") as connection:
        assert connection.channel().is_open
    for vhost in ("/", "staging", "dev-2"):
        with pika_connect(braid, vhost, "admin", "admin-secret") as connection:
            assert connection.channel().is_open


async def test_aio_pika_is_refused_at_open(braid: BraidProcess) -> None:
    # aiormq reports the Connection.Close it got instead of Open-Ok without its text (pika,
    # above, shows the texts); the point here is that the open fails, and "app" gets in.
    for target in (url(braid, "nope"), url(braid, "/", "app", "app-secret")):
        with pytest.raises(aiormq.exceptions.InvalidFrameError, match=r"got <Connection\.Close"):
            await aio_pika.connect(target)
    async with await aio_pika.connect(url(braid, "staging", "app", "app-secret")) as connection:
        assert not (await connection.channel()).is_closed


# -- separate namespaces ------------------------------------------------------------------------


async def test_same_names_in_two_vhosts_are_different_objects(braid: BraidProcess) -> None:
    async with (
        await aio_pika.connect(url(braid, "/")) as root,
        await aio_pika.connect(url(braid, "staging", "app", "app-secret")) as staging,
    ):
        root_channel = await root.channel()
        staging_channel = await staging.channel()
        # Same names, different types and flags: no 406, they are not the same exchange.
        root_ex = await root_channel.declare_exchange("orders", ExchangeType.DIRECT)
        staging_ex = await staging_channel.declare_exchange(
            "orders", ExchangeType.FANOUT, durable=True
        )
        root_q = await root_channel.declare_queue("orders.q")
        staging_q = await staging_channel.declare_queue("orders.q", durable=True)
        await root_q.bind(root_ex, "eu")
        await staging_q.bind(staging_ex, "")
        await root_ex.publish(Message(b"root eu"), "eu")
        await root_ex.publish(Message(b"root us"), "us")  # unrouted in "/"
        await staging_ex.publish(Message(b"staging any"), "whatever")
        got_root = await drain(root_q, 1)
        got_staging = await drain(staging_q, 1)
        assert [m.body for m in got_root] == [b"root eu"]
        assert [m.body for m in got_staging] == [b"staging any"]
        # Deliver's exchange is the name in the vhost, not the topic.
        assert got_root[0].exchange == "orders"
        assert got_staging[0].exchange == "orders"
        assert await nothing_more(root_q)
        assert await nothing_more(staging_q)

        # The default exchange routes to the vhost's own queue of that name.
        await root_channel.default_exchange.publish(Message(b"direct root"), "orders.q")
        await staging_channel.default_exchange.publish(Message(b"direct staging"), "orders.q")
        assert [m.body for m in await drain(root_q, 1)] == [b"direct root"]
        assert [m.body for m in await drain(staging_q, 1)] == [b"direct staging"]
        staging_got = await staging_q.get(no_ack=True, fail=False)
        assert staging_got is None

        # A queue and an exchange of "/" do not exist in staging.
        await root_channel.declare_queue("root-only")
        await root_channel.declare_exchange("root-only-ex", ExchangeType.TOPIC)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await staging_channel.declare_queue("root-only", passive=True)
        assert "NOT_FOUND - no queue 'root-only' in vhost 'staging'" in str(missing.value)
        staging_channel = await staging.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await staging_channel.declare_exchange("root-only-ex", passive=True)
        assert "NOT_FOUND - no exchange 'root-only-ex' in vhost 'staging'" in str(missing.value)
        staging_channel = await staging.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await staging_channel.get_exchange("root-only-ex")
        staging_channel = await staging.channel()
        # Nor can "/" reach staging's topics through their topic names.
        root_channel = await root.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as missing:
            await root_channel.declare_exchange("amq.vhost.staging.orders", passive=True)
        assert "in vhost '/'" in str(missing.value)
        root_channel = await root.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await root_channel.declare_exchange("amq.vhost.staging.orders", ExchangeType.FANOUT)


async def test_each_vhost_has_its_own_builtin_exchanges(braid: BraidProcess) -> None:
    async with (
        await aio_pika.connect(url(braid, "/")) as root,
        await aio_pika.connect(url(braid, "dev-2", "admin", "admin-secret")) as dev,
    ):
        root_channel = await root.channel()
        dev_channel = await dev.channel()
        root_q = await root_channel.declare_queue("", exclusive=True)
        dev_q = await dev_channel.declare_queue("", exclusive=True)
        assert dev_q.name.startswith("amq.gen-")
        for name in ("amq.direct", "amq.fanout", "amq.headers", "amq.match"):
            await dev_channel.declare_exchange(name, passive=True)
        await root_q.bind("amq.topic", "sensors.#")
        await dev_q.bind("amq.topic", "sensors.#")
        root_topic = await root_channel.get_exchange("amq.topic")
        dev_topic = await dev_channel.get_exchange("amq.topic")
        await root_topic.publish(Message(b"root"), "sensors.a")
        await dev_topic.publish(Message(b"dev"), "sensors.a")
        root_got = await drain(root_q, 1)
        dev_got = await drain(dev_q, 1)
        assert [m.body for m in root_got] == [b"root"]
        assert [(m.body, m.exchange) for m in dev_got] == [(b"dev", "amq.topic")]
        assert await nothing_more(root_q)
        assert await nothing_more(dev_q)
        # amq.* stays reserved in every vhost.
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await dev_channel.declare_exchange("amq.mine", ExchangeType.DIRECT)


async def test_exclusive_auto_delete_and_direct_reply_to_per_vhost(braid: BraidProcess) -> None:
    async with (
        await aio_pika.connect(url(braid, "staging", "app", "app-secret")) as server_conn,
        await aio_pika.connect(url(braid, "staging", "app", "app-secret")) as client_conn,
        await aio_pika.connect(url(braid, "/")) as root,
    ):
        server_channel = await server_conn.channel()
        requests = await server_channel.declare_queue("rpc", auto_delete=True)

        async def serve(message: AbstractIncomingMessage) -> None:
            async with message.process():
                assert message.reply_to is not None
                assert message.reply_to.startswith("amq.rabbitmq.reply-to.")
                await server_channel.default_exchange.publish(
                    Message(message.body * 2, correlation_id=message.correlation_id),
                    routing_key=message.reply_to,
                )

        consumer_tag = await requests.consume(serve)
        channel = await client_conn.channel()
        replies = await channel.get_queue("amq.rabbitmq.reply-to")
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_reply(message: AbstractIncomingMessage) -> None:
            reply.set_result(message.body)

        await replies.consume(on_reply, no_ack=True)
        await channel.default_exchange.publish(
            Message(b"ab", correlation_id="1", reply_to="amq.rabbitmq.reply-to"), "rpc"
        )
        assert await asyncio.wait_for(reply, TIMEOUT_S) == b"abab"

        # "/" has no queue "rpc": a publish there is unroutable (mandatory -> returned).
        root_channel = await root.channel(on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await root_channel.default_exchange.publish(Message(b"x"), "rpc", mandatory=True)

        # Exclusive: another staging connection is locked out (405, text names the vhost).
        mine = await server_channel.declare_queue("mine", exclusive=True)
        other = await client_conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelLockedResource) as locked:
            await other.declare_queue("mine", exclusive=True)
        assert "locked queue 'mine' in vhost 'staging'" in str(locked.value)
        # ... while "/" may have its own exclusive "mine".
        root_mine = await root_channel.declare_queue("mine", exclusive=True)
        assert root_mine.name == mine.name == "mine"

        # Auto-delete: "rpc" goes with its last consumer.
        await requests.cancel(consumer_tag)
        await asyncio.sleep(0.2)
        other = await client_conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await other.declare_queue("rpc", passive=True)

    # The exclusive queues went with their connections, in both vhosts.
    async with (
        await aio_pika.connect(url(braid, "staging")) as staging,
        await aio_pika.connect(url(braid, "/")) as root,
    ):
        for connection in (staging, root):
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await channel.declare_queue("mine", passive=True)


async def test_dead_letters_and_alternate_exchange_stay_in_their_vhost(
    braid: BraidProcess,
) -> None:
    async with (
        await aio_pika.connect(url(braid, "staging")) as staging,
        await aio_pika.connect(url(braid, "/")) as root,
    ):
        channel = await staging.channel()
        root_channel = await root.channel()
        # The same dead-letter names in "/" must not receive staging's dead letters.
        root_dlx = await root_channel.declare_exchange("dlx", ExchangeType.FANOUT)
        root_dead = await root_channel.declare_queue("dead", exclusive=True)
        await root_dead.bind(root_dlx)

        dlx = await channel.declare_exchange("dlx", ExchangeType.FANOUT)
        dead = await channel.declare_queue("dead", exclusive=True)
        await dead.bind(dlx)
        work = await channel.declare_queue(
            "work", exclusive=True, arguments={"x-dead-letter-exchange": "dlx"}
        )
        await channel.default_exchange.publish(Message(b"bad"), "work")
        (message,) = await asyncio.wait_for(_get(work), TIMEOUT_S)
        await message.reject(requeue=False)
        (dead_letter,) = await drain(dead, 1)
        assert dead_letter.body == b"bad"
        headers = dead_letter.headers
        assert headers["x-first-death-reason"] == "rejected"
        assert headers["x-first-death-queue"] == "work"
        assert headers["x-first-death-exchange"] == ""
        assert await nothing_more(root_dead)

        # Alternate exchange: named in the vhost.
        unrouted = await channel.declare_queue("unrouted", exclusive=True)
        await unrouted.bind(dlx)
        main = await channel.declare_exchange(
            "main", ExchangeType.DIRECT, arguments={"alternate-exchange": "dlx"}
        )
        await main.publish(Message(b"lost"), "nobody")
        assert [m.body for m in await drain(unrouted, 1)] == [b"lost"]
        assert await nothing_more(root_dead)


async def _get(queue: AbstractQueue) -> list[AbstractIncomingMessage]:
    while True:
        message = await queue.get(fail=False)
        if message is not None:
            return [message]
        await asyncio.sleep(0.05)


# -- Kafka and MQTT reach a vhost's exchange by its topic name ----------------------------------


async def test_mqtt_reaches_staging_exchange_by_its_topic_name(braid: BraidProcess) -> None:
    async with await aio_pika.connect(url(braid, "staging")) as staging:
        channel = await staging.channel()
        exchange = await channel.declare_exchange("telemetry", ExchangeType.TOPIC)
        queue = await channel.declare_queue("telemetry.q", exclusive=True)
        await queue.bind(exchange, "room.*")
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        client.connect("127.0.0.1", braid.mqtt_port)
        client.loop_start()
        try:
            info = client.publish("amq.vhost.staging.telemetry/room/1", b"21.5", qos=1)
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT_S)
        finally:
            client.disconnect()
            client.loop_stop()
        (got,) = await drain(queue, 1)
        assert (got.body, got.routing_key, got.exchange) == (b"21.5", "room.1", "telemetry")


async def test_kafka_reaches_staging_exchange_by_its_topic_name(braid: BraidProcess) -> None:
    async with await aio_pika.connect(url(braid, "staging")) as staging:
        channel = await staging.channel()
        exchange = await channel.declare_exchange("events", ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue("events.k", exclusive=True)
        await queue.bind(exchange, "k.*")

        consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap)
        await consumer.start()
        try:
            partition = TopicPartition("amq.vhost.staging.events", 0)
            consumer.assign([partition])
            await consumer.seek_to_end(partition)
            producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait("amq.vhost.staging.events", b"from kafka", key=b"k.1")
            finally:
                await producer.stop()
            (got,) = await drain(queue, 1)
            assert (got.body, got.routing_key, got.exchange) == (b"from kafka", "k.1", "events")

            # And an AMQP publish to staging's "events" is a record of that topic.
            await exchange.publish(Message(b"from amqp"), "k.2")
            values: list[bytes] = []
            async with asyncio.timeout(TIMEOUT_S):
                while b"from amqp" not in values:
                    batches = await consumer.getmany(timeout_ms=200)
                    values += [r.value or b"" for rs in batches.values() for r in rs]
        finally:
            await consumer.stop()


# -- durability ---------------------------------------------------------------------------------


def declare_and_publish(braid: BraidProcess, vhost: str, user: str, password: str) -> None:
    with pika_connect(braid, vhost, user, password) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("orders.eu", durable=True)
        channel.queue_bind("orders.eu", "orders", "eu")
        channel.queue_declare("scratch", durable=False)
        channel.exchange_declare("transient-ex", "fanout", durable=False)
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        for i in range(20):
            channel.basic_publish("orders", "eu", f"{vhost} {i}".encode(), persistent)


def check_after_restart(braid: BraidProcess, vhost: str, user: str, password: str) -> None:
    with pika_connect(braid, vhost, user, password) as connection:
        channel = connection.channel()
        bodies = []
        while True:
            method, _, body = channel.basic_get("orders.eu", auto_ack=True)
            if method is None:
                break
            assert method.exchange == "orders"
            bodies.append(body)
        assert bodies == [f"{vhost} {i}".encode() for i in range(20)]
        # The binding survived: a new publish still routes.
        channel.basic_publish("orders", "eu", b"again")
        method, _, body = channel.basic_get("orders.eu", auto_ack=True)
        assert body == b"again"
        channel.exchange_declare("orders", "direct", passive=True)
        for gone in ("scratch",):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
                channel.queue_declare(gone, passive=True)
            assert missing.value.reply_code == 404
            assert f"in vhost '{vhost}'" in missing.value.reply_text
            channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            channel.exchange_declare("transient-ex", passive=True)
        assert missing.value.reply_code == 404


def test_durable_entities_of_every_vhost_survive_restart(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with BraidProcess(tmp_path, listeners=("amqp",), extra_args=("--config", str(config))) as braid:
        declare_and_publish(braid, "/", "guest", "guest")
        declare_and_publish(braid, "staging", "app", "app-secret")
        declare_and_publish(braid, "dev-2", "admin", "admin-secret")
        braid.restart()
        check_after_restart(braid, "staging", "app", "app-secret")
        check_after_restart(braid, "/", "guest", "guest")
        check_after_restart(braid, "dev-2", "admin", "admin-secret")
        # A stop and start with a config that drops "dev-2": its records stay in the log and
        # come back with it; meanwhile opening it is "not found".
        code = braid.stop()
        assert code == 0
        config.write_text(CONFIG.replace(', "dev-2"]', "]"))
        braid.start()
        assert "vhost dev-2 not found" in open_refused(braid, "dev-2", "admin", "admin-secret")
        with pika_connect(braid, "/") as connection:
            channel = connection.channel()
            assert channel.queue_declare("orders.eu", passive=True).method.message_count == 0
        braid.stop()
        config.write_text(CONFIG)
        braid.start()
        with pika_connect(braid, "dev-2", "admin", "admin-secret") as connection:
            channel = connection.channel()
            channel.basic_publish("orders", "eu", b"back", pika.BasicProperties(delivery_mode=2))
            _, _, body = channel.basic_get("orders.eu", auto_ack=True)
            assert body == b"back"


def test_bad_vhost_config_stops_braid_serve(tmp_path: Path) -> None:
    for n, (text, message) in enumerate(
        (
            ('[amqp]\nvhosts = ["/", "a.b"]\n', "invalid vhost name 'a.b'"),
            ('[amqp]\nvhosts = ["/"]\n[amqp.users.x]\npassword = "y"\nvhosts = ["nope"]\n', "nope"),
            ('[amqp]\nvhost = ["/"]\n', "[amqp] vhost: unknown key"),
        )
    ):
        directory = tmp_path / str(n)
        directory.mkdir()
        config = directory / "bad.toml"
        config.write_text(text)
        braid = BraidProcess(directory, listeners=("amqp",), extra_args=("--config", str(config)))
        with pytest.raises(RuntimeError, match="did not start"):
            braid.start()
        assert braid.process is not None
        assert braid.process.returncode == 2
        assert message in braid.stderr()


async def test_persistent_message_in_staging_and_root_do_not_mix(braid: BraidProcess) -> None:
    async with (
        await aio_pika.connect(url(braid, "staging")) as staging,
        await aio_pika.connect(url(braid, "/")) as root,
    ):
        staging_channel = await staging.channel()
        root_channel = await root.channel()
        staging_q = await staging_channel.declare_queue("shared-name", durable=True)
        root_q = await root_channel.declare_queue("shared-name", durable=True)
        for i in range(10):
            await staging_channel.default_exchange.publish(
                Message(b"s%d" % i, delivery_mode=DeliveryMode.PERSISTENT), "shared-name"
            )
        staging_count = (
            await staging_channel.declare_queue("shared-name", durable=True)
        ).declaration_result.message_count
        root_count = (
            await root_channel.declare_queue("shared-name", durable=True)
        ).declaration_result.message_count
        assert (staging_count, root_count) == (10, 0)
        await staging_q.purge()
        await root_q.delete()
        await staging_q.delete()
