"""``braid serve --workers N``: the supervisor of docs/cluster.md section 9, end to end with real
processes: the supervisor, its private ``redis-server`` on ``ROOT/run/redis.sock``, its
workers (``braid serve --cluster ... --supervised``), and real clients (pika, kafka-python).

A root of one shard (multi-shard roots come with forwarding): worker 0 owns shard 0 and
serves every protocol on the shared ports, worker 1 is a standby. Kafka clients bootstrap on
the shared port and are told worker 0's own port (``--kafka-worker-port-base`` + 0). A worker
killed with SIGKILL is started again by the supervisor and claims its shard back at the next
epoch with every confirmed message there; SIGTERM stops workers, then Redis, exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from braid import workers
from tests.braid_process import REPO_ROOT, BraidProcess, free_ports
from tests.cluster.redis_server import RedisProcesses, RedisServer
from tests.cluster.test_node import (
    CLUSTER_CONFIG,
    DEADLINE_S,
    ConfirmedPublisher,
    braid,
    drain,
    eventually,
    make_root,
)

READY_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0


def free_port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free now: the two workers' Kafka ports."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no two consecutive free ports")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Supervisor:
    """``braid serve --workers 2 --shards 1`` (``shards``; None: no flag, the default) on
    free loopback ports."""

    def __init__(self, tmp_path: Path, root: Path, *extra: str, shards: int | None = 1) -> None:
        self.tmp_path = tmp_path
        self.root = root
        config = tmp_path / "braid.toml"
        config.write_text(CLUSTER_CONFIG)
        self.amqp_port, self.kafka_port, self.http_port = free_ports(3)
        self.kafka_base = free_port_pair()
        self.command = [
            sys.executable,
            "-m",
            "braid",
            "serve",
            "--workers",
            "2",
            *(() if shards is None else ("--shards", str(shards))),
            "--data-dir",
            str(root),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--amqp-port",
            str(self.amqp_port),
            "--mqtt-port",
            "0",
            "--mqtt-ws-port",
            "0",
            "--kafka-port",
            str(self.kafka_port),
            "--http-port",
            str(self.http_port),
            "--kafka-worker-port-base",
            str(self.kafka_base),
            *extra,
        ]
        self.stderr_path = tmp_path / "supervisor-stderr.log"
        self.process: subprocess.Popen[str] | None = None
        self.ready_line = ""

    def start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        with self.stderr_path.open("a") as stderr:
            self.process = process = subprocess.Popen(
                self.command,
                cwd=self.tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        return process

    def wait_ready(self) -> str:
        process = self.process
        assert process is not None
        assert process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith("braid ready"):
                self.ready_line = line.strip()
                return self.ready_line
            if not line and process.poll() is not None:
                break
        raise AssertionError(f"the supervisor did not get ready:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def kill(self) -> None:
        """Whatever a failed test left: the supervisor (its children get SIGTERM from the
        kernel: PR_SET_PDEATHSIG) and any worker still there."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(EXIT_TIMEOUT_S)


def status(root: Path) -> dict[str, Any]:
    """`braid cluster status ROOT --json`, without --cluster: the supervisor's Redis."""
    result = braid("cluster", "status", str(root), "--json")
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def nodes(root: Path) -> dict[str, dict[str, Any]]:
    return {node["node"]: node for node in status(root)["nodes"]}


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    running = Supervisor(tmp_path, tmp_path / "root")
    try:
        yield running
    finally:
        running.kill()


def test_workers_serve_restart_and_stop(supervisor: Supervisor) -> None:
    root = supervisor.root
    supervisor.start()
    line = supervisor.wait_ready()
    assert f"amqp=127.0.0.1:{supervisor.amqp_port}" in line
    assert f"kafka=127.0.0.1:{supervisor.kafka_port}" in line
    assert "workers=2" in line
    socket_path = root / "run" / "redis.sock"
    assert f"redis=unix://{socket_path}" in line
    assert socket_path.exists()
    assert json.loads((root / "cluster.json").read_text())["shards"] == 1

    # Both workers are nodes in the private Redis; worker 0 owns the shard.
    found = status(root)
    live = {node["node"]: node for node in found["nodes"]}
    assert set(live) == {"0", "1"}
    assert live["0"]["kafka"] == f"127.0.0.1:{supervisor.kafka_base}"
    assert live["1"]["kafka"] == f"127.0.0.1:{supervisor.kafka_base + 1}"
    assert (found["shards"][0]["owner"], found["shards"][0]["epoch"]) == ("0", 1)
    first_pid = live["0"]["pid"]
    process = supervisor.process
    assert process is not None
    assert int((root / "run" / "supervisor.pid").read_text()) == process.pid
    redis_pid = _redis_pid(socket_path)

    # AMQP on the shared port, with confirms.
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", supervisor.amqp_port, heartbeat=0)
    )
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("jobs", durable=True)
    for number in range(20):
        channel.basic_publish(
            "", "jobs", f"before-{number}".encode(), pika.BasicProperties(delivery_mode=2)
        )
    connection.close()

    # Kafka: bootstrap on the shared port; Metadata names worker 0's own port.
    bootstrap = f"127.0.0.1:{supervisor.kafka_port}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    assert [(b["host"], b["port"]) for b in brokers] == [("127.0.0.1", supervisor.kafka_base)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for number in range(10):
        producer.send("events", value=b"e%d" % number)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(
        "events",
        bootstrap_servers=bootstrap,
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
    assert values == {b"e%d" % number for number in range(10)}

    # SIGKILL worker 0 under a confirming publisher: the supervisor starts it again, it
    # claims shard 0 back at epoch 2, and nothing confirmed is lost.
    publisher = ConfirmedPublisher(supervisor, "", "jobs")  # type: ignore[arg-type]
    publisher.start()
    eventually(lambda: len(publisher.confirmed) >= 50, "50 confirmed publishes")
    os.kill(first_pid, signal.SIGKILL)
    assert publisher.ended.wait(DEADLINE_S)
    publisher.stopping.set()

    def restarted() -> bool:
        found = status(root)
        node = {n["node"]: n for n in found["nodes"]}.get("0")
        shard = found["shards"][0]
        return (
            node is not None
            and node["pid"] != first_pid
            and (shard["owner"], shard["epoch"], shard["state"]) == ("0", 2, "owned")
        )

    eventually(restarted, "worker 0 restarted, owning shard 0 at epoch 2")
    assert f"worker 0 (pid {first_pid}) exited on SIGKILL" in supervisor.stderr()
    bodies = eventually(lambda: drain(supervisor, "jobs"), "the queue served again")
    assert bodies[:20] == [f"before-{number}".encode() for number in range(20)]
    missing = set(publisher.confirmed) - set(bodies)
    assert not missing, f"{len(missing)} confirmed messages lost"
    worker_pids = [node["pid"] for node in status(root)["nodes"]]

    # SIGTERM: every worker stops cleanly (the epoch closed), then Redis; exit 0.
    process.send_signal(signal.SIGTERM)
    assert process.wait(EXIT_TIMEOUT_S) == 0, supervisor.stderr()
    assert not [pid for pid in (*worker_pids, redis_pid) if alive(pid)]
    assert not socket_path.exists()  # redis-server removes it as it shuts down
    assert (root / "shards/0000/epochs/00000000000000000002.closed").exists()
    assert not (root / "run" / "supervisor.pid").exists()


def _redis_pid(socket_path: Path) -> int:
    import redis

    client = redis.Redis(unix_socket_path=str(socket_path))
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_two_workers_share_the_default_sixteen_shards(tmp_path: Path) -> None:
    """``--workers 2`` on a root of the default 16 shards: each worker serves 8; a Kafka
    topic of 16 partitions has leaders on both, and what a producer on the shared port sends
    is read back, every partition's in order."""
    supervisor = Supervisor(tmp_path, tmp_path / "root", shards=None)
    try:
        supervisor.start()
        supervisor.wait_ready()
        assert json.loads((supervisor.root / "cluster.json").read_text())["shards"] == 16
        found = status(supervisor.root)
        owners = [shard["owner"] for shard in found["shards"]]
        assert len(owners) == 16
        assert sorted(owners.count(node) for node in ("0", "1")) == [8, 8]
        bootstrap = f"127.0.0.1:{supervisor.kafka_port}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([NewTopic("w.events", num_partitions=16, replication_factor=1)])
        finally:
            admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            sent = [producer.send("w.events", value=b"%d" % n, partition=n % 16) for n in range(64)]
            producer.flush(timeout=60)
            leaders = {f.get(timeout=60).partition for f in sent}
        finally:
            producer.close()
        assert leaders == set(range(16))
        consumer = KafkaConsumer(
            "w.events",
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=15000,
        )
        try:
            got: dict[int, list[int]] = {}
            for message in consumer:
                got.setdefault(message.partition, []).append(int(message.value))
                if sum(len(values) for values in got.values()) == 64:
                    break
        finally:
            consumer.close()
        assert got == {p: [n for n in range(64) if n % 16 == p] for p in range(16)}
    finally:
        if supervisor.process is not None and supervisor.process.poll() is None:
            supervisor.process.send_signal(signal.SIGTERM)
            assert supervisor.process.wait(EXIT_TIMEOUT_S) == 0
        supervisor.kill()


def test_a_worker_refused_at_start_stops_the_supervisor(supervisor: Supervisor) -> None:
    """Worker 0 cannot bind the AMQP port (a plain socket holds it, without SO_REUSEPORT): it
    exits 1 before its ready line, and the supervisor stops everything and exits 1 with its
    message instead of restarting it for ever."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", supervisor.amqp_port))
        holder.listen()
        process = supervisor.start()
        assert process.wait(EXIT_TIMEOUT_S) == 1
    stderr = supervisor.stderr()
    assert "worker 0 refused to start (exit 1)" in stderr
    assert f"cannot listen for amqp on 127.0.0.1:{supervisor.amqp_port}" in stderr
    assert "restarting" not in stderr
    assert "private redis-server stopped" in stderr
    assert not (supervisor.root / "run" / "redis.sock").exists()


def test_supervisor_settings_refused() -> None:
    """What names one process's own id or port is refused with --workers (exit 2)."""
    refused = braid("serve", "--workers", "2", "--node-id", "1", "--data-dir", "unused")
    assert refused.returncode == 2
    assert "the supervisor numbers its workers 0..1" in refused.stderr
    refused = braid("serve", "--workers", "2", "--kafka-advertised-port", "9", "--data-dir", "x")
    assert refused.returncode == 2
    assert "worker i advertises its own" in refused.stderr
    assert workers.worker_arguments(
        ["serve", "--workers", "2", "--shards=1", "--wor", "3", "--data-dir", "r"]
    ) == ["serve", "--data-dir", "r"]


# -- SO_REUSEPORT between two processes --------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    processes = RedisProcesses(tmp_path_factory.mktemp("redis"))
    try:
        yield processes.redis()
    finally:
        processes.stop()


def test_supervised_workers_share_a_port(tmp_path: Path, redis_server: RedisServer) -> None:
    """Two supervised workers bind one AMQP port (SO_REUSEPORT): here the owners of two
    one-shard roots, so both listen, and the kernel hands connections to each (a queue only
    one of them has is found on some connections, 404 NOT_FOUND on others)."""
    (amqp_port,) = free_ports(1)
    config = tmp_path / "braid.toml"
    config.write_text(CLUSTER_CONFIG)
    started: list[BraidProcess] = []
    try:
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            process = BraidProcess(
                directory,
                listeners=(),
                data_dir=make_root(directory / "root"),
                extra_args=(
                    "--config",
                    str(config),
                    "--cluster",
                    redis_server.url,
                    "--node-id",
                    "0",
                    "--supervised",
                    "--kafka-worker-port-base",
                    "0",
                    "--amqp-port",
                    str(amqp_port),
                ),
            )
            started.append(process.start())
            assert f"amqp=127.0.0.1:{amqp_port}" in process.ready_line
        first = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
        first.channel().queue_declare("only-here", durable=True)
        first.close()
        answers = set()
        for _ in range(40):
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
            try:
                connection.channel().queue_declare("only-here", passive=True)
                answers.add("found")
            except pika.exceptions.ChannelClosedByBroker as error:
                answers.add(f"closed {error.reply_code}")
            finally:
                if connection.is_open:
                    connection.close()
            if len(answers) == 2:
                break
        assert answers == {"found", "closed 404"}
    finally:
        for process in started:
            assert process.stop() == 0
