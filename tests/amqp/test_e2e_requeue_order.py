"""Requeued messages come back in publish order (pika against a real ``braid serve``).

RabbitMQ puts a requeued message back at its original position: after basic.nack or
basic.reject with requeue, or a channel closed with unacked messages, a consumer gets the
requeued ones first, oldest first, flagged redelivered, then the never-delivered ones. The same
holds on a queue with ``x-message-ttl``, whose head the broker's TTL sweep visits every 0.1 s
(it once put the first requeued record behind the second: m2 before m0).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess

PUBLISHED = 6
TAKEN = 4
# Taken m0..m3; m2 then m0 requeued (newest first, so the broker must sort them), m1 and m3 acked.
REQUEUED = (2, 0)
ACKED = (1, 3)
EXPECTED = [("m0", True), ("m2", True), ("m4", False), ("m5", False)]
# Several TTL sweeps (gateway/amqp/vhost.py TTL_SWEEP_INTERVAL_S: 0.1 s) run in this time.
SWEEP_WAIT_S = 1.0
# Far beyond the test's length: nothing expires, the sweep only looks at the head.
TTL_MS = 600_000

Requeue = Callable[[BlockingChannel, int], None]


def _nack(channel: BlockingChannel, tag: int) -> None:
    channel.basic_nack(tag, requeue=True)


def _reject(channel: BlockingChannel, tag: int) -> None:
    channel.basic_reject(tag, requeue=True)


# "close": the requeued messages are left unacked and the channel is closed.
HOW: dict[str, Requeue | None] = {"nack": _nack, "reject": _reject, "close": None}


def _take_and_requeue(
    connection: pika.BlockingConnection, queue: str, ttl_ms: int | None, requeue: Requeue | None
) -> None:
    channel = connection.channel()
    arguments = {} if ttl_ms is None else {"x-message-ttl": ttl_ms}
    channel.queue_declare(queue, arguments=arguments)
    for index in range(PUBLISHED):
        channel.basic_publish("", queue, f"m{index}".encode())
    tags = []
    for index in range(TAKEN):
        method, _, body = channel.basic_get(queue, auto_ack=False)
        assert method is not None
        assert body == f"m{index}".encode()
        tags.append(method.delivery_tag)
    for index in ACKED:
        channel.basic_ack(tags[index])
    if requeue is None:
        channel.close()
        return
    for index in REQUEUED:
        requeue(channel, tags[index])
    channel.close()


def _consume_all(connection: pika.BlockingConnection, queue: str) -> list[tuple[str, bool]]:
    """Every message the queue holds, in delivery order, through a consumer (acked)."""
    channel = connection.channel()
    seen: list[tuple[str, bool]] = []
    deadline = time.monotonic() + 10.0
    for method, _, body in channel.consume(queue, inactivity_timeout=0.3):
        if method is None:
            if len(seen) >= len(EXPECTED) or time.monotonic() > deadline:
                break
            continue
        seen.append((body.decode(), bool(method.redelivered)))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    channel.queue_delete(queue)
    channel.close()
    return seen


def test_requeued_messages_come_back_in_publish_order(braid: BraidProcess) -> None:
    params = pika.ConnectionParameters("127.0.0.1", braid.amqp_port)
    cases = {
        (how, ttl_ms): unique(f"requeue-{how}-{'ttl' if ttl_ms else 'plain'}")
        for how in HOW
        for ttl_ms in (None, TTL_MS)
    }
    with pika.BlockingConnection(params) as connection:
        for (how, ttl_ms), queue in cases.items():
            _take_and_requeue(connection, queue, ttl_ms, HOW[how])
        time.sleep(SWEEP_WAIT_S)  # the TTL sweep visits the TTL queues' heads meanwhile
        got = {case: _consume_all(connection, queue) for case, queue in cases.items()}
    assert got == dict.fromkeys(cases, EXPECTED)
