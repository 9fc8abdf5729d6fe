"""Virtual hosts: the vhost -> topic name mapping, the ``[amqp]`` config section, permissions."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from braid import config
from core.broker import BrokerConfig, Node
from core.broker.topics import validate_topic_name
from core.log import LogConfig, LogStore
from gateway.amqp.session import SessionSettings
from gateway.amqp.vhost import (
    VHOST_NAME,
    VirtualHost,
    check_vhost_name,
    exchange_name,
    queue_name,
    topic_prefix,
)
from tests.amqp.inprocess import ServerUnderTest
from tests.amqp.raw import RawConnection

KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's legal topic names


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerUnderTest]:
    store = LogStore(LogConfig(tmp_path, segment_size=4 << 20, index_entries_per_file=4096))
    await store.start()
    broker = Node(store, BrokerConfig())
    await broker.start()
    settings = SessionSettings(
        users={"guest": "guest", "app": "pw"},
        vhosts=("/", "staging"),
        permissions={"guest": ("/",), "app": ("staging",)},
    )
    amqp = ServerUnderTest(broker, settings)
    await amqp.start("127.0.0.1", 0)
    try:
        yield amqp
    finally:
        await amqp.close()
        await broker.close()
        await store.aclose()


def test_topic_prefix_of_a_vhost() -> None:
    assert topic_prefix("/") == ""
    assert topic_prefix("staging") == "amq.vhost.staging."
    assert topic_prefix("dev-2_b") == "amq.vhost.dev-2_b."


@pytest.mark.parametrize("name", ["", "a.b", "/staging", "a b", "x" * 65, "é", "*", "a/b"])
def test_invalid_vhost_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid vhost name"):
        check_vhost_name(name)
    with pytest.raises(ValueError, match="invalid vhost name"):
        topic_prefix(name)


def test_config_and_gateway_agree_on_vhost_names() -> None:
    assert config.AMQP_VHOST_NAME.pattern == VHOST_NAME.pattern
    assert config.AMQP_DEFAULT_VHOST == "/"


async def test_names_map_to_topics_and_back(server: ServerUnderTest) -> None:
    root, staging = server.vhosts["/"], server.vhosts["staging"]
    assert root.exchange_topic("E") == "E"
    assert root.queue_topic("Q") == "amq.queue.Q"
    assert staging.exchange_topic("E") == "amq.vhost.staging.E"
    assert staging.queue_topic("Q") == "amq.vhost.staging.amq.queue.Q"
    for vhost in (root, staging):
        for name in ("E", "a.b-c_d", "amq.topic"):
            topic = vhost.exchange_topic(name)
            assert vhost.exchange_name(topic) == name
            assert vhost.owns_topic(topic)
            validate_topic_name(topic)
            assert KAFKA_TOPIC.fullmatch(topic)
        topic = vhost.queue_topic("Q.1")
        assert vhost.queue_name(topic) == "Q.1"
        assert vhost.exchange_name(topic) == ""  # published through the default exchange
        assert vhost.owns_topic(topic)
    # "/" is today's mapping, unchanged.
    assert root.exchange_name("E") == exchange_name("E") == "E"
    assert root.queue_name("amq.queue.Q") == queue_name("amq.queue.Q") == "Q"
    # Each vhost owns only its own topics.
    assert not root.owns_topic("amq.vhost.staging.E")
    assert not staging.owns_topic("E")
    assert not staging.owns_topic("amq.queue.Q")
    assert not staging.owns_topic("amq.vhost.stagingx.E")
    assert staging.queue_name("amq.queue.Q") == "amq.queue.Q"  # not one of its queues


async def test_builtin_exchanges_exist_in_every_vhost(server: ServerUnderTest) -> None:
    topics = server.broker.topics
    root, staging = server.vhosts["/"], server.vhosts["staging"]
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        assert name in topics
        assert f"amq.vhost.staging.{name}" in topics
        exchange = staging.find_exchange(staging.context, name)
        assert exchange is not None
        assert (exchange.name, exchange.topic) == (name, f"amq.vhost.staging.{name}")
    # "/" does not see staging's topics as exchanges; staging does not see "/"'s.
    assert root.find_exchange(root.context, "amq.vhost.staging.amq.topic") is None
    await server.broker.declare_topic("kafka-made", 1)
    assert root.find_exchange(root.context, "kafka-made") is not None
    assert staging.find_exchange(staging.context, "kafka-made") is None
    # A topic another protocol made under staging's prefix is a staging (topic) exchange.
    await server.broker.declare_topic("amq.vhost.staging.kafka-made", 1)
    found = staging.find_exchange(staging.context, "kafka-made")
    assert found is not None
    assert (found.type, found.topic) == ("topic", "amq.vhost.staging.kafka-made")


async def test_open_checks_existence_then_permission(server: ServerUnderTest) -> None:
    assert server.address is not None
    cases = (
        ("\x00guest\x00guest", "nope", "NOT_ALLOWED - vhost nope not found"),
        ("\x00app\x00pw", "nope", "NOT_ALLOWED - vhost nope not found"),
        ("\x00guest\x00guest", "staging", "NOT_ALLOWED - access to vhost 'staging' refused "
         "for user 'guest'"),
        ("\x00app\x00pw", "/", "NOT_ALLOWED - access to vhost '/' refused for user 'app'"),
    )  # fmt: skip
    from pamqp import commands

    for response, vhost, text in cases:
        raw = await RawConnection.connect(server.address)
        await raw.handshake(response=response, open_vhost=False)
        raw.send(0, commands.Connection.Open(vhost))
        close = await raw.expect(commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (530, text)
        assert (close.class_id, close.method_id) == (10, 40)
        raw.send(0, commands.Connection.CloseOk())
        assert await raw.closed()
    for response, vhost in (("\x00guest\x00guest", "/"), ("\x00app\x00pw", "staging")):
        raw = await RawConnection.connect(server.address)
        await raw.handshake(response=response, open_vhost=False)
        raw.send(0, commands.Connection.Open(vhost))
        await raw.expect(commands.Connection.OpenOk)
        raw.send(0, commands.Connection.Close(200, "bye", 0, 0))
        await raw.expect(commands.Connection.CloseOk)


def test_permissions() -> None:
    settings = SessionSettings(permissions={"a": ("/",), "b": ("*",), "c": ()})
    assert settings.may_open("a", "/")
    assert not settings.may_open("a", "staging")
    assert settings.may_open("b", "staging")
    assert not settings.may_open("c", "/")
    assert not settings.may_open("unknown", "/")
    assert SessionSettings(permissions=None).may_open("anyone", "x")
    assert SessionSettings().may_open("guest", "/")  # RabbitMQ's default: guest on "/"
    assert not SessionSettings().may_open("guest", "staging")


async def test_invalid_vhost_in_settings_is_refused(tmp_path: Path) -> None:
    store = LogStore(LogConfig(tmp_path, segment_size=4 << 20, index_entries_per_file=4096))
    try:
        with pytest.raises(ValueError, match=r"invalid vhost name 'a\.b'"):
            ServerUnderTest(Node(store, BrokerConfig()), SessionSettings(vhosts=("/", "a.b")))
    finally:
        await store.aclose()


def test_vhost_keeps_the_name_it_was_given(server: ServerUnderTest) -> None:
    assert isinstance(server.vhosts["staging"], VirtualHost)
    assert server.vhosts["staging"].name == "staging"
    assert server.vhost is server.vhosts["/"]


# -- the [amqp] section of the config file -----------------------------------------------------


def test_amqp_config_defaults() -> None:
    settings = config.settings_from_mapping({}, "test")
    assert settings.amqp.vhosts == ("/",)
    assert settings.amqp.users == {"guest": config.AmqpUser("guest", ("/",))}
    settings = config.settings_from_mapping({"amqp": {"vhosts": ["/", "staging"]}}, "test")
    assert settings.amqp.vhosts == ("/", "staging")
    assert settings.amqp.users["guest"].vhosts == ("/",)  # as RabbitMQ: guest gets "/" only


def test_amqp_config_users() -> None:
    raw = {
        "amqp": {
            "vhosts": ["staging", "/"],
            "users": {
                "app": {"password": "pw", "vhosts": ["staging"]},
                "ops": {"password": "x", "vhosts": ["*"]},
                "plain": {"password": "p"},
            },
        }
    }
    amqp = config.settings_from_mapping(raw, "test").amqp
    assert amqp.vhosts == ("staging", "/")
    assert amqp.users == {
        "app": config.AmqpUser("pw", ("staging",)),
        "ops": config.AmqpUser("x", ("*",)),
        "plain": config.AmqpUser("p", ("/",)),
    }  # guest is not kept when users are listed


@pytest.mark.parametrize(
    ("amqp", "message"),
    [
        ({"vhosts": ["/", "a.b"]}, r"\[amqp\] vhosts: invalid vhost name 'a.b'"),
        ({"vhosts": []}, "at least one vhost"),
        ({"vhosts": ["/", "/"]}, "listed twice"),
        ({"vhosts": "/"}, "expected a list of strings"),
        ({"vhost": ["/"]}, r"\[amqp\] vhost: unknown key \(known: vhosts, users\)"),
        ({"users": {"a": {"vhosts": ["/"]}}}, r"users.a: password missing"),
        ({"users": {"a": {"password": "p", "tags": []}}}, r"users.a tags: unknown key"),
        ({"users": {"a": {"password": "p", "vhosts": ["nope"]}}}, "'nope' is not one of"),
        ({"users": {"a": "p"}}, r"users.a: expected a table"),
        ({"users": []}, r"users: expected a table"),
    ],
)
def test_amqp_config_errors(amqp: dict[str, object], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.settings_from_mapping({"amqp": amqp}, "test")
