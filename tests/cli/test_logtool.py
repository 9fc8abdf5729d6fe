"""``braid log stat|dump|verify`` on data dirs written by a LogStore (and by a running broker)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from braid.cli import main

from .conftest import SEGMENT_SIZE, braid_env, run_braid, start_broker, write_log


@pytest.fixture
def written(tmp_path):
    data_dir = tmp_path / "data"
    return data_dir, write_log(data_dir)


def test_stat_text(written, capsys):
    data_dir, facts = written
    assert main(["log", "stat", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert f"segment size {SEGMENT_SIZE} B" in out
    assert "stopped cleanly" in out
    assert f"checkpoint   position {facts['end']}" in out
    assert f"commit log   positions 0..{facts['end']}, {facts['segments']} segments" in out
    assert out.count(" sealed") == facts["segments"] - 1
    assert out.count(" active") == 1
    assert "__offsets  [system]  (1 queue)" in out
    assert "orders  (2 queues)" in out
    assert "queue 1    offsets 0..150  records 150  entries 150" in out


def test_stat_json(written, capsys):
    data_dir, facts = written
    assert main(["log", "stat", str(data_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["segment_size"] == SEGMENT_SIZE
    assert info["clean_shutdown"] is True
    assert info["running_pid"] is None
    assert info["end_position"] == facts["end"] == info["checkpoint"]["position"]
    assert len(info["segments"]) == facts["segments"]
    assert all(segment["size"] == SEGMENT_SIZE for segment in info["segments"])
    assert [s["sealed"] for s in info["segments"]] == [True] * (facts["segments"] - 1) + [False]
    assert info["segments"][-1]["used"] == facts["end"] % SEGMENT_SIZE
    assert info["topics"]["__offsets"]["system"] is True
    orders = info["topics"]["orders"]
    assert orders["system"] is False
    assert [(q["queue"], q["start_offset"], q["next_offset"]) for q in orders["queues"]] == [
        (0, 0, 150),
        (1, 0, 150),
    ]


def test_dump_queue_json(written, capsys):
    data_dir, facts = written
    args = ["log", "dump", str(data_dir), "--topic", "orders", "--queue", "1"]
    assert main([*args, "--from", "10", "--limit", "5", "--json", "--max-body", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["offset"] for r in records] == [10, 11, 12, 13, 14]
    first = records[0]
    number = 2 * 10 + 1  # queue 1 holds the odd numbers
    assert first["position"] == facts["orders/1@10"]
    assert first["topic"] == "orders"
    assert first["queue"] == 1
    assert first["protocol"] == "internal"
    assert first["subject"] == f"orders.eu.{number}"
    assert first["key"] == f"key-{number}"
    assert first["headers"] == [["trace", f"t-{number}"]]
    assert first["tags"] == ["odd"]
    assert first["client"] == "test-client"
    assert first["body"] == f"body-{number}-"
    assert first["body_truncated"] is True
    assert first["body_size"] == len(f"body-{number}-") + 400
    assert first["store_time"].endswith("Z")


def test_dump_queue_text_and_whole_topic(written, capsys):
    data_dir, _ = written
    assert main(["log", "dump", str(data_dir), "--topic", "orders", "--limit", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 200
    assert lines[0].startswith("orders/0@0 pos=0 ")
    assert "subject='orders.eu.0'" in lines[0]
    assert "key=b'key-0'" in lines[0]
    assert "tags=['even']" in lines[0]
    assert "body[407]=b'body-0-xxx" in lines[0]
    assert lines[150].startswith("orders/1@0 ")


def test_dump_commit_log_order(written, capsys):
    data_dir, facts = written
    assert main(["log", "dump", str(data_dir), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 301
    assert [r["position"] for r in records] == sorted(r["position"] for r in records)
    assert records[-1]["topic"] == "__offsets"
    assert "offset" not in records[0]  # a scan knows positions, not queue offsets

    start = facts["orders/0@100"]
    assert main(["log", "dump", str(data_dir), "--from", str(start), "--queue", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"orders/0 pos={start} ")
    assert len(lines) == 50 + 1  # orders/0@100..149 and the __offsets record (queue 0)


def test_dump_from_a_position_inside_a_record(written, capsys):
    data_dir, _ = written
    assert main(["log", "dump", str(data_dir), "--from", "3"]) == 1
    assert "--from must be the position of a record" in capsys.readouterr().err


def test_dump_unknown_queue(written, capsys):
    data_dir, _ = written
    assert main(["log", "dump", str(data_dir), "--topic", "nope"]) == 2
    assert "no queue nope/*" in capsys.readouterr().err


def flip_byte(data_dir, position):
    segment = data_dir / "commitlog" / f"{position // SEGMENT_SIZE * SEGMENT_SIZE:020d}.log"
    with segment.open("r+b") as stream:
        stream.seek(position % SEGMENT_SIZE)
        byte = stream.read(1)
        stream.seek(position % SEGMENT_SIZE)
        stream.write(bytes([byte[0] ^ 0xFF]))


def test_verify_detects_a_flipped_byte_in_a_sealed_segment(written):
    data_dir, facts = written
    result = run_braid("log", "verify", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert f"ok: {facts['segments']} segments verified" in result.stdout

    bad = facts["orders/1@20"]
    assert bad // SEGMENT_SIZE == 0  # segment 0 is sealed
    flip_byte(data_dir, bad + 100)
    result = run_braid("log", "verify", str(data_dir))
    assert result.returncode == 1
    assert f"corrupt: position {bad} (segment {0:020d}.log offset {bad}): crc32c mismatch" in (
        result.stdout
    )
    assert f"FAILED: 1 of {facts['segments']} segments corrupt" in result.stdout

    # dump reports the bad record, skips it, and still prints the others.
    result = run_braid("log", "dump", str(data_dir), "--topic", "orders", "--queue", "1")
    assert result.returncode == 1
    assert f"corrupt record at commit-log position {bad}" in result.stderr
    offsets = [int(line.split()[0].split("@")[1]) for line in result.stdout.splitlines()]
    assert offsets == [n for n in range(150) if n != 20]

    # A commit-log scan loses the rest of segment 0 only.
    result = run_braid("log", "dump", str(data_dir), "--json")
    assert result.returncode == 1
    positions = [json.loads(line)["position"] for line in result.stdout.splitlines()]
    assert positions[0] == 0
    assert bad not in positions
    assert max(positions) > SEGMENT_SIZE


def test_not_a_data_dir(tmp_path):
    for command in ("stat", "dump", "verify"):
        result = run_braid("log", command, str(tmp_path))
        assert result.returncode == 2
        assert "holds no BraidMQ log" in result.stderr
        result = run_braid("log", command, str(tmp_path / "missing"))
        assert result.returncode == 2
        assert "no such directory" in result.stderr


def test_reads_the_dir_of_a_running_broker(tmp_path, brokers):
    data_dir = tmp_path / "data"
    write_log(data_dir)
    broker = start_broker(tmp_path)
    brokers.append(broker)
    result = run_braid("log", "stat", str(data_dir))
    assert result.returncode == 0, result.stderr
    assert f"running (broker pid {broker.process.pid})" in result.stdout
    result = run_braid("log", "dump", str(data_dir), "--topic", "orders", "--limit", "3")
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 3
    assert run_braid("log", "verify", str(data_dir)).returncode == 0
    assert broker.stop() == 0


def test_dump_into_a_closed_pipe(written):
    """``braid log dump DIR | head -1``: no traceback, exit 0."""
    data_dir, _ = written
    process = subprocess.Popen(
        [sys.executable, "-m", "braid", "log", "dump", str(data_dir), "--max-body", "0"],
        env=braid_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"orders/0 pos=0 ")
    process.stdout.close()
    assert process.wait(30) == 0
    assert process.stderr is not None
    assert b"Traceback" not in process.stderr.read()
    process.stderr.close()


def test_dump_shows_links_and_what_they_point_at(tmp_path, capsys):
    from core.log import LogConfig, LogStore

    data_dir = tmp_path / "data"
    store = LogStore(LogConfig(data_dir, segment_size=SEGMENT_SIZE))
    original = store.append("orders", 0, b"the body", headers=[("h", b"1")])
    store.link([original.position], [("dlq", 0)], headers=[("x-death", b"rejected")])
    store.close()

    assert main(["log", "dump", str(data_dir), "--topic", "dlq", "--json"]) == 0
    (moved,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert moved["body"] == "the body"
    assert moved["headers"] == [["h", "1"], ["x-death", "rejected"]]

    assert main(["log", "dump", str(data_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("__transactions/0 ")
    assert "flags=link" in lines[1]
    assert f"link=[pos {original.position} size {original.end - original.position}]" in lines[1]
    assert "destinations=[dlq/0]" in lines[1]
