"""Requeued messages come back in publish order (pika against a real ``braid serve``).

RabbitMQ (3.10, checked with the same steps) puts a requeued message back at its original
position: after basic.nack or basic.reject with requeue, or a channel closed with unacked
messages, a consumer gets the requeued ones first, oldest first, flagged redelivered, then the
never-delivered ones. The same holds on a queue with ``x-message-ttl``, whose head the broker's
TTL sweep visits every 0.1 s (it once put the first requeued record behind the second: m2
before m0), and on a priority queue with one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess

PUBLISHED = 6
# A first channel takes m0 and m1, a second m2 and m3; m1 and m3 are acked, m0 is requeued
# (nack, reject or its channel closed), the TTL sweep runs, then m2 is requeued likewise: m0
# waits at the head while m2 comes back behind it.
EXPECTED = [("m0", True), ("m2", True), ("m4", False), ("m5", False)]
# Several TTL sweeps (gateway/amqp/vhost.py TTL_SWEEP_INTERVAL_S: 0.1 s) run in this time.
SWEEP_WAIT_S = 0.5
# Far beyond the test's length: nothing expires, the sweep only looks at the head.
TTL_MS = 600_000
# A priority queue keeps requeued records at the front of their priority's lane.
MAX_PRIORITY = 5

Requeue = Callable[[BlockingChannel, int], None]


def _nack(channel: BlockingChannel, tag: int) -> None:
    channel.basic_nack(tag, requeue=True)


def _reject(channel: BlockingChannel, tag: int) -> None:
    channel.basic_reject(tag, requeue=True)


# "close": the requeued message is left unacked and its channel closed.
HOW: dict[str, Requeue | None] = {"nack": _nack, "reject": _reject, "close": None}


@dataclass
class Case:
    """One queue: its requeue method and arguments, and the two channels holding m0 and m2."""

    queue: str
    requeue: Requeue | None
    holders: list[tuple[BlockingChannel, int]] = field(default_factory=list)

    def take(self, connection: pika.BlockingConnection, arguments: dict[str, int]) -> None:
        setup = connection.channel()
        setup.queue_declare(self.queue, arguments=arguments)
        for index in range(PUBLISHED):
            setup.basic_publish("", self.queue, f"m{index}".encode())
        setup.close()
        for first in (0, 2):
            channel = connection.channel()
            tags = []
            for index in (first, first + 1):
                method, _, body = channel.basic_get(self.queue, auto_ack=False)
                assert method is not None
                assert body == f"m{index}".encode()
                tags.append(method.delivery_tag)
            channel.basic_ack(tags[1])
            self.holders.append((channel, tags[0]))

    def requeue_next(self) -> None:
        channel, tag = self.holders.pop(0)
        if self.requeue is not None:
            self.requeue(channel, tag)
        channel.close()


def _consume_all(connection: pika.BlockingConnection, queue: str) -> list[tuple[str, bool]]:
    """Every message the queue holds, in delivery order, through a consumer (acked)."""
    channel = connection.channel()
    seen: list[tuple[str, bool]] = []
    deadline = time.monotonic() + 10.0
    for method, _, body in channel.consume(queue, inactivity_timeout=0.2):
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
    kinds: dict[str, dict[str, int]] = {
        "plain": {},
        "ttl": {"x-message-ttl": TTL_MS},
        "priority-ttl": {"x-message-ttl": TTL_MS, "x-max-priority": MAX_PRIORITY},
    }
    with pika.BlockingConnection(params) as connection:
        cases = {}
        for how, requeue in HOW.items():
            for kind, arguments in kinds.items():
                case = Case(unique(f"requeue-{how}-{kind}"), requeue)
                case.take(connection, arguments)
                cases[how, kind] = case
        for _ in ("m0", "m2"):
            for case in cases.values():
                case.requeue_next()
            time.sleep(SWEEP_WAIT_S)  # the TTL sweep visits the TTL queues' heads meanwhile
        got = {key: _consume_all(connection, case.queue) for key, case in cases.items()}
    assert got == dict.fromkeys(cases, EXPECTED)
