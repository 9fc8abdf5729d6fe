"""Spark's Python workers must run an interpreter that can import the braid source (issue 17:
from a venv that is not activated, ``python3`` on PATH lacked crc32c and every read failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark import worker_python_problem

from .logdata import write_jobs_data

REPO = Path(__file__).resolve().parent.parent.parent


def test_this_interpreter_is_fine() -> None:
    assert worker_python_problem(sys.executable) is None


def test_an_interpreter_without_the_packages_is_reported_with_the_fix(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    problem = worker_python_problem(str(bare / "bin" / "python"))
    assert problem is not None
    assert "ModuleNotFoundError" in problem
    assert f"PYSPARK_PYTHON={sys.executable}" in problem


def test_an_interpreter_not_on_path_is_reported() -> None:
    problem = worker_python_problem("no-such-python-3.99")
    assert problem is not None
    assert "not on PATH" in problem


def test_a_job_runs_with_another_python3_first_on_path(tmp_path: Path) -> None:
    """The user's case: this interpreter is a venv's, not activated; ``python3`` on PATH is a
    bare one. The job still reads the log (its session points the workers at this one)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    data = tmp_path / "data"
    write_jobs_data(data)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = f"{bare / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "spark.jobs.traffic", str(data), str(tmp_path / "out")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote" in done.stdout
