"""A real ``braid serve`` subprocess for end-to-end tests with the real client libraries.

Usage::

    with BraidProcess(tmp_path) as braid:          # every listener on a free 127.0.0.1 port
        producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
        ...
        braid.restart()                             # SIGTERM, then start on the same data dir
        braid.kill9()                               # SIGKILL (crash), then braid.start()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 30
LISTENERS = ("amqp", "mqtt", "mqtt-ws", "kafka", "http")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all held open while choosing (one at a time, the kernel
    may hand the port it just freed out again, and two listeners then collide)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class BraidProcess:
    def __init__(
        self,
        tmp_path: Path,
        *,
        listeners: tuple[str, ...] = LISTENERS,
        extra_args: tuple[str, ...] = (),
        data_dir: Path | None = None,
    ) -> None:
        self.tmp_path = tmp_path
        self.data_dir = data_dir or tmp_path / "braid-data"
        chosen = iter(free_ports(sum(name in listeners for name in LISTENERS)))
        self.ports = {name: (next(chosen) if name in listeners else 0) for name in LISTENERS}
        self.extra_args = extra_args
        self.process: subprocess.Popen[str] | None = None
        self.ready_line = ""
        self.stderr_path = tmp_path / "braid-stderr.log"

    # -- addresses -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def amqp_port(self) -> int:
        return self.ports["amqp"]

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.ports['amqp']}/"

    @property
    def mqtt_port(self) -> int:
        return self.ports["mqtt"]

    @property
    def mqtt_ws_port(self) -> int:
        return self.ports["mqtt-ws"]

    @property
    def kafka_port(self) -> int:
        return self.ports["kafka"]

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['kafka']}"

    @property
    def http_port(self) -> int:
        return self.ports["http"]

    # -- lifecycle -------------------------------------------------------------------------

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
        command += ["--data-dir", str(self.data_dir)]
        command += ["--amqp-port", str(self.ports["amqp"])]
        command += ["--mqtt-port", str(self.ports["mqtt"])]
        command += ["--mqtt-ws-port", str(self.ports["mqtt-ws"])]
        command += ["--kafka-port", str(self.ports["kafka"])]
        command += ["--http-port", str(self.ports["http"])]
        return command + list(self.extra_args)

    def start(self) -> BraidProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        stderr = self.stderr_path.open("a")
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        stderr.close()
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("braid ready"):
                self.ready_line = line.strip()
                return self
            if not line and self.process.poll() is not None:
                break
        self.kill9()
        raise RuntimeError(f"braid serve did not start:\n{self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signum)
        code = self.process.wait(EXIT_TIMEOUT_S)
        return code

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(EXIT_TIMEOUT_S)

    def restart(self) -> BraidProcess:
        code = self.stop()
        assert code == 0, f"braid serve exited {code}:\n{self.stderr()}"
        return self.start()

    def __enter__(self) -> BraidProcess:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.kill9() if exc_info[0] is not None else self.stop()
        self.kill9()


def interop_braid(path: Path, config: str) -> Iterator[BraidProcess]:
    """A module fixture's body: ``braid serve`` with AMQP, MQTT and Kafka listeners and
    ``config`` as its ``--config`` file (written into ``path``)."""
    config_file = path / "braid.toml"
    config_file.write_text(config)
    with BraidProcess(
        path, listeners=("amqp", "mqtt", "kafka"), extra_args=("--config", str(config_file))
    ) as process:
        yield process
