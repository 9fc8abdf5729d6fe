"""core/cluster/layout.py and ``braid cluster init|check`` (docs/cluster.md section 2): a new
root, the adoption of a single-node directory a real ``braid serve`` wrote (its records then
read by ``braid log`` in shards/0000), the refusals of the wrong mode both ways, an adoption
finished after a crash half-way, and the filesystem check."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from braid import cluster_cli
from braid.cli import main
from core.cluster import layout
from core.cluster.layout import ClusterLayout, LayoutError, detect
from tests.braid_process import REPO_ROOT, BraidProcess

RECORDS = 40
QUEUE = "orders"
# Small files, so copying the directory per test is cheap (a segment is preallocated).
CONFIG = """
[log]
segment_size = 1048576
index_entries_per_file = 4096
"""
TIMEOUT_S = 60


def braid(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m braid ARGS`` as a real process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "braid", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )


def braid_main(*args: str) -> tuple[int, str, str]:
    """``braid ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class SingleNode:
    """A single-node data directory written by a real broker, and what happened meanwhile."""

    data_dir: Path
    bodies: list[str]
    adopt_while_running: tuple[int, str, str]
    broker_pid: int


@pytest.fixture(scope="module")
def single_node(tmp_path_factory) -> SingleNode:
    base = tmp_path_factory.mktemp("single")
    config = base / "braid.toml"
    config.write_text(CONFIG)
    bodies = [f"order-{number}" for number in range(RECORDS)]
    with BraidProcess(base, listeners=("amqp",), extra_args=("--config", str(config))) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        for body in bodies:
            channel.basic_publish(
                "", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2), mandatory=True
            )
        connection.close()
        adopt_while_running = braid_main("cluster", "init", str(broker.data_dir), "--adopt")
        assert broker.process is not None
        pid = broker.process.pid
        assert broker.stop() == 0, broker.stderr()
    if broker.process.stdout is not None:
        broker.process.stdout.close()
    return SingleNode(broker.data_dir, bodies, adopt_while_running, pid)


@pytest.fixture
def single_dir(single_node: SingleNode, tmp_path: Path) -> Path:
    """A copy of the stopped broker's directory, for one test to change."""
    copy = tmp_path / "node"
    shutil.copytree(single_node.data_dir, copy)
    return copy


def log_stat(directory: Path) -> dict:
    code, out, err = braid_main("log", "stat", str(directory), "--json")
    assert code == 0, err
    return json.loads(out)


def queue_bodies(directory: Path) -> list[str]:
    """The bodies of the AMQP queue's records, as ``braid log dump`` reads them."""
    topics = [name for name in log_stat(directory)["topics"] if name.endswith(QUEUE)]
    assert len(topics) == 1, topics
    code, out, err = braid_main("log", "dump", str(directory), "--topic", topics[0], "--json")
    assert code == 0, err
    return [json.loads(line)["body"] for line in out.splitlines()]


def serve_refusal(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """A plain ``braid serve`` on ``data_dir``, every listener off: it must refuse to start."""
    ports = [f"--{name}-port" for name in ("amqp", "mqtt", "mqtt-ws", "kafka", "http")]
    args = [arg for port in ports for arg in (port, "0")]
    return braid("serve", "--host", "127.0.0.1", "--data-dir", str(data_dir), *args)


# -- detect ------------------------------------------------------------------------------------


def test_detect_tells_the_three_apart(tmp_path, single_dir):
    assert detect(tmp_path / "absent") == "new"
    (tmp_path / "empty").mkdir()
    assert detect(tmp_path / "empty") == "new"
    assert detect(single_dir) == "single"
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / layout.CLUSTER_FILE).write_text("{}")
    assert detect(tmp_path / "root") == "root"


# -- init --------------------------------------------------------------------------------------


def test_init_makes_sixteen_shards_and_cluster_json(tmp_path):
    root = tmp_path / "root"
    code, out, err = braid_main("cluster", "init", str(root))
    assert code == 0, err
    assert "16 shards" in out
    assert sorted(os.listdir(root)) == ["cluster.json", "shards"]
    assert sorted(os.listdir(root / "shards")) == [f"{shard:04d}" for shard in range(16)]
    assert all(not any((root / "shards" / name).iterdir()) for name in os.listdir(root / "shards"))
    written = json.loads((root / "cluster.json").read_text())
    assert written["format"] == 1
    assert written["shards"] == 16
    assert written["legacy_shard"] is None
    assert uuid.UUID(written["cluster_id"]).version == 4
    assert isinstance(written["created_ms"], int)
    assert written["created_ms"] > 1_700_000_000_000  # milliseconds, not seconds
    opened = ClusterLayout.open(root)
    assert opened.shard_dir(15) == root / "shards" / "0015"
    assert detect(root) == "root"


def test_init_again_keeps_the_root_and_refuses_another_shard_count(tmp_path):
    root = tmp_path / "root"
    first = layout.init(root, 4)
    code, out, _ = braid_main("cluster", "init", str(root))
    assert code == 0
    assert "already a cluster root" in out
    assert ClusterLayout.open(root) == first
    code, _, err = braid_main("cluster", "init", str(root), "--shards", "8")
    assert code == cluster_cli.EXIT_REFUSED
    assert "4 shards" in err
    assert "--shards 8 is refused" in err
    assert ClusterLayout.open(root) == first


def test_init_refuses_a_single_node_directory_without_adopt(single_dir):
    before = sorted(os.listdir(single_dir))
    code, _, err = braid_main("cluster", "init", str(single_dir))
    assert code == cluster_cli.EXIT_REFUSED
    assert "single-node data directory" in err
    assert "--adopt" in err
    assert sorted(os.listdir(single_dir)) == before


def test_init_refuses_a_non_empty_directory_that_is_neither(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = braid_main("cluster", "init", str(tmp_path))
    assert code == cluster_cli.EXIT_REFUSED
    assert "not empty" in err
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    with pytest.raises(LayoutError, match="nothing to adopt"):
        layout.adopt(tmp_path)


def test_shards_out_of_range_are_refused(tmp_path):
    with pytest.raises(LayoutError, match=r"1\.\.9999"):
        layout.init(tmp_path / "root", 10_000)
    assert not (tmp_path / "root" / layout.PENDING_FILE).exists()
    assert braid_main("cluster", "init", str(tmp_path / "r"), "--shards", "0")[0] == 2


# -- adopt -------------------------------------------------------------------------------------


def test_adopt_is_refused_while_a_broker_runs_on_the_directory(single_node):
    code, _, err = single_node.adopt_while_running
    assert code == cluster_cli.EXIT_FAILED
    assert f"running broker (pid {single_node.broker_pid})" in err
    # Nothing moved: the stopped broker's directory is still a single-node one.
    assert detect(single_node.data_dir) == "single"
    assert not (single_node.data_dir / layout.SHARDS_DIR).exists()


def test_adopt_moves_a_real_brokers_directory_into_shard_zero(single_node, single_dir):
    before = log_stat(single_dir)
    entries = sorted(os.listdir(single_dir))
    code, out, err = braid_main("cluster", "init", str(single_dir), "--adopt")
    assert code == 0, err
    assert "shard 0 holds the adopted single-node data" in out
    adopted = ClusterLayout.open(single_dir)
    assert adopted.shards == 16
    assert adopted.legacy_shard == 0
    shard0 = adopted.shard_dir(0)
    assert sorted(os.listdir(shard0)) == entries
    assert sorted(os.listdir(single_dir)) == ["cluster.json", "shards"]
    assert all(not any(path.iterdir()) for path in adopted.shard_dirs()[1:])
    # braid log reads shard 0 as it read the single-node directory.
    after = log_stat(shard0)
    assert after["topics"] == before["topics"]
    assert after["end_position"] == before["end_position"]
    assert after["clean_shutdown"] is True
    assert queue_bodies(shard0) == single_node.bodies
    code, out, err = braid_main("log", "verify", str(shard0))
    assert code == 0, out + err


def test_a_plain_serve_refuses_a_root(single_dir):
    layout.adopt(single_dir, 2)
    done = serve_refusal(single_dir)
    assert done.returncode == 1, done.stderr
    assert "is a cluster data root" in done.stderr
    assert "--workers" in done.stderr
    assert "--cluster" in done.stderr
    # It opened no log beside the shards.
    assert not (single_dir / "log.json").exists()
    assert not (single_dir / "commitlog").exists()


CRASH_AFTER_RENAMES = 2
CRASHING_ADOPT = f"""
import os, sys
from pathlib import Path
from core.cluster import layout

renames = 0
real_rename = os.rename

def rename_then_die(source, target):
    global renames
    real_rename(source, target)
    renames += 1
    if renames == {CRASH_AFTER_RENAMES}:
        os._exit(9)  # a crash: no cleanup, no more renames

os.rename = rename_then_die
layout.adopt(Path(sys.argv[1]), 3)
"""


def test_an_adoption_that_crashed_half_way_is_finished_by_running_it_again(single_node, single_dir):
    entries = sorted(os.listdir(single_dir))
    assert len(entries) > CRASH_AFTER_RENAMES + 1
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_ADOPT, str(single_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert crashed.returncode == 9, crashed.stderr
    # Half-way: entries in both places, no cluster.json yet.
    shard0 = single_dir / "shards" / "0000"
    moved = sorted(os.listdir(shard0))
    assert len(moved) == CRASH_AFTER_RENAMES
    assert not (single_dir / layout.CLUSTER_FILE).exists()
    # Neither mode opens it meanwhile: it is a root being made.
    assert detect(single_dir) == "root"
    with pytest.raises(LayoutError, match="did not finish"):
        ClusterLayout.open(single_dir)
    code, _, err = braid_main("cluster", "init", str(single_dir))
    assert code == cluster_cli.EXIT_REFUSED
    assert "interrupted" in err
    assert "--adopt" in err
    # Running the adoption again finishes it, with the plan made before the crash.
    code, _, err = braid_main("cluster", "init", str(single_dir), "--adopt")
    assert code == 0, err
    adopted = ClusterLayout.open(single_dir)
    assert (adopted.shards, adopted.legacy_shard) == (3, 0)
    assert sorted(os.listdir(shard0)) == entries
    assert queue_bodies(shard0) == single_node.bodies


# -- check -------------------------------------------------------------------------------------


def test_check_passes_on_a_local_filesystem_and_cleans_up(tmp_path):
    root = tmp_path / "root"
    layout.init(root, 2)
    code, out, err = braid_main("cluster", "check", str(root), "--rounds", "20")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("OK   o_excl_race: 20 rounds")
    assert lines[1].startswith("OK   stat_visibility: 20 rounds")
    assert lines[2] == f"{root}: OK"
    assert sorted(os.listdir(root)) == ["cluster.json", "shards"]


def test_check_reports_a_failed_round():
    """The verdicts the check prints, given what a broken filesystem would show."""
    two_winners = cluster_cli.race_verdict(3, [[0, 1, 2], [1]], ["0", "0", "0"])
    assert not two_winners.ok
    assert "epoch 1: 2 creators" in two_winners.line()
    assert two_winners.line().startswith("FAIL o_excl_race")
    wrong_owner = cluster_cli.race_verdict(2, [[0], [1]], ["0", "0"])
    assert "epoch 1: created by 1, file says 0" in wrong_owner.detail
    assert cluster_cli.race_verdict(2, [[0], [1]], ["0", "1"]).ok
    stale = cluster_cli.visibility_verdict(3, [False, False, False], [True, False, True])
    assert not stale.ok
    assert "round 1: not seen after creation" in stale.detail
    assert cluster_cli.visibility_verdict(2, [False, False], [True, True]).ok


def test_check_of_a_missing_directory(tmp_path):
    code, _, err = braid_main("cluster", "check", str(tmp_path / "absent"))
    assert code == cluster_cli.EXIT_REFUSED
    assert "not a directory" in err
