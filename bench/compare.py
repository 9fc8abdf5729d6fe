"""``python -m bench compare --base REV NAME [-- ARGS]``: one benchmark, two commits, interleaved.

A change is judged against the commit before it on the same machine in the same minutes: the
machine here is shared, and its speed moves 1.5-2x between runs (docs/benchmarks.md). So this
runs ``python -m bench NAME ARGS`` alternately with the code of ``REV`` (an export of that
commit in a temporary directory) and with the working tree (or an export of ``--head REV``),
``--rounds`` times each, base first
in odd rounds and the working tree first in even ones. Each run gets the code of its tree through
``PYTHONPATH`` (``braid serve`` processes a benchmark starts inherit it), so the brokers, the
load clients and the peers all run as that commit had them.

Every run's output is kept under ``--out`` (default ``results/compare-NAME-TIME/``). The summary
reads the Markdown table rows every benchmark prints: a row is named by its text cells, and for
each of its numeric cells the summary gives the range over the base runs and over the working
tree's runs, and whether the working tree's range overlaps the base's spread.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 3
_RATIO = re.compile(r"([^,=|:]+?)\s*=\s*([-+]?[\d,]*\.?\d+x?)")
_NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+\s*(?:x|%|µs|ms|s|MB/s|/s)?$")

Key = tuple[str, ...]


def export_commit(revision: str, into: Path) -> Path:
    """The tree of ``revision`` as files under ``into`` (``git archive``: no worktree left)."""
    target = into / f"base-{revision.replace('/', '_')}"
    target.mkdir(parents=True)
    archive = into / "base.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), revision], cwd=REPO, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    return target


def run_once(tree: Path, name: str, args: list[str], output: Path) -> float:
    """Run the benchmark with the code of ``tree``; its stdout and stderr go to ``output``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.monotonic()
    with output.open("w") as sink:
        subprocess.run(
            [sys.executable, "-m", "bench", name, *args],
            cwd=tree,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return time.monotonic() - started


def _number(cell: str) -> float | None:
    text = cell.strip().replace("*", "")
    if not _NUMBER.match(text):
        return None
    digits = re.sub(r"[^\d.+-]", "", text)
    try:
        return float(digits)
    except ValueError:
        return None


def table_rows(text: str) -> dict[Key, list[tuple[str, float]]]:
    """The figures of a benchmark's output, by row: Markdown table rows (text cells name the
    row, each numeric cell is a figure named by its column's header) and ``name = number``
    ratios printed on their own lines (``100 B: throughput BraidMQ/RabbitMQ = 0.91``). A name
    seen twice in one run gets a ``#2`` suffix."""
    rows: dict[Key, list[tuple[str, float]]] = {}

    def add(name: Key, figures: list[tuple[str, float]]) -> None:
        key, copy = name, 2
        while key in rows:
            key, copy = (*name, f"#{copy}"), copy + 1
        rows[key] = figures

    header: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            if set(line) <= set("|-: "):
                continue
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            numbers = [_number(cell) for cell in cells]
            if not any(n is not None for n in numbers):
                header = cells
                continue
            name = tuple(c for c, n in zip(cells, numbers, strict=True) if n is None and c)
            add(
                name,
                [
                    (header[i] if i < len(header) else str(i + 1), n)
                    for i, n in enumerate(numbers)
                    if n is not None
                ],
            )
            continue
        header = []
        prefix = line.split(":", 1)[0] if ":" in line.split("=", 1)[0] else ""
        for label, value in _RATIO.findall(line):
            number = _number(value)
            if number is not None:
                add((prefix, label.strip(" :,")), [("ratio", number)])
    return rows


def summary(base_runs: list[str], head_runs: list[str]) -> list[str]:
    base: dict[Key, list[list[tuple[str, float]]]] = defaultdict(list)
    head: dict[Key, list[list[tuple[str, float]]]] = defaultdict(list)
    for text in base_runs:
        for key, figures in table_rows(text).items():
            base[key].append(figures)
    for text in head_runs:
        for key, figures in table_rows(text).items():
            head[key].append(figures)
    lines = [
        "| row | figure | base runs | working tree runs | within the base's spread |",
        "|---|---|---|---|---|",
    ]
    for key in base:
        if key not in head:
            continue
        width = min(len(figures) for figures in base[key] + head[key])
        for column in range(width):
            label = base[key][0][column][0]
            old = [figures[column][1] for figures in base[key]]
            new = [figures[column][1] for figures in head[key]]
            overlap = min(new) <= max(old) and max(new) >= min(old)
            name = " / ".join(k for k in key if k) or "-"
            within = "yes" if overlap else "NO"
            lines.append(f"| {name} | {label} | {_span(old)} | {_span(new)} | {within} |")
    return lines


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _span(values: list[float]) -> str:
    shown = ", ".join(_figure(value) for value in values)
    return f"{_figure(min(values))}-{_figure(max(values))} ({shown})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__)
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument(
        "--head",
        default=None,
        help="a commit to measure instead of the working tree (others may be editing it)",
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each tree")
    parser.add_argument("--out", default=None, help="where the runs' outputs go")
    parser.add_argument("name", help="the benchmark (python -m bench NAME)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the benchmark's own")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(options.out or REPO / "results" / f"compare-{options.name}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[str]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="braid-compare-") as scratch:
        base_dir, head_dir = Path(scratch) / "base", Path(scratch) / "head"
        base_dir.mkdir()
        trees = {"base": export_commit(options.base, base_dir), "head": REPO}
        if options.head is not None:
            head_dir.mkdir()
            trees["head"] = export_commit(options.head, head_dir)
        for round_number in range(1, options.rounds + 1):
            order = ("base", "head") if round_number % 2 else ("head", "base")
            for side in order:
                output = out / f"{side}-{round_number}.txt"
                seconds = run_once(trees[side], options.name, args, output)
                runs[side].append(output.read_text())
                print(f"# round {round_number} {side}: {seconds:.0f} s -> {output}", flush=True)
    command = " ".join([options.name, *args])
    head = options.head or "the working tree"
    print(f"\n# bench {command}: base {options.base} against {head}")
    print("\n".join(summary(runs["base"], runs["head"])))
    return 0
