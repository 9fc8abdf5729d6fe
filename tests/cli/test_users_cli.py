"""``braid user`` / ``braid permission`` and the real ``rabbitmqadmin`` against ``braid serve``:
users and permissions made over the HTTP API, kept across a restart, and no plaintext password
in the data directory or the logs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from .conftest import REPO_ROOT, braid_env, start_broker

RABBITMQADMIN = shutil.which("rabbitmqadmin")


def braid_cli(broker, *args: str, stdin: str = "", admin=("guest", "guest")):
    env = braid_env()
    env["BRAID_URL"] = broker.http_url
    env["BRAID_ADMIN_USER"], env["BRAID_ADMIN_PASSWORD"] = admin
    return subprocess.run(
        [sys.executable, "-m", "braid", *args],
        cwd=REPO_ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_users_and_permissions_from_the_cli_survive_a_restart(tmp_path, brokers):
    broker = start_broker(tmp_path)
    brokers.append(broker)
    added = braid_cli(
        broker,
        "user",
        "add",
        "alice",
        "--tags",
        "management",
        "--password-stdin",
        stdin="alice-s3cret\n",
    )
    assert added.returncode == 0, added.stderr
    assert "added user alice" in added.stdout
    done = braid_cli(
        broker,
        "permission",
        "set",
        "alice",
        "--configure",
        "^alice\\.",
        "--write",
        "^alice\\.",
        "--read",
        ".*",
    )
    assert done.returncode == 0, done.stderr
    listed = braid_cli(broker, "user", "list")
    assert listed.stdout.splitlines() == ["alice\tmanagement", "guest\tadministrator"]
    # alice is no administrator: she cannot manage users.
    refused = braid_cli(broker, "user", "list", admin=("alice", "alice-s3cret"))
    assert refused.returncode == 1
    assert "401 Not administrator user" in refused.stderr
    wrong = braid_cli(broker, "user", "list", admin=("guest", "nope"))
    assert wrong.returncode == 1
    assert "401" in wrong.stderr

    assert broker.stop() == 0
    again = start_broker(tmp_path, data_dir=broker.data_dir)
    brokers.append(again)
    permissions = json.loads(braid_cli(again, "permission", "list", "--json").stdout)
    assert {
        "user": "alice",
        "vhost": "/",
        "configure": "^alice\\.",
        "write": "^alice\\.",
        "read": ".*",
    } in permissions
    changed = braid_cli(again, "user", "passwd", "alice", "--password-stdin", stdin="n3w\n")
    assert changed.returncode == 0, changed.stderr
    assert braid_cli(again, "user", "list", admin=("alice", "n3w")).returncode == 1  # 401 again
    cleared = braid_cli(again, "permission", "clear", "alice")
    assert cleared.returncode == 0
    deleted = braid_cli(again, "user", "delete", "alice")
    assert deleted.returncode == 0
    missing = braid_cli(again, "user", "delete", "alice")
    assert missing.returncode == 1
    assert "404" in missing.stderr
    assert again.stop() == 0

    for path in list(broker.data_dir.rglob("*")) + list(tmp_path.glob("braid-stderr-*")):
        if path.is_file():
            raw = path.read_bytes()
            assert b"alice-s3cret" not in raw, path
            assert b'"n3w"' not in raw, path


def test_rabbitmqadmin_manages_users_and_permissions(tmp_path, brokers):
    assert RABBITMQADMIN is not None, "rabbitmqadmin (RabbitMQ's management CLI) is needed"
    broker = start_broker(tmp_path)
    brokers.append(broker)
    host, port = broker.listeners["http"].rsplit(":", 1)

    def admin(*args: str, user: str = "guest", password: str = "guest"):
        return subprocess.run(
            [RABBITMQADMIN, "-H", host, "-P", port, "-u", user, "-p", password, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(tmp_path)},
        )

    made = admin("declare", "user", "name=bob", "password=b0b", "tags=administrator")
    assert made.returncode == 0, made.stderr + made.stdout
    made = admin(
        "declare", "permission", "vhost=/", "user=bob", "configure=.*", "write=.*", "read=.*"
    )
    assert made.returncode == 0, made.stderr + made.stdout
    listed = admin("-f", "tsv", "-q", "list", "users", "name", user="bob", password="b0b")
    assert listed.returncode == 0, listed.stderr + listed.stdout
    assert sorted(listed.stdout.split()) == ["bob", "guest"]
    listed = admin("-f", "tsv", "-q", "list", "permissions", "user", "vhost", "configure")
    assert "bob\t/\t.*" in listed.stdout
    deleted = admin("delete", "user", "name=bob")
    assert deleted.returncode == 0, deleted.stderr
    assert admin("list", "users", user="bob", password="b0b").returncode != 0
