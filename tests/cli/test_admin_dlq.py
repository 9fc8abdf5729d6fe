"""``braid dlq list`` and ``braid dlq redrive`` run as subprocesses against a real ``braid
serve``: pika makes dead letters (a queue with ``x-dead-letter-exchange`` whose messages are
rejected), the CLI lists the dead-letter queue as a table and as JSON and moves its records back
to the queue they died in; the broker's refusals are exit code 1 with its reason."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pika
import pytest

from tests.braid_process import BraidProcess
from tests.management.test_cli_resources import braid_cli, ok, table

DLQ_HEADER = ["VHOST", "QUEUE", "MESSAGES", "READY", "UNACKED", "FROM", "THROUGH"]


@pytest.fixture
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("dlq"), listeners=("amqp", "http")) as process:
        yield process


@pytest.fixture
def channel(braid: BraidProcess) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials("guest", "guest")
        )
    )
    yield connection.channel()
    connection.close()


def dead_letter(channel: pika.adapters.blocking_connection.BlockingChannel, count: int) -> None:
    """``count`` messages published to ``work`` and rejected there: they reach ``parked``
    through the dead-letter exchange ``dlx``."""
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("parked")
    channel.queue_bind("parked", "dlx")
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    for index in range(count):
        channel.basic_publish("", "work", f"m{index}".encode())
    for _ in range(count):
        method, _properties, _body = channel.basic_get("work")
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)


def depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_dlq_list_shows_the_dead_letters_and_redrive_moves_them_back(
    braid: BraidProcess, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    assert table(ok(braid_cli(braid, "dlq", "list"))) == [DLQ_HEADER]
    dead_letter(channel, 3)
    assert depth(channel, "parked") == 3

    rows = table(ok(braid_cli(braid, "dlq", "list")))
    assert rows == [DLQ_HEADER, ["/", "parked", "3", "3", "0", "work", "dlx"]]
    listed = json.loads(ok(braid_cli(braid, "dlq", "list", "--json")))
    assert [(q["queue"], q["messages_ready"]) for q in listed] == [("parked", 3)]

    out = ok(braid_cli(braid, "dlq", "redrive", "parked", "--count", "2"))
    lines = out.splitlines()
    assert lines[0] == "moved 2 dead letter(s) from parked"
    assert table("\n".join(lines[2:])) == [["TO_VHOST", "TO_QUEUE", "MESSAGES"], ["/", "work", "2"]]
    assert (depth(channel, "work"), depth(channel, "parked")) == (2, 1)
    # Back in their queue, in order, from the head of the dead-letter queue.
    assert [channel.basic_get("work", auto_ack=True)[2] for _ in range(2)] == [b"m0", b"m1"]

    redriven = json.loads(ok(braid_cli(braid, "dlq", "redrive", "parked", "--json")))
    assert redriven["moved"] == 1
    assert [(t["queue"], t["messages"]) for t in redriven["to"]] == [("work", 1)]
    assert depth(channel, "parked") == 0
    assert table(ok(braid_cli(braid, "dlq", "list")))[1][2] == "0"


def test_dlq_refusals_are_exit_code_1_with_the_brokers_reason(braid: BraidProcess) -> None:
    missing = braid_cli(braid, "dlq", "redrive", "no-such-queue")
    assert missing.returncode == 1
    assert "braid dlq: error: POST /api/braid/dead-letters/%2F/no-such-queue/redrive:" in (
        missing.stderr
    )
    assert "404" in missing.stderr
    ok(braid_cli(braid, "user", "add", "plain", "--password-stdin", stdin="pw\n"))
    refused = braid_cli(braid, "dlq", "redrive", "parked", admin=("plain", "pw"))
    assert refused.returncode == 1
    assert "401" in refused.stderr or "403" in refused.stderr
    usage = braid_cli(braid, "dlq", "redrive", "parked", "--count", "0")
    assert usage.returncode == 2
