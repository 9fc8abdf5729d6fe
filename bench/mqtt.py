"""``python -m bench mqtt``: MQTT publish -> deliver throughput and p99 latency, BraidMQ against
Mosquitto, RabbitMQ's MQTT plugin and amqtt's broker, in the same run, alternating.

Workloads: QoS 0 and QoS 1 (publish and subscription), 100-byte and 1 KiB payloads. For each
workload every broker runs in turn (``--rounds`` times, alternating; the best round counts), each
on its own port, started once for the whole run:

- ``braid``: ``python -m braid serve`` (MQTT listener only), default settings (``sync``
  durability: a QoS 1 PUBACK waits for the group-commit fsync);
- ``mosquitto``: the Debian package, ``max_queued_messages 0`` and ``max_inflight_messages 0``
  (no caps, so it neither drops nor throttles what the client's window allows), no persistence;
- ``rabbitmq``: ``rabbitmq-server`` with ``rabbitmq_mqtt``, run as user ``rabbitmq`` with a
  unique node name and its own temporary directories, loopback only;
- ``amqtt``: amqtt's ``Broker`` in its own Python process (anonymous auth plugin only).

The load client is one process (uvloop when present) speaking MQTT 3.1.1 over raw sockets with
BraidMQ's own sans-IO codec (``gateway.mqtt.codec``): a subscriber connection and a publisher
connection on one topic. It is closed-loop: at most ``--window`` messages are published and not
yet delivered (and, for QoS 1, not yet PUBACKed), so queues stay bounded and the latency is the
broker's, not a backlog's. Each payload starts with the send time (``time.monotonic_ns``);
latency is receive time minus that. Throughput is delivered messages over the time from the
first publish to the last delivery. A broker's CPU is its processes' CPU time over the run
(psutil: the process and its children).

Each broker run is bounded (``--seconds``), and so is the whole run (about 3 minutes with the
defaults); brokers that are not installed are reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.rabbitmq import launch_rabbitmq, rabbitmq_missing, rabbitmq_version, stop_rabbitmq
from gateway.mqtt.codec import (
    Connack,
    Connect,
    MqttDecoder,
    Suback,
    Subscribe,
    Subscription,
    encode,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BROKERS = ("braid", "braid-async", "mosquitto", "rabbitmq", "amqtt")
# (QoS, payload bytes)
WORKLOADS = ((0, 100), (0, 1024), (1, 100), (1, 1024))
DEFAULT_SECONDS = 2.0
DEFAULT_ROUNDS = 3
DEFAULT_WINDOW = 1000
WARMUP_MESSAGES = 2000
# A run that delivers nothing for this long has stalled (a broker dropping messages).
STALL_S = 3.0
START_TIMEOUT_S = 60.0
V311 = 4
TIMESTAMP = struct.Struct(">Q")
TARGETS = {"amqtt": 5.0, "rabbitmq": 1.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[Any] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} not open after {timeout:.0f}s")


# -- brokers -----------------------------------------------------------------------------------


@dataclass
class BrokerProcess:
    name: str
    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[Any] | None = None
    version: str = ""

    def available(self) -> str | None:
        """None if it can run here, else why not."""
        return None

    def start(self) -> None:
        raise NotImplementedError

    def pids(self) -> list[int]:
        import psutil

        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root.pid] + [child.pid for child in root.children(recursive=True)]
        except psutil.Error:
            return []

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


class Braid(BrokerProcess):
    durability = "sync"

    def start(self) -> None:
        data = self.workdir / "braid-data"
        config = self.workdir / "braid.toml"
        config.write_text(f'[log]\ndurability = "{self.durability}"\n')
        command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
        command += ["--config", str(config)]
        command += ["--data-dir", str(data), "--mqtt-port", str(self.port)]
        for other in ("--mqtt-ws-port", "--amqp-port", "--kafka-port", "--http-port"):
            command += [other, "0"]
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=(self.workdir / "braid.log").open("w"),
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("braid ready"):
            raise RuntimeError(f"braid did not start: {line!r}")
        from braid import version

        self.version = version()


class BraidAsync(Braid):
    """BraidMQ with ``durability = "async"``: a QoS 1 PUBACK once the record is in the log's
    shared memory map (survives a process crash; the disk is synced every 200 ms)."""

    durability = "async"


class Mosquitto(BrokerProcess):
    def available(self) -> str | None:
        return (
            None
            if shutil.which("mosquitto")
            else "mosquitto not installed (apt-get install mosquitto)"
        )

    def start(self) -> None:
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_queued_messages 0\n"
            "max_queued_bytes 0\n"
            "max_inflight_messages 0\n"
            "set_tcp_nodelay true\n"
            "log_type error\n"
        )
        self.process = subprocess.Popen(
            ["mosquitto", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "mosquitto.log").open("w"),
        )
        wait_for_port(self.port, 10, self.process)
        out = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, check=False)
        self.version = (out.stdout.splitlines() or [""])[0].replace("mosquitto version ", "")


class RabbitMQ(BrokerProcess):
    """rabbitmq-server with rabbitmq_mqtt (bench/rabbitmq.py starts and stops it)."""

    base: Path | None = None
    plugins: tuple[str, ...] = ("rabbitmq_mqtt",)

    def available(self) -> str | None:
        return rabbitmq_missing()

    def config(self, node_dir: Path) -> list[str]:
        """The node's rabbitmq.conf lines besides its AMQP listener (files it needs may be put
        in ``node_dir``, which becomes the node's)."""
        return [
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.port}",
            "mqtt.allow_anonymous = true",
            "loopback_users = none",
        ]

    def amqp_port(self) -> int:
        return free_port()

    def ports(self) -> list[int]:
        """The ports to wait for before the node counts as started."""
        return [self.port]

    def start(self) -> None:
        # Its own directory under the system temp dir: the run's work dir is private to us.
        base = self.base = Path(tempfile.mkdtemp(prefix="bench-rabbitmq-"))
        os.chmod(base, 0o755)
        node_dir = base / "node"
        node_dir.mkdir()
        self.process = launch_rabbitmq(
            node_dir,
            node=f"braidbench{os.getpid()}",
            amqp_port=self.amqp_port(),
            dist_port=free_port(),
            config=self.config(node_dir),
            plugins=self.plugins,
        )
        for port in self.ports():
            wait_for_port(port, START_TIMEOUT_S, self.process)
        self.version = rabbitmq_version()

    def stop(self) -> None:
        try:
            if self.process is not None:
                stop_rabbitmq(self.process)
        finally:
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)


AMQTT_SCRIPT = """
import asyncio, sys
from amqtt.broker import Broker
config = {
    "listeners": {"default": {"type": "tcp", "bind": "127.0.0.1:%d"}},
    "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
}
async def main():
    broker = Broker(config)
    await broker.start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


class Amqtt(BrokerProcess):
    def available(self) -> str | None:
        try:
            import amqtt  # noqa: F401
        except ImportError:
            return "amqtt not installed"
        return None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", AMQTT_SCRIPT % self.port],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "amqtt.log").open("w"),
        )
        wait_for_port(self.port, 20, self.process)
        import importlib.metadata

        self.version = importlib.metadata.version("amqtt")


BROKER_CLASSES: dict[str, type[BrokerProcess]] = {
    "braid": Braid,
    "braid-async": BraidAsync,
    "mosquitto": Mosquitto,
    "rabbitmq": RabbitMQ,
    "amqtt": Amqtt,
}


# -- the load client ---------------------------------------------------------------------------
#
# Lean on purpose (the brokers, not the client, must be measured): the publisher sends chunks of
# identical packets built once per chunk (one send timestamp per chunk; QoS 1 packet ids patched
# in with pack_into); the subscriber walks the received bytes without building packet objects,
# reading the timestamp of one message in LATENCY_SAMPLE and collecting QoS 1 packet ids for one
# joined PUBACK write; the publisher counts PUBACKs by their 4 bytes.

LATENCY_SAMPLE = 16
CHUNK = 256
_PUBACK = b"\x40\x02"
_PID = struct.Struct(">H")


class _Peer(asyncio.Protocol):
    """One raw MQTT 3.1.1 connection; CONNACK and SUBACK through the codec, then raw bytes."""

    def __init__(self, run: LoadRun, role: str) -> None:
        self.run = run
        self.role = role
        self.decoder: MqttDecoder | None = MqttDecoder(V311, max_packet_size=1 << 24)
        self.transport: asyncio.Transport | None = None
        self.rest = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        if decoder is not None:  # setup: CONNACK / SUBACK
            for packet in decoder.feed(data):
                future = self.run.replies.pop(type(packet), None)
                if future is not None and not future.done():
                    future.set_result(packet)
            return
        if self.role == "sub":
            self.run.on_sub_bytes(self, data)
        else:
            self.run.on_pub_bytes(self, data)


@dataclass
class RunResult:
    delivered: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float
    stalled: bool = False
    client_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0


class LoadRun:
    """One closed-loop run: publisher and subscriber on one topic at one QoS."""

    def __init__(self, port: int, qos: int, size: int, window: int, seconds: float) -> None:
        self.port = port
        self.qos = qos
        self.size = size
        self.window = window
        self.seconds = seconds
        self.topic = f"bench/{os.getpid()}/{time.monotonic_ns()}"
        self.padding = b"x" * (size - TIMESTAMP.size)
        # Byte offsets inside one PUBLISH we build (also what the broker sends back: 3.1.1).
        topic_bytes = self.topic.encode()
        remaining = 2 + len(topic_bytes) + (2 if qos else 0) + size
        header = bytes((0x30 | (qos << 1),)) + _varint(remaining)
        self.prefix = header + _PID.pack(len(topic_bytes)) + topic_bytes
        self.packet_size = len(self.prefix) + (2 if qos else 0) + size
        self.sent = 0
        self.acked = 0
        self.received = 0
        self.latencies: list[int] = []
        self.measuring = False
        self.stop_sending_at = 0.0
        self.first_send = 0
        self.last_receive = 0
        self.next_id = 0
        self.limit = 0
        self.pump_scheduled = False
        self.done: asyncio.Future[None] | None = None
        self.sub: _Peer | None = None
        self.pub: _Peer | None = None
        self.replies: dict[type, asyncio.Future[Any]] = {}

    async def _open(self, client_id: str, role: str) -> _Peer:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_connection(lambda: _Peer(self, role), "127.0.0.1", self.port)
        waiter = self.replies[Connack] = loop.create_future()
        assert peer.transport is not None
        peer.transport.write(encode(Connect(client_id, V311, True, 60), V311))
        connack = await asyncio.wait_for(waiter, 10)
        if connack.reason_code:
            raise RuntimeError(f"CONNACK {connack.reason_code}")
        return peer

    async def setup(self) -> None:
        loop = asyncio.get_running_loop()
        tag = f"{os.getpid()}-{time.monotonic_ns() % 1_000_000}"
        self.sub = await self._open(f"bench-sub-{tag}", "sub")
        waiter = self.replies[Suback] = loop.create_future()
        assert self.sub.transport is not None
        self.sub.transport.write(encode(Subscribe(1, (Subscription(self.topic, self.qos),)), V311))
        suback = await asyncio.wait_for(waiter, 10)
        if suback.reason_codes[0] >= 0x80:
            raise RuntimeError("SUBACK refused")
        self.pub = await self._open(f"bench-pub-{tag}", "pub")
        self.sub.decoder = self.pub.decoder = None  # raw bytes from now on

    def on_sub_bytes(self, peer: _Peer, data: bytes) -> None:
        buf = peer.rest + data if peer.rest else data
        size = len(buf)
        pos = 0
        count = self.received
        qos = self.qos
        pids: list[bytes] = []
        latencies = self.latencies if self.measuring else None
        now = time.monotonic_ns()
        while pos + 2 <= size:
            length = buf[pos + 1]
            body = pos + 2
            if length & 0x80:
                if pos + 3 > size:
                    break
                length = (length & 0x7F) | (buf[pos + 2] << 7)
                body = pos + 3
            end = body + length
            if end > size:
                break
            if buf[pos] & 0xF0 == 0x30:
                count += 1
                at = body + 2 + ((buf[body] << 8) | buf[body + 1])
                if qos:
                    pids.append(buf[at : at + 2])
                    at += 2
                if latencies is not None and not count % LATENCY_SAMPLE:
                    latencies.append(now - TIMESTAMP.unpack_from(buf, at)[0])
            pos = end
        peer.rest = buf[pos:]
        if pids and peer.transport is not None:
            peer.transport.write(_PUBACK + _PUBACK.join(pids))
        if count != self.received:
            self.received = count
            self.last_receive = now
            self._schedule_pump()

    def on_pub_bytes(self, peer: _Peer, data: bytes) -> None:
        total = len(peer.rest) + len(data)
        acks, extra = divmod(total, 4)  # only PUBACKs (4 bytes) come during a run
        peer.rest = b"\x00" * extra
        if acks:
            self.acked += acks
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        if not self.pump_scheduled:
            self.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self.pump_scheduled = False
        done = self.done
        if done is None or done.done():
            return
        if self.measuring and self.sent < self.limit and time.monotonic() >= self.stop_sending_at:
            self.limit = self.sent  # time is up: wait for what is in flight
        if self.received >= self.limit and (not self.qos or self.acked >= self.limit):
            done.set_result(None)
            return
        room = self.window - (self.sent - self.received)
        if self.qos:
            room = min(room, self.window - (self.sent - self.acked))
        room = min(room, self.limit - self.sent, CHUNK)
        if room <= 0:
            return
        now = time.monotonic_ns()
        if not self.first_send and self.measuring:
            self.first_send = now
        packet = self.prefix + (b"\x00\x00" if self.qos else b"") + TIMESTAMP.pack(now)
        packet += self.padding
        if self.qos:
            chunk = bytearray(packet * room)
            pid_at = len(self.prefix)
            step = self.packet_size
            next_id = self.next_id
            for index in range(room):
                next_id = next_id % 65535 + 1
                _PID.pack_into(chunk, pid_at + index * step, next_id)
            self.next_id = next_id
            data = bytes(chunk)
        else:
            data = packet * room
        self.sent += room
        pub = self.pub
        assert pub is not None
        assert pub.transport is not None
        pub.transport.write(data)
        self._schedule_pump()

    async def _phase(self, limit: int, measuring: bool) -> bool:
        """Send up to ``limit`` messages (or for ``seconds``); False if it stalled."""
        loop = asyncio.get_running_loop()
        self.limit = limit
        self.measuring = measuring
        self.stop_sending_at = time.monotonic() + self.seconds
        self.done = loop.create_future()
        self._pump()
        while True:
            before = self.received
            try:
                await asyncio.wait_for(asyncio.shield(self.done), STALL_S)
                return True
            except TimeoutError:
                if self.received == before:
                    return False

    async def run(self, pids: list[int]) -> RunResult:
        import psutil

        await self.setup()
        if not await self._phase(WARMUP_MESSAGES, measuring=False):
            return RunResult(self.received, 0, 0, 0, 0, stalled=True)
        self.sent = self.acked = self.received = 0
        self.first_send = self.last_receive = 0
        cpu_before = _cpu(pids, psutil)
        client_before = time.process_time()
        ok = await self._phase(1 << 40, measuring=True)
        cpu = _cpu(pids, psutil) - cpu_before
        client_cpu = time.process_time() - client_before
        elapsed = (self.last_receive - self.first_send) / 1e9
        latencies = sorted(self.latencies)
        p50 = latencies[len(latencies) // 2] / 1e6 if latencies else 0.0
        p99 = latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else 0.0
        for peer in (self.pub, self.sub):
            if peer is not None and peer.transport is not None:
                peer.transport.write(b"\xe0\x00")  # DISCONNECT
                peer.transport.close()
        return RunResult(self.received, elapsed, p50, p99, cpu, not ok, client_cpu)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _cpu(pids: list[int], psutil: Any) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def run_load(
    port: int, qos: int, size: int, window: int, seconds: float, pids: list[int]
) -> RunResult:
    async def main() -> RunResult:
        return await LoadRun(port, qos, size, window, seconds).run(pids)

    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        return runner.run(asyncio.wait_for(main(), seconds + 60))


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


# -- the run -----------------------------------------------------------------------------------


def _table(results: dict[tuple[int, int], dict[str, RunResult]], names: list[str]) -> list[str]:
    lines = [
        "| workload | broker | msgs/s | p50 ms | p99 ms | broker CPU | client CPU | braid / it "
        "| braid-async / it |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (qos, size), by_broker in results.items():
        for name in names:
            result = by_broker.get(name)
            if result is None:
                continue
            cpu = f"{100 * result.cpu_s / result.seconds:.0f}%" if result.seconds else "-"
            client = f"{100 * result.client_cpu_s / result.seconds:.0f}%" if result.seconds else "-"
            ratios = []
            for ours in ("braid", "braid-async"):
                mine = by_broker.get(ours)
                ok = mine is not None and result.rate and not name.startswith("braid")
                ratios.append(f"{mine.rate / result.rate:.2f}x" if ok and mine else "")
            stalled = " (stalled)" if result.stalled else ""
            lines.append(
                f"| QoS {qos}, {size} B | {name} | {result.rate:,.0f}{stalled} | "
                f"{result.p50_ms:.2f} | {result.p99_ms:.2f} | {cpu} | {client} | {ratios[0]} "
                f"| {ratios[1]} |"
            )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench mqtt", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated subset")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="per broker run")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    parser.add_argument("--qos", default="0,1")
    parser.add_argument("--sizes", default="100,1024")
    args = parser.parse_args(argv)
    names = [name for name in args.brokers.split(",") if name]
    unknown = [name for name in names if name not in BROKER_CLASSES]
    if unknown:
        parser.error(f"unknown brokers {unknown}")
    workloads = [
        (int(qos), int(size)) for qos in args.qos.split(",") for size in args.sizes.split(",")
    ]
    started = time.monotonic()
    print(f"# python -m bench mqtt, {datetime.date.today()}")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(f"# Python {platform.python_version()}; client: one process, raw sockets, MQTT 3.1.1")
    workdir = Path(tempfile.mkdtemp(prefix="bench-mqtt-"))
    brokers: dict[str, BrokerProcess] = {}
    results: dict[tuple[int, int], dict[str, RunResult]] = {}
    try:
        for name in names:
            broker = BROKER_CLASSES[name](name, workdir / name)
            broker.workdir.mkdir(parents=True, exist_ok=True)
            reason = broker.available()
            if reason is not None:
                print(f"# {name}: skipped ({reason})")
                continue
            try:
                broker.start()
            except Exception as error:  # a peer that does not start is reported, not fatal
                print(f"# {name}: did not start: {error}")
                broker.stop()
                continue
            brokers[name] = broker
            print(f"# {name} {broker.version} on port {broker.port}")
        for qos, size in workloads:
            by_broker: dict[str, RunResult] = {}
            for _round in range(args.rounds):
                for name, broker in brokers.items():
                    # The others are stopped (SIGSTOP) while one is measured: an idle Erlang VM
                    # still spins its schedulers, which would take CPU from the broker measured.
                    others = [p for n, b in brokers.items() if n != name for p in b.pids()]
                    _signal_all(others, signal.SIGSTOP)
                    try:
                        result = run_load(
                            broker.port, qos, size, args.window, args.seconds, broker.pids()
                        )
                    except Exception as error:
                        print(f"# {name} QoS {qos} {size} B: failed: {error!r}")
                        continue
                    finally:
                        _signal_all(others, signal.SIGCONT)
                    best = by_broker.get(name)
                    if best is None or result.rate > best.rate:
                        by_broker[name] = result
                    print(
                        f"# {name:9} QoS {qos} {size:5} B: {result.rate:10,.0f} msg/s "
                        f"p99 {result.p99_ms:7.2f} ms{' STALLED' if result.stalled else ''}",
                        flush=True,
                    )
            results[(qos, size)] = by_broker
    finally:
        for broker in brokers.values():
            with contextlib.suppress(Exception):
                broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print("\n".join(_table(results, names)))
    print()
    failed = False
    for (qos, size), by_broker in results.items():
        for ours in ("braid", "braid-async"):
            braid = by_broker.get(ours)
            if braid is None:
                continue
            for peer, target in TARGETS.items():
                other = by_broker.get(peer)
                if other is None or not other.rate:
                    continue
                ratio = braid.rate / other.rate
                verdict = "PASS" if ratio >= target else "FAIL"
                if ours == "braid":  # the default settings are what the targets are about
                    failed |= ratio < target
                print(
                    f"{verdict}: QoS {qos} {size} B {ours}/{peer} = {ratio:.2f}x (target {target}x)"
                )
            mosquitto = by_broker.get("mosquitto")
            if mosquitto is not None and mosquitto.rate:
                ratio = braid.rate / mosquitto.rate
                print(f"INFO: QoS {qos} {size} B {ours}/mosquitto = {ratio:.2f}x")
    print(f"# total {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
