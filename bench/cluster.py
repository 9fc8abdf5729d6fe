"""``python -m bench cluster``: throughput and broker CPU per message for 1, 2, ... workers
(issue 22; docs/cluster.md step 11), and the cost of a cross-node AMQP publish beside a local one.

For each N of ``--workers`` (default ``1,2``) the bench starts ``braid serve --workers N --shards
S --data-dir TMP`` on free loopback ports (``--workers 1`` is the single node, one process, the
baseline; N > 1 is the supervisor of ``braid/workers.py`` with N workers sharing the listeners'
ports through SO_REUSEPORT and a private ``redis-server``), waits until every shard is owned
(``braid cluster status --json``), and runs, each bounded:

- ``amqp``: the workload of ``bench amqp`` (persistent publishes with confirms, window
  ``--window``, a consumer with prefetch 100 and a manual ack each), on ``--amqp-queues`` queues at
  once, one producer and one consumer connection per queue (``bench.amqp.run_once``'s raw-socket
  client). Queue i is named so that its shard is owned by worker ``i % N``;
- ``mqtt-qos0``, ``mqtt-qos1``: the workload of ``bench mqtt`` (``bench.mqtt.LoadRun``: one
  publisher and one subscriber connection, closed loop, window ``--window``) for ``--mqtt-seconds``.
  Which worker a connection lands on is the kernel's draw (SO_REUSEPORT; the workers have no MQTT
  port of their own), and on different workers every message crosses a node (``Fanout``), so a
  cluster runs every landing case in turn: publisher on worker p, subscriber on worker s, for each
  p and s owning shards (``mqtt-qos0 p->s``, connections opened, and the others closed, until one
  lands there, found from the workers' sockets). The ``mqtt-qos0`` row and the gate use the mean
  of the cases' CPU per message (its msgs/s: all the cases' messages over their time);
- ``kafka-produce``, ``kafka-fetch``: the lean producer of ``bench kafka``
  (``bench/kafka_load.py``, its own process per topic: Produce v7, ``acks=-1``, one pre-built
  batch per request, 5 in flight) writing ``--kafka-records`` records in all to
  ``--kafka-topics`` one-partition topics at once (the lean producer writes partition 0; the
  topics, named so that their shards are owned by every worker in turn, are the partitioned
  load), each to its leader's own Kafka port; then the records fetched back, topic after topic,
  with ``bench.kafka.consume`` (confluent-kafka).

Broker CPU is read from ``/proc/<pid>/stat`` (utime + stime, every thread) of the workers and the
private ``redis-server`` right before and after the timed part of each point (the supervisor, which
only relays the workers' log lines, is left out). CPU per message = broker CPU seconds / messages.
The gate of the issue (the load client shares the 2 cores, so throughput cannot scale there):
the broker's CPU per message with 2 workers over that of the single node, <= 1.25, per workload
(for MQTT: the mean of the landing cases, each of which is also shown against the single node).

The cross-node cost (N >= 2): one AMQP connection, the worker it landed on found from the
workers' sockets; persistent publishes with confirms (no consumer) to a queue whose shard that
worker owns, then to one another worker owns (forwarded: ``Append`` over gRPC), alternating
``--rounds`` times; names picked by ``core/cluster/placement.py``, owners from ``braid cluster
status --json``, the shard checked against the placement recorded in Redis.

Output: the table (markdown) on stdout and a JSON file, ``results/cluster-<time>.json`` unless
``--out`` says where. ``--quick``: a short run (about a quarter of the volume).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import psutil
from pamqp import commands

from bench import amqp as amqp_bench
from bench import kafka as kafka_bench
from bench import mqtt as mqtt_bench
from core.cluster import placement

REPO: Final = Path(__file__).resolve().parents[1]
DEFAULT_WORKERS: Final = (1, 2)
DEFAULT_SHARDS: Final = 16
SIZE: Final = 100  # body / payload / record value bytes: bench amqp/mqtt/kafka's small size
WINDOW: Final = 1000  # unconfirmed AMQP publishes, MQTT messages in flight (as bench amqp/mqtt)
AMQP_QUEUES: Final = 4
AMQP_MESSAGES: Final = 40_000  # in all, over the queues
QUICK_AMQP_MESSAGES: Final = 10_000
AMQP_WARMUP_MESSAGES: Final = 1_000  # per queue, before the timed run
MQTT_SECONDS: Final = 3.0
QUICK_MQTT_SECONDS: Final = 1.0
KAFKA_TOPICS: Final = 4
# Produced in all, over the topics: the lean producer writes ~1M records/s here, and the broker
# spends ~0.5 us on each, so it takes this many for a few seconds and enough 10 ms CPU ticks.
KAFKA_RECORDS: Final = 2_000_000
QUICK_KAFKA_RECORDS: Final = 400_000
# Fetched back in all (the first of each topic's records): confluent-kafka reads ~100k/s here.
KAFKA_FETCH_RECORDS: Final = 400_000
QUICK_KAFKA_FETCH_RECORDS: Final = 100_000
KAFKA_PER_BATCH: Final = 1_000  # records per Produce request (bench.kafka_load's default)
CROSS_MESSAGES: Final = 20_000  # per cross-node round and queue
QUICK_CROSS_MESSAGES: Final = 5_000
CROSS_ROUNDS: Final = 2
# After an MQTT SUBSCRIBE on a cluster: a probe every ROUTE_PROBE_S until one arrives.
ROUTE_PROBE_S: Final = 0.1
ROUTE_TIMEOUT_S: Final = 30.0
IDLE_SETTLE_S: Final = 1.0  # after start, before the broker's idle CPU is read
# Then, until a half second's broker CPU stays below this share of a core (bounded): start-up
# work in the background (each process resolves its ~130 Kafka request schemas in a thread,
# ~0.5 s of CPU) read as idle CPU, or inside the first point, was neither.
SETTLE_WINDOW_S: Final = 0.5
SETTLED_RATE: Final = 0.1
SETTLE_TIMEOUT_S: Final = 30.0
IDLE_S: Final = 3.0  # how long the idle CPU is read (10 ms ticks: +-0.3% of a core)
QUICK_IDLE_S: Final = 1.0
# Connections opened, at most, until a worker owning shards holds one (SO_REUSEPORT spreads them
# by a hash of the addresses; only with fewer shards than workers does one miss).
CONNECT_ATTEMPTS: Final = 40
# The gate of issue 22: a worker of a 2-worker broker spends at most this much CPU per message
# as the single node does.
GATE_RATIO: Final = 1.25
# Starts of the broker, each on new ports, when one found a port taken (see running_broker).
START_ATTEMPTS: Final = 3
PORT_TAKEN: Final = "address already in use"  # in a listener's error line (braid/server.py)
START_TIMEOUT_S: Final = 120.0  # a supervisor opening 16 shards on a loaded 2-core machine
STOP_TIMEOUT_S: Final = 60.0  # the supervisor's own wait for a worker is 60 s
STEP_TIMEOUT_S: Final = 120.0
# Worker lease as the cluster tests use it (tests/cluster/test_node.py): renewals every 0.5 s.
CLUSTER_CONFIG: Final = "[cluster]\nlease_ms = 5000\nheartbeat_ms = 500\n"
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
QUEUE_TOPIC_PREFIX: Final = "amq.queue."  # gateway/amqp/vhost.py: queue q of "/" is this + q
VHOST: Final = "/"
OWNED: Final = "owned"
WORKLOADS: Final = (
    "amqp",
    "mqtt",
    "kafka",
    "cross",
)  # braid/cluster_cli.py's state of a shard served by its owner

T = TypeVar("T")


# -- ports and processes -----------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, all held open while choosing."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port_run(count: int) -> int:
    """A port ``p`` with ``p .. p + count - 1`` all free now: the workers' own Kafka ports."""
    for _ in range(200):
        base = free_ports(1)[0]
        if base + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) from ``/proc/<pid>/stat``, in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        raise RuntimeError(f"broker process {pid} is gone: the point is void") from None
    # Fields 14 and 15 (utime, stime); the command name in parentheses may hold spaces.
    fields = text.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def env_with_repo() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )


# -- the broker under test ---------------------------------------------------------------------


@dataclass
class Broker:
    """A running ``braid serve --workers N``: its ports, processes and shard owners."""

    workers: int
    shards: int  # 1 for the single node: one log holds everything
    workdir: Path
    process: subprocess.Popen[bytes]
    amqp_port: int
    mqtt_port: int
    kafka_port: int
    kafka_base: int
    worker_pids: dict[int, int] = field(default_factory=dict)  # node id -> pid
    redis_pid: int | None = None
    cluster_id: str = ""
    redis_socket: str = ""  # the private Redis' socket, from the supervisor's ready line
    owners: dict[int, int] = field(default_factory=dict)  # shard -> node id
    kafka_addresses: dict[int, str] = field(default_factory=dict)  # node id -> host:port
    started: list[int] = field(default_factory=list)  # every pid this bench started

    @property
    def root(self) -> Path:
        return self.workdir / "root"

    @property
    def cluster(self) -> bool:
        return self.workers > 1

    def pids(self) -> list[int]:
        """The broker's processes whose CPU counts: the workers and the private Redis."""
        found = list(self.worker_pids.values())
        if self.redis_pid is not None:
            found.append(self.redis_pid)
        return found

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(pid) for pid in self.pids())

    def owner_of(self, shard: int) -> int:
        return self.owners[shard] if self.cluster else 0

    def shards_of(self, node: int) -> list[int]:
        if not self.cluster:
            return [0]
        return sorted(shard for shard, owner in self.owners.items() if owner == node)

    def serving(self) -> list[int]:
        """The workers that own shards (with fewer shards than workers, the others stand by)."""
        if not self.cluster:
            return [0]
        return sorted(set(self.owners.values()))

    def kafka_address(self, node: int) -> str:
        if not self.cluster:
            return f"127.0.0.1:{self.kafka_port}"
        return self.kafka_addresses[node]

    def node_of(self, client_port: int, server_port: int) -> int:
        """The worker holding the server end of the loopback connection from ``client_port``
        to ``server_port`` (SO_REUSEPORT lets the kernel pick one)."""
        if not self.cluster:
            return 0
        for node, pid in self.worker_pids.items():
            for connection in psutil.Process(pid).net_connections(kind="tcp"):
                if (
                    connection.laddr
                    and connection.raddr
                    and connection.laddr.port == server_port
                    and connection.raddr.port == client_port
                ):
                    return node
        raise RuntimeError(f"no worker holds the connection from port {client_port}")

    def status(self) -> dict[str, Any]:
        """``braid cluster status --cluster URL ROOT --json``: the supervisor's Redis, read
        only (named, since a long ROOT moves its socket out of ROOT/run)."""
        command = [sys.executable, "-m", "braid", "cluster", "status", str(self.root), "--json"]
        done = subprocess.run(
            [*command, "--cluster", f"unix://{self.redis_socket}"],
            env=env_with_repo(),
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"braid cluster status: {done.stderr.strip()}")
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    def recorded_queue_shard(self, name: str) -> int | None:
        """The shard Redis records for AMQP queue ``name`` of "/" (``place:partition`` of its
        topic, or ``place:queue``), None when none is recorded."""
        if not self.cluster:
            return None
        import redis

        client = redis.Redis(unix_socket_path=self.redis_socket)
        try:
            prefix = f"braid:{self.cluster_id}:place:"
            for kind, key in (
                (placement.PLACE_PARTITION, placement.partition_key(QUEUE_TOPIC_PREFIX + name, 0)),
                (placement.PLACE_QUEUE, placement.queue_key(VHOST, name)),
            ):
                value = client.hget(prefix + kind, key)
                if value is not None:
                    return int(value)
            return None
        finally:
            client.close()

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "braid.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _read_ready_line(broker: Broker, deadline: float) -> str:
    stdout = broker.process.stdout
    assert stdout is not None
    while time.monotonic() < deadline:
        readable, _, _ = select.select([stdout], [], [], 0.5)
        if readable:
            line = stdout.readline().decode(errors="replace")
            if line.startswith("braid ready"):
                return line.strip()
            if not line:
                break
        if broker.process.poll() is not None:
            break
        if PORT_TAKEN in broker.log_tail():  # the supervisor goes on without that worker
            raise PortTaken(f"braid serve --workers {broker.workers}:\n{broker.log_tail(8)}")
    raise RuntimeError(
        f"braid serve --workers {broker.workers} did not get ready (exit "
        f"{broker.process.poll()}):\n{broker.log_tail()}"
    )


def _wait_owned(broker: Broker, deadline: float) -> dict[str, Any]:
    """The status once every worker is live and every shard owned."""
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = broker.status()
        owned = all(shard["state"] == OWNED for shard in found["shards"])
        if owned and len(found["nodes"]) == broker.workers:
            return found
        time.sleep(0.5)
    raise RuntimeError(f"shards not all owned by {broker.workers} workers in time: {found}")


class PortTaken(RuntimeError):
    """A port chosen free was taken by another process before the broker bound it."""


@contextlib.contextmanager
def running_broker(workdir: Path, workers: int, shards: int) -> Iterator[Broker]:
    """``braid serve --workers N --shards S --data-dir workdir/root`` on free ports; stopped
    (SIGTERM, then SIGKILL of what this bench started) on the way out. A port taken between
    its choice and the bind (the machine's other processes) costs a new start on new ports in
    a fresh directory, :data:`START_ATTEMPTS` times at most."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            broker = _start_broker(workdir, workers, shards)
            break
        except PortTaken as taken:
            print(f"attempt {attempt}: {taken}", file=sys.stderr, flush=True)
            if attempt == START_ATTEMPTS:
                raise
            shutil.rmtree(workdir, ignore_errors=True)
    try:
        yield broker
    finally:
        _stop(broker)


def _start_broker(workdir: Path, workers: int, shards: int) -> Broker:
    """Start the broker and wait until every shard is owned; stopped again if that fails
    (:class:`PortTaken` when a listener found its port taken)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "braid.toml"
    config.write_text(CLUSTER_CONFIG)
    amqp_port, mqtt_port, kafka_port = free_ports(3)
    kafka_base = free_port_run(workers)
    command = [sys.executable, "-m", "braid", "serve", "--workers", str(workers)]
    command += ["--shards", str(shards), "--data-dir", str(workdir / "root")]
    command += ["--config", str(config), "--host", "127.0.0.1", "--log-level", "warning"]
    command += ["--amqp-port", str(amqp_port), "--mqtt-port", str(mqtt_port)]
    command += ["--kafka-port", str(kafka_port), "--mqtt-ws-port", "0", "--http-port", "0"]
    command += ["--kafka-worker-port-base", str(kafka_base)]
    with (workdir / "braid.log").open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env_with_repo(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
        )
    broker = Broker(
        workers,
        shards if workers > 1 else 1,
        workdir,
        process,
        amqp_port,
        mqtt_port,
        kafka_port,
        kafka_base,
        started=[process.pid],
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = _read_ready_line(broker, deadline)
        if broker.cluster:
            redis_url = next(
                (part[len("redis=") :] for part in ready.split() if part.startswith("redis=")), ""
            )
            if not redis_url.startswith("unix://"):
                raise RuntimeError(f"no private Redis in the ready line: {ready}")
            broker.redis_socket = redis_url[len("unix://") :]
            found = _wait_owned(broker, deadline)
            broker.cluster_id = found["cluster_id"]
            broker.owners = {
                shard["shard"]: int(shard["owner"]) for shard in found["shards"] if shard["owner"]
            }
            broker.worker_pids = {int(node["node"]): int(node["pid"]) for node in found["nodes"]}
            broker.kafka_addresses = {
                int(node["node"]): str(node["kafka"]) for node in found["nodes"]
            }
            children = psutil.Process(process.pid).children()
            broker.started += [child.pid for child in children]
            redis = [child.pid for child in children if child.name() == "redis-server"]
            broker.redis_pid = redis[0] if redis else None
        else:
            broker.worker_pids = {0: process.pid}
        return broker
    except BaseException as error:
        _stop(broker)
        if isinstance(error, RuntimeError) and PORT_TAKEN in broker.log_tail():
            raise PortTaken(str(error)) from error
        raise


def _stop(broker: Broker) -> None:
    process = broker.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
    for pid in broker.started[1:]:  # the workers and Redis get SIGTERM as their parent dies
        with contextlib.suppress(psutil.Error):
            child = psutil.Process(pid)
            with contextlib.suppress(psutil.TimeoutExpired):
                child.wait(STOP_TIMEOUT_S)
            if child.is_running():
                child.kill()


# -- placement: names whose shards a given worker owns -------------------------------------------


def amqp_queue_shards(name: str, shards: int) -> set[int]:
    """The shard of AMQP queue ``name`` by each rule the broker may use: its topic's partition 0
    (what a node of many shards places by now) and the design's ``vhost\\0name``."""
    return {
        placement.partition_shard(QUEUE_TOPIC_PREFIX + name, 0, shards),
        placement.queue_shard(VHOST, name, shards),
    }


def queue_name_on(broker: Broker, node: int, stem: str) -> str:
    """An AMQP queue name whose shard worker ``node`` owns, by either placement rule."""
    for number in range(10_000):
        name = f"{stem}-{number}"
        if {broker.owner_of(shard) for shard in amqp_queue_shards(name, broker.shards)} == {node}:
            return name
    raise RuntimeError(f"no queue name placed on worker {node}")


def topic_name_on(broker: Broker, node: int, stem: str) -> str:
    """A topic name whose partition 0's shard worker ``node`` owns."""
    for number in range(10_000):
        name = f"{stem}-{number}"
        if broker.owner_of(placement.partition_shard(name, 0, broker.shards)) == node:
            return name
    raise RuntimeError(f"no topic name placed on worker {node}")


# -- points ------------------------------------------------------------------------------------


@dataclass
class Point:
    """One workload on one broker: messages over the timed part and the broker's CPU in it."""

    workload: str
    workers: int
    messages: int
    seconds: float
    broker_cpu_s: float
    note: str = ""
    case_of: str = ""  # a landing case's: the workload it is one case of (its mean's row)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_message(self) -> float:
        return 1e6 * self.broker_cpu_s / self.messages if self.messages else 0.0


def mean_of_cases(workload: str, cases: Sequence[Point], note: str) -> Point:
    """The point of ``workload`` over its landing cases: their mean CPU per message (the CPU
    figure is that mean times all their messages), and all their messages over all their time."""
    messages = sum(case.messages for case in cases)
    mean_us = sum(case.cpu_us_per_message for case in cases) / len(cases)
    seconds = sum(case.seconds for case in cases)
    return Point(workload, cases[0].workers, messages, seconds, mean_us * messages / 1e6, note)


@dataclass
class CrossPoint:
    """AMQP publishes with confirms from one connection to a queue of its own worker (local)
    or of another (remote)."""

    kind: str  # "local" or "remote"
    connected_node: int
    queue: str
    shard: int
    owner: int
    messages: int
    seconds: float
    broker_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_message(self) -> float:
        return 1e6 * self.broker_cpu_s / self.messages if self.messages else 0.0


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on uvloop when present (the lean clients are written for it)."""
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        return runner.run(factory())


async def connections_on_every_worker(
    broker: Broker,
) -> tuple[dict[int, amqp_bench.RawClient], list[amqp_bench.RawClient]]:
    """AMQP connections until every worker owning shards holds one (the kernel picks the worker
    of each connection): {worker: a connection to it}, and every connection opened (to close)."""
    serving = set(broker.serving())
    on: dict[int, amqp_bench.RawClient] = {}
    opened: list[amqp_bench.RawClient] = []
    for _ in range(CONNECT_ATTEMPTS * len(serving)):
        client = await amqp_bench.RawClient.open("127.0.0.1", broker.amqp_port)
        opened.append(client)
        assert client.transport is not None
        port = int(client.transport.get_extra_info("sockname")[1])
        node = await asyncio.to_thread(broker.node_of, port, broker.amqp_port)
        if node in serving:
            on.setdefault(node, client)
        if len(on) == len(serving):
            return on, opened
    for client in opened:
        await client.close()
    raise RuntimeError(f"connections never reached every worker of {sorted(serving)}")


async def declare_everywhere(
    broker: Broker, on: dict[int, amqp_bench.RawClient], queues: Sequence[str]
) -> None:
    """Declare each queue through its owner, then through every other worker: a queue declared
    through one worker is not yet known to another's AMQP front end (404 on its consume), and
    one declared through its owner after another worker would start empty again."""
    for queue in queues:
        # queue_name_on picked a name both placement rules put on one worker's shards.
        owner = broker.owner_of(min(amqp_queue_shards(queue, broker.shards)))
        for node in sorted(on, key=lambda node: node != owner):
            await on[node].call(commands.Queue.Declare(queue=queue, durable=True))


def amqp_point(broker: Broker, settings: Settings) -> Point:
    """``bench amqp``'s workload (``bench.amqp.run_once``) on ``settings.amqp_queues`` queues at
    once, queue i placed on the (i mod N)-th worker; the producer and consumer connections land
    where the kernel puts them."""
    serving = broker.serving()

    def names(stem: str) -> list[str]:
        return [
            queue_name_on(broker, serving[index % len(serving)], f"{stem}{index}")
            for index in range(settings.amqp_queues)
        ]

    warmups, queues = names("bench-cluster-w"), names("bench-cluster-q")
    each = max(1, settings.amqp_messages // len(queues))

    async def many(chosen: list[str], messages: int) -> None:
        await asyncio.gather(
            *(
                # No purge: each queue is new (a purge through a worker that does not own the
                # queue is not supported yet).
                amqp_bench.run_once(
                    "BraidMQ",
                    broker.amqp_port,
                    [],
                    SIZE,
                    messages,
                    settings.window,
                    queue,
                    purge=False,
                )
                for queue in chosen
            )
        )

    async def run() -> tuple[float, float]:
        on, opened = await connections_on_every_worker(broker)
        try:
            await declare_everywhere(broker, on, [*warmups, *queues])
            await many(warmups, min(each, AMQP_WARMUP_MESSAGES))
            cpu = broker.cpu_seconds()
            started = time.perf_counter()
            await many(queues, each)
            return time.perf_counter() - started, broker.cpu_seconds() - cpu
        finally:
            for client in opened:
                await client.close()

    seconds, cpu = run_async(run)
    note = f"{len(queues)} queues"
    return Point("amqp", broker.workers, each * len(queues), seconds, cpu, note)


def mqtt_points(broker: Broker, qos: int, settings: Settings) -> list[Point]:
    """The single node's one point; a cluster's landing cases (publisher's worker, subscriber's
    worker: every pair of serving workers) and their mean (module docstring)."""
    if not broker.cluster:
        return [mqtt_point(broker, qos, settings)]
    serving = broker.serving()
    cases = [mqtt_point(broker, qos, settings, (pub, sub)) for pub in serving for sub in serving]
    topic = cases[0].note.rpartition(", ")[2]
    names = ", ".join(f"{pub}->{sub}" for pub in serving for sub in serving)
    note = f"mean of {len(cases)} landing cases (pub->sub on worker {names}), {topic}"
    return [*cases, mean_of_cases(f"mqtt-qos{qos}", cases, note)]


class LandingLoadRun(mqtt_bench.LoadRun):
    """``bench mqtt``'s load run that connects the publisher and the subscriber to the workers
    ``want`` names (``(pub, sub)``; None: where they land), notes the worker of each connection
    and waits until a message published reaches the subscriber."""

    def __init__(
        self, broker: Broker, qos: int, settings: Settings, want: tuple[int, int] | None = None
    ) -> None:
        super().__init__(broker.mqtt_port, qos, SIZE, settings.window, settings.mqtt_s)
        self.broker = broker
        self.want = want
        self.landed = ""
        self.arrived: asyncio.Event | None = None

    async def _open(self, client_id: str, role: str) -> Any:
        """A connection on the wanted worker: each one that lands elsewhere is closed (after its
        CONNACK, when the worker holds it) and another opened, under a new client id."""
        if self.want is None or not self.broker.cluster:
            return await super()._open(client_id, role)
        want = self.want[0] if role == "pub" else self.want[1]
        for attempt in range(CONNECT_ATTEMPTS * self.broker.workers):
            peer = await super()._open(f"{client_id}-{attempt}", role)
            assert peer.transport is not None
            port = int(peer.transport.get_extra_info("sockname")[1])
            if await asyncio.to_thread(self.broker.node_of, port, self.broker.mqtt_port) == want:
                return peer
            peer.transport.write(b"\xe0\x00")  # DISCONNECT
            peer.transport.close()
        raise RuntimeError(f"no MQTT {role} connection landed on worker {want}")

    def on_sub_bytes(self, peer: Any, data: bytes) -> None:
        super().on_sub_bytes(peer, data)
        if self.arrived is not None and self.received:
            self.arrived.set()

    async def setup(self) -> None:
        await super().setup()
        if not self.broker.cluster:
            return
        ends = []
        for peer in (self.pub, self.sub):
            assert peer is not None
            assert peer.transport is not None
            port = int(peer.transport.get_extra_info("sockname")[1])
            node = await asyncio.to_thread(self.broker.node_of, port, self.broker.mqtt_port)
            ends.append(str(node))
        # Where the topic's messages are stored matters as much: MQTT stores a topic name under
        # its first level's log topic (gateway/mqtt/addresses.py), in its partition 0's shard.
        log_topic = self.topic.split("/", 1)[0]
        shard = placement.partition_shard(log_topic, 0, self.broker.shards)
        self.landed = (
            f"pub->sub on worker {ends[0]}->{ends[1]}, topic on worker "
            f"{self.broker.owner_of(shard)}"
        )
        await self._wait_for_route()

    async def _wait_for_route(self) -> None:
        """The subscription reaches the other workers' route tables through Redis a moment
        later (docs/cluster.md section 8; longer on a loaded machine); what they get before
        goes to no subscriber, and the closed loop would wait for it for ever. So: one probe
        message at a time, the load's own packet (packet id 0xFFFF at QoS 1), until one
        arrives. Counted in the warm-up, whose counts the load run drops."""
        assert self.pub is not None
        assert self.pub.transport is not None
        self.arrived = arrived = asyncio.Event()
        probe = self.prefix + (b"\xff\xff" if self.qos else b"")
        deadline = time.monotonic() + ROUTE_TIMEOUT_S
        while time.monotonic() < deadline:
            self.pub.transport.write(probe + mqtt_bench.TIMESTAMP.pack(0) + self.padding)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), ROUTE_PROBE_S)
                return
        raise RuntimeError(f"no probe reached the subscriber in {ROUTE_TIMEOUT_S:.0f} s")


def mqtt_point(
    broker: Broker, qos: int, settings: Settings, want: tuple[int, int] | None = None
) -> Point:
    """``bench mqtt``'s closed loop at ``qos``, publisher and subscriber on the workers ``want``
    names (a landing case: ``mqtt-qos<qos> pub->sub``) or where they land; notes which workers
    they landed on."""
    load = LandingLoadRun(broker, qos, settings, want)

    async def run() -> mqtt_bench.RunResult:
        return await asyncio.wait_for(load.run(broker.pids()), settings.mqtt_s + STEP_TIMEOUT_S)

    result = run_async(run)
    if result.stalled:
        raise RuntimeError(f"MQTT QoS {qos} stalled with {broker.workers} worker(s)")
    workload = f"mqtt-qos{qos}"
    return Point(
        workload if want is None else f"{workload} {want[0]}->{want[1]}",
        broker.workers,
        result.delivered,
        result.seconds,
        result.cpu_s,
        load.landed,
        case_of="" if want is None else workload,
    )


class KafkaSide(kafka_bench.Broker):
    """``bench.kafka``'s broker handle over this bench's broker: the shared Kafka port, and CPU
    summed over the workers and Redis (its helpers ask only for these)."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(f"braid x{broker.workers}", broker.process, broker.kafka_port)
        self.cluster_broker = broker

    def cpu_seconds(self) -> float:
        return self.cluster_broker.cpu_seconds()


def _start_lean_producer(address: str, topic: str, records: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.kafka_load", "--bootstrap", address]
    command += ["--topic", topic, "--records", str(records), "--size", str(SIZE)]
    command += ["--per-batch", str(min(KAFKA_PER_BATCH, records))]
    command += ["--in-flight", str(kafka_bench.LEAN_IN_FLIGHT)]
    command += ["--timeout", str(STEP_TIMEOUT_S), "--wait"]
    return subprocess.Popen(
        command,
        env=env_with_repo(),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lean_produce_all(broker: Broker, topics: dict[str, int], records: int) -> tuple[float, float]:
    """``records`` records into each topic at once, one ``bench.kafka_load`` process per topic
    connected to the topic's leader; (wall seconds, broker CPU seconds) from the go to the last
    answer."""
    producers = [
        _start_lean_producer(broker.kafka_address(node), topic, records)
        for topic, node in topics.items()
    ]
    try:
        for producer in producers:
            assert producer.stdout is not None
            ready = ""
            if select.select([producer.stdout], [], [], STEP_TIMEOUT_S)[0]:
                ready = producer.stdout.readline().strip()
            if ready != "ready":
                producer.kill()
                _, errors = producer.communicate(timeout=5)
                raise RuntimeError(f"lean producer said {ready!r}: {errors.strip()}")
        cpu = broker.cpu_seconds()
        started = time.perf_counter()
        for producer in producers:
            assert producer.stdin is not None
            producer.stdin.write("go\n")
            producer.stdin.flush()
        outputs = [producer.communicate(timeout=STEP_TIMEOUT_S) for producer in producers]
        seconds = time.perf_counter() - started
        cpu = broker.cpu_seconds() - cpu
    finally:
        for producer in producers:
            if producer.poll() is None:
                producer.kill()
                producer.wait(5)
    for producer, (output, errors) in zip(producers, outputs, strict=True):
        if producer.returncode != 0:
            raise RuntimeError(f"lean producer exited {producer.returncode}: {errors.strip()}")
        if json.loads(output)["records"] != records:
            raise RuntimeError(f"lean producer sent {output.strip()}")
    return seconds, cpu


def _wait_for_leaders(broker: Broker, topics: dict[str, int]) -> None:
    """Each topic is known, with a leader, to the worker its lean producer talks to."""
    from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

    deadline = time.monotonic() + STEP_TIMEOUT_S
    for topic, node in topics.items():
        admin = AdminClient({"bootstrap.servers": broker.kafka_address(node)})
        while True:
            found = admin.list_topics(topic, timeout=5).topics.get(topic)
            partitions = found.partitions if found is not None and found.error is None else {}
            if 0 in partitions and partitions[0].leader >= 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} has no leader on worker {node}")
            time.sleep(0.2)


def kafka_points(broker: Broker, settings: Settings) -> list[Point]:
    """The lean producer into ``settings.kafka_topics`` topics at once, then the records fetched
    back (``bench.kafka.consume``, topic after topic)."""
    side = KafkaSide(broker)
    serving = broker.serving()
    nodes = [serving[index % len(serving)] for index in range(settings.kafka_topics)]
    topics = {
        topic_name_on(broker, node, f"bench-cluster-t{index}"): node
        for index, node in enumerate(nodes)
    }
    for topic in topics:
        kafka_bench.create_topic(side, topic)
    _wait_for_leaders(broker, topics)
    each = max(1, settings.kafka_records // len(topics))
    warmup = min(KAFKA_PER_BATCH, each)
    lean_produce_all(broker, topics, warmup)
    seconds, cpu = lean_produce_all(broker, topics, each)
    note = f"{len(topics)} topics"
    produced = Point("kafka-produce", broker.workers, each * len(topics), seconds, cpu, note)
    # The first records of each topic: the warm-up batch, then the timed ones.
    fetch_each = max(1, min(each, settings.kafka_fetch_records // len(topics)))
    fetched = [
        kafka_bench.consume(side, topic, fetch_each, SIZE, warmup=warmup) for topic in topics
    ]
    fetch = Point(
        "kafka-fetch",
        broker.workers,
        sum(result.records for result in fetched),
        sum(result.wall for result in fetched),
        sum(result.broker_cpu for result in fetched),
        note,
    )
    return [produced, fetch]


async def _publish_confirmed(
    client: amqp_bench.RawClient, queue: str, messages: int, window: int, before: int
) -> int:
    """``messages`` persistent publishes to ``queue`` (default exchange), at most ``window``
    unconfirmed, on a channel in confirm mode that published ``before`` messages already (its
    delivery tags go on from there); returns once all are confirmed (raises on a nack) with
    the channel's new count."""
    confirmed = 0
    nacked = 0
    window_open = asyncio.Event()

    def on_confirm(tag: int, multiple: bool, positive: bool) -> None:
        nonlocal confirmed, nacked
        confirmed = max(confirmed, tag - before)  # one channel's confirms come in order
        nacked += not positive
        window_open.set()

    client.on_confirm = on_confirm
    message = amqp_bench.publish_prefix(1, queue, SIZE) + b"x" * SIZE + b"\xce"
    published = 0
    while confirmed < messages:
        room = min(window - (published - confirmed), messages - published, 256)
        if room <= 0:
            window_open.clear()
            await asyncio.wait_for(window_open.wait(), STEP_TIMEOUT_S)
            continue
        client.write(message * room)
        published += room
        await asyncio.sleep(0)
    if nacked:
        raise RuntimeError(f"{nacked} publishes to {queue} nacked")
    return before + messages


async def connection_on_a_serving_worker(
    broker: Broker,
) -> tuple[int, amqp_bench.RawClient, list[amqp_bench.RawClient]]:
    """An AMQP connection that the kernel gave to a worker owning shards: (that worker, the
    connection, every connection opened, to close)."""
    serving = set(broker.serving())
    opened: list[amqp_bench.RawClient] = []
    for _ in range(CONNECT_ATTEMPTS):
        client = await amqp_bench.RawClient.open("127.0.0.1", broker.amqp_port)
        opened.append(client)
        assert client.transport is not None
        port = int(client.transport.get_extra_info("sockname")[1])
        node = await asyncio.to_thread(broker.node_of, port, broker.amqp_port)
        if node in serving:
            return node, client, opened
    for client in opened:
        await client.close()
    raise RuntimeError(f"{CONNECT_ATTEMPTS} connections never reached a worker owning shards")


def cross_points(broker: Broker, settings: Settings) -> list[CrossPoint]:
    """Publishes from one connection to a queue its worker owns and to one another worker owns
    (both declared on that connection: the other's through its owner)."""

    async def run() -> list[CrossPoint]:
        here, client, opened = await connection_on_a_serving_worker(broker)
        try:
            there = next(node for node in broker.serving() if node != here)
            queues = {
                "local": queue_name_on(broker, here, "bench-cluster-local"),
                "remote": queue_name_on(broker, there, "bench-cluster-remote"),
            }
            shards = {}
            for kind, queue in queues.items():
                # A fresh root: the queue is new, nothing to purge.
                await client.call(commands.Queue.Declare(queue=queue, durable=True))
                predicted = amqp_queue_shards(queue, broker.shards)
                recorded = await asyncio.to_thread(broker.recorded_queue_shard, queue)
                if recorded is not None and recorded not in predicted:
                    raise RuntimeError(f"{queue} recorded in shard {recorded}, not {predicted}")
                shards[kind] = recorded if recorded is not None else min(predicted)
            await client.call(commands.Confirm.Select())
            published = 0
            for queue in queues.values():
                published = await _publish_confirmed(
                    client, queue, AMQP_WARMUP_MESSAGES, settings.window, published
                )
            points = []
            for _ in range(settings.rounds):
                for kind, queue in queues.items():
                    cpu = broker.cpu_seconds()
                    started = time.perf_counter()
                    published = await _publish_confirmed(
                        client, queue, settings.cross_messages, settings.window, published
                    )
                    seconds = time.perf_counter() - started
                    cpu = broker.cpu_seconds() - cpu
                    shard = shards[kind]
                    points.append(
                        CrossPoint(
                            kind,
                            here,
                            queue,
                            shard,
                            broker.owner_of(shard),
                            settings.cross_messages,
                            seconds,
                            cpu,
                        )
                    )
            wanted = AMQP_WARMUP_MESSAGES + settings.rounds * settings.cross_messages
            for kind, queue in queues.items():
                # Every confirmed publish must be in the queue (a passive declare counts them
                # on the owner): one the worker could not route is confirmed too, and stores
                # nothing.
                stored = await client.call(commands.Queue.Declare(queue=queue, passive=True))
                assert isinstance(stored, commands.Queue.DeclareOk)
                if stored.message_count != wanted:
                    raise RuntimeError(
                        f"{kind} queue {queue}: {stored.message_count} messages stored of "
                        f"{wanted} confirmed publishes from worker {here}"
                    )
                await client.call(commands.Queue.Delete(queue=queue))
            return points
        finally:
            for opened_client in opened:
                await opened_client.close()

    return run_async(run)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Settings:
    workers: list[int]
    shards: int
    window: int
    amqp_queues: int
    amqp_messages: int
    mqtt_s: float
    kafka_topics: int
    kafka_records: int
    kafka_fetch_records: int
    cross_messages: int
    rounds: int
    out: Path
    workdir: str | None
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    idle_s: float = IDLE_S


@dataclass
class Report:
    settings: Settings
    points: list[Point] = field(default_factory=list)
    cross: list[CrossPoint] = field(default_factory=list)
    owners: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # N -> node -> shards
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # a workload that raised, and why
    idle: dict[int, float] = field(default_factory=dict)  # N -> broker CPU s per s, no load

    def busy_us_per_message(self, point: Point) -> float | None:
        """CPU per message less what the broker spends idle over the point's time (leases,
        heartbeats, metadata refreshes: a cost per second, not per message)."""
        idle = self.idle.get(point.workers)
        if idle is None or not point.messages:
            return None
        return 1e6 * (point.broker_cpu_s - idle * point.seconds) / point.messages

    def baseline(self) -> int:
        return min(self.settings.workers)

    def point(self, workload: str, workers: int) -> Point | None:
        return next(
            (p for p in self.points if p.workload == workload and p.workers == workers), None
        )

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(p.workload for p in self.points))

    def table_order(self) -> list[str]:
        """The workloads, each followed by its landing cases."""
        cases: dict[str, list[str]] = {}
        for p in self.points:
            if p.case_of and p.workload not in cases.setdefault(p.case_of, []):
                cases[p.case_of].append(p.workload)
        whole = [w for w in self.workloads() if not any(w in c for c in cases.values())]
        return [name for w in whole for name in [w, *cases.get(w, [])]]

    def cpu_ratio(self, workload: str, workers: int) -> float | None:
        """CPU per message with ``workers`` workers over the baseline's (a landing case's: over
        the baseline's point of the workload it is a case of)."""
        mine = self.point(workload, workers)
        base = self.point(mine.case_of or workload if mine else workload, self.baseline())
        if base is None or mine is None or not base.cpu_us_per_message:
            return None
        return mine.cpu_us_per_message / base.cpu_us_per_message

    def rate_ratio(self, workload: str, workers: int) -> float | None:
        mine = self.point(workload, workers)
        base = self.point(mine.case_of or workload if mine else workload, self.baseline())
        if base is None or mine is None or not base.rate:
            return None
        return mine.rate / base.rate

    def expected_workloads(self) -> list[str]:
        names = {
            "amqp": ["amqp"],
            "mqtt": ["mqtt-qos0", "mqtt-qos1"],
            "kafka": ["kafka-produce", "kafka-fetch"],
        }
        return [w for chosen in self.settings.workloads for w in names.get(chosen, [])]

    def gate(self) -> dict[str, Any] | None:
        """Issue 22's gate: CPU per message at 2 workers over 1, per workload, <= 1.25; not
        passed while a workload is missing (it failed at 1 or 2 workers)."""
        if not {1, 2} <= set(self.settings.workers):
            return None
        ratios = {w: self.cpu_ratio(w, 2) for w in self.expected_workloads()}
        known = {w: r for w, r in ratios.items() if r is not None}
        missing = [w for w, r in ratios.items() if r is None]
        return {
            "limit": GATE_RATIO,
            "ratios": known,
            "missing": missing,
            "worst": max(known, key=lambda w: known[w]) if known else None,
            "passed": bool(known) and not missing and all(r <= GATE_RATIO for r in known.values()),
        }

    def table(self) -> list[str]:
        base = self.baseline()
        lines = [
            f"| workload | workers | msgs/s | broker CPU s | CPU us/msg | CPU/msg vs {base} "
            f"| CPU us/msg less idle | msgs/s vs {base} | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for workload in self.table_order():
            for workers in self.settings.workers:
                p = self.point(workload, workers)
                if p is None:
                    continue
                cpu_ratio = self.cpu_ratio(workload, workers)
                rate_ratio = self.rate_ratio(workload, workers)
                busy = self.busy_us_per_message(p)
                lines.append(
                    f"| {workload} | {workers} | {p.rate:,.0f} | {p.broker_cpu_s:.2f} | "
                    f"{p.cpu_us_per_message:.1f} | "
                    f"{'-' if cpu_ratio is None else f'{cpu_ratio:.2f}x'} | "
                    f"{busy_text(busy)} | "
                    f"{'-' if rate_ratio is None else f'{rate_ratio:.2f}x'} | {p.note} |"
                )
        gate = self.gate()
        lines.append("")
        if self.idle:
            idle = ", ".join(f"{n} worker(s) {100 * rate:.1f}%" for n, rate in self.idle.items())
            lines.append(f"broker CPU with no load (% of one core): {idle}")
        if gate is not None:
            known = gate["ratios"]
            over = any(r > GATE_RATIO for r in known.values())
            verdict = "FAIL" if over else "INCOMPLETE" if gate["missing"] else "PASS"
            ratios = ", ".join(f"{w} {r:.2f}" for w, r in known.items())
            worst = gate["worst"]
            detail = f"worst {worst} {known[worst]:.2f}; {ratios}" if worst else "nothing measured"
            if gate["missing"]:
                detail += f"; not measured: {', '.join(gate['missing'])}"
            lines.append(
                f"gate: broker CPU per message, 2 workers / 1 <= {GATE_RATIO}: {verdict} ({detail})"
            )
        if self.cross:
            lines += [
                "",
                "| publish to | connected worker | queue shard (owner) | msgs/s | CPU us/msg |",
                "|---|---:|---|---:|---:|",
            ]
            for c in self.cross:
                lines.append(
                    f"| {c.kind} queue | {c.connected_node} | {c.shard} (worker {c.owner}) | "
                    f"{c.rate:,.0f} | {c.cpu_us_per_message:.1f} |"
                )
            cross = self.cross_ratio()
            if cross is not None:
                lines.append(f"cross-node publish / local: CPU per message {cross:.2f}x")
        lines += [f"skipped: {reason}" for reason in self.skipped]
        lines += [f"FAILED: {reason}" for reason in self.failed]
        return lines

    def cross_ratio(self) -> float | None:
        """CPU per message of the remote publishes over the local ones (all rounds)."""
        sums = {}
        for kind in ("local", "remote"):
            points = [c for c in self.cross if c.kind == kind]
            messages = sum(c.messages for c in points)
            if not messages:
                return None
            sums[kind] = sum(c.broker_cpu_s for c in points) / messages
        return sums["remote"] / sums["local"] if sums["local"] else None

    def to_json(self) -> dict[str, Any]:
        def with_figures(item: Point | CrossPoint) -> dict[str, Any]:
            figures = {
                **asdict(item),
                "rate": item.rate,
                "cpu_us_per_message": item.cpu_us_per_message,
            }
            if isinstance(item, Point):
                figures["busy_us_per_message"] = self.busy_us_per_message(item)
            return figures

        settings = asdict(self.settings)
        settings["out"] = str(self.settings.out)
        return {
            "benchmark": "cluster",
            "date": datetime.date.today().isoformat(),
            "machine": kafka_bench.machine(),
            "load_average": os.getloadavg(),
            "settings": settings,
            "size": SIZE,
            "points": [with_figures(p) for p in self.points],
            "cpu_ratios": {
                w: {str(n): self.cpu_ratio(w, n) for n in self.settings.workers}
                for w in self.workloads()
            },
            "gate": self.gate(),
            "cross": [with_figures(c) for c in self.cross],
            "cross_ratio": self.cross_ratio(),
            "owners": {str(n): {str(k): v for k, v in o.items()} for n, o in self.owners.items()},
            "idle_cpu_per_s": {str(n): rate for n, rate in self.idle.items()},
            "skipped": self.skipped,
            "failed": self.failed,
        }


# What a workload that cannot run on this broker raises: the bench reports it and goes on.
WORKLOAD_ERRORS: Final = (
    RuntimeError,
    TimeoutError,
    AssertionError,
    OSError,
    subprocess.SubprocessError,
)


def measure(broker: Broker, settings: Settings, report: Report) -> None:
    workers = broker.workers
    step = f"{workers} worker(s)"

    def attempt(name: str, action: Callable[[], list[Point]]) -> None:
        print(f"{step}: {name}", file=sys.stderr, flush=True)
        try:
            report.points += action()
        except WORKLOAD_ERRORS as error:
            reason = f"{name} with {step}: {type(error).__name__}: {error}"
            print(
                f"FAILED: {reason}\n{traceback.format_exc(limit=-4)}{broker.log_tail(8)}",
                file=sys.stderr,
                flush=True,
            )
            report.failed.append(reason)

    chosen = settings.workloads
    if "amqp" in chosen:
        attempt("amqp", lambda: [amqp_point(broker, settings)])
    if "mqtt" in chosen:
        for qos in (0, 1):
            attempt(f"mqtt QoS {qos}", functools.partial(mqtt_points, broker, qos, settings))
    if "kafka" in chosen:
        attempt("kafka", lambda: kafka_points(broker, settings))
    if "cross" in chosen and workers > 1:
        if len(broker.serving()) < 2:
            report.skipped.append(f"cross-node publish with {step}: one worker owns every shard")
        else:

            def cross() -> list[Point]:
                report.cross += cross_points(broker, settings)
                return []

            attempt("cross-node publish", cross)


def busy_text(busy: float | None) -> str:
    """A CPU-per-message-less-idle cell: below zero when the idle rate, read apart, was above
    what the broker spent in the point (noise: the load is the idle background)."""
    if busy is None:
        return "-"
    return f"{busy:.1f}" if busy >= 0 else "~0"


def idle_cpu_rate(broker: Broker, seconds: float) -> float:
    """The broker's CPU seconds per second with no client: after a settling second, over
    ``seconds``, once its start-up work is done (its CPU rate below :data:`SETTLED_RATE`)."""
    time.sleep(IDLE_SETTLE_S)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        cpu = broker.cpu_seconds()
        started = time.perf_counter()
        time.sleep(SETTLE_WINDOW_S)
        if (broker.cpu_seconds() - cpu) / (time.perf_counter() - started) < SETTLED_RATE:
            break
    cpu = broker.cpu_seconds()
    started = time.perf_counter()
    time.sleep(seconds)
    return (broker.cpu_seconds() - cpu) / (time.perf_counter() - started)


def run(settings: Settings) -> Report:
    report = Report(settings)
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-", dir=settings.workdir))
    try:
        for workers in settings.workers:
            print(f"starting braid serve --workers {workers}", file=sys.stderr, flush=True)
            with running_broker(workdir / f"workers-{workers}", workers, settings.shards) as broker:
                report.owners[workers] = {
                    node: broker.shards_of(node) for node in sorted(broker.worker_pids)
                }
                report.idle[workers] = idle_cpu_rate(broker, settings.idle_s)
                measure(broker, settings, report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def parse(argv: Sequence[str]) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m bench cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--workers",
        default=",".join(map(str, DEFAULT_WORKERS)),
        help="worker counts, comma-separated (default 1,2; 1 is the single node)",
    )
    parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="shards of the root")
    parser.add_argument("--quick", action="store_true", help="a short run (a quarter)")
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--amqp-queues", type=int, default=AMQP_QUEUES)
    parser.add_argument("--amqp-messages", type=int, default=None, help="in all, per point")
    parser.add_argument("--mqtt-seconds", type=float, default=None, help="per MQTT point")
    parser.add_argument("--kafka-topics", type=int, default=KAFKA_TOPICS)
    parser.add_argument("--kafka-records", type=int, default=None, help="in all, per point")
    parser.add_argument(
        "--kafka-fetch-records", type=int, default=None, help="fetched back in all, per point"
    )
    parser.add_argument("--cross-messages", type=int, default=None, help="per cross-node run")
    parser.add_argument("--rounds", type=int, default=CROSS_ROUNDS, help="cross-node rounds")
    parser.add_argument(
        "--idle-seconds", type=float, default=None, help="how long the idle CPU is read"
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument("--out", default=None, help="the JSON file (default results/cluster-*)")
    parser.add_argument("--dir", default=None, help="parent of the temporary data directories")
    args = parser.parse_args(argv)
    try:
        workers = sorted({int(part) for part in args.workers.split(",") if part.strip()})
    except ValueError:
        parser.error(f"--workers: comma-separated integers, not {args.workers!r}")
    if not workers or min(workers) < 1:
        parser.error("--workers: at least one count, each >= 1")
    counts = (args.amqp_queues, args.kafka_topics, args.window, args.shards, args.rounds)
    if min(counts) < 1:
        parser.error("--amqp-queues, --kafka-topics, --window, --shards, --rounds must be >= 1")
    chosen = [part.strip() for part in args.workloads.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(WORKLOADS))
    if unknown or not chosen:
        parser.error(f"--workloads: a subset of {','.join(WORKLOADS)}, not {args.workloads!r}")
    quick = args.quick
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Settings(
        workers=workers,
        shards=args.shards,
        window=args.window,
        amqp_queues=args.amqp_queues,
        amqp_messages=args.amqp_messages or (QUICK_AMQP_MESSAGES if quick else AMQP_MESSAGES),
        mqtt_s=args.mqtt_seconds or (QUICK_MQTT_SECONDS if quick else MQTT_SECONDS),
        kafka_topics=args.kafka_topics,
        kafka_records=args.kafka_records or (QUICK_KAFKA_RECORDS if quick else KAFKA_RECORDS),
        kafka_fetch_records=args.kafka_fetch_records
        or (QUICK_KAFKA_FETCH_RECORDS if quick else KAFKA_FETCH_RECORDS),
        cross_messages=args.cross_messages or (QUICK_CROSS_MESSAGES if quick else CROSS_MESSAGES),
        rounds=1 if quick and args.rounds == CROSS_ROUNDS else args.rounds,
        out=Path(args.out) if args.out else REPO / "results" / f"cluster-{stamp}.json",
        workdir=args.dir,
        workloads=chosen,
        idle_s=args.idle_seconds or (QUICK_IDLE_S if quick else IDLE_S),
    )


def main(argv: list[str]) -> int:
    settings = parse(argv)
    began = time.perf_counter()
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    report = run(settings)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print(
        f"bench cluster, {datetime.date.today()}; {kafka_bench.machine()}; load average at "
        f"start {load}; {SIZE} B messages, shards {settings.shards}; broker CPU = workers + "
        "private redis-server (/proc/<pid>/stat); 1 worker = the single node"
    )
    print("\n".join(report.table()))
    print(f"(JSON: {settings.out}; bench took {time.perf_counter() - began:.0f} s)")
    return 1 if report.failed else 0
