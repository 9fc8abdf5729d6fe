"""Helpers for the CLI tests: run ``python -m braid`` as a real subprocess, free ports, HTTP."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.log import LogConfig, LogStore

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 30.0
GATEWAY_PORT_FLAGS = ("--amqp-port", "--mqtt-port", "--mqtt-ws-port", "--kafka-port")
SEGMENT_SIZE = 64 * 1024


def braid_env() -> dict[str, str]:
    """The environment for ``python -m braid``: the repo importable even when not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_braid(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "braid", *args],
        cwd=cwd or REPO_ROOT,
        env=braid_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class Broker:
    """A ``braid serve`` subprocess."""

    process: subprocess.Popen
    stderr_path: Path
    data_dir: Path
    ready_line: str = ""
    extra_stdout: list[str] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    @property
    def listeners(self) -> dict[str, str]:
        """``{name: "host:port" or "-"}`` from the ready line."""
        fields = self.ready_line.removeprefix("braid ready: ").split()
        return dict(item.split("=", 1) for item in fields)

    @property
    def http_url(self) -> str:
        return f"http://{self.listeners['http']}"

    def wait_ready(self) -> str:
        selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                pytest.fail(f"no ready line in {READY_TIMEOUT_S}s; stderr:\n{self.stderr}")
            if selector.select(remaining):
                line = self.process.stdout.readline()
                if not line:
                    code = self.process.wait(EXIT_TIMEOUT_S)
                    pytest.fail(f"braid serve exited {code} before ready; stderr:\n{self.stderr}")
                self.ready_line = line.rstrip("\n")
                return self.ready_line

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send ``signum``, wait for the exit; returns the exit code."""
        self.process.send_signal(signum)
        code = self.process.wait(EXIT_TIMEOUT_S)
        assert self.process.stdout is not None
        self.extra_stdout = self.process.stdout.read().splitlines()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(EXIT_TIMEOUT_S)


def start_broker(
    tmp_path: Path,
    *args: str,
    data_dir: Path | None = None,
    http: bool = True,
    gateways_off: bool = True,
    cwd: Path | None = None,
    wait: bool = True,
) -> Broker:
    """Start ``braid serve`` on 127.0.0.1 with a data dir under ``tmp_path``; gateway ports 0
    (off) unless ``gateways_off`` is false, the HTTP port free (or 0 without ``http``)."""
    data_dir = data_dir or tmp_path / "data"
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += ["--data-dir", str(data_dir)]
    if gateways_off:
        for flag in GATEWAY_PORT_FLAGS:
            command += [flag, "0"]
    if not any(arg.startswith("--http-port") for arg in args):
        command += ["--http-port", str(free_port() if http else 0)]
    command += list(args)
    stderr_path = tmp_path / f"braid-stderr-{time.monotonic_ns()}.log"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            command,
            cwd=cwd or tmp_path,
            env=braid_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    broker = Broker(process, stderr_path, data_dir)
    if wait:
        broker.wait_ready()
    return broker


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    """Brokers appended here are killed at teardown if a test left them running."""
    started: list[Broker] = []
    yield started
    for broker in started:
        broker.kill()


def http_get(url: str, *, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers.items()), error.read()


def parse_exposition(text: str) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """Prometheus text format → (samples by ``name{labels}``, HELP by family, TYPE by family)."""
    samples: dict[str, float] = {}
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, text_ = line[7:].partition(" ")
            helps[name] = text_
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples, helps, types


def write_log(data_dir: Path, records_per_queue: int = 150) -> dict[str, int]:
    """Fill a data dir through a LogStore (small segments, so several roll) and close it.

    Topic ``orders`` queues 0 and 1, plus one record in the system topic ``__offsets``.
    Returns facts to check against: the end position and the position of each order record.
    """
    store = LogStore(LogConfig(data_dir, segment_size=SEGMENT_SIZE))
    facts: dict[str, int] = {}
    for number in range(2 * records_per_queue):
        appended = store.append(
            "orders",
            number % 2,
            b"body-%d-" % number + b"x" * 400,
            key=b"key-%d" % number,
            headers=[("trace", b"t-%d" % number)],
            tags=["even"] if number % 2 == 0 else ["odd"],
            subject=f"orders.eu.{number}",
            client="test-client",
        )
        facts[f"orders/{number % 2}@{number // 2}"] = appended.position
    appended = store.append("__offsets", 0, b"group-commit")
    facts["end"] = appended.end
    facts["segments"] = len(store.commitlog.segments)
    store.close()
    return facts
