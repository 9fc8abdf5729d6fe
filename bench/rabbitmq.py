"""Debian's ``rabbitmq-server`` started by hand: the peer of ``bench amqp``, ``bench mqtt`` and
``bench tls``, and the management API the shape tests compare with
(tests/management/rabbitmq_peer.py). One start and one stop for all of them (each used to carry
its own copy).

Why by hand and not the system service: every run gets a node of its own on free loopback ports,
with its mnesia, log and home in a temporary directory, and leaves nothing behind. The node runs
as user ``rabbitmq`` (``runuser``, so the caller must be root): the Erlang cookie and the node's
files must be that user's own, so ``base`` and everything in it is handed to it, and ``base``'s
parents must let that user through (not pytest's private ``/tmp/pytest-of-root``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
STOP_TIMEOUT_S = 60.0


def rabbitmq_missing() -> str | None:
    """Why the node cannot be started here, or None when it can."""
    if not RABBITMQ_SERVER.exists():
        return "rabbitmq-server is not installed (apt-get install -y rabbitmq-server)"
    if os.geteuid() != 0 or not shutil.which("runuser"):
        return "needs root (runuser) to run rabbitmq-server as user rabbitmq"
    return None


def rabbitmq_version() -> str:
    """The installed server's version, from its directory name (no node needed)."""
    for entry in sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*")):
        return entry.name.split("-", 1)[1]
    return "?"


def launch_rabbitmq(
    base: Path,
    *,
    node: str,
    amqp_port: int,
    dist_port: int,
    config: Sequence[str] = (),
    plugins: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start a node named ``node@localhost`` in ``base`` (created): AMQP on 127.0.0.1:``amqp_port``,
    Erlang distribution on ``dist_port``, the ``config`` lines in its ``rabbitmq.conf``, the
    ``plugins`` enabled; its console goes to ``base/rabbitmq.out``. The caller waits for the
    ports it needs (a node takes 5-20 s, more with plugins on a loaded machine) and calls
    :func:`stop_rabbitmq`."""
    missing = rabbitmq_missing()
    if missing is not None:
        raise RuntimeError(missing)
    for sub in ("mnesia", "log", "home"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "rabbitmq.conf").write_text(
        "\n".join((f"listeners.tcp.default = 127.0.0.1:{amqp_port}", *config, ""))
    )
    (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    user = pwd.getpwnam("rabbitmq")
    for path in [base, *base.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)
    env = {
        "HOME": str(base / "home"),
        "RABBITMQ_NODENAME": f"{node}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
    }
    command = ["runuser", "-u", "rabbitmq", "--", "env", *(f"{k}={v}" for k, v in env.items())]
    with (base / "rabbitmq.out").open("wb") as console:
        # A session of its own: the stop signals the whole group (runuser, the Erlang VM, its
        # port helpers) at once.
        return subprocess.Popen(
            [*command, str(RABBITMQ_SERVER)],
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=base,
        )


def stop_rabbitmq(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the node's process group (a clean stop), SIGKILL if it is still there after
    ``STOP_TIMEOUT_S``."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)


def rabbitmq_output(base: Path) -> str:
    """The end of what the node wrote, its console and its log files (for an error message)."""
    texts = [(base / "rabbitmq.out").read_text(errors="replace")[-3000:]]
    texts += [log.read_text(errors="replace")[-3000:] for log in (base / "log").glob("*.log")]
    return "\n".join(texts)
