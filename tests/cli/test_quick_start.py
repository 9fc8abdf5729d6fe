"""The Quick start's first command on a Debian machine whose system Python refuses installs
outside a virtual environment (PEP 668): ``bash scripts/serve`` from a fresh copy of the
repository installs into ``.venv`` and serves (issue 17: ``pip install .`` failed there with
``externally-managed-environment``)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.braid_process import free_port

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")


def _externally_managed(python: Path) -> bool:
    check = subprocess.run(
        [
            str(python),
            "-c",
            "import pathlib, sys, sysconfig; sys.exit(not (pathlib.Path("
            "sysconfig.get_path('stdlib')) / 'EXTERNALLY-MANAGED').exists())",
        ],
        check=False,
    )
    return check.returncode == 0


@pytest.mark.slow
def test_scripts_serve_installs_and_serves_on_an_externally_managed_python(tmp_path: Path):
    assert _externally_managed(DEBIAN_PYTHON), "this test needs Debian's python3 (PEP 668)"
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    checkout = tmp_path / "checkout"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(checkout, filter="data")
    # The working tree's scripts and README, so the test checks what is being changed.
    for name in ("scripts/serve", "README.md"):
        (checkout / name).write_bytes((ROOT / name).read_bytes())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHON"] = str(DEBIAN_PYTHON)
    flags = ["--host", "127.0.0.1", "--amqp-port", str(port), "--mqtt-port", "0"]
    flags += ["--mqtt-ws-port", "0", "--kafka-port", "0", "--http-port", "0"]
    process = subprocess.Popen(
        ["bash", "scripts/serve", *flags],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "serve.err").open("w"),
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()  # the install, then braid's one ready line
        assert ready.startswith("braid ready:"), (tmp_path / "serve.err").read_text()[-3000:]
        assert f"amqp=127.0.0.1:{port}" in ready
        assert (checkout / ".venv" / "bin" / "python").exists()
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
