"""Dead-letter queues, and moving dead letters back to the queue they died in (redrive).

A **dead-letter queue** is an ack queue that dead letters reach: one bound (directly or through
exchange-to-exchange bindings) to a topic that some ack queue names as its dead-letter topic
(AMQP ``x-dead-letter-exchange``), or that topic's own queue 0 when it is an ack queue.

**Redrive** takes up to ``count`` ready records from the head of a dead-letter queue and puts
each back into the queue it died in: the ``queue`` of the newest ``x-death`` entry, the
dead-lettering that brought it here (for a record that died once, RabbitMQ's
``x-first-death-queue``). Each move is a LINK (no body copy) into that queue's index whose
headers, laid over the record's, keep ``x-death`` and ``x-first-death-reason`` (as RabbitMQ's
shovel keeps them), set the address it is delivered under to the default exchange and the
queue's name (what a shovel's re-publish to a queue shows), and name where it came from
(:data:`REDRIVEN_FROM_HEADER`). Since it stays a dead letter, the per-message expiry it died
with does not apply again (RabbitMQ drops a dead letter's ``expiration``). Records without an
``x-death``, or whose queue is gone, stay where they are and are reported.

**Nothing lost or duplicated on a crash in the middle.** The log is one append-only file kept
as a prefix after any crash, so a redrive is three kinds of appends in this order:

1. an *intent* in the broker's metadata (kind ``redrive``: the ``__meta`` table of the same
   log): the dead-letter queue, the offsets taken, and for each target queue its end offset
   before the move;
2. the LINKs, each carrying ``x-braid-redriven-from: <dead-letter queue> <offset>``;
3. the dead-letter queue's acks (its ack-state record, written at once), then the intent's
   deletion.

A crash leaves the intent or not. Without it, either nothing happened or everything did. With
it, :func:`settle_interrupted` (run before the next redrive, listing, and when the AMQP
listener registers its vhosts, before it accepts a client) reads each target queue from the
recorded end offset, collects the offsets whose LINK is there, and acks exactly those in the
dead-letter queue; the others were never moved and stay. So each record is in exactly one of
the two queues. (The offsets taken are the ready head of the queue, unchanged by a restart.)

Event-loop thread only, like the broker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from core.broker.broker import EXCHANGE_QUEUE
from core.broker.shard import Shard
from core.cluster.metadata import KIND_REDRIVE, Change
from core.deadletter.policy import (
    DEAD_LETTER_SUBJECT_HEADER,
    DEAD_LETTER_TOPIC_HEADER,
    X_DEATH_HEADER,
)
from core.delivery.ackqueue import AckQueue, Delivery
from core.delivery.message import messages_of
from core.log import record as rec

log = logging.getLogger(__name__)

# "<dead-letter queue topic> <offset>" on each LINK a redrive appends (the crash check reads it).
REDRIVEN_FROM_HEADER: Final = "x-braid-redriven-from"
# Records one redrive moves when no count is given (RabbitMQ's shovel moves all; a bound keeps
# one HTTP call's work, and the event loop's pause, short: ~10 us per record measured).
DEFAULT_REDRIVE_COUNT: Final = 10_000
# Reading a target queue back after a crash: entries per read.
_SETTLE_READ: Final = 1024
_LINK_DEPTH: Final = 64  # core/log/reader.py's MAX_LINK_DEPTH

SubjectOf = Callable[[str], str]  # a queue topic -> the routing key a redriven record shows


@dataclass(frozen=True, slots=True)
class DeadLetterQueue:
    """An ack queue dead letters reach: ``sources`` dead-letter into ``exchanges``, whose
    bindings lead here."""

    topic: str
    exchanges: list[str]
    sources: list[str]
    ready: int
    unacked: int
    consumers: int


@dataclass(slots=True)
class RedriveResult:
    """What a redrive did: records moved per target queue topic, and the offsets left in the
    dead-letter queue with the reason."""

    moved: dict[str, int] = field(default_factory=dict)
    left: list[tuple[int, str]] = field(default_factory=list)

    @property
    def moved_total(self) -> int:
        return sum(self.moved.values())


def dead_letter_sources(broker: Shard) -> dict[str, list[str]]:
    """Dead-letter topic -> the ack queues (topics) that dead-letter into it."""
    found: dict[str, list[str]] = {}
    for (topic, _queue), ack in broker.ack_queues.items():
        target = ack.config.dead_letter.dead_letter_topic
        if target:
            found.setdefault(target, []).append(topic)
    return found


def _reached_from(broker: Shard, exchange: str) -> set[tuple[str, int]]:
    """Ack queues the bindings of ``exchange`` lead to, whatever their pattern."""
    seen = {exchange}
    frontier = [exchange]
    found: set[tuple[str, int]] = set()
    if broker.ack_queue(exchange) is not None:
        found.add((exchange, 0))  # the dead-letter topic's own queue (a RocketMQ %DLQ%)
    while frontier:
        source = frontier.pop()
        for binding in broker.bindings.bindings():
            if binding.source != source:
                continue
            destination = binding.destination
            if destination[1] == EXCHANGE_QUEUE:
                if destination[0] not in seen:
                    seen.add(destination[0])
                    frontier.append(destination[0])
            elif destination in broker.ack_queues:
                found.add(destination)
    return found


def dead_letter_queues(broker: Shard) -> list[DeadLetterQueue]:
    """Every dead-letter queue, by topic."""
    settle_interrupted(broker)
    exchanges_of: dict[tuple[str, int], set[str]] = {}
    sources = dead_letter_sources(broker)
    for exchange in sources:
        for destination in _reached_from(broker, exchange):
            exchanges_of.setdefault(destination, set()).add(exchange)
    found: list[DeadLetterQueue] = []
    for destination, exchanges in sorted(exchanges_of.items()):
        ack = broker.ack_queues[destination]
        found.append(
            DeadLetterQueue(
                destination[0],
                sorted(exchanges),
                sorted({source for exchange in exchanges for source in sources[exchange]}),
                ack.message_count(),
                ack.unacked_count(),
                len(ack.consumers),
            )
        )
    return found


def died_in(headers: Iterable[tuple[str, bytes]]) -> str | None:
    """The queue topic of the newest ``x-death`` entry (the dead-lettering that brought the
    record where it is), or None when it has none."""
    for name, value in headers:
        if name == X_DEATH_HEADER:
            try:
                entries = json.loads(value)
            except ValueError:
                return None
            if entries and isinstance(entries[0], dict) and entries[0].get("queue"):
                return str(entries[0]["queue"])
            return None
    return None


def _data_frame(broker: Shard, position: int) -> tuple[int, list[tuple[str, bytes]]]:
    """The record a (chain of) LINK(s) at ``position`` points at, and the LINK headers laid
    over it, outer first wins (as the log's reader lays them): the redrive links the record
    itself, so chains do not grow with each redrive."""
    headers: dict[str, bytes] = {}
    commitlog = broker.store.commitlog
    for _ in range(_LINK_DEPTH):
        buf, start, _size = commitlog.read_frame(position)
        if not rec.FLAGS.unpack_from(buf, start + rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            return position, list(headers.items())
        link = rec.decode_record(buf, start, position)
        for name, value in link.headers:
            headers.setdefault(name, value)
        ((position, _),) = rec.decode_link_body(link.body or b"")
    raise rec.CorruptRecordError(position, "LINK chain too deep")


def redrive(
    broker: Shard,
    dead_letter_queue: str,
    count: int = DEFAULT_REDRIVE_COUNT,
    subject_of: SubjectOf | None = None,
) -> RedriveResult | None:
    """Move up to ``count`` ready records of the ack queue ``dead_letter_queue`` back to the
    queues they died in (module docstring). None when there is no such ack queue.
    ``subject_of``: the routing key a moved record is delivered with, from its queue's topic
    (the AMQP queue's name; default: the record's own subject)."""
    ack = broker.ack_queue(dead_letter_queue)
    if ack is None:
        return None
    settle_interrupted(broker)
    result = RedriveResult()
    taken: list[Delivery] = []
    while len(taken) < count:
        delivery = ack.get(no_ack=False)
        if delivery is None:
            break
        taken.append(delivery)
    moves: list[tuple[Delivery, str]] = []
    stay: list[Delivery] = []
    for delivery in taken:
        origin = died_in(delivery.message.headers)
        if origin is None:
            result.left.append((delivery.offset, "no x-death header"))
            stay.append(delivery)
        elif broker.ack_queue(origin) is None:
            result.left.append((delivery.offset, f"queue {origin!r} is gone"))
            stay.append(delivery)
        else:
            moves.append((delivery, origin))
    if moves:
        _move(broker, ack, moves, subject_of, result)
    # Put back last-first, so the head keeps its order.
    for delivery in reversed(stay):
        ack.nack(delivery.offset, requeue=True)
    if stay:
        ack.notify()
    return result


def _move(
    broker: Shard,
    ack: AckQueue,
    moves: list[tuple[Delivery, str]],
    subject_of: SubjectOf | None,
    result: RedriveResult,
) -> None:
    key = ack.topic  # an intent's key: its dead-letter queue
    targets = sorted({origin for _delivery, origin in moves})
    intent = {
        "offsets": [delivery.offset for delivery, _origin in moves],
        "targets": {target: broker.store.queue_bounds(target, 0)[1] for target in targets},
    }
    # 1. the intent (shard state: written now, in the log of the LINKs that follow)
    broker.local_metadata.apply_now([Change(KIND_REDRIVE, key, json.dumps(intent).encode())])
    linked: list[Delivery] = []
    try:
        for delivery, origin in moves:  # 2. the LINKs
            message = delivery.message
            position, link_headers = _data_frame(broker, message.position)
            overlay = dict(link_headers)
            # The address a shovel's re-publish to the queue shows: the default exchange and
            # the queue's name. Still a dead letter: its x-death is kept and its expiry does
            # not apply again (core.delivery.message.Message.expires_at_ms).
            overlay[DEAD_LETTER_TOPIC_HEADER] = b""
            subject = subject_of(origin) if subject_of is not None else message.subject
            overlay[DEAD_LETTER_SUBJECT_HEADER] = subject.encode()
            overlay[REDRIVEN_FROM_HEADER] = f"{ack.topic} {delivery.offset}".encode()
            broker.store.link([position], [(origin, 0)], headers=list(overlay.items()))
            linked.append(delivery)
            result.moved[origin] = result.moved.get(origin, 0) + 1
    except Exception:
        # An error, not a crash: the process goes on, so nothing may stay taken. What was
        # linked is in its queue now (acked here); the rest goes back to the head.
        done = {delivery.offset for delivery in linked}
        for delivery in linked:
            ack.ack(delivery.offset)
        for delivery, _origin in reversed(moves):
            if delivery.offset not in done:
                ack.nack(delivery.offset, requeue=True)
        broker.flush_ack_states()
        broker.local_metadata.apply_now([Change(KIND_REDRIVE, key, None)])
        raise
    for delivery in linked:  # 3. the acks, persisted now, then the intent is done
        ack.ack(delivery.offset)
    broker.flush_ack_states()
    broker.local_metadata.apply_now([Change(KIND_REDRIVE, key, None)])
    log.info(
        "redrive: %d record(s) of %s moved back to %s",
        result.moved_total,
        ack.topic,
        ", ".join(f"{topic} ({n})" for topic, n in sorted(result.moved.items())),
    )


def settle_interrupted(broker: Shard) -> int:
    """Finish every redrive a crash interrupted (module docstring): ack in its dead-letter
    queue what reached its target, leave the rest. Returns the records acked."""
    settled = 0
    for dead_letter_queue, value in broker.local_metadata.items(KIND_REDRIVE):
        intent = json.loads(value)
        taken = {int(offset) for offset in intent["offsets"]}
        arrived: set[int] = set()
        for target, start in intent["targets"].items():
            arrived |= _redriven_offsets(broker, target, int(start), dead_letter_queue) & taken
        ack = broker.ack_queue(dead_letter_queue)
        if ack is not None and arrived:
            settled += _ack_offsets(ack, arrived)
            broker.flush_ack_states()
        broker.local_metadata.apply_now([Change(KIND_REDRIVE, dead_letter_queue, None)])
        log.warning(
            "redrive of %s was interrupted: %d of %d record(s) had reached their queue and "
            "were acked in the dead-letter queue now; the others stay there",
            dead_letter_queue,
            len(arrived),
            len(taken),
        )
    return settled


def _redriven_offsets(broker: Shard, target: str, start: int, dead_letter_queue: str) -> set[int]:
    """Offsets of ``dead_letter_queue`` whose redrive LINK is in ``target`` from ``start``."""
    found: set[int] = set()
    prefix = f"{dead_letter_queue} "
    offset = start
    while True:
        entries = broker.store.read(target, 0, offset, max_records=_SETTLE_READ)
        if not entries:
            return found
        for queued in entries:
            for message in messages_of(queued):
                marker = message.header(REDRIVEN_FROM_HEADER)
                if marker is not None:
                    text = marker.decode("utf-8", "replace")
                    if text.startswith(prefix):
                        found.add(int(text[len(prefix) :]))
            offset = max(offset, queued.next_offset)


def _ack_offsets(ack: AckQueue, offsets: set[int]) -> int:
    """Ack ``offsets`` of ``ack`` (its ready head, where a redrive took them), through the
    queue's own get and ack; what is taken and not wanted goes back. Returns how many."""
    taken: list[Delivery] = []
    acked = 0
    last = max(offsets)
    while acked < len(offsets):
        delivery = ack.get(no_ack=False)
        if delivery is None:
            break
        if delivery.offset in offsets:
            ack.ack(delivery.offset)
            acked += 1
        else:
            taken.append(delivery)
            if delivery.offset > last:
                break  # past what the redrive took: the rest were acked before the crash
    for delivery in reversed(taken):
        ack.nack(delivery.offset, requeue=True)
    if taken:
        ack.notify()
    return acked
