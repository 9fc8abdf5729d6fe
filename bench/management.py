"""``python -m bench mgmt``: what watching a broker costs it. The AMQP and MQTT loads of
``bench amqp`` and ``bench mqtt`` (their own clients and runs, smaller), each run with and
without a poller that GETs ``/metrics`` and ``/api/overview`` once a second, as a Prometheus
scrape and a dashboard do (``/api/overview`` with the administrator's basic auth).

One ``braid serve`` (AMQP, MQTT and HTTP listeners, default settings) serves every run. Per
workload, three pairs, interleaved (without, with; with, without; without, with) so drift on a
shared machine hits both sides alike. The table gives per side the median and the spread (min -
max) of the three runs, the with/without ratio of the medians, and whether the poller made a
median worse than the whole spread of the runs without it (issue 19's check: lower msgs/s than
the slowest run without it, or a longer p99 than the longest). The poller runs in a thread
of the bench process (off the load client's event loop) and reports what its GETs took.

Bounded: about two minutes with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import amqp as amqp_bench
from bench import mqtt as mqtt_bench

REPO_ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3  # pairs per workload (the "three interleaved runs")
POLL_INTERVAL_S = 1.0  # the "once a second"
POLL_PATHS = ("/metrics", "/api/overview")
AMQP_MESSAGES = 40_000  # ~3 s per run at bench amqp's rates here
AMQP_SIZE = 100
AMQP_WINDOW = 1000
MQTT_SECONDS = 4.0
MQTT_WINDOW = 1000
MQTT_WORKLOADS = ((0, 100), (1, 100))  # (QoS, payload bytes)
ADMIN = ("guest", "guest")  # braid serve's default administrator (loopback only)
HTTP_TIMEOUT_S = 30.0


@dataclass
class Sample:
    rate: float  # messages per second
    p99_ms: float
    cpu_percent: float  # the broker's, of one core


@dataclass
class Poller:
    """GETs every path once per interval, in a thread, until stopped."""

    port: int
    interval_s: float = POLL_INTERVAL_S
    took_ms: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mgmt-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(HTTP_TIMEOUT_S)

    def _run(self) -> None:
        auth = "Basic " + base64.b64encode(":".join(ADMIN).encode()).decode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S)
        next_at = time.monotonic()
        while not self._stop.is_set():
            for path in POLL_PATHS:
                started = time.perf_counter()
                try:
                    connection.request("GET", path, headers={"Authorization": auth})
                    response = connection.getresponse()
                    response.read()
                    if response.status != 200:
                        self.failures.append(f"{path}: HTTP {response.status}")
                except (OSError, http.client.HTTPException) as error:
                    self.failures.append(f"{path}: {error!r}")
                    connection.close()
                    connection = http.client.HTTPConnection(
                        "127.0.0.1", self.port, timeout=HTTP_TIMEOUT_S
                    )
                self.took_ms.setdefault(path, []).append((time.perf_counter() - started) * 1000)
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        connection.close()


@contextlib.contextmanager
def braid_server(root: Path) -> Iterator[tuple[int, int, int, list[int]]]:
    """``(amqp port, mqtt port, http port, pids)`` of a ``braid serve`` on loopback."""
    amqp_port, mqtt_port, http_port = (amqp_bench.free_port() for _ in range(3))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(root / "braid-data"), "--log-level", "warning"]
    command += ["--amqp-port", str(amqp_port), "--mqtt-port", str(mqtt_port)]
    command += ["--http-port", str(http_port), "--mqtt-ws-port", "0", "--kafka-port", "0"]
    with (root / "braid.log").open("w") as log_file:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
        )
    try:
        for port in (amqp_port, mqtt_port, http_port):
            amqp_bench.wait_for_port(port, process, "braid serve")
        yield amqp_port, mqtt_port, http_port, amqp_bench.tree_pids(process)
    finally:
        amqp_bench.stop_group(process)


def amqp_run(port: int, pids: list[int], messages: int) -> Sample:
    result = asyncio.run(
        amqp_bench.run_once("BraidMQ", port, pids, AMQP_SIZE, messages, AMQP_WINDOW, "bench-mgmt")
    )
    return Sample(result.rate, result.percentile(0.99), result.cpu_percent)


def mqtt_run(port: int, pids: list[int], qos: int, size: int, seconds: float) -> Sample:
    result = mqtt_bench.run_load(port, qos, size, MQTT_WINDOW, seconds, pids)
    if result.stalled:
        raise RuntimeError(f"MQTT QoS {qos} run stalled")
    return Sample(result.rate, result.p99_ms, 100 * result.cpu_s / result.seconds)


def _mqtt_runner(
    port: int, pids: list[int], qos: int, size: int, seconds: float
) -> Callable[[], Sample]:
    return lambda: mqtt_run(port, pids, qos, size, seconds)


def interleaved(
    run: Callable[[], Sample], poller: Poller, rounds: int, label: str
) -> dict[bool, list[Sample]]:
    """``rounds`` pairs of runs, without and with the poller, alternating which goes first."""
    samples: dict[bool, list[Sample]] = {False: [], True: []}
    for round_number in range(rounds):
        order = (False, True) if round_number % 2 == 0 else (True, False)
        for polled in order:
            if polled:
                poller.start()
            try:
                sample = run()
            finally:
                if polled:
                    poller.stop()
            samples[polled].append(sample)
            print(
                f"# {label:<16} {'with' if polled else 'without'} poller: "
                f"{sample.rate:9,.0f} msg/s  p99 {sample.p99_ms:7.2f} ms  "
                f"broker CPU {sample.cpu_percent:4.0f}%",
                flush=True,
            )
    return samples


def spread(values: list[float], digits: int = 0) -> str:
    return f"{min(values):,.{digits}f} - {max(values):,.{digits}f}"


def table(results: dict[str, dict[bool, list[Sample]]]) -> list[str]:
    lines = [
        "| workload | poller | msgs/s (median) | msgs/s spread | p99 ms (median) | p99 spread "
        "| broker CPU % | with / without | worse beyond the spread? |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for label, by_side in results.items():
        base_rates = [s.rate for s in by_side[False]]
        base_p99 = [s.p99_ms for s in by_side[False]]
        for polled in (False, True):
            samples = by_side[polled]
            rates = [s.rate for s in samples]
            p99s = [s.p99_ms for s in samples]
            cpu = statistics.median(s.cpu_percent for s in samples)
            ratio = verdict = ""
            if polled:
                rate_ratio = statistics.median(rates) / statistics.median(base_rates)
                p99_ratio = statistics.median(p99s) / statistics.median(base_p99)
                ratio = f"msgs/s {rate_ratio:.2f}, p99 {p99_ratio:.2f}"
                # The check is one-sided: the poller must not make a run slower than every
                # run without it, or its p99 longer than every one's; better is noise.
                worse = []
                if statistics.median(rates) < min(base_rates):
                    worse.append("msgs/s below")
                if statistics.median(p99s) > max(base_p99):
                    worse.append("p99 above")
                verdict = ", ".join(worse) or "no"
            lines.append(
                f"| {label} | {'with' if polled else 'without'} | "
                f"{statistics.median(rates):,.0f} | {spread(rates)} | "
                f"{statistics.median(p99s):.2f} | {spread(p99s, 2)} | {cpu:.0f} | {ratio} "
                f"| {verdict} |"
            )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench mgmt", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="pairs per workload")
    parser.add_argument("--amqp-messages", type=int, default=AMQP_MESSAGES, help="per AMQP run")
    parser.add_argument("--mqtt-seconds", type=float, default=MQTT_SECONDS, help="per MQTT run")
    parser.add_argument("--dir", default=None, help="where the data directory goes")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="braid-bench-mgmt-", dir=args.dir))
    results: dict[str, dict[bool, list[Sample]]] = {}
    with braid_server(root) as (amqp_port, mqtt_port, http_port, pids):
        poller = Poller(http_port)
        amqp_run(amqp_port, pids, 2000)  # warm-up: the queue, the first connections
        results[f"AMQP {AMQP_SIZE} B"] = interleaved(
            lambda: amqp_run(amqp_port, pids, args.amqp_messages),
            poller,
            args.rounds,
            f"AMQP {AMQP_SIZE} B",
        )
        for qos, size in MQTT_WORKLOADS:
            label = f"MQTT QoS {qos}, {size} B"
            results[label] = interleaved(
                _mqtt_runner(mqtt_port, pids, qos, size, args.mqtt_seconds),
                poller,
                args.rounds,
                label,
            )
    print()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {amqp_bench.machine()}; "
        f"Python {sys.version.split()[0]}; one braid serve (default settings); "
        f"AMQP: {args.amqp_messages} confirmed publishes per run, window {AMQP_WINDOW}; "
        f"MQTT 3.1.1: {args.mqtt_seconds:g} s per run, window {MQTT_WINDOW}; "
        f"poller: GET {' and '.join(POLL_PATHS)} every {POLL_INTERVAL_S:g} s"
    )
    print("\n".join(table(results)))
    print()
    for path, took in poller.took_ms.items():
        ordered = sorted(took)
        print(
            f"GET {path}: {len(took)} requests, median {statistics.median(took):.1f} ms, "
            f"max {ordered[-1]:.1f} ms"
        )
    if poller.failures:
        print(f"poller failures: {len(poller.failures)} (first: {poller.failures[0]})")
    print(f"(bench took {time.perf_counter() - started:.0f} s)")
    return 1 if poller.failures else 0
