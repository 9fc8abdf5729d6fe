"""A real RabbitMQ 3.10 (Debian's ``rabbitmq-server``) with ``rabbitmq_management``, on free
loopback ports, for comparing the management API's shapes (tests/management/test_rabbit_shapes.py).

Started by bench/rabbitmq.py: as user ``rabbitmq`` (the Erlang cookie and the node's
files must be its own) with its mnesia, log and home in directories it owns under the test's
temporary directory, the plugin enabled through ``RABBITMQ_ENABLED_PLUGINS_FILE`` and the
management listener's port in a ``rabbitmq.conf`` of its own. ``root`` must be reachable by
that user all along: not under pytest's ``/tmp/pytest-of-root``, which every pytest session
that starts (other tests running beside this one) makes private again (mode 0700). Statistics
are collected every 500 ms (RabbitMQ's default is 5 s), so counts show soon after traffic.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.rabbitmq import launch_rabbitmq, rabbitmq_output, stop_rabbitmq
from tests.braid_process import free_ports

# An Erlang node with the management plugin takes 5-20 s to start on a loaded machine.
START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class RabbitPeer:
    amqp_port: int
    http_port: int
    log_dir: Path

    def api(self, method: str, path: str, body: object = None) -> requests.Response:
        return requests.request(
            method,
            f"http://127.0.0.1:{self.http_port}/api/{path}",
            auth=("guest", "guest"),
            json=body,
            timeout=30,
        )


@contextlib.contextmanager
def rabbitmq_with_management(root: Path) -> Iterator[RabbitPeer]:
    os.chmod(root, 0o755)  # (root: a directory of its own under /tmp, see the module doc)
    base = root / "rabbitmq"
    amqp_port, http_port, dist_port = free_ports(3)
    process = launch_rabbitmq(
        base,
        node=f"braidshapes{os.getpid()}",
        amqp_port=amqp_port,
        dist_port=dist_port,
        config=(
            "management.tcp.ip = 127.0.0.1",
            f"management.tcp.port = {http_port}",
            "collect_statistics_interval = 500",
        ),
        plugins=("rabbitmq_management",),
    )
    peer = RabbitPeer(amqp_port, http_port, base / "log")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited {process.returncode}:\n{rabbitmq_output(base)}"
                )
            with contextlib.suppress(requests.RequestException):
                if peer.api("GET", "overview").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rabbitmq-server's management API did not answer:\n{rabbitmq_output(base)}"
                )
            time.sleep(0.25)
        yield peer
    finally:
        stop_rabbitmq(process)
