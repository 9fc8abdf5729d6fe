"""The mapping table of docs/security.md, row by row, against a real ``braid serve``.

The table is parsed from the page itself (so the page cannot drift from what the broker does).
For every row, the operation is driven with a real client (pika for AMQP, paho 5.0 for MQTT,
confluent-kafka for Kafka produce, and kafka-python's own protocol classes over its sans-IO
``KafkaProtocol`` for the other Kafka requests, sent as a SASL PLAIN client) twice: as a user
that has the row's permission on the row's resource (allowed), and as one that lacks exactly
that permission there (refused, in that protocol's words: an AMQP 403 channel close, MQTT
PUBACK/SUBACK/CONNACK 0x87 or a record not delivered, Kafka's TOPIC_ (29), GROUP_ (30),
CLUSTER_ (31) or TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), or the name left out of a
listing). Every refusal writes its audit line. No Kafka ACL is written anywhere here: the vhost
permissions alone decide.

Names: each row's resource is named ``t<token>...`` and everything else the operation needs
(the group of a topic row, the topic of a group row, ...) ``o<token>...``. Having the permission
is all three expressions matching both; lacking it is the row's permission matching only the
``o`` names (for ``describe``: none of the three matching the ``t`` names; for
``administrator``: no ``administrator`` tag).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kafka.protocol
import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.parser import KafkaProtocol

from tests.braid_process import BraidProcess
from tests.security.http_admin import Admin

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DEADLINE_S = 30.0
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


@dataclass(frozen=True)
class Row:
    protocol: str
    operation: str
    resource: str
    permission: str

    @property
    def name(self) -> str:
        return f"{self.protocol} {self.operation}"


def table_rows() -> list[Row]:
    """The rows of the page's mapping table (``| protocol | `operation` | resource | ...``)."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in ("amqp", "mqtt", "kafka") and cells[1].startswith("`"):
            rows.append(Row(cells[0], cells[1].strip("`"), cells[2], cells[3]))
    return rows


ROWS = table_rows()


def test_the_table_is_there() -> None:
    assert len(ROWS) > 50
    assert {row.protocol for row in ROWS} == {"amqp", "mqtt", "kafka"}


# -- the broker, users, names -------------------------------------------------------------------


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    directory = tmp_path_factory.mktemp("mapping-table")
    config = directory / "braid.toml"
    config.write_text('[amqp]\nvhosts = ["/", "secret"]\n')  # guest keeps "/" alone
    with BraidProcess(
        directory,
        listeners=("amqp", "mqtt", "kafka", "http"),
        extra_args=("--config", str(config)),
    ) as process:
        yield process


@pytest.fixture(scope="module")
def admin(braid: BraidProcess) -> Admin:
    return Admin(braid.http_port)


@dataclass
class Names:
    """The row's resource (``t``...) and the rest (``o``...) of one test."""

    token: str

    def t(self, suffix: str) -> str:
        return f"t{self.token}.{suffix}"

    def o(self, suffix: str) -> str:
        return f"o{self.token}.{suffix}"


@dataclass
class Actor:
    user: str
    password: str


def make_user(admin: Admin, row: Row, names: Names, *, lacking: bool) -> Actor:
    user, password = f"u{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    both, other = f"^[to]{names.token}\\.", f"^o{names.token}\\."
    tags = "administrator" if row.permission == "administrator" and not lacking else ""
    admin._send("PUT", f"/users/{user}", {"password": password, "tags": tags})
    expressions = {"configure": both, "write": both, "read": both}
    if lacking and row.permission == "describe":
        expressions = dict.fromkeys(expressions, other)
    elif lacking and row.permission in expressions:
        expressions[row.permission] = other
    admin.permit(user, **expressions)
    return Actor(user, password)


GUEST = Actor("guest", "guest")


def wait_for(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- AMQP: pika ---------------------------------------------------------------------------------


def amqp_channel(braid: BraidProcess, actor: Actor) -> Any:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            credentials=pika.PlainCredentials(actor.user, actor.password),
            connection_attempts=1,
        )
    )
    return connection.channel()


def amqp_setup(braid: BraidProcess, steps: Callable[[Any], None]) -> None:
    channel = amqp_channel(braid, GUEST)
    try:
        steps(channel)
    finally:
        channel.connection.close()


def amqp_allowed(braid: BraidProcess, actor: Actor, action: Callable[[Any], None]) -> bool:
    channel = amqp_channel(braid, actor)
    refusal: pika.exceptions.ChannelClosedByBroker | None = None
    try:
        action(channel)
    except pika.exceptions.ChannelClosedByBroker as closed:
        refusal = closed
    finally:
        channel.connection.close()
    if refusal is None:
        return True
    assert refusal.reply_code == 403, refusal
    assert refusal.reply_text.startswith("ACCESS_REFUSED - "), refusal
    assert f"refused for user '{actor.user}'" in refusal.reply_text, refusal
    return False


def amqp_driver(operation: str) -> Callable[[BraidProcess, Names, Actor], bool]:
    def drive(braid: BraidProcess, names: Names, actor: Actor) -> bool:
        xt, xo, qt, qo = names.t("x"), names.o("x"), names.t("q"), names.o("q")

        def objects(channel: Any) -> None:
            for exchange in (xt, xo):
                channel.exchange_declare(exchange, "topic")
            for queue in (qt, qo):
                channel.queue_declare(queue)
            channel.exchange_bind(xt, xo, "k")
            channel.exchange_bind(xo, xt, "k")
            channel.queue_bind(qt, xo, "k")
            channel.queue_bind(qo, xt, "k")

        if operation != "exchange.declare" and operation != "queue.declare":
            amqp_setup(braid, objects)

        def publish(channel: Any) -> None:
            channel.confirm_delivery()
            channel.basic_publish(xt, "a.b", b"x")

        actions: dict[str, Callable[[Any], Any]] = {
            "exchange.declare": lambda c: c.exchange_declare(xt, "topic"),
            "exchange.declare with alternate-exchange": lambda c: c.exchange_declare(
                names.t("y"), "topic", arguments={"alternate-exchange": xo}
            ),
            "exchange.declare alternate-exchange": lambda c: c.exchange_declare(
                names.o("y"), "topic", arguments={"alternate-exchange": xt}
            ),
            "queue.declare with x-dead-letter-exchange": lambda c: c.queue_declare(
                names.t("r"), arguments={"x-dead-letter-exchange": xo}
            ),
            "queue.declare x-dead-letter-exchange": lambda c: c.queue_declare(
                names.o("r"), arguments={"x-dead-letter-exchange": xt}
            ),
            "exchange.delete": lambda c: c.exchange_delete(xt),
            "exchange.bind destination": lambda c: c.exchange_bind(xt, xo, "k2"),
            "exchange.bind source": lambda c: c.exchange_bind(xo, xt, "k2"),
            "exchange.unbind destination": lambda c: c.exchange_unbind(xt, xo, "k"),
            "exchange.unbind source": lambda c: c.exchange_unbind(xo, xt, "k"),
            "queue.declare": lambda c: c.queue_declare(qt),
            "queue.delete": lambda c: c.queue_delete(qt),
            "queue.purge": lambda c: c.queue_purge(qt),
            "queue.bind queue": lambda c: c.queue_bind(qt, xo, "k2"),
            "queue.bind exchange": lambda c: c.queue_bind(qo, xt, "k2"),
            "queue.unbind queue": lambda c: c.queue_unbind(qt, xo, "k"),
            "queue.unbind exchange": lambda c: c.queue_unbind(qo, xt, "k"),
            "basic.publish": publish,
            "basic.consume": lambda c: c.basic_consume(qt, lambda *_: None),
            "basic.get": lambda c: c.basic_get(qt),
        }
        return amqp_allowed(braid, actor, actions[operation])

    return drive


# -- MQTT: paho 5.0 -----------------------------------------------------------------------------


class MqttClient:
    def __init__(self, port: int, actor: Actor, will: str | None = None) -> None:
        self.paho = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"row-{uuid.uuid4().hex[:10]}",
            protocol=mqtt.MQTTv5,
        )
        if actor.user:  # (else anonymous)
            self.paho.username_pw_set(actor.user, actor.password)
        if will is not None:
            self.paho.will_set(will, b"gone", qos=1)
        self.connack: int | None = None
        self.done = threading.Event()
        self.messages: list[str] = []
        self.acks: dict[int, int] = {}
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = lambda *_args: self.done.set()
        self.paho.on_message = lambda _c, _u, message: self.messages.append(message.topic)
        self.paho.on_subscribe = lambda _c, _u, mid, codes, _p: self.acks.update(
            {mid: int(codes[0].value)}
        )
        self.paho.on_publish = lambda _c, _u, mid, code, _p: self.acks.update(
            {mid: int(code.value)}
        )
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()
        assert self.done.wait(DEADLINE_S)

    def _on_connect(self, _c: Any, _u: Any, _f: Any, code: Any, _p: Any) -> None:
        self.connack = int(code.value)
        self.done.set()

    def publish(self, topic: str) -> int:
        info = self.paho.publish(topic, b"p", qos=1)
        wait_for(lambda: info.mid in self.acks, f"the PUBACK of {topic}")
        return self.acks[info.mid]

    def subscribe(self, topic_filter: str) -> int:
        _, mid = self.paho.subscribe(topic_filter, qos=1)
        wait_for(lambda: mid in self.acks, f"the SUBACK of {topic_filter}")
        return self.acks[mid]

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def mqtt_driver(operation: str) -> Callable[[BraidProcess, Names, Actor], bool]:
    def drive(braid: BraidProcess, names: Names, actor: Actor) -> bool:
        port = braid.mqtt_port
        target = f"{names.t('m')}/a/b"
        if operation == "will":
            client = MqttClient(port, actor, will=target)
            client.close()
            assert client.connack in (0, 0x87)
            return client.connack == 0
        client = MqttClient(port, actor)
        try:
            assert client.connack == 0
            if operation == "PUBLISH":
                code = client.publish(target)
                assert code in (0, 0x87)
                return code == 0
            if operation == "SUBSCRIBE":
                code = client.subscribe(f"{names.t('m')}/+/b")
                assert code in (1, 0x87)
                return code == 1
            assert operation == "deliver"
            assert client.subscribe("+/a/b") == 1  # first level a wildcard: checked per record
            guest = MqttClient(port, GUEST)
            marker = f"{names.o('m')}/a/b"  # readable either way: tells that nothing came
            assert guest.publish(target) == 0
            assert guest.publish(marker) == 0
            guest.close()
            wait_for(lambda: marker in client.messages, "the marker")
            return target in client.messages
        finally:
            client.close()

    return drive


# -- Kafka: kafka-python's protocol classes, confluent-kafka for produce -------------------------


def _request_classes() -> dict[str, Any]:
    classes: dict[str, Any] = {}
    for info in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        if ".old" in info.name or "generate" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, ApiMessage)
                and cls is not ApiMessage
                and getattr(cls, "_json", None)
                and cls.is_request()
            ):
                classes[name] = cls
    return classes


REQUESTS = _request_classes()


def _build(cls: Any, version: int | None, values: dict[str, Any]) -> Any:
    """A kafka-python request (or nested struct) from plain dicts and lists."""
    converted = {}
    for name, value in values.items():
        field = cls._struct.fields[name]
        if field.is_struct_array() and value is not None:
            value = [_build(field.data_class, None, v) if isinstance(v, dict) else v for v in value]
        elif field.is_struct() and isinstance(value, dict):
            value = _build(field.data_class, None, value)
        converted[name] = value
    return cls(version=version, **converted) if version is not None else cls(**converted)


def request(name: str, version: int, **values: Any) -> Any:
    return _build(REQUESTS[name], version, values)


class KafkaSession:
    """One SASL PLAIN connection speaking through kafka-python's sans-IO ``KafkaProtocol``."""

    def __init__(self, braid: BraidProcess, actor: Actor) -> None:
        self.sock = socket.create_connection(("127.0.0.1", braid.kafka_port), timeout=DEADLINE_S)
        self.protocol = KafkaProtocol(client_id="mapping-table")
        self.correlation_id = 0
        if not actor.user:  # anonymous: no SASL
            return
        handshake = self.call(request("SaslHandshakeRequest", 1, mechanism="PLAIN"))
        assert handshake.error_code == 0, handshake
        token = f"\0{actor.user}\0{actor.password}".encode()
        login = self.call(request("SaslAuthenticateRequest", 0, auth_bytes=token))
        assert login.error_code == 0, login

    def call(self, message: Any) -> Any:
        self.correlation_id += 1
        self.protocol.send_request(message, correlation_id=self.correlation_id)
        self.sock.sendall(bytes(self.protocol.send_bytes()))
        while True:
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            for correlation_id, response in self.protocol.receive_bytes(data):
                if correlation_id == self.correlation_id:
                    return response

    def close(self) -> None:
        self.sock.close()


def error_codes(value: Any) -> set[int]:
    """Every ``error_code`` (``partition_error_code``, ...) anywhere in a response."""
    found: set[int] = set()
    if isinstance(value, list):
        for item in value:
            found |= error_codes(item)
        return found
    struct = getattr(value, "_struct", None)
    if struct is None:
        return found
    for field in struct._fields:
        item = getattr(value, field.name, None)
        if field.name.endswith("error_code") and isinstance(item, int):
            found.add(item)
        elif isinstance(item, list) or getattr(item, "_struct", None) is not None:
            found |= error_codes(item)
    return found


def create_topic(session: KafkaSession, name: str, partitions: int = 1) -> None:
    topic = {
        "name": name,
        "num_partitions": partitions,
        "replication_factor": 1,
        "assignments": [],
        "configs": [],
    }
    response = session.call(request("CreateTopicsRequest", 2, topics=[topic], timeout_ms=10_000))
    assert error_codes(response) <= {0, 36}, response  # (36: it exists)


def commit_offset(session: KafkaSession, group: str, topic: str) -> Any:
    partition = {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}
    return session.call(
        request(
            "OffsetCommitRequest",
            2,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            retention_time_ms=-1,
            topics=[{"name": topic, "partitions": [partition]}],
        )
    )


def init_producer(session: KafkaSession, transactional_id: str) -> tuple[int, int]:
    response = session.call(
        request(
            "InitProducerIdRequest",
            0,
            transactional_id=transactional_id,
            transaction_timeout_ms=60_000,
        )
    )
    assert response.error_code == 0, response
    return response.producer_id, response.producer_epoch


def produce(braid: BraidProcess, actor: Actor, topic: str) -> KafkaError | None:
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": actor.user,
            "sasl.password": actor.password,
            "message.timeout.ms": 10_000,
        }
    )
    producer.produce(topic, b"v", on_delivery=lambda error, _message: reports.append(error))
    producer.flush(DEADLINE_S)
    assert reports, "no delivery report"
    return reports[0]


# (request builder given the names and a guest session for the set-up, the code of a refusal)
KafkaCase = Callable[[Names, KafkaSession, KafkaSession], Any]


def _partitions(name: str, **fields: Any) -> list[dict[str, Any]]:
    return [{"name": name, "partitions": [{"partition_index": 0, **fields}]}]


def kafka_cases() -> dict[str, tuple[KafkaCase, int]]:
    topic_refused, group_refused = TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED
    txn_refused, cluster_refused = (
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        CLUSTER_AUTHORIZATION_FAILED,
    )

    def with_topic(names: Names, guest: KafkaSession, name: str, partitions: int = 1) -> str:
        create_topic(guest, name, partitions)
        return name

    def fetch(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        part = {
            "partition": 0,
            "fetch_offset": 0,
            "log_start_offset": -1,
            "partition_max_bytes": 1 << 20,
        }
        return s.call(
            request(
                "FetchRequest",
                4,
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=1 << 20,
                isolation_level=0,
                topics=[{"topic": topic, "partitions": [part]}],
            )
        )

    def list_offsets(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        return s.call(
            request(
                "ListOffsetsRequest",
                1,
                replica_id=-1,
                topics=[{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
            )
        )

    def metadata(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        return s.call(request("MetadataRequest", 1, topics=[{"name": topic}]))

    def offset_commit_topic(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        return commit_offset(s, n.o("g"), with_topic(n, g, n.t("k")))

    def offset_fetch(group: str, topic: str, s: KafkaSession) -> Any:
        return s.call(
            request(
                "OffsetFetchRequest",
                3,
                group_id=group,
                topics=[{"name": topic, "partition_indexes": [0]}],
            )
        )

    def create_topics(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = {
            "name": n.t("k"),
            "num_partitions": 1,
            "replication_factor": 1,
            "assignments": [],
            "configs": [],
        }
        return s.call(request("CreateTopicsRequest", 2, topics=[topic], timeout_ms=10_000))

    def delete_topics(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        return s.call(request("DeleteTopicsRequest", 1, topic_names=[topic], timeout_ms=10_000))

    def delete_records(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        return s.call(
            request(
                "DeleteRecordsRequest", 0, timeout_ms=10_000, topics=_partitions(topic, offset=0)
            )
        )

    def create_partitions(n: Names, g: KafkaSession, s: KafkaSession) -> Any:
        topic = with_topic(n, g, n.t("k"))
        return s.call(
            request(
                "CreatePartitionsRequest",
                0,
                timeout_ms=10_000,
                validate_only=False,
                topics=[{"name": topic, "count": 2, "assignments": None}],
            )
        )

    def alter_configs(kind: int, name: str, config: str, value: str, s: KafkaSession) -> Any:
        resource = {
            "resource_type": kind,
            "resource_name": name,
            "configs": [{"name": config, "value": value}],
        }
        return s.call(request("AlterConfigsRequest", 0, resources=[resource], validate_only=False))

    def describe_configs(kind: int, name: str, s: KafkaSession) -> Any:
        resource = {"resource_type": kind, "resource_name": name, "configuration_keys": None}
        return s.call(
            request("DescribeConfigsRequest", 1, resources=[resource], include_synonyms=False)
        )

    def add_partitions(txn: str, topic: str, s: KafkaSession, producer: tuple[int, int]) -> Any:
        return s.call(
            request(
                "AddPartitionsToTxnRequest",
                1,
                v3_and_below_transactional_id=txn,
                v3_and_below_producer_id=producer[0],
                v3_and_below_producer_epoch=producer[1],
                v3_and_below_topics=[{"name": topic, "partitions": [0]}],
            )
        )

    def txn_offset_commit(
        txn: str, group: str, topic: str, s: KafkaSession, producer: tuple[int, int]
    ) -> Any:
        return s.call(
            request(
                "TxnOffsetCommitRequest",
                1,
                transactional_id=txn,
                group_id=group,
                producer_id=producer[0],
                producer_epoch=producer[1],
                topics=_partitions(topic, committed_offset=0, committed_metadata=""),
            )
        )

    def add_offsets(txn: str, group: str, s: KafkaSession, producer: tuple[int, int]) -> Any:
        return s.call(
            request(
                "AddOffsetsToTxnRequest",
                1,
                transactional_id=txn,
                producer_id=producer[0],
                producer_epoch=producer[1],
                group_id=group,
            )
        )

    def join(group: str, s: KafkaSession) -> Any:
        protocol = {"name": "range", "metadata": b""}
        return s.call(
            request(
                "JoinGroupRequest",
                2,
                group_id=group,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_id="",
                protocol_type="consumer",
                protocols=[protocol],
            )
        )

    def find_coordinator(key: str, key_type: int, s: KafkaSession) -> Any:
        return s.call(request("FindCoordinatorRequest", 1, key=key, key_type=key_type))

    def existing_group(n: Names, g: KafkaSession) -> str:
        topic = with_topic(n, g, n.o("k"))
        assert error_codes(commit_offset(g, n.t("g"), topic)) == {0}
        return n.t("g")

    def acl_filter() -> dict[str, Any]:
        return {
            "resource_type_filter": 2,
            "resource_name_filter": "nothing-here",
            "pattern_type_filter": 3,
            "principal_filter": None,
            "host_filter": None,
            "operation": 2,
            "permission_type": 3,
        }

    bogus = (1_000_000, 0)  # a producer id no transaction has: refused or not, never applied
    cases: dict[str, tuple[KafkaCase, int]] = {
        "Fetch": (fetch, topic_refused),
        "ListOffsets": (list_offsets, topic_refused),
        "Metadata": (metadata, topic_refused),
        "OffsetCommit topic": (offset_commit_topic, topic_refused),
        "OffsetFetch topic": (
            lambda n, g, s: offset_fetch(n.o("g"), with_topic(n, g, n.t("k")), s),
            topic_refused,
        ),
        "CreateTopics": (create_topics, topic_refused),
        "DeleteTopics": (delete_topics, topic_refused),
        "DeleteRecords": (delete_records, topic_refused),
        "CreatePartitions": (create_partitions, topic_refused),
        "AlterConfigs topic": (
            lambda n, g, s: alter_configs(
                2, with_topic(n, g, n.t("k")), "retention.ms", "86400000", s
            ),
            topic_refused,
        ),
        "DescribeConfigs topic": (
            lambda n, g, s: describe_configs(2, with_topic(n, g, n.t("k")), s),
            topic_refused,
        ),
        "AddPartitionsToTxn topic": (
            lambda n, g, s: add_partitions(
                n.o("tx"), with_topic(n, g, n.t("k")), s, init_producer(s, n.o("tx"))
            ),
            topic_refused,
        ),
        "TxnOffsetCommit topic": (
            lambda n, g, s: txn_offset_commit(
                n.o("tx"), n.o("g"), with_topic(n, g, n.t("k")), s, init_producer(s, n.o("tx"))
            ),
            topic_refused,
        ),
        "JoinGroup": (lambda n, g, s: join(n.t("g"), s), group_refused),
        "SyncGroup": (
            lambda n, g, s: s.call(
                request(
                    "SyncGroupRequest",
                    1,
                    group_id=n.t("g"),
                    generation_id=1,
                    member_id="nobody",
                    assignments=[],
                )
            ),
            group_refused,
        ),
        "Heartbeat": (
            lambda n, g, s: s.call(
                request(
                    "HeartbeatRequest", 1, group_id=n.t("g"), generation_id=1, member_id="nobody"
                )
            ),
            group_refused,
        ),
        "LeaveGroup": (
            lambda n, g, s: s.call(
                request("LeaveGroupRequest", 1, group_id=n.t("g"), member_id="nobody")
            ),
            group_refused,
        ),
        "OffsetCommit": (
            lambda n, g, s: commit_offset(s, n.t("g"), with_topic(n, g, n.o("k"))),
            group_refused,
        ),
        "TxnOffsetCommit": (
            lambda n, g, s: txn_offset_commit(
                n.o("tx"), n.t("g"), with_topic(n, g, n.o("k")), s, init_producer(s, n.o("tx"))
            ),
            group_refused,
        ),
        "AddOffsetsToTxn group": (
            lambda n, g, s: add_offsets(n.o("tx"), n.t("g"), s, init_producer(s, n.o("tx"))),
            group_refused,
        ),
        "OffsetFetch": (
            lambda n, g, s: offset_fetch(n.t("g"), with_topic(n, g, n.o("k")), s),
            group_refused,
        ),
        "FindCoordinator group": (lambda n, g, s: find_coordinator(n.t("g"), 0, s), group_refused),
        "DescribeGroups": (
            lambda n, g, s: s.call(request("DescribeGroupsRequest", 1, groups=[n.t("g")])),
            group_refused,
        ),
        "DeleteGroups": (
            lambda n, g, s: s.call(
                request("DeleteGroupsRequest", 0, groups_names=[existing_group(n, g)])
            ),
            group_refused,
        ),
        "AlterConfigs group": (
            lambda n, g, s: alter_configs(32, n.t("g"), "consumer.session.timeout.ms", "45000", s),
            group_refused,
        ),
        "DescribeConfigs group": (
            lambda n, g, s: describe_configs(32, n.t("g"), s),
            group_refused,
        ),
        "InitProducerId": (
            lambda n, g, s: s.call(
                request(
                    "InitProducerIdRequest",
                    0,
                    transactional_id=n.t("tx"),
                    transaction_timeout_ms=60_000,
                )
            ),
            txn_refused,
        ),
        "AddPartitionsToTxn": (
            lambda n, g, s: add_partitions(n.t("tx"), with_topic(n, g, n.o("k")), s, bogus),
            txn_refused,
        ),
        "AddOffsetsToTxn": (
            lambda n, g, s: add_offsets(n.t("tx"), n.o("g"), s, bogus),
            txn_refused,
        ),
        "EndTxn": (
            lambda n, g, s: s.call(
                request(
                    "EndTxnRequest",
                    1,
                    transactional_id=n.t("tx"),
                    producer_id=bogus[0],
                    producer_epoch=bogus[1],
                    committed=False,
                )
            ),
            txn_refused,
        ),
        "TxnOffsetCommit transaction": (
            lambda n, g, s: txn_offset_commit(
                n.t("tx"), n.o("g"), with_topic(n, g, n.o("k")), s, bogus
            ),
            txn_refused,
        ),
        "FindCoordinator transaction": (
            lambda n, g, s: find_coordinator(n.t("tx"), 1, s),
            txn_refused,
        ),
        "CreateAcls": (
            lambda n, g, s: s.call(
                request(
                    "CreateAclsRequest",
                    1,
                    creations=[
                        {
                            "resource_type": 2,
                            "resource_name": n.o("k"),
                            "resource_pattern_type": 3,
                            "principal": "User:nobody",
                            "host": "*",
                            "operation": 3,
                            "permission_type": 2,
                        }
                    ],
                )
            ),
            cluster_refused,
        ),
        "DeleteAcls": (
            lambda n, g, s: s.call(request("DeleteAclsRequest", 1, filters=[acl_filter()])),
            cluster_refused,
        ),
        "DescribeAcls": (
            lambda n, g, s: s.call(request("DescribeAclsRequest", 1, **acl_filter())),
            cluster_refused,
        ),
        "AlterUserScramCredentials": (
            lambda n, g, s: s.call(
                request(
                    "AlterUserScramCredentialsRequest",
                    0,
                    deletions=[{"name": "nobody-at-all", "mechanism": 1}],
                    upsertions=[],
                )
            ),
            cluster_refused,
        ),
        "DescribeUserScramCredentials": (
            lambda n, g, s: s.call(request("DescribeUserScramCredentialsRequest", 0, users=None)),
            cluster_refused,
        ),
        "AlterConfigs broker": (
            lambda n, g, s: alter_configs(4, "1", "log.retention.ms", "86400000", s),
            cluster_refused,
        ),
        "DescribeConfigs broker": (lambda n, g, s: describe_configs(4, "1", s), cluster_refused),
        # The admin APIs of issue 19 (gateway/kafka/admin_records.py, admin_cluster.py).
        "DescribeProducers": (
            lambda n, g, s: s.call(
                request(
                    "DescribeProducersRequest",
                    0,
                    topics=[{"name": with_topic(n, g, n.t("k")), "partition_indexes": [0]}],
                )
            ),
            topic_refused,
        ),
        "OffsetDelete": (
            lambda n, g, s: s.call(
                request(
                    "OffsetDeleteRequest",
                    0,
                    group_id=existing_group(n, g),
                    topics=[{"name": n.o("k"), "partitions": [{"partition_index": 0}]}],
                )
            ),
            group_refused,
        ),
        "DescribeTransactions": (
            lambda n, g, s: s.call(
                request("DescribeTransactionsRequest", 0, transactional_ids=[n.t("tx")])
            ),
            txn_refused,
        ),
        # v3: the first version with a top-level error code (older ones answer nothing).
        "DescribeLogDirs": (
            lambda n, g, s: s.call(request("DescribeLogDirsRequest", 3, topics=None)),
            cluster_refused,
        ),
        "ElectLeaders": (
            lambda n, g, s: s.call(
                request(
                    "ElectLeadersRequest",
                    1,
                    election_type=0,
                    topic_partitions=[{"topic": with_topic(n, g, n.o("k")), "partitions": [0]}],
                    timeout_ms=10_000,
                )
            ),
            cluster_refused,
        ),
        "AlterPartitionReassignments": (
            lambda n, g, s: s.call(
                request(
                    "AlterPartitionReassignmentsRequest",
                    0,
                    timeout_ms=10_000,
                    topics=[
                        {
                            "name": with_topic(n, g, n.o("k")),
                            "partitions": [{"partition_index": 0, "replicas": None}],
                        }
                    ],
                )
            ),
            cluster_refused,
        ),
        "ListPartitionReassignments": (
            lambda n, g, s: s.call(
                request("ListPartitionReassignmentsRequest", 0, timeout_ms=10_000, topics=None)
            ),
            cluster_refused,
        ),
    }
    return cases


KAFKA_CASES = kafka_cases()


def kafka_driver(operation: str) -> Callable[[BraidProcess, Names, Actor], bool]:
    def drive(braid: BraidProcess, names: Names, actor: Actor) -> bool:
        if operation == "Produce":
            guest = KafkaSession(braid, GUEST)
            create_topic(guest, names.t("k"))
            guest.close()
            error = produce(braid, actor, names.t("k"))
            assert error is None or error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
            return error is None
        if operation == "ListGroups":
            guest = KafkaSession(braid, GUEST)
            topic = names.o("k")
            create_topic(guest, topic)
            assert error_codes(commit_offset(guest, names.t("g"), topic)) == {0}
            guest.close()
            session = KafkaSession(braid, actor)
            try:
                listed = session.call(request("ListGroupsRequest", 1))
            finally:
                session.close()
            assert listed.error_code == 0, listed
            return names.t("g") in {group.group_id for group in listed.groups}
        case, refused_code = KAFKA_CASES[operation]
        guest = KafkaSession(braid, GUEST)
        session = KafkaSession(braid, actor)
        try:
            response = case(names, guest, session)
        finally:
            guest.close()
            session.close()
        return refused_code not in error_codes(response)

    return drive


DRIVERS: dict[str, Callable[[str], Callable[[BraidProcess, Names, Actor], bool]]] = {
    "amqp": amqp_driver,
    "mqtt": mqtt_driver,
    "kafka": kafka_driver,
}


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_every_row(braid: BraidProcess, admin: Admin, row: Row) -> None:
    drive = DRIVERS[row.protocol](row.operation)
    having = Names(uuid.uuid4().hex[:8])
    assert drive(braid, having, make_user(admin, row, having, lacking=False)), (
        f"{row.name}: refused with {row.permission} on {row.resource}"
    )
    lacking = Names(uuid.uuid4().hex[:8])
    actor = make_user(admin, row, lacking, lacking=True)
    assert not drive(braid, lacking, actor), f"{row.name}: allowed without {row.permission}"
    audit = re.compile(
        rf"access denied: protocol={row.protocol} .* user='{actor.user}' "
        rf"operation='{re.escape(row.name)}'"
    )
    assert audit.search(braid.stderr()), f"no audit line for {row.name}"


# -- the examples ------------------------------------------------------------------------


def test_alice_produces_to_her_topics_only_without_any_acl(
    braid: BraidProcess, admin: Admin
) -> None:
    name, password = f"alice{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    admin.user(name, password)
    admin.permit(name, configure=f"^{name}\\.", write=f"^{name}\\.", read=f"^{name}\\.")
    alice = Actor(name, password)
    guest = KafkaSession(braid, GUEST)
    for topic in (f"{name}.t", f"bob{name}.t"):
        create_topic(guest, topic)
    acls = guest.call(
        request(
            "DescribeAclsRequest",
            1,
            resource_type_filter=1,
            resource_name_filter=None,
            pattern_type_filter=1,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        )
    )
    guest.close()
    assert not [r for r in acls.resources if name in str(r)]  # no Kafka ACL for her
    assert produce(braid, alice, f"{name}.t") is None
    error = produce(braid, alice, f"bob{name}.t")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_private_vhosts_queue_is_refused_to_anonymous_clients(
    braid: BraidProcess, admin: Admin
) -> None:
    """The issue's example: an anonymous Kafka consumer reading, an anonymous MQTT client
    injecting into, and an anonymous Kafka DeleteTopics emptying vhost ``secret``'s queue
    ``payroll`` (log topic ``amq.vhost.secret.amq.queue.payroll``) are all refused."""
    owner = Actor(f"owner{uuid.uuid4().hex[:6]}", uuid.uuid4().hex)
    admin.user(owner.user, owner.password)
    admin._send("PUT", f"/permissions/secret/{owner.user}",
                {"configure": ".*", "write": ".*", "read": ".*"})  # fmt: skip
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, "secret",
            pika.PlainCredentials(owner.user, owner.password),
        )
    )  # fmt: skip
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("payroll", durable=True)
    channel.basic_publish("", "payroll", b"salaries")
    queue = "amq.vhost.secret.amq.queue.payroll"
    anonymous = Actor("", "")
    reader = KafkaSession(braid, anonymous)
    try:
        part = {"partition": 0, "fetch_offset": 0, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20}  # fmt: skip
        fetched = reader.call(
            request("FetchRequest", 4, replica_id=-1, max_wait_ms=0, min_bytes=0,
                    max_bytes=1 << 20, isolation_level=0,
                    topics=[{"topic": queue, "partitions": [part]}])
        )  # fmt: skip
        assert TOPIC_AUTHORIZATION_FAILED in error_codes(fetched), fetched
        assert b"salaries" not in repr(fetched).encode()
        deleted = reader.call(request("DeleteTopicsRequest", 1, topic_names=[queue],
                                      timeout_ms=10_000))  # fmt: skip
        assert TOPIC_AUTHORIZATION_FAILED in error_codes(deleted), deleted
    finally:
        reader.close()
    injector = MqttClient(braid.mqtt_port, anonymous)
    try:
        assert injector.connack == 0
        assert injector.publish(queue) == 0x87  # MQTT topic = that log topic, one level
    finally:
        injector.close()
    # The queue and its vhost are intact: the one message is still there, nothing injected.
    _method, _properties, body = channel.basic_get("payroll", auto_ack=True)
    assert body == b"salaries"
    assert channel.basic_get("payroll") == (None, None, None)
    connection.close()
    assert "vhost='secret' resource='queue payroll'" in braid.stderr()
