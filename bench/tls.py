"""``python -m bench tls``: what TLS costs on each protocol, BraidMQ beside RabbitMQ (AMQPS) and
Mosquitto (MQTTS), plaintext beside TLS, in one run.

Brokers, started once for the run on free loopback ports, each with a plain and a TLS listener
serving the same certificate (a test CA's, made here with ``tests/security/certs.py``: ECDSA
P-256, so the handshake and the record layer are what OpenSSL does by default, TLS 1.3 with
AES-GCM):

- ``braid serve`` (default ``sync`` durability) with its AMQP, AMQPS, MQTT, MQTTS, Kafka and
  Kafka TLS listeners (``--tls-cert``/``--tls-key``);
- ``rabbitmq-server`` (as user ``rabbitmq``, its own temporary directories) with
  ``listeners.tcp`` and ``listeners.ssl`` (``ssl_options``, ``verify_none``);
- ``mosquitto`` with two listeners, the second with ``certfile``/``keyfile``, no persistence,
  no queue or in-flight caps (as ``bench/mqtt.py`` runs it).

Workloads (each broker, plaintext then TLS, the order swapped every round so drift hits both):

- AMQP: one publisher connection (publisher confirms, at most ``--window`` unconfirmed) and one
  consumer (prefetch 100, one ack per message) on a durable queue, persistent messages, through
  ``bench/amqp.py``'s lean raw-socket client; ``--amqp-messages`` per run;
- MQTT 3.1.1 QoS 1: ``bench/mqtt.py``'s closed-loop load client (publisher and subscriber on one
  topic, ``--window`` in flight) for ``--mqtt-seconds`` per run;
- Kafka: produce ``--kafka-records`` records with confluent-kafka (``acks=all``, ``linger.ms=5``,
  as ``bench/kafka.py``), BraidMQ only (the peers here are the AMQP and MQTT ones).

Throughput is messages over the run's wall time (first publish to last delivery, or to the last
acknowledgement for Kafka). Broker CPU is the broker's processes' CPU time (psutil: user +
system, every thread) over the run's wall time, in % of one core, and per message in µs: TLS's
cost is the difference between a broker's two rows. Client CPU (this process) is shown too: on
a small machine the client shares the cores. The best of ``--rounds`` rounds counts.

Bounded: a few thousand messages per run, every step with a timeout, about three minutes with
the defaults; the brokers are stopped and the directory removed, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands

from bench import amqp as amqp_bench
from bench import mqtt as mqtt_bench
from gateway.mqtt.codec import Connack, Connect, encode

REPO_ROOT = Path(__file__).resolve().parents[1]
SIZES = (100, 1024)
ROUNDS = 2
AMQP_MESSAGES = 20_000
MQTT_SECONDS = 2.0
KAFKA_RECORDS = 300_000
WINDOW = 1000
PREFETCH = 100
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0
PLAIN = "plain"
TLS = "TLS"
PROTOCOLS = ("amqp", "mqtt", "kafka")


def free_ports(count: int) -> list[int]:
    """Distinct free ports, all held open while choosing (one at a time the kernel may hand
    out the same port twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> Certificates:
        from tests.security.certs import CertificateAuthority

        authority = CertificateAuthority(directory, "bench-ca")
        server = authority.issue("localhost", server=True)
        # Readable by the brokers' own users (rabbitmq; mosquitto drops to its user as root).
        for path in (directory, authority.cert_path, server.cert, server.key):
            path.chmod(0o755 if path.is_dir() else 0o644)
        return cls(authority.cert_path, server.cert, server.key)

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@dataclass
class Result:
    protocol: str
    broker: str
    transport: str
    size: int
    messages: int
    seconds: float
    broker_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_percent(self) -> float:
        return 100 * self.broker_cpu_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_message(self) -> float:
        return 1e6 * self.broker_cpu_s / self.messages if self.messages else 0.0

    @property
    def client_percent(self) -> float:
        return 100 * self.client_cpu_s / self.seconds if self.seconds > 0 else 0.0


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def wait_for_port(port: int, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT_S:.0f} s")


# -- the brokers ---------------------------------------------------------------------------------


@dataclass
class Broker:
    """A started broker: its (plain, TLS) port per protocol and its processes."""

    name: str
    ports: dict[str, tuple[int, int]]
    pids: Callable[[], list[int]]
    version: str


@contextlib.contextmanager
def braid(root: Path, certificates: Certificates) -> Iterator[Broker]:
    amqp, amqps, mqtt, mqtts, kafka, kafka_tls = free_ports(6)
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(root / "braid-data"), "--log-level", "warning"]
    command += ["--tls-cert", str(certificates.cert), "--tls-key", str(certificates.key)]
    command += ["--amqp-port", str(amqp), "--amqps-port", str(amqps)]
    command += ["--mqtt-port", str(mqtt), "--mqtts-port", str(mqtts)]
    command += ["--kafka-port", str(kafka), "--kafka-tls-port", str(kafka_tls)]
    command += ["--mqtt-ws-port", "0", "--mqtt-wss-port", "0", "--http-port", "0"]
    command += ["--https-port", "0"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with (root / "braid.log").open("w") as log_file:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("braid ready"):
            raise RuntimeError(f"braid serve did not start: {(root / 'braid.log').read_text()}")
        from braid import version

        yield Broker(
            "BraidMQ",
            {"amqp": (amqp, amqps), "mqtt": (mqtt, mqtts), "kafka": (kafka, kafka_tls)},
            lambda: [process.pid],
            version(),
        )
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


class RabbitTls(mqtt_bench.RabbitMQ):
    """rabbitmq-server with a plain and a TLS AMQP listener (bench/mqtt.py's node, its config
    written for AMQPS instead of MQTT)."""

    certificates: Certificates
    amqps_port: int
    plugins = ()

    def amqp_port(self) -> int:
        return self.port

    def config(self, node_dir: Path) -> list[str]:
        (self.amqps_port,) = free_ports(1)
        for name, source in (
            ("ca.pem", self.certificates.ca),
            ("server.pem", self.certificates.cert),
            ("server.key", self.certificates.key),
        ):
            shutil.copy(source, node_dir / name)
        return [
            f"listeners.ssl.default = 127.0.0.1:{self.amqps_port}",
            f"ssl_options.cacertfile = {node_dir / 'ca.pem'}",
            f"ssl_options.certfile = {node_dir / 'server.pem'}",
            f"ssl_options.keyfile = {node_dir / 'server.key'}",
            "ssl_options.verify = verify_none",
            "ssl_options.fail_if_no_peer_cert = false",
        ]

    def ports(self) -> list[int]:
        return [self.port, self.amqps_port]

    def broker_pids(self) -> list[int]:
        """The Erlang VM and its helpers, without the runuser wrapper."""
        wrapper = self.process.pid if self.process is not None else -1
        return [pid for pid in self.pids() if pid != wrapper]


class MosquittoTls(mqtt_bench.Mosquitto):
    """mosquitto with a plain and a TLS listener, otherwise as bench/mqtt.py runs it."""

    certificates: Certificates
    mqtts_port: int

    def start(self) -> None:
        (self.mqtts_port,) = free_ports(1)
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            "per_listener_settings false\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_queued_messages 0\n"
            "max_queued_bytes 0\n"
            "max_inflight_messages 0\n"
            "set_tcp_nodelay true\n"
            "log_type error\n"
            f"listener {self.port} 127.0.0.1\n"
            f"listener {self.mqtts_port} 127.0.0.1\n"
            f"certfile {self.certificates.cert}\n"
            f"keyfile {self.certificates.key}\n"
        )
        self.process = subprocess.Popen(
            ["mosquitto", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "mosquitto.log").open("w"),
        )
        for port in (self.port, self.mqtts_port):
            wait_for_port(port, self.process, "mosquitto")
        out = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, check=False)
        self.version = (out.stdout.splitlines() or [""])[0].replace("mosquitto version ", "")


@contextlib.contextmanager
def peer(
    kind: type[mqtt_bench.BrokerProcess], root: Path, certificates: Certificates
) -> Iterator[mqtt_bench.BrokerProcess | None]:
    """A started RabbitTls or MosquittoTls, or None (with a line saying why) when it cannot run
    here."""
    process = kind("peer", root)
    process.certificates = certificates  # type: ignore[attr-defined]
    missing = process.available()
    if missing is not None:
        print(f"skipped {kind.__name__}: {missing}", flush=True)
        yield None
        return
    try:
        process.start()
        yield process
    finally:
        process.stop()


# -- the workloads -------------------------------------------------------------------------------


async def open_amqp(port: int, context: ssl.SSLContext | None) -> amqp_bench.RawClient:
    """bench/amqp.py's lean client, over TLS when ``context`` is given (its ``open`` without
    the TLS argument: the same handshake)."""
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(
        amqp_bench.RawClient,
        "127.0.0.1",
        port,
        ssl=context,
        server_hostname="localhost" if context is not None else None,
    )
    client.write(b"AMQP\x00\x00\x09\x01")
    await asyncio.wait_for(client.replies.get(), RUN_TIMEOUT_S)  # Connection.Start
    client.send(
        commands.Connection.StartOk(
            {"product": "braid-bench-tls", "capabilities": {"publisher_confirms": True}},
            "PLAIN",
            "\x00guest\x00guest",
        ),
        0,
    )
    tune = await asyncio.wait_for(client.replies.get(), RUN_TIMEOUT_S)
    assert isinstance(tune, commands.Connection.Tune)
    frame_max = min(amqp_bench.FRAME_MAX, tune.frame_max)
    client.send(commands.Connection.TuneOk(tune.channel_max, frame_max), 0)
    await client.call(commands.Connection.Open("/"), 0)
    await client.call(commands.Channel.Open())
    return client


async def amqp_run(
    port: int, context: ssl.SSLContext | None, pids: list[int], size: int, messages: int
) -> tuple[float, float, float]:
    """Publish ``messages`` with confirms and consume them with acks: (seconds, broker CPU
    seconds, client CPU seconds). As bench/amqp.py's run_once, without the latencies."""
    queue = f"bench-tls-{size}"
    producer = await open_amqp(port, context)
    consumer = await open_amqp(port, context)
    await producer.call(commands.Queue.Declare(queue=queue, durable=True))
    await producer.call(commands.Queue.Purge(queue=queue))
    await producer.call(commands.Confirm.Select())
    await consumer.call(commands.Basic.Qos(prefetch_count=PREFETCH))
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    received = 0
    ack = amqp_bench._ACK_FRAME.pack

    def on_deliver(tag: int, _body: memoryview) -> None:
        nonlocal received
        received += 1
        consumer.out.append(ack(1, 1, 13, 60, 80, tag, 0, 0xCE))
        if received == messages and not done.done():
            done.set_result(None)

    consumer.on_deliver = on_deliver
    await consumer.call(commands.Basic.Consume(queue=queue, consumer_tag="bench"))
    confirmed = 0
    window_open = asyncio.Event()

    def on_confirm(tag: int, _multiple: bool, positive: bool) -> None:
        nonlocal confirmed
        if not positive:
            raise RuntimeError("a publish was nacked")
        confirmed = max(confirmed, tag)  # confirms of one channel come in order
        window_open.set()

    producer.on_confirm = on_confirm
    message = amqp_bench.publish_prefix(1, queue, size) + b"x" * size + b"\xce"
    broker_before = cpu_seconds(pids)
    client_before = time.process_time()
    started = time.perf_counter()
    published = 0
    while published < messages:
        room = min(WINDOW - (published - confirmed), messages - published, 256)
        if room <= 0:
            window_open.clear()
            await asyncio.wait_for(window_open.wait(), RUN_TIMEOUT_S)
            continue
        producer.write(message * room)
        published += room
        await asyncio.sleep(0)
    await asyncio.wait_for(done, RUN_TIMEOUT_S)
    seconds = time.perf_counter() - started
    client_cpu = time.process_time() - client_before
    broker_cpu = cpu_seconds(pids) - broker_before
    await consumer.close()
    await producer.call(commands.Queue.Delete(queue=queue))
    await producer.close()
    return seconds, broker_cpu, client_cpu


class TlsLoadRun(mqtt_bench.LoadRun):
    """bench/mqtt.py's closed-loop run, its connections over TLS when ``context`` is given."""

    def __init__(self, port: int, size: int, seconds: float, context: ssl.SSLContext | None):
        super().__init__(port, 1, size, WINDOW, seconds)
        self.context = context

    async def _open(self, client_id: str, role: str) -> mqtt_bench._Peer:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_connection(
            lambda: mqtt_bench._Peer(self, role),
            "127.0.0.1",
            self.port,
            ssl=self.context,
            server_hostname="localhost" if self.context is not None else None,
        )
        waiter = self.replies[Connack] = loop.create_future()
        assert peer.transport is not None
        connect = Connect(client_id, mqtt_bench.V311, True, 60)
        peer.transport.write(encode(connect, mqtt_bench.V311))
        connack = await asyncio.wait_for(waiter, RUN_TIMEOUT_S)
        if connack.reason_code:
            raise RuntimeError(f"CONNACK {connack.reason_code}")
        return peer


def kafka_run(
    bootstrap: str, config: dict[str, Any], pids: list[int], size: int, records: int
) -> tuple[float, float, float]:
    """Produce ``records`` (bench/kafka.py's producer settings): (seconds, broker CPU seconds,
    client CPU seconds)."""
    from confluent_kafka import Producer

    from bench.kafka import PRODUCE_CHUNK, PRODUCER_CONFIG

    topic = f"bench-tls-{size}-{time.monotonic_ns()}"
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **config})
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    value = b"x" * size
    producer.produce(topic, value, on_delivery=delivered)  # the topic, the connection
    producer.flush(RUN_TIMEOUT_S)
    chunk = [{"value": value} for _ in range(PRODUCE_CHUNK)]
    broker_before = cpu_seconds(pids)
    client_before = time.process_time()
    started = time.perf_counter()
    left = records
    while left > 0:
        messages = chunk if left >= PRODUCE_CHUNK else chunk[:left]
        queued = producer.produce_batch(topic, messages, partition=0, on_delivery=delivered)
        left -= queued
        if queued < len(messages):  # the client's queue is full: poll, then the rest
            for message in messages:
                message.pop("_error", None)
            producer.poll(0.005)
    if producer.flush(RUN_TIMEOUT_S):
        raise RuntimeError(f"produce did not finish in {RUN_TIMEOUT_S:.0f} s")
    seconds = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{len(failed)} records failed, e.g. {failed[0]}")
    return seconds, cpu_seconds(pids) - broker_before, time.process_time() - client_before


def run_in_loop(coroutine: Any) -> Any:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        return runner.run(coroutine)


def measure(
    protocol: str,
    broker: Broker,
    transport: str,
    size: int,
    args: argparse.Namespace,
    certificates: Certificates,
) -> Result:
    plain_port, tls_port = broker.ports[protocol]
    tls = transport == TLS
    port = tls_port if tls else plain_port
    context = certificates.client_context() if tls else None
    pids = broker.pids()
    if protocol == "amqp":
        messages = args.amqp_messages
        seconds, broker_cpu, client_cpu = run_in_loop(amqp_run(port, context, pids, size, messages))
    elif protocol == "mqtt":
        load = TlsLoadRun(port, size, args.mqtt_seconds, context)
        result = run_in_loop(asyncio.wait_for(load.run(pids), args.mqtt_seconds + RUN_TIMEOUT_S))
        if result.stalled:
            raise RuntimeError(f"{broker.name} MQTT {transport} stalled")
        messages, seconds = result.delivered, result.seconds
        broker_cpu, client_cpu = result.cpu_s, result.client_cpu_s
    else:
        config = {"security.protocol": "SSL", "ssl.ca.location": str(certificates.ca)}
        messages = args.kafka_records
        seconds, broker_cpu, client_cpu = kafka_run(
            f"127.0.0.1:{port}", config if tls else {}, pids, size, messages
        )
    return Result(protocol, broker.name, transport, size, messages, seconds, broker_cpu, client_cpu)


# -- the report ----------------------------------------------------------------------------------


def machine() -> str:
    return amqp_bench.machine()


def best(results: list[Result], **match: Any) -> Result | None:
    runs = [r for r in results if all(getattr(r, key) == value for key, value in match.items())]
    return max(runs, key=lambda r: r.rate) if runs else None


def table(results: list[Result]) -> str:
    rows = [
        "| protocol | body | broker | plain msg/s | TLS msg/s | TLS/plain | broker CPU % "
        "plain / TLS | broker CPU µs/msg plain / TLS | client CPU % plain / TLS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r.protocol, r.size, r.broker) for r in results},
        key=lambda key: (PROTOCOLS.index(key[0]), key[1], key[2] != "BraidMQ"),
    )
    for protocol, size, name in keys:
        plain = best(results, protocol=protocol, size=size, broker=name, transport=PLAIN)
        tls = best(results, protocol=protocol, size=size, broker=name, transport=TLS)
        if plain is None or tls is None:
            continue
        label = {"amqp": "AMQP", "mqtt": "MQTT QoS 1", "kafka": "Kafka produce"}[protocol]
        rows.append(
            f"| {label} | {size} B | {name} | {plain.rate:,.0f} | {tls.rate:,.0f} | "
            f"{tls.rate / plain.rate:.2f} | {plain.cpu_percent:.0f} / {tls.cpu_percent:.0f} | "
            f"{plain.cpu_us_per_message:.1f} / {tls.cpu_us_per_message:.1f} | "
            f"{plain.client_percent:.0f} / {tls.client_percent:.0f} |"
        )
    return "\n".join(rows)


def start_brokers(
    stack: contextlib.ExitStack, args: argparse.Namespace, root: Path, certificates: Certificates
) -> dict[str, list[Broker]]:
    """The brokers each protocol runs on: BraidMQ, and the peer where it can run here."""
    ours = stack.enter_context(braid(root, certificates))
    brokers: dict[str, list[Broker]] = {protocol: [ours] for protocol in args.protocols}
    if args.braid_only:
        return brokers
    if "amqp" in args.protocols:
        rabbit = stack.enter_context(peer(RabbitTls, root, certificates))
        if isinstance(rabbit, RabbitTls):
            ports = {"amqp": (rabbit.port, rabbit.amqps_port)}
            brokers["amqp"].append(Broker("RabbitMQ", ports, rabbit.broker_pids, rabbit.version))
    if "mqtt" in args.protocols:
        (root / "mosquitto").mkdir()
        mosquitto = stack.enter_context(peer(MosquittoTls, root / "mosquitto", certificates))
        if isinstance(mosquitto, MosquittoTls):
            ports = {"mqtt": (mosquitto.port, mosquitto.mqtts_port)}
            brokers["mqtt"].append(Broker("Mosquitto", ports, mosquitto.pids, mosquitto.version))
    return brokers


def run_protocol(
    protocol: str, brokers: list[Broker], args: argparse.Namespace, certificates: Certificates
) -> list[Result]:
    results = []
    for broker in brokers:  # warm-up: connections, queues, the first handshakes
        for transport in (PLAIN, TLS):
            measure(protocol, broker, transport, args.sizes[0], warmup(args), certificates)
    for size in args.sizes:
        for round_number in range(args.rounds):
            order = (PLAIN, TLS) if round_number % 2 == 0 else (TLS, PLAIN)
            for broker in brokers:
                for transport in order:
                    result = measure(protocol, broker, transport, size, args, certificates)
                    results.append(result)
                    print(
                        f"round {round_number + 1} {protocol:<5} {size:>5} B {broker.name:<9} "
                        f"{transport:<5} {result.rate:>9,.0f} msg/s  broker CPU "
                        f"{result.cpu_percent:4.0f}% ({result.cpu_us_per_message:.1f} µs/msg)  "
                        f"client CPU {result.client_percent:4.0f}%",
                        flush=True,
                    )
    return results


def warmup(args: argparse.Namespace) -> argparse.Namespace:
    """Small runs that open the connections and queues and make the first TLS handshakes."""
    return argparse.Namespace(
        amqp_messages=min(2000, args.amqp_messages),
        mqtt_seconds=min(0.5, args.mqtt_seconds),
        kafka_records=min(5000, args.kafka_records),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tls", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs per broker and size")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--amqp-messages", type=int, default=AMQP_MESSAGES, help="per run")
    parser.add_argument("--mqtt-seconds", type=float, default=MQTT_SECONDS, help="per run")
    parser.add_argument("--kafka-records", type=int, default=KAFKA_RECORDS, help="per run")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--braid-only", action="store_true", help="skip RabbitMQ and Mosquitto")
    parser.add_argument("--dir", default=None, help="where temporary directories go")
    args = parser.parse_args(argv)
    if any(size < 8 for size in args.sizes):
        parser.error("MQTT payloads hold an 8-byte timestamp: sizes must be >= 8")
    root = Path(tempfile.mkdtemp(prefix="braid-bench-tls-", dir=args.dir))
    root.chmod(0o755)  # the peers run as their own users and read the certificates here
    started = time.perf_counter()
    results: list[Result] = []
    try:
        certificates = Certificates.make(root / "pki")
        with contextlib.ExitStack() as stack:
            brokers = start_brokers(stack, args, root, certificates)
            versions = {b.name: b.version for each in brokers.values() for b in each}
            for protocol in args.protocols:
                results += run_protocol(protocol, brokers[protocol], args, certificates)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    shown = ", ".join(f"{name} {version}" for name, version in versions.items())
    print(f"{datetime.date.today()} on {machine()}; {shown}; best of {args.rounds} rounds")
    print(table(results))
    print(f"(bench took {time.perf_counter() - started:.0f} s)")
    return 0
