"""Real redis-server processes for the cluster tests (the Debian package's binary): a server on a
Unix socket or a free loopback port in its own directory, replicas of it, and
``redis-server --sentinel`` processes watching it. Everything started through a
:class:`RedisProcesses` is stopped when its ``with`` block ends, whatever happened in it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_DEADLINE_S = 15.0  # generous: two cores shared with the rest of the suite
POLL_S = 0.02


def free_port() -> int:
    """A loopback port nothing listens on now (redis-server binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def until(check, deadline_s: float, what: str):  # type: ignore[no-untyped-def]
    """Poll ``check()`` until it returns something true; fail with ``what`` after the
    deadline. Errors of ``check`` (a server not up yet) count as not yet."""
    end = time.monotonic() + deadline_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            result = check()
        except (redis.RedisError, OSError) as exc:
            last = exc
        else:
            if result:
                return result
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


class RedisServer:
    """One redis-server. ``port=None``: a Unix socket only (``--port 0``), in a short
    temporary directory (socket paths are limited to 107 bytes)."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        replica_of: RedisServer | None = None,
        appendonly: bool = False,
    ) -> None:
        self.directory = directory
        self.port = port
        self.replica_of = replica_of
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None
        self._socket_dir = tempfile.mkdtemp(prefix="braid-redis-")
        self.socket_path = os.path.join(self._socket_dir, "redis.sock")
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        if self.port is None:
            return f"unix://{self.socket_path}"
        return f"redis://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = [
            REDIS_SERVER,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port or 0),
            "--unixsocket",
            self.socket_path,
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            # A replica's first sync starts at once (Redis 7 waits 5 s for more replicas).
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.replica_of is not None:
            assert self.replica_of.port is not None, "a replica follows a TCP master"
            args += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        return args

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket_path, socket_timeout=5)

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

        def ready() -> bool:
            self._check_alive()
            with self.client() as client:
                if not client.ping():
                    return False
                if self.replica_of is None:
                    return True
                link = client.info("replication").get("master_link_status")
                return link == "up"

        until(ready, START_DEADLINE_S, f"redis-server in {self.directory}")

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            log = self.directory / "redis.log"
            text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise AssertionError(f"redis-server exited ({self.process.returncode}):\n{text}")

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like (the AOF keeps what ``appendfsync always``
        wrote)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused one dies too
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self._socket_dir, ignore_errors=True)


class SentinelServer:
    """``redis-server <conf> --sentinel`` watching ``master`` as ``service`` (quorum 2): the
    master is judged down after a second without an answer; ``failover_timeout_ms`` bounds a
    failover that does not finish (and how soon another may start)."""

    def __init__(
        self,
        directory: Path,
        master: RedisServer,
        service: str,
        *,
        failover_timeout_ms: int = 10000,
    ) -> None:
        assert master.port is not None
        self.directory = directory
        self.port = free_port()
        self.service = service
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        # Sentinel rewrites its configuration file, so it is one per process.
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {directory}\n"
            f"logfile {directory / 'sentinel.log'}\n"
            f"sentinel monitor {service} 127.0.0.1 {master.port} 2\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
        )

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [REDIS_SERVER, str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            with self.client() as client:
                return bool(client.ping())

        until(ready, START_DEADLINE_S, f"sentinel on port {self.port}")

    def master_port(self) -> int:
        with self.client() as client:
            _, port = client.sentinel_get_master_addr_by_name(self.service)
            return int(port)

    def replica_count(self) -> int:
        with self.client() as client:
            return len(client.sentinel_slaves(self.service))

    def peer_count(self) -> int:
        """The other sentinels this one heard of (their hello messages: every 2 s)."""
        with self.client() as client:
            return len(client.sentinel_sentinels(self.service))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class RedisProcesses:
    """What a test started; :func:`redis_processes` stops it all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []

    def redis(
        self, *, tcp: bool = False, replica_of: RedisServer | None = None, appendonly: bool = False
    ) -> RedisServer:
        """Start a redis-server (on a Unix socket, or also a free port with ``tcp``)."""
        name = f"redis{len(self.servers)}"
        for _ in range(3):  # a free port taken by someone else meanwhile: pick another
            server = RedisServer(
                self.directory / name,
                port=free_port() if tcp or replica_of else None,
                replica_of=replica_of,
                appendonly=appendonly,
            )
            self.servers.append(server)
            try:
                server.start()
            except AssertionError:
                if server.port is None:
                    raise
                server.stop()
                continue
            return server
        raise AssertionError("redis-server did not start on three free ports")

    def sentinel_group(
        self,
        master: RedisServer,
        service: str,
        count: int = 3,
        *,
        failover_timeout_ms: int = 10000,
    ) -> str:
        """Start ``count`` sentinels watching ``master``; returns the redis+sentinel:// URL
        naming them all. They know the master's replicas before this returns."""
        with master.client() as client:
            replicas = int(client.info("replication")["connected_slaves"])
        for _ in range(count):
            sentinel = SentinelServer(
                self.directory / f"sentinel{len(self.sentinels)}",
                master,
                service,
                failover_timeout_ms=failover_timeout_ms,
            )
            self.sentinels.append(sentinel)
            sentinel.start()
        for sentinel in self.sentinels[-count:]:
            until(
                lambda s=sentinel: s.replica_count() >= replicas,
                START_DEADLINE_S,
                f"sentinel {sentinel.port} to see the replicas",
            )
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels[-count:])
        return f"redis+sentinel://{hosts}/{service}"

    def sentinels_acquainted(self) -> None:
        """Wait until every sentinel knows the others: a failover needs a quorum of them to
        agree the master is down, and a majority to elect the one that promotes a replica."""
        for sentinel in self.sentinels:
            until(
                lambda s=sentinel: s.peer_count() >= len(self.sentinels) - 1,
                START_DEADLINE_S,
                f"sentinel {sentinel.port} to hear of the others",
            )

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()


@contextmanager
def redis_processes(directory: Path) -> Iterator[RedisProcesses]:
    processes = RedisProcesses(directory)
    try:
        yield processes
    finally:
        processes.stop()
