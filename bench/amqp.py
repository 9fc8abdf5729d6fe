"""``python -m bench amqp``: BraidMQ's AMQP front end against RabbitMQ, same client, same run.

Workload (each broker, each body size): one producer connection publishing persistent messages
(delivery_mode 2) to a durable queue through the default exchange, with publisher confirms and
at most ``--window`` unconfirmed; one consumer connection with prefetch 100 and a manual ack per
message. The body starts with the publish time (CLOCK_MONOTONIC ns), so the consumer measures
publish -> deliver latency. Throughput = messages / (first publish .. last delivery).

Both brokers run on loopback, started and stopped by the bench: ``braid serve`` (sync durability,
only the AMQP listener) and Debian's ``rabbitmq-server`` (as user rabbitmq, temporary mnesia and
log directories, a unique node name). Runs alternate BraidMQ, RabbitMQ, BraidMQ, ... so drift on
a shared machine hits both. Broker CPU is the broker's process tree CPU time over the run's wall
time (psutil), in % of one core.

The client is a raw-socket asyncio client: control frames through pamqp, the hot frames
(Basic.Publish triples, Basic.Deliver, Basic.Ack, confirms) packed and parsed with ``struct``,
so that the client, which shares the machine, costs far less than pika would.
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
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.base import Frame

from bench.rabbitmq import launch_rabbitmq, rabbitmq_version, stop_rabbitmq

REPO_ROOT = Path(__file__).resolve().parents[1]
SIZES = (100, 1024)
MESSAGES = 20_000
ROUNDS = 2
PREFETCH = 100
WINDOW = 1000  # unconfirmed publishes in flight
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0
FRAME_MAX = 131072

# --- a minimal AMQP 0-9-1 client --------------------------------------------------------------

_FRAME_HEADER = struct.Struct(">BHI")  # type, channel, size
_METHOD_ID = struct.Struct(">HH")  # class id, method id
_U64 = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
_ACK_FRAME = struct.Struct(">BHIHHQBB")  # Basic.Ack: frame header, 60/80, tag, bits, frame end
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_END = b"\xce"


def publish_prefix(channel: int, queue: str, body_size: int) -> bytes:
    """Basic.Publish to the default exchange + a content header (delivery_mode 2) + the
    header of the body frame: everything of a publish before its body."""
    rkey = queue.encode()
    args = b"\x00\x00" + b"\x00" + bytes((len(rkey),)) + rkey + b"\x00"
    method = _METHOD_ID.pack(60, 40) + args
    properties = b"\x10\x00\x02"  # flags: delivery_mode; delivery_mode = 2
    header = struct.pack(">HHQ", 60, 0, body_size) + properties
    return (
        _FRAME_HEADER.pack(1, channel, len(method))
        + method
        + _FRAME_END
        + _FRAME_HEADER.pack(2, channel, len(header))
        + header
        + _FRAME_END
        + _FRAME_HEADER.pack(3, channel, body_size)
    )


class RawClient(asyncio.Protocol):
    """One connection, channel 1. Control methods: ``await call(method)``."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.replies: asyncio.Queue[Frame] = asyncio.Queue()
        self.closed = self.loop.create_future()
        self.on_confirm: Any = None  # (tag, multiple, ack) -> None
        self.on_deliver: Any = None  # (delivery tag, body memoryview) -> None
        self._deliver_tag = 0
        self._body_left = 0
        self._body = bytearray()
        self.out: list[bytes] = []

    # transport ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        n = len(buf)
        pos = 0
        unpack_header = _FRAME_HEADER.unpack_from
        while n - pos >= 7:
            ftype, _channel, size = unpack_header(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            start = pos + 7
            if ftype == 1:
                class_id, method_id = _METHOD_ID.unpack_from(buf, start)
                if class_id == 60 and method_id == 60:  # Basic.Deliver
                    p = start + 4
                    p += 1 + buf[p]  # consumer tag
                    self._deliver_tag = _U64.unpack_from(buf, p)[0]
                elif class_id == 60 and method_id in (80, 120):  # confirms
                    tag, bits = _TAG_BITS.unpack_from(buf, start + 4)
                    self.on_confirm(tag, bool(bits & 1), method_id == 80)
                else:
                    self.replies.put_nowait(
                        pamqp_frame.unmarshal(bytes(buf[pos : end + 1]))[2]  # type: ignore[arg-type]
                    )
            elif ftype == 2:
                self._body_left = _U64.unpack_from(buf, start + 4)[0]
                self._body = bytearray()
                if not self._body_left:
                    self.on_deliver(self._deliver_tag, memoryview(b""))
            elif ftype == 3:
                self._body += buf[start:end]
                self._body_left -= size
                if self._body_left <= 0:
                    self.on_deliver(self._deliver_tag, memoryview(self._body))
            pos = end + 1
        del buf[:pos]
        if self.out:  # the acks of this read, in one write
            self.write(b"".join(self.out))
            self.out.clear()

    # control --------------------------------------------------------------------------------

    def send(self, method: Frame, channel: int = 1) -> None:
        self.write(pamqp_frame.marshal(method, channel))

    async def call(self, method: Frame, channel: int = 1) -> Frame:
        self.send(method, channel)
        return await asyncio.wait_for(self.replies.get(), 30)

    @classmethod
    async def open(cls, host: str, port: int) -> RawClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(cls, host, port)
        client.write(_PROTOCOL_HEADER)
        await asyncio.wait_for(client.replies.get(), 30)  # Connection.Start
        client.send(
            commands.Connection.StartOk(
                {"product": "braid-bench", "capabilities": {"publisher_confirms": True}},
                "PLAIN",
                "\x00guest\x00guest",
            ),
            0,
        )
        tune = await asyncio.wait_for(client.replies.get(), 30)
        assert isinstance(tune, commands.Connection.Tune)
        client.send(commands.Connection.TuneOk(tune.channel_max, min(FRAME_MAX, tune.frame_max)), 0)
        await client.call(commands.Connection.Open("/"), 0)
        await client.call(commands.Channel.Open())
        return client

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.call(commands.Connection.Close(200, "bye"), 0)
        if self.transport is not None:
            self.transport.close()


# --- one run -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    broker: str
    size: int
    messages: int
    seconds: float
    latencies_ms: list[float]
    broker_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def cpu_percent(self) -> float:
        return 100 * self.broker_cpu_s / self.seconds


async def run_once(
    name: str,
    port: int,
    pids: list[int],
    size: int,
    messages: int,
    window: int,
    queue: str,
    *,
    purge: bool = True,  # bench cluster: a fresh queue, maybe on another node (no remote purge)
) -> RunResult:
    producer = await RawClient.open("127.0.0.1", port)
    consumer = await RawClient.open("127.0.0.1", port)
    await producer.call(commands.Queue.Declare(queue=queue, durable=True))
    if purge:
        await producer.call(commands.Queue.Purge(queue=queue))
    await producer.call(commands.Confirm.Select())
    await consumer.call(commands.Basic.Qos(prefetch_count=PREFETCH))

    loop = asyncio.get_running_loop()
    latencies = [0.0] * messages
    received = 0
    done = loop.create_future()
    ack = _ACK_FRAME.pack
    monotonic_ns = time.monotonic_ns

    def on_deliver(tag: int, body: memoryview) -> None:
        nonlocal received
        if received < messages:
            latencies[received] = (monotonic_ns() - _U64.unpack_from(body, 0)[0]) / 1e6
        received += 1
        consumer.out.append(ack(1, 1, 13, 60, 80, tag, 0, 0xCE))
        if received == messages and not done.done():
            done.set_result(None)

    consumer.on_deliver = on_deliver
    await consumer.call(commands.Basic.Consume(queue=queue, consumer_tag="bench"))

    confirmed = 0
    nacked = 0
    window_open = asyncio.Event()

    def on_confirm(tag: int, multiple: bool, positive: bool) -> None:
        nonlocal confirmed, nacked
        # Confirms of one channel come in order: a single one settles everything before it
        # too (``multiple`` or not), counting-wise.
        confirmed = max(confirmed, tag)
        if not positive:
            nacked += 1
        window_open.set()

    producer.on_confirm = on_confirm
    prefix = publish_prefix(1, queue, size)
    padding = b"x" * (size - 8) + _FRAME_END
    pack_time = _U64.pack

    cpu = [psutil.Process(pid) for pid in pids]
    broker_cpu = sum(sum(p.cpu_times()[:2]) for p in cpu)
    client_cpu = time.process_time()
    started = time.perf_counter()
    published = 0
    while published < messages:
        room = min(window - (published - confirmed), messages - published)
        if room <= 0:
            window_open.clear()
            await asyncio.wait_for(window_open.wait(), RUN_TIMEOUT_S)
            continue
        batch = []
        for _ in range(min(room, 256)):
            batch.append(prefix + pack_time(monotonic_ns()) + padding)
        published += len(batch)
        producer.write(b"".join(batch))
        await asyncio.sleep(0)
    await asyncio.wait_for(done, RUN_TIMEOUT_S)
    seconds = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    broker_cpu = sum(sum(p.cpu_times()[:2]) for p in cpu) - broker_cpu
    while confirmed < messages:
        window_open.clear()
        await asyncio.wait_for(window_open.wait(), RUN_TIMEOUT_S)
    assert not nacked, f"{name}: {nacked} publishes nacked"
    await consumer.close()
    await producer.call(commands.Queue.Delete(queue=queue))
    await producer.close()
    return RunResult(name, size, messages, seconds, latencies, broker_cpu, client_cpu)


# --- the brokers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {READY_TIMEOUT_S} s")


def stop_group(process: subprocess.Popen[Any]) -> None:
    """SIGTERM the process group this bench started (start_new_session), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def tree_pids(process: subprocess.Popen[Any]) -> list[int]:
    parent = psutil.Process(process.pid)
    return [parent.pid, *(child.pid for child in parent.children(recursive=True))]


@contextlib.contextmanager
def braid_server(root: Path) -> Iterator[tuple[int, list[int]]]:
    port = free_port()
    data = root / "braid-data"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(data), "--amqp-port", str(port), "--log-level", "warning"]
    command += ["--mqtt-port", "0", "--mqtt-ws-port", "0", "--kafka-port", "0", "--http-port", "0"]
    with (root / "braid.log").open("w") as log_file:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            start_new_session=True,
        )
    try:
        wait_for_port(port, process, "braid serve")
        yield port, [process.pid]
    finally:
        stop_group(process)


@contextlib.contextmanager
def rabbitmq_server(root: Path) -> Iterator[tuple[int, list[int]]]:
    port = free_port()
    os.chmod(root, 0o755)  # the node's user must reach root/rabbitmq
    process = launch_rabbitmq(
        root / "rabbitmq", node=f"braidbench{os.getpid()}", amqp_port=port, dist_port=free_port()
    )
    try:
        wait_for_port(port, process, "rabbitmq-server")
        yield port, [pid for pid in tree_pids(process) if pid != process.pid]
    finally:
        stop_rabbitmq(process)


# --- main --------------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} vCPU {cpu}, {memory:.0f} GiB RAM, Linux {platform.release()}"


def table(results: list[RunResult]) -> str:
    rows = [
        "| body | broker | msgs/s (median) | p50 ms | p99 ms | broker CPU % | client CPU % |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for size in sorted({r.size for r in results}):
        summary = {}
        for broker in ("BraidMQ", "RabbitMQ"):
            runs = [r for r in results if r.size == size and r.broker == broker]
            if not runs:
                continue
            rate = statistics.median(r.rate for r in runs)
            p50 = statistics.median(r.percentile(0.50) for r in runs)
            p99 = statistics.median(r.percentile(0.99) for r in runs)
            cpu = statistics.median(r.cpu_percent for r in runs)
            client = statistics.median(100 * r.client_cpu_s / r.seconds for r in runs)
            summary[broker] = (rate, p99)
            rows.append(
                f"| {size} B | {broker} | {rate:,.0f} | {p50:.1f} | {p99:.1f} | {cpu:.0f} | "
                f"{client:.0f} |"
            )
        if len(summary) == 2:
            ratios.append(
                f"{size} B: throughput BraidMQ/RabbitMQ = "
                f"{summary['BraidMQ'][0] / summary['RabbitMQ'][0]:.2f}, p99 BraidMQ/RabbitMQ = "
                f"{summary['BraidMQ'][1] / summary['RabbitMQ'][1]:.2f}"
            )
    return "\n".join([*rows, "", *ratios])


async def run_all(args: argparse.Namespace, root: Path) -> list[RunResult]:
    results: list[RunResult] = []
    brokers = ["BraidMQ"] if args.braid_only else ["BraidMQ", "RabbitMQ"]
    with contextlib.ExitStack() as stack:
        servers = {}
        if args.braid_port:  # an already running braid serve (for profiling it)
            pid = next(
                c.pid
                for c in psutil.net_connections("tcp")
                if c.laddr and c.laddr.port == args.braid_port and c.status == "LISTEN"
            )
            servers["BraidMQ"] = (args.braid_port, [pid])
        else:
            servers["BraidMQ"] = stack.enter_context(braid_server(root))
        if "RabbitMQ" in brokers:
            servers["RabbitMQ"] = stack.enter_context(rabbitmq_server(root))
        for name in brokers:  # warm-up: connections, queue creation, JIT-free paths
            port, pids = servers[name]
            await run_once(name, port, pids, 100, 2000, args.window, "bench-warmup")
        for size in args.sizes:
            for round_number in range(args.rounds):
                for name in brokers:
                    port, pids = servers[name]
                    result = await run_once(
                        name, port, pids, size, args.messages, args.window, f"bench-{size}"
                    )
                    results.append(result)
                    print(
                        f"round {round_number + 1} {size:>5} B {name:<9} "
                        f"{result.rate:>9,.0f} msg/s  p50 {result.percentile(0.5):6.1f} ms  "
                        f"p99 {result.percentile(0.99):6.1f} ms  broker CPU "
                        f"{result.cpu_percent:4.0f}%",
                        flush=True,
                    )
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench amqp", description=__doc__)
    parser.add_argument("--messages", type=int, default=MESSAGES, help="per run")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs per broker and size")
    parser.add_argument("--window", type=int, default=WINDOW, help="unconfirmed publishes")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--braid-only", action="store_true", help="skip RabbitMQ")
    parser.add_argument("--dir", default=None, help="where temporary directories go")
    parser.add_argument(
        "--braid-port", type=int, default=0, help="use this running braid serve (profiling)"
    )
    args = parser.parse_args(argv)
    if any(size < 8 for size in args.sizes):
        parser.error("bodies hold an 8-byte timestamp: sizes must be >= 8")
    root = Path(tempfile.mkdtemp(prefix="braid-bench-amqp-", dir=args.dir))
    try:
        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        started = time.perf_counter()
        results = asyncio.run(run_all(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"{datetime.date.today()} on {machine()}; RabbitMQ {rabbitmq_version()}; ", end="")
    print(f"{args.messages} messages per run, window {args.window}, prefetch {PREFETCH}")
    print(table(results))
    print(f"(bench took {time.perf_counter() - started:.0f} s)")
    return 0
