"""``python -m bench soak``: issue 21's soak. Healthy mixed load from all three protocols, once
without and once with rate-limited abusers, each phase on its own fresh ``braid serve`` (every
listener on, default settings) for the same ``--duration``. Not in CI: the lead runs the
10-minute one (``--duration 600``) on a quiet machine.

Healthy load (one asyncio loop, uvloop when present; Kafka in two threads), each at a fixed
target rate (``--rate`` messages/s per protocol) so that it does not need all the CPU and the
abusers' cost shows as a shortfall:

- AMQP: a publisher with confirms (at most ``WINDOW`` unconfirmed) to a durable queue, a consumer
  with manual acks (``bench.amqp.RawClient``);
- MQTT 3.1.1: a QoS 1 publisher and a QoS 1 subscriber on one topic (``gateway.mqtt.codec``);
- Kafka: Produce v7 acks=all, one request at a time (``bench.kafka_load``), and a consumer
  (kafka-python, assigned partition 0 from the start).

Every message carries its id; the ids the broker acknowledged (confirm, PUBACK, Produce
response) must all be consumed: after the phase the publishers stop and the consumers get
``DRAIN_S`` to catch up; what is acknowledged and still not consumed is "lost" (must be 0).
Throughput is acknowledged-and-consumed messages over the phase's duration.

Abusers (second phase only, in a thread of blocking sockets):

- one MQTT subscriber on ``#`` that never reads its socket (the broker aborts it after
  ``[limits] stalled_client_timeout_s``; then a new one takes its place);
- one MQTT client publishing QoS 0 to a fresh first-level topic (a new broker topic each)
  ``--abuse-rate`` times a second;
- partial frames on every listener (AMQP, MQTT, MQTT over WebSocket, Kafka, HTTP): every
  ``--partial-interval`` s a new connection per listener sends half a frame and holds it
  (the broker drops it after its handshake or incomplete-request timeout); at most
  ``MAX_HELD`` held per listener, the oldest closed by us beyond that.

A sampler thread reads, every ``--sample-interval`` s, the broker's anonymous memory (the
``braid_process_anonymous_memory_bytes`` gauge of ``/metrics``: its heap, without the mapped
log), its RSS and its open descriptors (``/proc/PID/fd``). The table gives per phase the
throughputs, memory first / last / max and its least-squares slope (flat: about 0), the most
descriptors and the lost count, then the with/without throughput ratio (issue 21's goal: at
least 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands

from bench import amqp as amqp_bench
from bench import kafka_load
from gateway.kafka.records import RecordInput, build_batch
from gateway.mqtt.codec import (
    Connect,
    Subscribe,
    Subscription,
    encode,
    encode_puback,
    encode_publish,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DURATION_S = 600.0  # issue 21: "bounded, e.g. 10 minutes"
RATE = 200  # healthy messages/s per protocol: well under what one core serves (docs/benchmarks.md)
ABUSE_RATE = 10.0  # fresh topics per second
PARTIAL_INTERVAL_S = 1.0  # a new half-frame connection per listener this often
MAX_HELD = 100  # half-frame connections held per listener at most (the bench's own fds)
SAMPLE_INTERVAL_S = 5.0
BODY_SIZE = 100
WINDOW = 1000  # unacknowledged publishes per client at most (as bench amqp / bench mqtt)
TICK_S = 0.02  # publishers send what is due this often
DRAIN_S = 30.0  # after a phase, how long consumers get to catch up before "lost" is counted
CONNECT_TIMEOUT_S = 10.0
V311 = 4
CONNACK, PUBLISH, PUBACK, SUBACK = 2, 3, 4, 9  # MQTT packet types (§2.1.2)
ID = struct.Struct(">Q")  # every healthy message starts with its id
ANON_GAUGE = re.compile(rb"^braid_process_anonymous_memory_bytes (\S+)$", re.MULTILINE)
ADMIN = ("guest", "guest")  # braid serve's default administrator (loopback only)
TCP_ESTABLISHED = 1  # tcpi_state, the first byte of TCP_INFO (include/net/tcp_states.h)
LISTENERS = ("amqp", "mqtt", "mqtt-ws", "kafka", "http")


def body(message_id: int) -> bytes:
    return ID.pack(message_id) + b"x" * (BODY_SIZE - ID.size)


@dataclass
class Flow:
    """One protocol's healthy pair: what was acknowledged to the publisher, what was consumed."""

    name: str
    acked: set[int] = field(default_factory=set)
    consumed: set[int] = field(default_factory=set)
    consumed_in_time: int = 0  # consumed before the phase's end (the throughput's numerator)
    errors: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.acked - self.consumed)


class Pacer:
    """How many messages are due at ``rate``/s since the start, less those already sent."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.sent = 0

    def due(self) -> int:
        return max(0, int((time.monotonic() - self.started) * self.rate) - self.sent)


# --- the broker --------------------------------------------------------------------------------


@dataclass
class Broker:
    process: subprocess.Popen[Any]
    ports: dict[str, int]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def warnings(self) -> int:
        return sum(
            " WARNING " in line for line in self.log.read_text(errors="replace").splitlines()
        )


@contextlib.contextmanager
def braid_server(root: Path) -> Iterator[Broker]:
    ports = {name: amqp_bench.free_port() for name in LISTENERS}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(root / "braid-data"), "--log-level", "warning"]
    for name, port in ports.items():
        command += [f"--{name}-port", str(port)]
    log = root / "braid.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
        )
    try:
        for port in ports.values():
            amqp_bench.wait_for_port(port, process, "braid serve")
        yield Broker(process, ports, log)
    finally:
        amqp_bench.stop_group(process)


# --- sampling ----------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # seconds since the phase started
    anon: int  # bytes
    rss: int  # bytes
    fds: int


class Sampler:
    """Reads the broker's memory and descriptors every interval, in a thread."""

    def __init__(self, broker: Broker, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self.samples: list[Sample] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        auth = base64.b64encode(":".join(ADMIN).encode()).decode()
        self._request = urllib.request.Request(
            f"http://127.0.0.1:{broker.ports['http']}/metrics",
            headers={"Authorization": f"Basic {auth}"},
        )

    def __enter__(self) -> Sampler:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        process = psutil.Process(self.broker.pid)
        while True:
            try:
                with urllib.request.urlopen(self._request, timeout=10) as response:
                    match = ANON_GAUGE.search(response.read())
                anon = int(float(match[1])) if match else 0
                fds = len(os.listdir(f"/proc/{self.broker.pid}/fd"))
                at = time.monotonic() - self.started
                self.samples.append(Sample(at, anon, process.memory_info().rss, fds))
            except (OSError, psutil.Error, ValueError) as error:
                self.failures.append(repr(error))
            if self._stop.wait(self.interval):
                return


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if not spread:
        return 0.0
    return 60 * sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


# --- healthy AMQP ------------------------------------------------------------------------------


async def amqp_pair(port: int, rate: float, stop: asyncio.Event, flow: Flow) -> None:
    queue = f"soak-{os.getpid()}-{time.monotonic_ns()}"
    producer = await amqp_bench.RawClient.open("127.0.0.1", port)
    consumer = await amqp_bench.RawClient.open("127.0.0.1", port)
    await producer.call(commands.Queue.Declare(queue=queue, durable=True))
    await producer.call(commands.Confirm.Select())
    await consumer.call(commands.Basic.Qos(prefetch_count=amqp_bench.PREFETCH))
    ack = amqp_bench._ACK_FRAME.pack
    unconfirmed: set[int] = set()  # delivery tags, which are the ids (1, 2, ...)

    def on_deliver(tag: int, payload: memoryview) -> None:
        flow.consumed.add(ID.unpack_from(payload)[0])
        if not stop.is_set():
            flow.consumed_in_time += 1
        consumer.out.append(ack(1, 1, 13, 60, 80, tag, 0, 0xCE))

    def on_confirm(tag: int, multiple: bool, positive: bool) -> None:
        settled = [t for t in unconfirmed if t <= tag] if multiple else [tag]
        for t in settled:
            unconfirmed.discard(t)
            if positive:
                flow.acked.add(t)
            else:
                flow.errors.append(f"publish {t} nacked")

    consumer.on_deliver = on_deliver
    producer.on_confirm = on_confirm
    await consumer.call(commands.Basic.Consume(queue=queue, consumer_tag="soak"))
    prefix = amqp_bench.publish_prefix(1, queue, BODY_SIZE)
    pacer = Pacer(rate)
    while not stop.is_set():
        count = min(pacer.due(), WINDOW - len(unconfirmed))
        if count > 0:
            frames = []
            for message_id in range(pacer.sent + 1, pacer.sent + count + 1):
                unconfirmed.add(message_id)
                frames.append(prefix + body(message_id) + amqp_bench._FRAME_END)
            pacer.sent += count
            producer.write(b"".join(frames))
        if producer.closed.done() or consumer.closed.done():
            flow.errors.append("AMQP connection closed by the broker")
            return
        await asyncio.sleep(TICK_S)
    await drain(flow, lambda: not unconfirmed)
    await consumer.close()
    await producer.close()


async def drain(flow: Flow, settled: Callable[[], bool]) -> None:
    """Waits until every publish is settled and every acknowledged one consumed, or DRAIN_S."""
    deadline = time.monotonic() + DRAIN_S
    # Polled: the sets change in protocol callbacks, where no event is worth setting per message.
    while time.monotonic() < deadline and not (settled() and flow.acked <= flow.consumed):  # noqa: ASYNC110
        await asyncio.sleep(0.1)


# --- healthy MQTT ------------------------------------------------------------------------------


class MqttPeer(asyncio.Protocol):
    """One MQTT 3.1.1 connection. Packets are encoded with the broker's codec but read with a
    few lines here: a client needs only each packet's type, its packet id and the PUBLISH
    payload, and the decoder's API is the broker's to change."""

    def __init__(self, on_packet: Callable[[MqttPeer, int, memoryview], None]) -> None:
        self.on_packet = on_packet  # (peer, packet type, body)
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        while pos + 2 <= len(buf):
            length, shift, at = 0, 0, pos + 1  # remaining length: a varint (§1.5.5)
            while at < len(buf) and buf[at] & 0x80:
                length |= (buf[at] & 0x7F) << shift
                shift += 7
                at += 1
            if at >= len(buf):
                break
            length |= buf[at] << shift
            end = at + 1 + length
            if end > len(buf):
                break
            self.on_packet(self, buf[pos] >> 4, memoryview(bytes(buf[at + 1 : end])))
            pos = end
        del buf[:pos]

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


async def mqtt_pair(port: int, rate: float, stop: asyncio.Event, flow: Flow) -> None:
    loop = asyncio.get_running_loop()
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    topic = f"soak/healthy/{tag}"
    replies: dict[int, asyncio.Future[memoryview]] = {}  # packet type -> its body
    in_flight: dict[int, int] = {}  # packet id -> message id

    def on_packet(peer: MqttPeer, packet_type: int, packet: memoryview) -> None:
        if packet_type == PUBLISH:  # QoS 1: topic name, packet id, payload
            at = 2 + int.from_bytes(packet[:2])
            flow.consumed.add(ID.unpack_from(packet, at + 2)[0])
            if not stop.is_set():
                flow.consumed_in_time += 1
            peer.write(encode_puback(int.from_bytes(packet[at : at + 2]), version=V311))
        elif packet_type == PUBACK:
            message_id = in_flight.pop(int.from_bytes(packet[:2]), None)
            if message_id is not None:
                flow.acked.add(message_id)
        else:
            waiter = replies.pop(packet_type, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(packet)

    async def connect(client_id: str) -> MqttPeer:
        _, peer = await loop.create_connection(lambda: MqttPeer(on_packet), "127.0.0.1", port)
        waiter = replies[CONNACK] = loop.create_future()
        peer.write(encode(Connect(client_id, V311, True, 60), V311))
        connack = await asyncio.wait_for(waiter, CONNECT_TIMEOUT_S)
        if connack[1]:  # flags, return code
            raise RuntimeError(f"MQTT CONNACK {connack[1]}")
        return peer

    subscriber = await connect(f"soak-sub-{tag}")
    waiter = replies[SUBACK] = loop.create_future()
    subscriber.write(encode(Subscribe(1, (Subscription(topic, 1),)), V311))
    if (await asyncio.wait_for(waiter, CONNECT_TIMEOUT_S))[2] >= 0x80:  # packet id, code
        raise RuntimeError("MQTT SUBACK refused")
    publisher = await connect(f"soak-pub-{tag}")
    pacer = Pacer(rate)
    packet_id = 0
    while not stop.is_set():
        count = min(pacer.due(), WINDOW - len(in_flight))
        if count > 0:
            packets = []
            for message_id in range(pacer.sent + 1, pacer.sent + count + 1):
                packet_id = packet_id % 65535 + 1
                in_flight[packet_id] = message_id
                packets.append(encode_publish(topic, body(message_id), 1, packet_id, version=V311))
            pacer.sent += count
            publisher.write(b"".join(packets))
        if publisher.closed.done() or subscriber.closed.done():
            flow.errors.append("MQTT connection closed by the broker")
            return
        await asyncio.sleep(TICK_S)
    await drain(flow, lambda: not in_flight)
    for peer in (publisher, subscriber):
        peer.write(b"\xe0\x00")  # DISCONNECT
        assert peer.transport is not None
        peer.transport.close()


# --- healthy Kafka (blocking clients, in threads) ----------------------------------------------


def kafka_produce(
    port: int, topic: str, rate: float, stop: threading.Event, finished: threading.Event, flow: Flow
) -> None:
    """Produce v7 acks=all, one request in flight: what is due each tick, in one batch.
    ``finished`` is set once nothing more can be acknowledged (the consumer waits for it)."""
    try:
        connection = kafka_load.Connection(f"127.0.0.1:{port}", CONNECT_TIMEOUT_S * 3)
    except OSError as error:
        flow.errors.append(f"Kafka produce: {error!r}")
        finished.set()
        return
    try:
        kafka_load.check_api_versions(connection)
        pacer = Pacer(rate)
        correlation_id = 1
        while not stop.is_set():
            count = pacer.due()
            if count > 0:
                ids = range(pacer.sent + 1, pacer.sent + count + 1)
                records: list[RecordInput] = [(None, None, body(i), []) for i in ids]
                correlation_id += 1
                connection.send(
                    kafka_load.produce_frame(topic, build_batch(records)), correlation_id
                )
                kafka_load.produce_base_offset(connection.receive(correlation_id), topic)
                pacer.sent += count
                flow.acked.update(ids)
            stop.wait(TICK_S)
    except (OSError, kafka_load.LoadError) as error:
        flow.errors.append(f"Kafka produce: {error!r}")
    finally:
        connection.close()
        finished.set()


def kafka_consume(
    port: int, topic: str, stop: threading.Event, drained: Callable[[], bool], flow: Flow
) -> None:
    """kafka-python, partition 0 from the start, until ``stop`` and then until ``drained``
    (or DRAIN_S)."""
    from kafka import KafkaConsumer, TopicPartition

    try:
        consumer = KafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{port}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
    except Exception as error:  # the phase goes on; its table shows what this cost
        flow.errors.append(f"Kafka consumer: {error!r}")
        return
    try:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100).values():
                for record in records:
                    flow.consumed.add(ID.unpack_from(record.value)[0])
                    if not stop.is_set():
                        flow.consumed_in_time += 1
            if stop.is_set():
                deadline = deadline or time.monotonic() + DRAIN_S
                if drained():
                    return
    except Exception as error:
        flow.errors.append(f"Kafka consumer: {error!r}")
    finally:
        consumer.close()


def create_kafka_topic(port: int, topic: str) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


# --- abusers -----------------------------------------------------------------------------------


def half_frame(listener: str) -> bytes:
    """The first half of a valid-looking frame on ``listener``: its length promises more."""
    if listener == "amqp":  # protocol header, then a method frame of 200 bytes, 20 sent
        return amqp_bench._PROTOCOL_HEADER + struct.pack(">BHI", 1, 0, 200) + bytes(20)
    if listener == "mqtt":  # CONNECT with remaining length 50, 20 bytes sent
        return b"\x10\x32" + b"\x00\x04MQTT\x04\x02\x00\x3c" + bytes(10)
    if listener == "kafka":  # a 100-byte request, 20 sent
        return struct.pack(">i", 100) + struct.pack(">hhi", 18, 0, 1) + bytes(12)
    path = "/mqtt" if listener == "mqtt-ws" else "/metrics"  # headers never ended
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n".encode()


def alive(sock: socket.socket) -> bool:
    """Whether the broker has not closed (FIN or RST) this connection, without reading it."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return info[0] == TCP_ESTABLISHED


def open_socket(port: int, first: bytes, receive_buffer: int = 0) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:  # before connect, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(CONNECT_TIMEOUT_S)
    sock.connect(("127.0.0.1", port))
    sock.sendall(first)
    return sock


@dataclass
class AbuseReport:
    topics_created: int = 0
    stalled_subscribers: int = 0  # opened; each but the last was aborted by the broker
    partial_opened: dict[str, int] = field(default_factory=dict)
    partial_dropped_by_broker: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def abuse(
    ports: dict[str, int], rate: float, interval: float, stop: threading.Event
) -> AbuseReport:
    """Runs the three abusers until ``stop``; blocking sockets, never read."""
    report = AbuseReport()
    held: dict[str, list[socket.socket]] = {name: [] for name in LISTENERS}
    stalled: socket.socket | None = None
    creator: socket.socket | None = None
    topics = Pacer(rate)
    next_partial = time.monotonic()
    try:
        while not stop.is_set():
            try:
                if stalled is None or not alive(stalled):
                    if stalled is not None:
                        stalled.close()
                    stalled = open_socket(
                        ports["mqtt"],
                        encode(Connect(f"soak-stalled-{report.stalled_subscribers}", V311), V311)
                        + encode(Subscribe(1, (Subscription("#", 1),)), V311),
                        receive_buffer=4096,
                    )
                    report.stalled_subscribers += 1
                if creator is None or not alive(creator):
                    if creator is not None:
                        creator.close()
                    creator = open_socket(
                        ports["mqtt"], encode(Connect("soak-creator", V311), V311)
                    )
                count = topics.due()
                if count:
                    first = topics.sent
                    creator.sendall(
                        b"".join(
                            encode_publish(f"soak-abuse-{os.getpid()}-{n}/t", b"x", version=V311)
                            for n in range(first, first + count)
                        )
                    )
                    topics.sent += count
                    report.topics_created += count
                if time.monotonic() >= next_partial:
                    next_partial += interval
                    for name in LISTENERS:
                        sockets = held[name]
                        for sock in [s for s in sockets if not alive(s)]:
                            sockets.remove(sock)
                            sock.close()
                            report.partial_dropped_by_broker[name] = (
                                report.partial_dropped_by_broker.get(name, 0) + 1
                            )
                        if len(sockets) >= MAX_HELD:
                            sockets.pop(0).close()
                        sockets.append(open_socket(ports[name], half_frame(name)))
                        report.partial_opened[name] = report.partial_opened.get(name, 0) + 1
            except OSError as error:
                report.errors.append(repr(error))
            stop.wait(TICK_S * 5)
    finally:
        leftovers = [stalled, creator, *(s for group in held.values() for s in group)]
        for leftover in leftovers:
            if leftover is not None:
                leftover.close()
    return report


# --- one phase ---------------------------------------------------------------------------------


@dataclass
class PhaseResult:
    abused: bool
    seconds: float
    flows: list[Flow]
    samples: list[Sample]
    warnings: int
    abuse: AbuseReport | None
    sampler_failures: list[str]

    def rate(self, flow: Flow) -> float:
        return flow.consumed_in_time / self.seconds

    @property
    def total_rate(self) -> float:
        return sum(self.rate(flow) for flow in self.flows)


async def healthy_load(
    broker: Broker, args: argparse.Namespace, abused: bool, flows: dict[str, Flow]
) -> tuple[float, AbuseReport | None]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    thread_stop = threading.Event()
    topic = f"soak-{os.getpid()}-{time.monotonic_ns()}"
    await loop.run_in_executor(None, create_kafka_topic, broker.ports["kafka"], topic)
    kafka = flows["Kafka"]
    produced = threading.Event()  # the producer's last response is in: ``acked`` is final
    threads = [
        threading.Thread(
            target=kafka_produce,
            args=(broker.ports["kafka"], topic, args.rate, thread_stop, produced, kafka),
            daemon=True,
        ),
        threading.Thread(
            target=kafka_consume,
            args=(broker.ports["kafka"], topic, thread_stop),
            kwargs={
                "drained": lambda: produced.is_set() and kafka.acked <= kafka.consumed,
                "flow": kafka,
            },
            daemon=True,
        ),
    ]
    abuse_result: list[AbuseReport] = []
    if abused:
        threads.append(
            threading.Thread(
                target=lambda: abuse_result.append(
                    abuse(broker.ports, args.abuse_rate, args.partial_interval, thread_stop)
                ),
                daemon=True,
            )
        )
    tasks = [
        asyncio.create_task(amqp_pair(broker.ports["amqp"], args.rate, stop, flows["AMQP"])),
        asyncio.create_task(mqtt_pair(broker.ports["mqtt"], args.rate, stop, flows["MQTT"])),
    ]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    done, _ = await asyncio.wait(tasks, timeout=args.duration)
    seconds = time.monotonic() - started
    stop.set()
    thread_stop.set()
    for task in done:  # a pair that ended early: its error is the phase's finding
        if task.exception() is not None:
            flows["AMQP" if task is tasks[0] else "MQTT"].errors.append(repr(task.exception()))
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), DRAIN_S + 30)
    for thread in threads:
        await loop.run_in_executor(None, thread.join, DRAIN_S + 30)
    return seconds, abuse_result[0] if abuse_result else None


def run_phase(args: argparse.Namespace, abused: bool) -> PhaseResult:
    root = Path(tempfile.mkdtemp(prefix="braid-bench-soak-", dir=args.dir))
    flows = {name: Flow(name) for name in ("AMQP", "MQTT", "Kafka")}
    try:
        with braid_server(root) as broker, Sampler(broker, args.sample_interval) as sampler:
            try:
                import uvloop

                runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            except ImportError:
                runner = asyncio.Runner()
            with runner:
                seconds, report = runner.run(healthy_load(broker, args, abused, flows))
            warnings = broker.warnings()
    except RuntimeError:  # the broker did not start: its log says why
        log = (root / "braid.log").read_text(errors="replace").splitlines()
        print("\n".join(["braid serve's log, last lines:", *log[-20:]]), file=sys.stderr)
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return PhaseResult(
        abused, seconds, list(flows.values()), sampler.samples, warnings, report, sampler.failures
    )


# --- report ------------------------------------------------------------------------------------


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def table(phases: list[PhaseResult]) -> list[str]:
    lines = [
        "| phase | AMQP msg/s | MQTT msg/s | Kafka msg/s | total msg/s | anon MiB first / last / "
        "max | anon slope MiB/min (2nd half) | RSS MiB max | fds max | acknowledged | lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in phases:
        anon = [s.anon for s in phase.samples] or [0]
        # After the warm-up (first connections, caches, the first segments): the second half.
        later = [s for s in phase.samples if s.at >= phase.seconds / 2]
        slope = slope_per_minute([(s.at, s.anon / 2**20) for s in later])
        rss = max((s.rss for s in phase.samples), default=0)
        fds = max((s.fds for s in phase.samples), default=0)
        rates = " | ".join(f"{phase.rate(flow):,.0f}" for flow in phase.flows)
        lines.append(
            f"| {'with abusers' if phase.abused else 'without'} | {rates} | "
            f"{phase.total_rate:,.0f} | {mib(anon[0])} / {mib(anon[-1])} / {mib(max(anon))} | "
            f"{slope:+.2f} | {mib(rss)} | {fds} | "
            f"{sum(len(f.acked) for f in phase.flows):,} | {sum(f.lost for f in phase.flows)} |"
        )
    return lines


def details(phases: list[PhaseResult]) -> list[str]:
    lines = []
    base, abused = phases[0], phases[-1]
    if base.total_rate:
        per = ", ".join(
            f"{a.name} {abused.rate(a) / base.rate(b):.2f}"
            for a, b in zip(abused.flows, base.flows, strict=True)
            if base.rate(b)
        )
        lines.append(
            f"throughput with / without abusers: {abused.total_rate / base.total_rate:.2f} "
            f"(goal >= 0.8; {per})"
        )
    for phase in phases:
        label = "with abusers" if phase.abused else "without"
        lines.append(f"{label}: {phase.warnings} WARNING lines in the broker's log")
        for flow in phase.flows:
            if flow.errors or flow.lost:
                lines.append(f"{label}: {flow.name}: lost {flow.lost}; errors {flow.errors[:3]}")
        if phase.sampler_failures:
            lines.append(f"{label}: sampler failures: {phase.sampler_failures[:3]}")
        report = phase.abuse
        if report is not None:
            lines.append(
                f"abusers: {report.topics_created:,} fresh topics; "
                f"{report.stalled_subscribers} stalled '#' subscribers opened "
                f"({report.stalled_subscribers - 1} aborted by the broker); half frames opened / "
                "dropped by the broker: "
                + ", ".join(
                    f"{name} {report.partial_opened.get(name, 0)} / "
                    f"{report.partial_dropped_by_broker.get(name, 0)}"
                    for name in LISTENERS
                )
            )
            if report.errors:
                lines.append(f"abuser errors: {len(report.errors)} (first: {report.errors[0]})")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("--duration", type=float, default=DURATION_S, help="seconds per phase")
    parser.add_argument("--rate", type=float, default=RATE, help="healthy msg/s per protocol")
    parser.add_argument("--abuse-rate", type=float, default=ABUSE_RATE, help="fresh topics/s")
    parser.add_argument(
        "--partial-interval",
        type=float,
        default=PARTIAL_INTERVAL_S,
        help="seconds between half-frame connections per listener",
    )
    parser.add_argument("--sample-interval", type=float, default=SAMPLE_INTERVAL_S)
    parser.add_argument("--dir", default=None, help="where the data directories go")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    phases = []
    for abused in (False, True):
        phase = run_phase(args, abused)
        phases.append(phase)
        print(
            f"# {'with abusers' if abused else 'without'}: {phase.total_rate:,.0f} msg/s, "
            f"lost {sum(f.lost for f in phase.flows)}",
            flush=True,
        )
    print()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {amqp_bench.machine()}; "
        f"Python {sys.version.split()[0]}; a fresh braid serve (default settings) per phase, "
        f"{args.duration:g} s each; healthy target {args.rate:g} msg/s per protocol, "
        f"{BODY_SIZE} B; abusers: {args.abuse_rate:g} topics/s, a half frame per listener every "
        f"{args.partial_interval:g} s, one stalled '#' subscriber"
    )
    print("\n".join(table(phases)))
    print()
    print("\n".join(details(phases)))
    print(f"(bench took {time.perf_counter() - started:.0f} s)")
    lost = sum(f.lost for phase in phases for f in phase.flows)
    failed = any(f.errors for phase in phases for f in phase.flows)
    return 1 if lost or failed else 0
