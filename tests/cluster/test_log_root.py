"""``braid log stat|dump|verify`` and ``braid tail`` on a cluster's data root (docs/cluster.md
section 2, issue 22): every shard in a section of its own, or the one ``--shard N`` names; a
shard nobody wrote yet says so; a copy of a record whose home is another shard shows its flag.
The root is made by ``braid cluster init``; shards 0 and 2 are written with LogStore, shard 1
is left empty (until the tail test writes it while tailing)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from braid.cli import main
from core.cluster.layout import CLUSTER_FILE, PENDING_FILE
from core.log import LogConfig, LogReader, LogStore
from core.log import record as rec
from tests.braid_process import REPO_ROOT

SHARDS = 3
SEGMENT_SIZE = 64 * 1024
TIMEOUT_S = 60
# What each written shard holds: topic -> queue -> records.
WRITTEN = {0: {"orders": {0: 4, 1: 3}}, 2: {"orders": {0: 2}, "audit": {0: 1}}}


def braid_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def shard_dir(root: Path, shard: int) -> Path:
    return root / "shards" / f"{shard:04d}"


def write(directory: Path, topic: str, queue: int, bodies: list[bytes], flags: int = 0) -> None:
    store = LogStore(LogConfig(directory, segment_size=SEGMENT_SIZE, durability="async"))
    for body in bodies:
        store.append(topic, queue, body, flags=flags)
    store.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    code, out, err = braid_main("cluster", "init", str(path), "--shards", str(SHARDS))
    assert code == 0, (out, err)
    write(shard_dir(path, 0), "orders", 0, [b"zero-a %d" % i for i in range(4)])
    write(shard_dir(path, 0), "orders", 1, [b"zero-b %d" % i for i in range(3)])
    write(shard_dir(path, 2), "orders", 0, [b"two %d" % i for i in range(2)])
    # A copy of a record whose home is another shard (forwarding will write these).
    write(shard_dir(path, 2), "audit", 0, [b"copied"], flags=rec.FLAG_COPY)
    return path


def test_stat_has_a_section_per_shard(root: Path) -> None:
    code, out, _ = braid_main("log", "stat", str(root))
    assert code == 0
    assert out.startswith(f"cluster root {root}: {SHARDS} shards, cluster id ")
    sections = out.split("\n== ")[1:]
    assert [section.split()[:2] for section in sections] == [
        ["shard", "0000"],
        ["shard", "0001"],
        ["shard", "0002"],
    ]
    assert "no log yet" in sections[1]
    assert "orders  (2 queues)" in sections[0]
    assert "queue 1    offsets 0..3  records 3" in sections[0]
    assert "audit  (1 queue)" in sections[2]
    assert "no log yet" not in sections[0] + sections[2]

    code, out, _ = braid_main("log", "stat", str(root), "--shard", "2", "--json")
    assert code == 0
    info = json.loads(out)
    assert (info["shard_count"], info["legacy_shard"]) == (SHARDS, None)
    (only,) = info["shards"]
    assert (only["shard"], only["data_dir"]) == (2, str(shard_dir(root, 2)))
    topics = only["log"]["topics"]
    held = {t: {q["queue"]: q["records"] for q in v["queues"]} for t, v in topics.items()}
    assert {t: q for t, q in held.items() if not t.startswith("__")} == WRITTEN[2]

    code, out, _ = braid_main("log", "stat", str(root), "--json")
    logs = {entry["shard"]: entry["log"] for entry in json.loads(out)["shards"]}
    assert logs[1] is None
    assert logs[0]["topics"]["orders"]["queues"][0]["next_offset"] == 4


def test_dump_reads_every_shard_or_the_one_named(root: Path) -> None:
    code, out, _ = braid_main("log", "dump", str(root), "--topic", "orders", "--json")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["shard"], r["queue"], r["offset"]) for r in records] == [
        *((0, 0, offset) for offset in range(4)),
        *((0, 1, offset) for offset in range(3)),
        *((2, 0, offset) for offset in range(2)),
    ]
    # Every record of every shard in commit-log order, shard by shard; a copy says so.
    code, out, _ = braid_main("log", "dump", str(root))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"# shard 0000  {shard_dir(root, 0)}"
    assert f"# shard 0002  {shard_dir(root, 2)}" in lines
    assert "# shard 0001" not in out  # nothing written there
    (copied,) = [line for line in lines if "b'copied'" in line]
    assert "flags=copy" in copied
    # --shard with --queue, and --limit over the shards.
    code, out, _ = braid_main(
        "log", "dump", str(root), "--shard", "0", "--topic", "orders", "--queue", "1", "--json"
    )
    assert [json.loads(line)["body"] for line in out.splitlines()] == [
        f"zero-b {i}" for i in range(3)
    ]
    code, out, _ = braid_main("log", "dump", str(root), "--topic", "orders", "--limit", "5")
    assert len([line for line in out.splitlines() if not line.startswith("#")]) == 5
    code, _, err = braid_main("log", "dump", str(root), "--topic", "nowhere")
    assert code == 2
    assert "no queue nowhere/* in any shard of" in err


def flip_a_byte_of_the_first_record(directory: Path) -> int:
    with LogReader(directory) as reader:
        position = reader.read("orders", 0, 0, max_records=1)[0].position
    segment = directory / "commitlog" / f"{position // SEGMENT_SIZE * SEGMENT_SIZE:020d}.log"
    with segment.open("r+b") as stream:
        stream.seek(position % SEGMENT_SIZE + 80)
        byte = stream.read(1)
        stream.seek(position % SEGMENT_SIZE + 80)
        stream.write(bytes([byte[0] ^ 0x01]))
    return position


def test_verify_names_the_corrupt_shard(root: Path) -> None:
    code, out, _ = braid_main("log", "verify", str(root))
    assert code == 0, out
    assert "shard 0001: no log yet" in out
    assert out.splitlines()[-1] == "ok: 2 shards with a log verified, 1 without one"
    position = flip_a_byte_of_the_first_record(shard_dir(root, 2))
    code, out, _ = braid_main("log", "verify", str(root))
    assert code == 1
    assert f"shard 0002: corrupt: position {position}" in out
    assert "shard 0000: ok: 1 segments verified" in out
    assert out.splitlines()[-1] == "FAILED: 1 of 2 shards with a log corrupt"
    code, out, _ = braid_main("log", "verify", str(root), "--shard", "0")
    assert code == 0
    assert "shard 0002" not in out


def test_a_shard_that_is_not_there_is_refused(root: Path, tmp_path: Path) -> None:
    for command in ("stat", "dump", "verify"):
        code, _, err = braid_main("log", command, str(root), "--shard", str(SHARDS))
        assert code == 2
        assert f"has shards 0..{SHARDS - 1}, not {SHARDS}" in err
        code, _, err = braid_main("log", command, str(shard_dir(root, 0)), "--shard", "0")
        assert code == 2
        assert "is not a cluster data root" in err
    # A root whose `braid cluster init` did not finish is refused, not read as empty.
    os.rename(root / CLUSTER_FILE, root / PENDING_FILE)
    code, _, err = braid_main("log", "stat", str(root))
    assert code == 2
    assert "did not finish" in err


def test_tail_follows_the_topic_in_every_shard(root: Path) -> None:
    code, out, _ = braid_main(
        "tail", "orders", "--data-dir", str(root), "--last", "1", "--limit", "3", "--json"
    )
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert sorted((line["shard"], line["queue"], line["offset"]) for line in lines) == [
        (0, 0, 3),
        (0, 1, 2),
        (2, 0, 1),
    ]


def test_tail_picks_up_a_shard_first_written_while_it_runs(root: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "braid", "tail", "orders", "--data-dir", str(root)]
    process = subprocess.Popen(
        [*command, "--limit", "2", "--interval-ms", "20"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        said = process.stderr.readline()
        assert said == "braid tail: following orders (shard 0000: 0@4, 1@3; shard 0002: 0@2)\n"
        write(shard_dir(root, 1), "orders", 5, [b"first in shard one"])  # had no log
        time.sleep(0.1)
        write(shard_dir(root, 2), "orders", 0, [b"next in shard two"])
        out, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    lines = out.splitlines()
    assert [line.split()[1:3] for line in lines] == [
        ["orders/5@0", "shard=1"],
        ["orders/0@2", "shard=2"],
    ]
    assert "first in shard one" in lines[0]
