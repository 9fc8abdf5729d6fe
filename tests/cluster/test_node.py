"""``braid serve --cluster URL --node-id ID --data-dir ROOT``: a cluster node on a data root of one
shard (docs/cluster.md section 15 steps 4-5), end to end: a real redis-server, real ``braid
serve`` processes (tests/braid_process.py), real clients (pika, kafka-python, paho).

The node that owns shard 0 serves every protocol with the cluster-wide definitions in Redis
(read back here with redis-py) and the data in ``ROOT/shards/0000``; ``braid cluster status``
shows its epoch, which a restart after ``kill -9`` raises; a second node on the root is a
standby without listeners; the wrong directories are refused with their messages.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from paho.mqtt.enums import CallbackAPIVersion

from braid import config
from core.log import LogConfig, LogStore
from tests.braid_process import REPO_ROOT, BraidProcess
from tests.cluster.redis_server import RedisProcesses, RedisServer, until

# Short leases (docs/cluster.md section 14's): a restarted node waits for its killed
# predecessor's lease, and a paused one is fenced after lease_ms; long enough that a loaded
# 2-core box does not fence a node by a slow loop turn.
LEASE_MS = 3000
# Takeover off: these tests expect a stopped node's shard to wait for it (issue 22).
CLUSTER_CONFIG = f"[cluster]\nlease_ms = {LEASE_MS}\nheartbeat_ms = 500\ntakeover = false\n"
DEADLINE_S = 30.0
COMMAND_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    processes = RedisProcesses(tmp_path_factory.mktemp("redis"))
    try:
        yield processes.redis()
    finally:
        processes.stop()


def braid(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "braid", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def make_root(path: Path, shards: int = 1) -> Path:
    result = braid("cluster", "init", str(path), "--shards", str(shards))
    assert result.returncode == 0, result.stderr
    return path


def cluster_id(root: Path) -> str:
    return str(json.loads((root / "cluster.json").read_text())["cluster_id"])


def node(
    tmp_path: Path, name: str, root: Path, url: str, node_id: int, *extra_args: str
) -> BraidProcess:
    """A ``braid serve --cluster`` node (not started) with the module's ``[cluster]`` settings;
    ``extra_args`` go after the cluster flags."""
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    config = directory / "braid.toml"
    config.write_text(CLUSTER_CONFIG)
    return BraidProcess(
        directory,
        listeners=("amqp", "mqtt", "kafka"),
        data_dir=root,
        extra_args=(
            "--config",
            str(config),
            "--cluster",
            url,
            "--node-id",
            str(node_id),
            "--advertised-host",
            "127.0.0.1",
            *extra_args,
        ),
    )


def status(root: Path, url: str) -> dict[str, Any]:
    result = braid("cluster", "status", "--cluster", url, str(root), "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def shard0(root: Path, url: str) -> dict[str, Any]:
    found: dict[str, Any] = status(root, url)["shards"][0]
    return found


def definitions(server: RedisServer, root: Path, kind: str) -> dict[bytes, bytes]:
    with server.client() as client:
        found: dict[bytes, bytes] = client.hgetall(f"braid:{cluster_id(root)}:def:{kind}")
        return found


def amqp(process: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", process.amqp_port, heartbeat=0)
    )


def drain(process: BraidProcess, queue_name: str) -> list[bytes]:
    """Every message of ``queue_name`` (acked), until it is empty."""
    connection = amqp(process)
    try:
        channel = connection.channel()
        bodies: list[bytes] = []
        while True:
            method, _, body = channel.basic_get(queue_name, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
    finally:
        connection.close()


class ConfirmedPublisher(threading.Thread):
    """Publishes numbered persistent messages with confirms until its connection breaks (or
    ``stop``); ``confirmed`` holds the bodies the broker confirmed."""

    def __init__(self, process: BraidProcess, exchange: str, routing_key: str) -> None:
        super().__init__(daemon=True)
        self.connection = amqp(process)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.exchange = exchange
        self.routing_key = routing_key
        self.confirmed: list[bytes] = []
        self.stopping = threading.Event()
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            number = 0
            while not self.stopping.is_set():
                body = f"load-{number}".encode()
                self.channel.basic_publish(
                    self.exchange,
                    self.routing_key,
                    body,
                    pika.BasicProperties(delivery_mode=2),
                )
                self.confirmed.append(body)  # basic_publish returned: confirmed (acked)
                number += 1
        except Exception:  # the broker went away mid-publish: that one is not confirmed
            pass
        finally:
            self.ended.set()


def eventually(check: Any, what: str) -> Any:
    """``check()``'s first true result, retried (errors too: a node not serving yet) until
    :data:`DEADLINE_S`."""
    end = time.monotonic() + DEADLINE_S
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            result = check()
        except Exception as error:
            last = error
        else:
            if result:
                return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (EOF, or a reset: Kafka's listener aborts)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# -- settings --------------------------------------------------------------------------------


def test_cluster_settings_from_file_and_flags() -> None:
    """[cluster] holds url, node_id, advertised_host, secret and ClusterSettings' fields; the
    flags override it; wrong values are named."""
    settings = config.settings_from_mapping(
        {"cluster": {"url": "redis://h:6379", "node_id": 3, "lease_ms": 3000, "secret": "s"}},
        "braid.toml",
    )
    assert settings.cluster.enabled
    assert (settings.cluster.node_id, settings.cluster.secret) == (3, "s")
    assert settings.cluster.settings().lease_ms == 3000
    flagged = config.override(
        settings, cluster={"node_id": 4, "expect_nodes": 2, "cluster_port": None}
    )
    assert flagged.cluster.node_id == 4
    assert flagged.cluster.settings().expect_nodes == 2
    assert flagged.cluster.settings().lease_ms == 3000
    assert not config.ServerSettings().cluster.enabled
    with pytest.raises(config.ConfigError, match=r"\[cluster\] nope: unknown key"):
        config.settings_from_mapping({"cluster": {"nope": 1}}, "t")
    with pytest.raises(config.ConfigError, match="must be below lease_ms"):
        config.settings_from_mapping({"cluster": {"lease_ms": 100}}, "t")
    with pytest.raises(config.ConfigError, match="node id is an integer"):
        config.settings_from_mapping({"cluster": {"url": "redis://h", "node_id": -1}}, "t")
    with pytest.raises(config.ConfigError, match="needs its node_id"):
        config.settings_from_mapping({"cluster": {"url": "redis://h"}}, "t")


# -- refusals --------------------------------------------------------------------------------


def serve_refusal(data_dir: Path, url: str) -> subprocess.CompletedProcess[str]:
    return braid(
        "serve",
        "--cluster",
        url,
        "--node-id",
        "1",
        "--data-dir",
        str(data_dir),
        "--host",
        "127.0.0.1",
        "--amqp-port",
        "0",
        "--mqtt-port",
        "0",
        "--mqtt-ws-port",
        "0",
        "--kafka-port",
        "0",
        "--http-port",
        "0",
    )


def test_refusals(tmp_path: Path, redis_server: RedisServer) -> None:
    """`--cluster` on a single-node directory says to adopt it; an adopted root of several
    shards is refused until forwarding exists (its old definitions are not placed yet); a
    directory that is not a root says how to make one; --node-id is required. Nothing is
    registered in Redis by a refused start."""
    single = tmp_path / "single"
    LogStore(LogConfig(single)).close()  # a real single-node data directory (log.json)
    refused = serve_refusal(single, redis_server.url)
    assert refused.returncode == 1
    assert f"run `braid cluster init --adopt {single}`" in refused.stderr
    assert not (single / "cluster.json").exists()

    multi = tmp_path / "multi"
    LogStore(LogConfig(multi)).close()
    adopted = braid("cluster", "init", str(multi), "--adopt", "--shards", "2")
    assert adopted.returncode == 0, adopted.stderr
    refused = serve_refusal(multi, redis_server.url)
    assert refused.returncode == 1
    assert "an adopted root's definitions are not placed in many shards yet" in refused.stderr

    refused = serve_refusal(tmp_path / "nothing", redis_server.url)
    assert refused.returncode == 1
    assert "is not a cluster data root" in refused.stderr
    assert "braid cluster init" in refused.stderr

    usage = braid("serve", "--cluster", redis_server.url, "--data-dir", str(multi))
    assert usage.returncode == 2
    assert "node_id" in usage.stderr
    with redis_server.client() as client:
        assert client.keys(f"braid:{cluster_id(multi)}:*") == []


# -- one node serving a one-shard root --------------------------------------------------------


def test_node_serves_its_shard(tmp_path: Path, redis_server: RedisServer) -> None:
    url = redis_server.url
    root = make_root(tmp_path / "root")
    first = node(tmp_path, "n1", root, url, 1).start()
    try:
        assert "node=1 shards=0" in first.ready_line
        owner = shard0(root, url)
        assert (owner["owner"], owner["epoch"], owner["state"]) == ("1", 1, "owned")

        # AMQP: definitions through pika, in Redis afterwards.
        connection = amqp(first)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("orders.eu", durable=True)
        channel.queue_bind("orders.eu", "orders", "eu")
        for number in range(20):
            channel.basic_publish(
                "orders", "eu", f"before-{number}".encode(), pika.BasicProperties(delivery_mode=2)
            )
        connection.close()
        assert b"orders" in definitions(redis_server, root, "topic")
        assert any(b"orders.eu" in key for key in definitions(redis_server, root, "queue"))
        bindings = [json.loads(key) for key in definitions(redis_server, root, "binding")]
        assert any(b[0] == "orders" and b[2] == "eu" for b in bindings)
        assert b'["user", "guest"]' in definitions(redis_server, root, "security")

        # Kafka: a topic created by an admin client, produced and consumed.
        admin = KafkaAdminClient(bootstrap_servers=first.kafka_bootstrap)
        admin.create_topics([NewTopic("metrics", num_partitions=2, replication_factor=1)])
        admin.close()
        assert json.loads(definitions(redis_server, root, "topic")[b"metrics"])["queues"] == 2
        producer = KafkaProducer(bootstrap_servers=first.kafka_bootstrap, acks="all")
        for number in range(10):
            producer.send("metrics", key=b"k%d" % number, value=b"v%d" % number)
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(
            "metrics",
            bootstrap_servers=first.kafka_bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=int(DEADLINE_S * 1000),
            group_id=None,
        )
        values = set()
        for record in consumer:
            values.add(record.value)
            if len(values) == 10:
                break
        consumer.close()
        assert values == {b"v%d" % number for number in range(10)}

        # MQTT: a QoS 1 round trip.
        got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="node-test")
        client.on_message = lambda _c, _u, message: got.put(message)
        client.connect("127.0.0.1", first.mqtt_port)
        client.loop_start()
        try:
            client.subscribe("sensors/#", qos=1)[1]
            time.sleep(0.2)  # the SUBACK; a publish before it would not match yet
            client.publish("sensors/1", b"21.5", qos=1).wait_for_publish(DEADLINE_S)
            message = got.get(timeout=DEADLINE_S)
        finally:
            client.loop_stop()
            client.disconnect()
        assert (message.topic, message.payload, message.qos) == ("sensors/1", b"21.5", 1)

        # kill -9 while a publisher waits for confirms: nothing it saw confirmed is lost.
        publisher = ConfirmedPublisher(first, "orders", "eu")
        publisher.start()
        until(lambda: len(publisher.confirmed) >= 50, DEADLINE_S, "50 confirmed publishes")
        first.kill9()
        assert publisher.ended.wait(DEADLINE_S)
        publisher.stopping.set()
        first.start()  # waits for the killed incarnation's lease to expire
        owner = shard0(root, url)
        assert (owner["owner"], owner["epoch"], owner["state"]) == ("1", 2, "owned")
        bodies = drain(first, "orders.eu")  # the queue and its messages: Redis and the shard
        assert bodies[:20] == [f"before-{number}".encode() for number in range(20)]
        missing = set(publisher.confirmed) - set(bodies)
        assert not missing, f"{len(missing)} confirmed messages lost"
        assert len(bodies) == len(set(bodies))

        # The binding came back from Redis: a publish routes again.
        connection = amqp(first)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare("orders", "direct", durable=True, passive=True)
        channel.basic_publish("orders", "eu", b"after", pika.BasicProperties(delivery_mode=2))
        connection.close()
        assert drain(first, "orders.eu") == [b"after"]

        # A second node on the root owns nothing: a standby, no listeners.
        standby = node(tmp_path, "n2", root, url, 2).start()
        try:
            assert "node=2 shards=none" in standby.ready_line
            assert "amqp=- mqtt=- mqtt-ws=- kafka=- http=-" in standby.ready_line
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", standby.amqp_port), timeout=5).close()
            found = status(root, url)
            assert {n["node"] for n in found["nodes"]} == {"1", "2"}
            assert found["shards"][0]["owner"] == "1"
            assert "owns no shard: standby" in standby.stderr()
        finally:
            assert standby.stop() == 0

        # A clean stop: the epoch marked closed and the lease released.
        assert first.stop() == 0
        assert (root / "shards/0000/epochs/00000000000000000002.closed").exists()
        assert "1" not in {n["node"] for n in status(root, url)["nodes"]}
    finally:
        first.kill9()


def test_adopted_root_copies_definitions_once(tmp_path: Path, redis_server: RedisServer) -> None:
    """A single-node directory's queue, exchange, binding and users survive `braid cluster
    init --adopt` and a cluster start: copied into Redis once, with the shard's messages."""
    data = tmp_path / "data"
    single = BraidProcess(tmp_path, listeners=("amqp",), data_dir=data).start()
    try:
        connection = amqp(single)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare("legacy", "fanout", durable=True)
        channel.queue_declare("legacy.q", durable=True)
        channel.queue_bind("legacy.q", "legacy")
        channel.basic_publish("legacy", "", b"old", pika.BasicProperties(delivery_mode=2))
        connection.close()
    finally:
        assert single.stop() == 0
    adopted = braid("cluster", "init", str(data), "--adopt", "--shards", "1")
    assert adopted.returncode == 0, adopted.stderr
    url = redis_server.url
    first = node(tmp_path, "n1", data, url, 1).start()
    try:
        assert b"legacy" in definitions(redis_server, data, "topic")
        marker = json.loads(definitions(redis_server, data, "adoption")[b"definitions_copied"])
        assert marker["copied"] >= 4  # exchange, queue, binding, users...
        assert "copied" in first.stderr()
        connection = amqp(first)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("legacy", "", b"new", pika.BasicProperties(delivery_mode=2))
        connection.close()
        assert drain(first, "legacy.q") == [b"old", b"new"]
        first.restart()
        # Once: the restart copies nothing (the marker is there).
        assert first.stderr().count("definitions of the adopted shard") == 1
    finally:
        first.kill9()


def test_fenced_node_closes_connections_and_rejoins(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A node paused past its lease (SIGSTOP) fences itself when it wakes: its clients are
    disconnected (AMQP 320 CONNECTION_FORCED, MQTT 5 DISCONNECT 0x8B, Kafka's socket closed),
    the shard is dropped without writing, and the node rejoins at the next epoch and serves
    again with nothing confirmed lost."""
    url = redis_server.url
    root = make_root(tmp_path / "root")
    first = node(tmp_path, "n1", root, url, 1).start()
    try:
        connection = amqp(first)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("paused", durable=True)
        for number in range(10):
            body = b"%d" % number
            channel.basic_publish("", "paused", body, pika.BasicProperties(delivery_mode=2))
        disconnects: queue.Queue[int] = queue.Queue()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="paused", protocol=mqtt.MQTTv5)
        client.on_disconnect = lambda _c, _u, _f, reason, _p: disconnects.put(reason.value)
        client.connect("127.0.0.1", first.mqtt_port)
        client.loop_start()
        kafka = socket.create_connection(("127.0.0.1", first.kafka_port), timeout=DEADLINE_S)
        try:
            assert first.process is not None
            first.process.send_signal(signal.SIGSTOP)
            time.sleep(LEASE_MS / 1000 + 0.5)  # past lease_ms: the lease expires in Redis
            first.process.send_signal(signal.SIGCONT)
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                connection.sleep(DEADLINE_S)  # processes events: the broker's Connection.Close
            assert closed.value.reply_code == 320
            assert disconnects.get(timeout=DEADLINE_S) == 0x8B  # Server shutting down
            assert closed_by_peer(kafka)
        finally:
            kafka.close()
            client.loop_stop()
        until(lambda: shard0(root, url)["epoch"] == 2, DEADLINE_S, "the shard at epoch 2")
        until(lambda: "shard 0 open at epoch 2" in first.stderr(), DEADLINE_S, "serving again")
        assert "fenced" in first.stderr()
        bodies = eventually(lambda: drain(first, "paused"), "the queue served again")
        assert bodies == [b"%d" % number for number in range(10)]
        assert first.stop() == 0
    finally:
        first.kill9()
