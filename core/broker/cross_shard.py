"""A record routed to queues in several shards, some of them other nodes' (docs/cluster.md
sections 2, 6 and 7): what :class:`~core.broker.node.Node` does with a publish, and with a dead
letter, once their destinations span more than one shard.

- :func:`publish_across`: the home shard of ``(topic, queue)`` stores the record indexed in its
  destinations there (the topic's queue first); every other local shard holding destinations
  stores a copy (``FLAG_COPY``) indexed only in its own; each shard of another node gets its
  part through the node's :class:`~core.broker.remote.RemoteAppend`. A Kafka batch travels
  whole, its ``FLAG_BATCH`` and record count with it. The publish's durable mark waits for
  the local appends and the forwards (:class:`~core.broker.shards.DurableMarks`).
- :func:`copy_elsewhere`: a dead letter's destinations outside the shard its LINK indexes
  into get a copy: a local shard's stored at once, another node's forwarded (not waited for:
  the dead-lettering is not a publish anyone confirms; a failure is logged and counted).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from core.broker.broker import Destination, PublishResult
from core.broker.remote import ForwardResult
from core.delivery.message import Message
from core.errors import ShardUnavailable
from core.log import record as rec
from core.log.store import Appended
from core.transactions.service import RecordFields

if TYPE_CHECKING:  # (annotations only: node.py imports this module)
    from core.broker.node import Node
    from core.broker.shard import Shard

log = logging.getLogger(__name__)


def by_shard(node: Node, destinations: Sequence[Destination]) -> dict[int, list[Destination]]:
    """``destinations`` grouped by the number of their shard, in their order."""
    groups: dict[int, list[Destination]] = {}
    number_of = node.shards.queue_number
    for destination in destinations:
        groups.setdefault(number_of(*destination), []).append(destination)
    return groups


async def publish_across(
    node: Node,
    topic: str,
    queue: int,
    body: bytes | memoryview | None,
    destinations: list[Destination],
    refused: list[Destination],
    *,
    flags: int,
    record_count: int,
    deliver_at_ms: int,
    fields: RecordFields,
    wait_durable: bool,
) -> PublishResult:
    """Store one routed record on a node of many shards (module docstring). Nothing is stored
    when a shard of another node has no way there (:class:`ShardUnavailable`)."""
    shards = node.shards
    groups = by_shard(node, destinations)
    home = shards.queue_number(topic, queue)
    remote = node.remote
    forwards = 0
    for number in groups:
        if shards.local(number) is None:
            if remote is None:
                raise ShardUnavailable(number, reason="not served by this node")
            forwards += 1
    mark = node.marks.next()
    # Counted before the first send: a forward may settle at once (a stopping forwarder).
    # What the other shards refused (reject-publish) is added to ``refused`` as they answer:
    # a gateway reads the outcome after awaiting its publication (section 6).
    settled = node.marks.forwarded(mark, forwards, refused) if forwards else None
    stored: list[tuple[Shard, list[Destination]]] = []
    appended: Appended | None = None
    for number, group in groups.items():
        copy = number != home
        shard = shards.local(number)
        if shard is None:
            assert remote is not None  # checked above
            assert settled is not None  # counted above
            remote.send(
                number,
                topic,
                queue,
                body,
                destinations=group,
                copy=copy,
                deliver_at_ms=deliver_at_ms,
                fields=fields,
                settled=settled,
                record_count=record_count,
                flags=flags,
            )
            continue
        written = shard.store.append(
            topic,
            queue,
            body,
            destinations=group if copy or len(group) > 1 else None,
            deliver_at_ms=deliver_at_ms,
            flags=flags | rec.FLAG_COPY if copy else flags,
            record_count=record_count,
            **fields,
        )
        stored.append((shard, group))
        if not copy:
            appended = written
    if appended is None:
        # The topic's own queue is on another node: its offset is not known here (-1).
        appended = Appended(-1, -1, [(topic, queue, -1)])
    result = PublishResult(appended, destinations, queue, refused, record_count=record_count)
    result.sequence = mark
    for shard, group in stored:
        for destination in group:
            ack_queue = shard.ack_queues.get(destination)
            if ack_queue is not None and ack_queue.config.max_length is not None:
                ack_queue.enforce_max_length()
    if wait_durable:
        await node.marks.wait(mark, topic)
    return result


def copy_elsewhere(
    node: Node,
    shard: int,
    message: Message,
    destinations: list[Destination],
    headers: list[tuple[str, bytes]],
) -> list[Destination]:
    """``destinations`` of a record of shard ``shard`` that a LINK there can index (a dead
    letter's, core/broker/ack_queues.py); each other shard holding some of the rest gets a
    copy (``FLAG_COPY``) indexed in its own, with ``headers`` laid over the record's as the
    LINK's would be: stored at once in a local shard, forwarded to another node's."""
    groups = by_shard(node, destinations)
    linked = groups.pop(shard, [])
    if not groups:
        return linked
    overlaid = {name for name, _ in headers}
    fields: RecordFields = {
        "key": message.key,
        "headers": [*((n, v) for n, v in message.headers if n not in overlaid), *headers],
        "tags": message.tags,
        "subject": message.subject,
        "client": message.client,
        "address": message.address,
        "protocol": message.protocol,
        "born_ms": message.born_ms,
    }
    for number, group in groups.items():
        other = node.shards.local(number)
        if other is not None:
            other.store.append(
                message.topic,
                message.queue,
                message.body,
                destinations=group,
                flags=rec.FLAG_COPY,
                **fields,
            )
            continue
        if node.remote is None:
            log.warning("a dead letter for %s: shard %d is not served here, dropped", group, number)
            continue
        forwarded = asyncio.ensure_future(
            node.remote.forward(
                number,
                message.topic,
                message.queue,
                message.body,
                destinations=group,
                copy=True,
                deliver_at_ms=0,
                fields=fields,
            )
        )
        forwarded.add_done_callback(_forward_settled(group, number))
    return linked


def _forward_settled(
    group: list[Destination], number: int
) -> Callable[[asyncio.Future[ForwardResult]], None]:
    """A forwarded dead letter's outcome, logged when it failed."""

    def settled(done: asyncio.Future[ForwardResult]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            log.warning(
                "a dead letter for %s in shard %d was not forwarded: %s", group, number, error
            )

    return settled
