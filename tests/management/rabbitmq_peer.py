"""A real RabbitMQ 3.10 (Debian's ``rabbitmq-server``) with ``rabbitmq_management``, on free
loopback ports, for comparing the management API's shapes (tests/management/test_rabbit_shapes.py).

Started as bench/amqp.py starts it: as user ``rabbitmq`` (the Erlang cookie and the node's
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
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.braid_process import free_ports

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
# An Erlang node with the management plugin takes 5-20 s to start on a loaded machine.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


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
    if not RABBITMQ_SERVER.exists():
        raise RuntimeError("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
    user = pwd.getpwnam("rabbitmq")
    base = root / "rabbitmq"
    for sub in ("", "mnesia", "log", "home"):
        (base / sub).mkdir(parents=True, exist_ok=True)
        os.chown(base / sub, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o755)  # (root: a directory of its own under /tmp, see the module doc)
    amqp_port, http_port, dist_port = free_ports(3)
    (base / "enabled_plugins").write_text("[rabbitmq_management].\n")
    (base / "rabbitmq.conf").write_text(
        "\n".join(
            (
                f"listeners.tcp.1 = 127.0.0.1:{amqp_port}",
                "management.tcp.ip = 127.0.0.1",
                f"management.tcp.port = {http_port}",
                "collect_statistics_interval = 500",
                "",
            )
        )
    )
    for name in ("enabled_plugins", "rabbitmq.conf"):
        os.chown(base / name, user.pw_uid, user.pw_gid)
    env = {
        "HOME": str(base / "home"),
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_NODENAME": f"braidshapes{os.getpid()}@localhost",
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
    }
    command = ["runuser", "-u", "rabbitmq", "--", "env", *(f"{k}={v}" for k, v in env.items())]
    with (root / "rabbitmq.out").open("w") as log_file:
        process = subprocess.Popen(
            [*command, str(RABBITMQ_SERVER)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=base,
        )
    peer = RabbitPeer(amqp_port, http_port, base / "log")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited {process.returncode}:\n{_output(root, base)}"
                )
            with contextlib.suppress(requests.RequestException):
                if peer.api("GET", "overview").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rabbitmq-server's management API did not answer:\n{_output(root, base)}"
                )
            time.sleep(0.25)
        yield peer
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)


def _output(root: Path, base: Path) -> str:
    """The end of what the node wrote: its console and its log files."""
    texts = [(root / "rabbitmq.out").read_text(errors="replace")[-3000:]]
    texts += [log.read_text(errors="replace")[-3000:] for log in (base / "log").glob("*.log")]
    return "\n".join(texts)
