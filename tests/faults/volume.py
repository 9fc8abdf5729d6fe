"""A small tmpfs volume for the disk-full tests (the test machines run as root), unmounted after,
and helpers to fill and free it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.braid_process import REPO_ROOT

DEADLINE_S = 60.0


@contextmanager
def tmpfs(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill_to(path: Path, ballast: Path, leave_free: int) -> None:
    """Write ``ballast`` until ``path``'s volume has about ``leave_free`` bytes free."""
    chunk = bytes(1 << 20)
    with ballast.open("ab") as stream:
        while free_bytes(path) - len(chunk) > leave_free:
            stream.write(chunk)
            stream.flush()
            os.fsync(stream.fileno())


def wait_for(condition: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` until it holds (a deadline for a hang, never a timing assert)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def health(http_port: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{http_port}/health"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def metrics(http_port: int) -> str:
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()  # type: ignore[no-any-return]


def log_verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "braid", "log", "verify", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
