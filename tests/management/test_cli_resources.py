"""``braid queue|exchange|binding|consumer|definitions`` (issue 19 item 5) run as subprocesses
against a real ``braid serve`` after real pika traffic: what they print, what they change, and
the broker's refusals as exit code 1 with its reason."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.braid_process import REPO_ROOT, BraidProcess

GUEST = ("guest", "guest")


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def braid_cli(
    broker: BraidProcess, *args: str, stdin: str = "", admin: tuple[str, str] = GUEST
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["BRAID_URL"] = f"http://127.0.0.1:{broker.http_port}"
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


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def table(output: str) -> list[list[str]]:
    """Rows of an aligned table, split on runs of two or more spaces (cells have none)."""
    return [re.split(r"\s{2,}", line.strip()) for line in output.splitlines()]


def wait_for(predicate, what: str, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def connect(broker: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", broker.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )


def make_traffic(broker: BraidProcess) -> pika.BlockingConnection:
    """An exchange, two queues bound to it, 5 messages in ``billing``, a consumer on ``audit``
    holding 1 of its 3 messages unacknowledged (prefetch 1, never acks)."""
    connection = connect(broker)
    channel = connection.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.queue_declare("billing", durable=True)
    channel.queue_declare("audit", durable=True)
    channel.queue_bind("billing", "orders", "order.*")
    channel.queue_bind("audit", "orders", "#")
    channel.confirm_delivery()
    for index in range(5):
        channel.basic_publish("orders", "order.created", f"order {index}".encode())
    for index in range(3):
        channel.basic_publish("", "audit", f"audit {index}".encode())
    consuming = connection.channel()
    consuming.basic_qos(prefetch_count=1)
    consuming.basic_consume("audit", lambda *_: None, auto_ack=False, consumer_tag="auditor")
    return connection


def test_queue_exchange_binding_consumer_lists_after_real_traffic(braid: BraidProcess) -> None:
    connection = make_traffic(braid)

    def audit_row() -> list[str] | None:
        connection.process_data_events(time_limit=0)
        rows = table(ok(braid_cli(braid, "queue", "list")))
        found = [row for row in rows if row[:2] == ["/", "audit"]]
        return found[0] if found and found[0][4] == "1" else None

    audit = wait_for(audit_row, "the consumer's unacked message in `braid queue list`")
    assert audit == ["/", "audit", "8", "7", "1", "1", "yes"]
    rows = table(ok(braid_cli(braid, "queue", "list")))
    assert rows[0] == ["VHOST", "NAME", "MESSAGES", "READY", "UNACKED", "CONSUMERS", "DURABLE"]
    assert ["/", "billing", "5", "5", "0", "0", "yes"] in rows
    queues = json.loads(ok(braid_cli(braid, "queue", "list", "--vhost", "/", "--json")))
    billing = next(q for q in queues if q["name"] == "billing")
    assert (billing["messages"], billing["messages_ready"], billing["consumers"]) == (5, 5, 0)

    exchanges = table(ok(braid_cli(braid, "exchange", "list")))
    assert exchanges[0] == ["VHOST", "NAME", "TYPE", "DURABLE", "AUTO_DELETE", "INTERNAL"]
    assert ["/", "orders", "topic", "yes", "no", "no"] in exchanges
    assert ["/", "(AMQP default)", "direct", "yes", "no", "no"] in exchanges
    names = {e["name"] for e in json.loads(ok(braid_cli(braid, "exchange", "list", "--json")))}
    assert {"", "orders", "amq.topic"} <= names

    bindings = table(ok(braid_cli(braid, "binding", "list", "--vhost", "/")))
    assert bindings[0] == ["VHOST", "SOURCE", "DESTINATION", "TYPE", "ROUTING_KEY", "ARGUMENTS"]
    assert ["/", "orders", "billing", "queue", "order.*"] in bindings
    assert ["/", "orders", "audit", "queue", "#"] in bindings
    assert ["/", "(AMQP default)", "billing", "queue", "billing"] in bindings

    consumers = table(ok(braid_cli(braid, "consumer", "list")))
    assert consumers == [
        ["VHOST", "QUEUE", "CONSUMER_TAG", "ACK_REQUIRED", "PREFETCH"],
        ["/", "audit", "auditor", "yes", "1"],
    ]
    listed = json.loads(ok(braid_cli(braid, "consumer", "list", "--json")))
    assert [c["consumer_tag"] for c in listed] == ["auditor"]

    # A vhost the broker does not have: the API's 404, exit code 1.
    missing = braid_cli(braid, "queue", "list", "--vhost", "nowhere")
    assert missing.returncode == 1
    assert "404" in missing.stderr
    connection.close()


def test_queue_purge_and_delete(braid: BraidProcess) -> None:
    connection = make_traffic(braid)
    assert "purged queue billing in vhost /" in ok(braid_cli(braid, "queue", "purge", "billing"))
    channel = connection.channel()
    assert channel.queue_declare("billing", passive=True).method.message_count == 0

    # audit has a consumer: --if-unused refuses (RabbitMQ's 400 reason), plain delete does not.
    refused = braid_cli(braid, "queue", "delete", "audit", "--if-unused")
    assert refused.returncode == 1
    assert "400" in refused.stderr, refused.stderr
    assert channel.queue_declare("audit", passive=True).method.message_count >= 2
    assert "deleted queue audit" in ok(braid_cli(braid, "queue", "delete", "audit"))
    assert "deleted queue billing" in ok(
        braid_cli(braid, "queue", "delete", "billing", "--if-empty", "--if-unused")
    )
    names = [row[1] for row in table(ok(braid_cli(braid, "queue", "list")))[1:]]
    assert "audit" not in names
    assert "billing" not in names

    gone = braid_cli(braid, "queue", "purge", "billing")
    assert gone.returncode == 1
    assert "404" in gone.stderr
    again = braid_cli(braid, "queue", "delete", "billing")
    assert again.returncode == 1
    assert again.stderr == "braid queue: error: DELETE /api/queues/%2F/billing: 404 Not Found\n"


def test_definitions_export_then_import_into_another_broker(
    braid: BraidProcess, tmp_path: Path
) -> None:
    connection = make_traffic(braid)
    connection.close()
    ok(
        braid_cli(
            braid,
            "user",
            "add",
            "carol",
            "--tags",
            "management",
            "--password-stdin",
            stdin="c4rol\n",
        )
    )
    ok(
        braid_cli(
            braid,
            "permission",
            "set",
            "carol",
            "--configure",
            ".*",
            "--write",
            ".*",
            "--read",
            ".*",
        )
    )
    exported = tmp_path / "definitions.json"
    said = ok(braid_cli(braid, "definitions", "export", str(exported)))
    assert f"exported the definitions to {exported}" in said
    document = json.loads(exported.read_text())
    assert {"billing", "audit"} <= {q["name"] for q in document["queues"]}
    assert json.loads(ok(braid_cli(braid, "definitions", "export"))) == document

    (tmp_path / "second").mkdir()
    with BraidProcess(tmp_path / "second") as second:
        said = ok(braid_cli(second, "definitions", "import", "-", stdin=exported.read_text()))
        assert "imported the definitions from -" in said
        rows = table(ok(braid_cli(second, "queue", "list")))
        assert ["/", "billing", "0", "0", "0", "0", "yes"] in rows
        bindings = table(ok(braid_cli(second, "binding", "list")))
        assert ["/", "orders", "audit", "queue", "#"] in bindings
        # carol's password hash moved over: she signs in to the second broker's API with the
        # same password (a management user sees the queues of her vhost).
        as_carol = table(ok(braid_cli(second, "queue", "list", admin=("carol", "c4rol"))))
        assert ["/", "audit", "0", "0", "0", "0", "yes"] in as_carol

        not_json = tmp_path / "broken.json"
        not_json.write_text("{ nope")
        broken = braid_cli(second, "definitions", "import", str(not_json))
        assert broken.returncode == 1
        assert "is not JSON" in broken.stderr
        refused = braid_cli(
            second, "definitions", "import", "-", stdin='{"queues": [{"name": "x", "vhost": "v9"}]}'
        )
        assert refused.returncode == 1
        assert "400" in refused.stderr
        # Not an administrator: the API's 401 and its reason.
        denied = braid_cli(second, "definitions", "export", admin=("carol", "c4rol"))
        assert denied.returncode == 1
        assert "401" in denied.stderr
