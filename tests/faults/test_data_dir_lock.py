"""Issue 21 item 7: two brokers on one data directory. The lock is an flock on the directory
itself, so deleting ``braid.lock`` (the file that held the lock before) does not let a second
``braid serve`` in. Two real processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pika

from tests.braid_process import EXIT_TIMEOUT_S, REPO_ROOT, BraidProcess


def second_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def publish_confirmed(braid: BraidProcess, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("locked", durable=True)
        for number in range(count):
            channel.basic_publish("", "locked", str(number).encode())
    finally:
        connection.close()


def count_messages(braid: BraidProcess) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
    try:
        declared = connection.channel().queue_declare("locked", durable=True, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


def test_second_broker_refused_even_after_the_lock_file_is_deleted(tmp_path: Path) -> None:
    first_dir = tmp_path / "first"
    second_dir = tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    data_dir = tmp_path / "data"
    with BraidProcess(first_dir, listeners=("amqp",), data_dir=data_dir) as first:
        publish_confirmed(first, 200)
        pid_file = data_dir / "braid.lock"
        assert pid_file.read_text().strip() == str(first.process.pid)  # type: ignore[union-attr]
        pid_file.unlink()  # what let a second broker in before (issue 21 item 7)
        second = BraidProcess(second_dir, listeners=("amqp",), data_dir=data_dir)
        refused = subprocess.run(
            second.command(),
            cwd=second_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=EXIT_TIMEOUT_S * 2,
            env=second_env(),
        )
        assert refused.returncode == 1, refused.stderr
        assert "in use by another braid process" in refused.stderr
        assert "braid ready" not in refused.stdout
        # The first broker is untouched: its messages are all there and it still takes more.
        publish_confirmed(first, 100)
        assert count_messages(first) == 300
    # Once the first stopped, the directory is free again.
    with BraidProcess(second_dir, listeners=("amqp",), data_dir=data_dir) as again:
        assert count_messages(again) == 300
