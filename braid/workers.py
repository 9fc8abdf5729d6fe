"""``braid serve --workers N --data-dir ROOT``: the supervisor (docs/cluster.md section 9).

It has no listeners of its own. It:

1. takes ROOT (an exclusive flock on the directory for as long as it runs, so neither a
   second supervisor nor a single-node broker opens it) and creates it as ``braid cluster
   init`` does (``--shards``, default 16) or opens it;
2. without ``--cluster URL``, starts a private ``redis-server`` (the Debian package's) on the
   Unix socket ``ROOT/run/redis.sock`` (TCP off, AOF ``appendfsync always`` in ``ROOT/redis``:
   metadata writes are rare, a lost declare is worse than an fsync), and waits until it
   answers. A socket path past the kernel's 107 bytes moves ``run/`` to ``$XDG_RUNTIME_DIR``
   or ``/tmp`` (as ``braid-<cluster id>``);
3. starts N workers, ``braid serve ... --cluster URL --node-id i --expect-nodes N
   --supervised`` with node ids 0..N-1 (membership's ``node_order`` sorts integer ids
   numerically), the supervisor's own arguments passed on (config file, ports, TLS) without
   ``--workers``/``--shards``. Each binds the shared listener ports with SO_REUSEPORT and its
   own Kafka port (braid/server.py). Their stderr is relayed with a ``[worker i]`` prefix;
   once every worker printed its ready line the supervisor prints one ready line of its own;
4. restarts a worker that exits abnormally, after 1 s doubling to 30 s (back to 1 s after it
   ran :data:`STABLE_AFTER_S`). A worker that fails its very first start (exit 1 or 2 before its
   ready line: a refused root, a bad setting, a port in use) would only fail again: the
   supervisor stops everything and exits 1 with that worker's message; so it does after
   :data:`MAX_FAILED_STARTS` restarts in a row that failed before their ready line;
5. on SIGTERM or SIGINT forwards SIGTERM to every worker, waits for them (each closes its
   shard cleanly, ``epochs/<e>.closed``, and releases its lease), then stops Redis with
   ``SHUTDOWN`` (which saves) and exits 0.

Workers and Redis run in their own sessions (a terminal's Ctrl-C reaches the supervisor
alone, which stops them in order: Redis last, after the workers released their leases) and
get SIGTERM from the kernel should the supervisor die (``PR_SET_PDEATHSIG``), so none is left
behind serving on shared ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from braid.config import ServerSettings
from braid.dirlock import DirectoryLocked, lock_directory
from core.cluster import layout

log = logging.getLogger(__name__)

RUN_DIR: Final = "run"
REDIS_DIR: Final = "redis"
REDIS_SOCKET: Final = "redis.sock"
PID_FILE: Final = "supervisor.pid"
# sun_path is 108 bytes with its terminating NUL.
MAX_SOCKET_PATH: Final = 107
REDIS_START_TIMEOUT_S: Final = 30.0
REDIS_STOP_TIMEOUT_S: Final = 30.0
POLL_S: Final = 0.05
# Restart backoff of a worker that exited abnormally: 1 s doubling to 30 s, back to 1 s once
# it ran this long (it was serving, so its next failure is a new one).
BACKOFF_FIRST_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
STABLE_AFTER_S: Final = 60.0
# Restarts in a row that exit before their ready line: the supervisor gives up.
MAX_FAILED_STARTS: Final = 5
# How long a worker may take to stop on SIGTERM (closing its shard, releasing its lease)
# before it is killed.
WORKER_STOP_TIMEOUT_S: Final = 60.0
# Exit codes of `braid serve` that mean "this start is refused" (braid/server.py's start-up
# errors exit 1, a bad setting exits 2): before a worker's first ready line they are final.
REFUSED_CODES: Final = frozenset({1, 2})
# The supervisor's own flags: not passed to the workers.
SUPERVISOR_FLAGS: Final = ("--workers", "--shards")
# The Linux prctl option that signals a child when its parent dies.
PR_SET_PDEATHSIG: Final = 1
READY_PREFIX: Final = "braid ready: "
STDERR_TAIL: Final = 20  # lines of a worker's stderr kept for the message of a refusal


class SupervisorError(Exception):
    """The supervisor cannot run; the message says why."""


def worker_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` (``serve ...``) without the supervisor's own flags (and their values; also
    as ``--flag=value`` and argparse's unambiguous abbreviations, ``--work 2``)."""
    kept: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        name, equals, _value = token.partition("=")
        if _supervisor_flag(name):
            if not equals:
                next(tokens, None)
            continue
        kept.append(token)
    return kept


def _supervisor_flag(name: str) -> bool:
    # "--wo" and "--sh" are the shortest prefixes no other `braid serve` flag shares.
    return len(name) >= 4 and any(flag.startswith(name) for flag in SUPERVISOR_FLAGS)


def run_directory(root: Path, cluster_id: str) -> Path:
    """Where the Redis socket and the pid file go: ``ROOT/run``, unless the socket's path
    would pass the kernel's limit; then ``$XDG_RUNTIME_DIR`` (or ``/tmp``)/braid-<id>."""
    run = root.absolute() / RUN_DIR
    if len(os.fsencode(run / REDIS_SOCKET)) <= MAX_SOCKET_PATH:
        return run
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
    return base / f"braid-{cluster_id}"


def _die_with_parent(parent: int) -> None:
    """In a child, before exec: SIGTERM when the supervisor dies; its own session, so a
    terminal's signals reach the supervisor alone."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class Worker:
    """One worker process slot: node ``index``, restarted in place."""

    index: int
    process: asyncio.subprocess.Process | None = None
    ready_line: str | None = None  # this run's ready line (None: not ready yet)
    ever_ready: bool = False
    started_s: float = 0.0
    failed_starts: int = 0
    backoff_s: float = BACKOFF_FIRST_S
    restarts: int = 0
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set at the first ready line
    relays: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def message(self) -> str:
        """What the worker said last on stderr: its refusal's reason."""
        errors = [line for line in self.stderr_tail if " ERROR " in line or "error:" in line]
        return (errors or list(self.stderr_tail) or ["(nothing on stderr)"])[-1]


class Supervisor:
    """``await run()`` until SIGTERM/SIGINT (module docstring)."""

    def __init__(self, settings: ServerSettings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.count = settings.cluster.workers
        self.root = Path(settings.data_dir)
        self.worker_argv = worker_arguments(argv)
        self.workers = [Worker(index) for index in range(self.count)]
        self.url = settings.cluster.url
        self.redis: asyncio.subprocess.Process | None = None
        self.redis_socket: Path | None = None
        self.run_dir: Path | None = None
        self.stopping = asyncio.Event()
        self.failure: str | None = None  # why the supervisor stops with exit 1
        self._lock_fd: int | None = None

    # -- the whole run ---------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        watchers: list[asyncio.Task[None]] = []
        try:
            found = self._open_root()
            log.info(
                "supervisor of %d workers on data root %s (%d shards, cluster %s)",
                self.count,
                self.root,
                found.shards,
                found.cluster_id,
            )
            self.run_dir = run_directory(self.root, found.cluster_id)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / PID_FILE).write_text(f"{os.getpid()}\n")
            if self.url is None:
                self.url = await self._start_redis()
            watchers = [
                loop.create_task(self._keep_running(worker), name=f"braid-worker-{worker.index}")
                for worker in self.workers
            ]
            if self.redis is not None:
                watchers.append(loop.create_task(self._watch_redis(), name="braid-redis"))
            await self._announce_when_ready()
            await self.stopping.wait()
        except SupervisorError as error:
            self.failure = str(error)
        finally:
            self.stopping.set()
            await self._stop_workers()
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await self._stop_redis()
            self._release_root()
        if self.failure is not None:
            log.error("%s", self.failure)
            return 1
        log.info("stopped")
        return 0

    def _on_signal(self, signum: signal.Signals) -> None:
        if self.stopping.is_set():
            log.warning("%s: already stopping", signum.name)
            return
        log.info("%s received: stopping the workers", signum.name)
        self.stopping.set()

    def _fail(self, reason: str) -> None:
        if self.failure is None and not self.stopping.is_set():
            self.failure = reason
        self.stopping.set()

    # -- ROOT ------------------------------------------------------------------------------

    def _open_root(self) -> layout.ClusterLayout:
        """Lock ROOT and create or open it as a data root (``braid cluster init``'s logic)."""
        root = self.root
        try:
            fd = lock_directory(root)
        except DirectoryLocked:
            raise SupervisorError(
                f"data root {root} is in use by another braid process (a supervisor, a "
                "broker, or `braid cluster init`)"
            ) from None
        except OSError as error:
            raise SupervisorError(f"cannot use data root {root}: {error}") from None
        self._lock_fd = fd
        if layout.detect(root) == "single":
            raise SupervisorError(
                f"data dir {root} is a single-node data directory, not a cluster data root: "
                f"stop its broker and run `braid cluster init --adopt {root}` to make it one "
                "(docs/cluster.md section 2)"
            )
        try:
            return layout.init(root, self.settings.cluster.shards)
        except (layout.LayoutError, OSError) as error:
            raise SupervisorError(str(error)) from None

    def _release_root(self) -> None:
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                (self.run_dir / PID_FILE).unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- the private Redis -------------------------------------------------------------------

    async def _start_redis(self) -> str:
        assert self.run_dir is not None
        binary = shutil.which("redis-server")
        if binary is None:
            raise SupervisorError(
                "--workers without --cluster runs a private redis-server, and none is on PATH "
                "(Debian: apt-get install redis-server), or give --cluster URL"
            )
        data = self.root.absolute() / REDIS_DIR
        data.mkdir(parents=True, exist_ok=True)
        socket_path = self.run_dir / REDIS_SOCKET
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()  # a crashed run's; nothing answers on it (ROOT is locked)
        self.redis_socket = socket_path
        self.redis = await asyncio.create_subprocess_exec(
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(socket_path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--logfile",
            str(data / "redis.log"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        await self._wait_for_redis(socket_path, data / "redis.log")
        url = f"unix://{socket_path}"
        log.info("private redis-server (pid %d) answers on %s", self.redis.pid, url)
        return url

    async def _wait_for_redis(self, socket_path: Path, log_file: Path) -> None:
        from redis import asyncio as aioredis
        from redis import exceptions as redis_errors

        assert self.redis is not None
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline and not self.stopping.is_set():
            if self.redis.returncode is not None:
                raise SupervisorError(
                    f"redis-server exited {self.redis.returncode} at start: "
                    f"{_tail(log_file) or 'see ' + str(log_file)}"
                )
            client = aioredis.Redis(unix_socket_path=str(socket_path))
            try:
                if await client.ping():
                    return
            except (redis_errors.RedisError, OSError) as error:
                last = error
            finally:
                await client.aclose()
            await asyncio.sleep(POLL_S)
        if self.stopping.is_set():
            raise SupervisorError("stopped while redis-server was starting")
        raise SupervisorError(
            f"redis-server did not answer on {socket_path} within {REDIS_START_TIMEOUT_S:.0f} s "
            f"(last error: {last!r})"
        )

    async def _watch_redis(self) -> None:
        assert self.redis is not None
        code = await self.redis.wait()
        if not self.stopping.is_set():
            self._fail(f"the private redis-server exited {code}: stopping the workers")

    async def _stop_redis(self) -> None:
        """``SHUTDOWN`` (which saves and fsyncs the AOF), then wait for the process."""
        process = self.redis
        if process is None or process.returncode is not None:
            return
        from redis import asyncio as aioredis
        from redis import exceptions as redis_errors
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        assert self.redis_socket is not None
        # No retries: SHUTDOWN closes the connection, which redis-py would otherwise answer
        # by reconnecting (to a socket that is gone) with backoff, for seconds.
        client = aioredis.Redis(
            unix_socket_path=str(self.redis_socket), retry=Retry(NoBackoff(), 0)
        )
        try:
            await client.shutdown()
        except (redis_errors.RedisError, OSError) as error:
            # redis-py reads the closed connection as an error; the process's exit tells.
            log.debug("redis SHUTDOWN: %r", error)
        finally:
            with contextlib.suppress(redis_errors.RedisError, OSError):
                await client.aclose()
        try:
            await asyncio.wait_for(process.wait(), REDIS_STOP_TIMEOUT_S)
        except TimeoutError:
            log.warning("redis-server did not stop after SHUTDOWN: killing it")
            process.kill()
            await process.wait()
        log.info("private redis-server stopped (exit %s)", process.returncode)

    # -- workers ---------------------------------------------------------------------------

    def worker_command(self, index: int) -> list[str]:
        command = [sys.executable, "-m", "braid", *self.worker_argv]
        if self.settings.cluster.url is None:
            assert self.url is not None
            command += ["--cluster", self.url]
        command += ["--node-id", str(index), "--expect-nodes", str(self.count), "--supervised"]
        return command

    async def _start_worker(self, worker: Worker) -> None:
        worker.ready_line = None
        worker.stderr_tail.clear()
        worker.process = process = await asyncio.create_subprocess_exec(
            *self.worker_command(worker.index),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()),
        )
        worker.started_s = time.monotonic()
        log.info("worker %d started (pid %d)", worker.index, process.pid)
        assert process.stdout is not None
        assert process.stderr is not None
        worker.relays = [
            asyncio.get_running_loop().create_task(self._read_stdout(worker, process.stdout)),
            asyncio.get_running_loop().create_task(self._relay_stderr(worker, process.stderr)),
        ]

    async def _read_stdout(self, worker: Worker, stream: asyncio.StreamReader) -> None:
        """A worker writes its ready line alone to stdout."""
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(READY_PREFIX) and worker.ready_line is None:
                worker.ready_line = text
                worker.ever_ready = True
                worker.ready.set()
                log.info("worker %d ready: %s", worker.index, text[len(READY_PREFIX) :])

    async def _relay_stderr(self, worker: Worker, stream: asyncio.StreamReader) -> None:
        prefix = f"[worker {worker.index}] "
        while line := await stream.readline():
            text = line.decode(errors="replace")
            worker.stderr_tail.append(text.rstrip("\n"))
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(prefix + text)
                sys.stderr.flush()

    async def _keep_running(self, worker: Worker) -> None:
        """Start ``worker``, and again after each abnormal exit (module docstring, 4)."""
        while not self.stopping.is_set():
            try:
                await self._start_worker(worker)
            except OSError as error:
                self._fail(f"cannot start worker {worker.index}: {error}")
                return
            process = worker.process
            assert process is not None
            code = await process.wait()
            await asyncio.gather(*worker.relays, return_exceptions=True)
            if self.stopping.is_set():
                return
            ran_s = time.monotonic() - worker.started_s
            was_ready = worker.ready_line is not None
            if code == 0:
                log.warning(
                    "worker %d (pid %d) stopped on its own (exit 0): not restarted",
                    worker.index,
                    process.pid,
                )
                if all(w.process is None or w.process.returncode == 0 for w in self.workers):
                    self._fail("every worker stopped on its own")
                return
            if not worker.ever_ready and code in REFUSED_CODES:
                self._fail(
                    f"worker {worker.index} refused to start (exit {code}): {worker.message()}"
                )
                return
            worker.failed_starts = 0 if was_ready else worker.failed_starts + 1
            if worker.failed_starts >= MAX_FAILED_STARTS:
                self._fail(
                    f"worker {worker.index} failed {worker.failed_starts} restarts in a row "
                    f"(last exit {code}): {worker.message()}"
                )
                return
            if ran_s >= STABLE_AFTER_S:
                worker.backoff_s = BACKOFF_FIRST_S
            log.warning(
                "worker %d (pid %d) exited %s after %.1f s: restarting in %.0f s",
                worker.index,
                process.pid,
                _exit_text(code),
                ran_s,
                worker.backoff_s,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), worker.backoff_s)
            worker.backoff_s = min(worker.backoff_s * 2, BACKOFF_MAX_S)
            worker.restarts += 1

    async def _announce_when_ready(self) -> None:
        """Print the supervisor's ready line once every worker printed its own (or return
        when stopping first)."""
        stop = asyncio.ensure_future(self.stopping.wait())
        ready = [asyncio.ensure_future(worker.ready.wait()) for worker in self.workers]
        try:
            for waiter in ready:
                await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop.done():
                    return
        finally:
            for future in (stop, *ready):
                future.cancel()
        line = self.ready_line()
        try:
            print(line, flush=True)
        except OSError as error:  # nobody reads stdout any more: keep serving
            log.warning("cannot write the ready line: %s", error)

    def ready_line(self) -> str:
        """``braid ready: data=ROOT <listener>=<address> ... workers=N redis=URL``: each
        listener's address as the first worker that listens shows it (a standby shows -)."""
        listeners: dict[str, str] = {}
        for worker in self.workers:
            for part in (worker.ready_line or "")[len(READY_PREFIX) :].split():
                name, _, address = part.partition("=")
                if name in ("data", "node", "shards", "kafka-worker", "kafka-tls-worker"):
                    continue
                if listeners.get(name, "-") == "-":
                    listeners[name] = address
        parts = [f"data={self.root}"]
        parts += [f"{name}={address}" for name, address in listeners.items()]
        parts += [f"workers={self.count}", f"redis={self.url if self.redis else '-'}"]
        return READY_PREFIX + " ".join(parts)

    async def _stop_workers(self) -> None:
        """SIGTERM to every live worker, wait for them; SIGKILL those still there after
        :data:`WORKER_STOP_TIMEOUT_S`."""
        live = [
            worker.process
            for worker in self.workers
            if worker.process is not None and worker.process.returncode is None
        ]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if not live:
            return
        _done, pending = await asyncio.wait(
            [asyncio.ensure_future(process.wait()) for process in live],
            timeout=WORKER_STOP_TIMEOUT_S,
        )
        for process in live:
            if process.returncode is None:
                log.warning("worker pid %d did not stop: killing it", process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        if pending:
            await asyncio.wait(pending)
        for worker in self.workers:
            stopped = worker.process
            if stopped is not None and stopped in live:
                log.info(
                    "worker %d (pid %d) exited %s",
                    worker.index,
                    stopped.pid,
                    _exit_text(stopped.returncode),
                )
                await asyncio.gather(*worker.relays, return_exceptions=True)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "?"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"on {signal.Signals(-code).name}"
    return str(code)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run(settings: ServerSettings, argv: Sequence[str]) -> int:
    """Run the supervisor until SIGTERM/SIGINT; the process's exit code."""
    return asyncio.run(Supervisor(settings, argv).run())
