"""The repository's entry points say what they do: README quick start, CI, scripts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.DOTALL)
    assert block
    return block[1].splitlines()


def test_quick_start_is_exactly_two_commands():
    assert quick_start_commands() == ["bash scripts/serve", "bash scripts/test"]


def test_ci_runs_the_readme_test_command_and_the_checks():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in ci
    assert quick_start_commands()[1] in ci.splitlines()
    assert "bash scripts/check" in ci.splitlines()


def test_shell_scripts_parse():
    for script in (".ci/run", "scripts/test", "scripts/check", "scripts/serve"):
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
