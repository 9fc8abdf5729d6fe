"""A shard's ack queues (AMQP queues, MQTT session and shared-group queues): opening them
with their persisted state, closing them, persisting their state, and what becomes of a record
that leaves one unconsumed (retry, dead letter, drop).

:class:`AckQueues` is a part of :class:`~core.broker.shard.Shard` (its base class), cut out by
job; it uses the shard's store and, through the shard's host (its node), the topics and the
routing of dead letters. What it persists: one ``__acks`` record per queue state, in the
shard's log. A queue's definition (``KIND_QUEUE`` metadata: topic, queue, config) is the
node's, which declares and deletes queues (``core/broker/node.py``) and opens each here.

Not thread-safe: the event loop's thread, as the shard.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from core.broker.eager import start_eagerly
from core.deadletter.policy import (
    DEAD_LETTER_REASON_HEADER,
    DEAD_LETTER_SUBJECT_HEADER,
    DEAD_LETTER_TOPIC_HEADER,
    RETRY_COUNT_HEADER,
    X_DEATH_HEADER,
    DeadLetterPolicy,
    updated_x_death,
)
from core.delivery.ackqueue import (
    OVERFLOW_DROP_HEAD,
    REASON_DELIVERY_LIMIT,
    REASON_REJECTED,
    AckQueue,
    AckQueueConfig,
    DeadLetterHook,
)
from core.delivery.message import Message
from core.log import LogStore, TagFilter
from core.log.store import now_ms
from core.state import DurableTable

if TYPE_CHECKING:  # (annotations only)
    from core.broker.broker import Destination
    from core.broker.shard import ShardHost
    from core.broker.topics import TopicRegistry

log = logging.getLogger("core.broker.broker")


def ack_queue_config_to_json(config: AckQueueConfig) -> dict[str, Any]:
    return {
        "message_ttl_ms": config.message_ttl_ms,
        "max_length": config.max_length,
        "overflow": config.overflow,
        "single_active_consumer": config.single_active_consumer,
        "delivery_limit": config.delivery_limit,
        "tags": sorted(config.tag_filter.tags) if config.tag_filter else None,
        "dead_letter": config.dead_letter.to_json(),
    }


def ack_queue_config_from_json(raw: Mapping[str, Any]) -> AckQueueConfig:
    tags = raw.get("tags")
    return AckQueueConfig(
        message_ttl_ms=raw.get("message_ttl_ms"),
        max_length=raw.get("max_length"),
        overflow=raw.get("overflow", OVERFLOW_DROP_HEAD),
        single_active_consumer=bool(raw.get("single_active_consumer")),
        delivery_limit=raw.get("delivery_limit"),
        tag_filter=TagFilter(tags) if tags else None,
        dead_letter=DeadLetterPolicy.from_json(raw.get("dead_letter")),
    )


def queue_key(destination: Destination) -> str:
    """An ack queue's key: of its definition (``KIND_QUEUE``) and of its ``__acks`` state."""
    return f"{destination[0]}\x00{destination[1]}"


class AckQueues:
    """The ack-queue job of the shard (see the module docstring)."""

    # The shard's, set in its constructor.
    number: int
    store: LogStore
    host: ShardHost
    topics: TopicRegistry
    ack_queues: dict[Destination, AckQueue]
    _ack_states: DurableTable
    dead_letter_hook: DeadLetterHook | None
    metrics: dict[str, int]

    if TYPE_CHECKING:  # the shard's method this job calls

        def _spawn(self, work: Coroutine[Any, Any, object]) -> None: ...

    def _schedule(self, callback: Callable[[], object]) -> None:
        try:
            asyncio.get_running_loop().call_soon(callback)
        except RuntimeError:
            callback()

    def open_ack_queue(self, destination: Destination, config: AckQueueConfig) -> AckQueue:
        """Open the ack queue over ``destination`` with its persisted state (the node's, as it
        declares one or loads the definitions)."""
        queue = AckQueue(
            self.store,
            destination[0],
            destination[1],
            config,
            schedule=self._schedule,
            on_dead_letter=self._dead_letter,
            persist_now=self._persist_ack_state,
        )
        raw = self._ack_states.get(queue_key(destination))
        if raw is not None:
            queue.restore_state(raw)
        self.ack_queues[destination] = queue
        return queue

    def _dead_letter(self, queue: AckQueue, message: Message, reason: str) -> None:
        """A record left ``queue`` unconsumed: retry it later, dead-letter it, or drop it
        (see core.deadletter.policy). Moves are LINKs: bodies are never copied."""
        if self.dead_letter_hook is not None:
            self.dead_letter_hook(queue, message, reason)
        policy = queue.config.dead_letter
        stamp = now_ms()
        if reason in (REASON_REJECTED, REASON_DELIVERY_LIMIT) and policy.retry_delays_ms:
            retries = int(message.header(RETRY_COUNT_HEADER) or b"0")
            if retries < len(policy.retry_delays_ms):
                self.store.link(
                    [message.position],
                    [(queue.topic, queue.queue)],
                    headers=[(RETRY_COUNT_HEADER, str(retries + 1).encode())],
                    deliver_at_ms=stamp + policy.retry_delays_ms[retries],
                )
                self.metrics["retried"] += 1
                return
        target = policy.dead_letter_topic
        if not target:
            self.metrics["dropped"] += 1
            return
        previous = message.header(X_DEATH_HEADER)
        # RabbitMQ's cycle rule: a record dead-lettered back into a queue it already died in,
        # with no rejection along the way, is dropped instead of looping forever.
        if (
            reason not in (REASON_REJECTED, REASON_DELIVERY_LIMIT)
            and previous
            and any(
                entry.get("queue") == queue.topic and entry.get("reason") != REASON_REJECTED
                for entry in json.loads(previous)
            )
        ):
            log.warning("dead-letter cycle through %s: record dropped", queue.topic)
            self.metrics["dropped"] += 1
            return
        subject = policy.dead_letter_subject or message.subject
        if target not in self.topics:
            # Done at once on a single node; elsewhere the LINK below does not wait for it
            # (the log takes entries for a topic not declared yet).
            start_eagerly(self.host.declare_topic(target), self._spawn)
        destinations = [(target, 0)]
        # With the record's headers, so a headers exchange routes its dead letters (aio-pika's
        # RPC: a call that expired comes back through rpc.dlx by its "From" header).
        for routed in self.host.route(target, subject, dict(message.headers)):
            if routed not in destinations:
                destinations.append(routed)
        x_death = updated_x_death(
            previous,
            queue=queue.topic,
            reason=reason,
            time_ms=stamp,
            exchange=message.topic,
            routing_keys=[message.subject],
        )
        headers = [
            (X_DEATH_HEADER, x_death),
            (DEAD_LETTER_TOPIC_HEADER, target.encode()),
            (DEAD_LETTER_SUBJECT_HEADER, subject.encode()),
        ]
        if message.header(DEAD_LETTER_REASON_HEADER) is None:
            headers.append((DEAD_LETTER_REASON_HEADER, reason.encode()))
        # A LINK indexes only this shard's queues: the others get a copy from the node.
        destinations = self.host.copy_elsewhere(self.number, message, destinations, headers)
        if destinations:
            self.store.link([message.position], destinations, headers=headers)
        self.metrics["dead_lettered"] += 1

    def ack_queue(self, topic: str, queue: int = 0) -> AckQueue | None:
        return self.ack_queues.get((topic, queue))

    def take_ack_queue(self, destination: Destination) -> AckQueue | None:
        """Close the ack queue over ``destination`` (its consumers detached; deleting its
        definition and bindings is the node's); None when there is none. Its state stays on
        disk until :meth:`forget_ack_state`, which the node calls once the definition is gone,
        so a crash in between finds the queue with its state."""
        removed = self.ack_queues.pop(destination, None)
        if removed is None:
            return None
        removed.deleted = True
        for consumer in list(removed.consumers):
            removed.remove_consumer(consumer)
        return removed

    def forget_ack_state(self, destination: Destination) -> None:
        self._ack_states.delete(queue_key(destination))

    def _persist_ack_state(self, queue: AckQueue) -> None:
        """Append one queue's state now (not awaiting fsync: the record is in the shared page
        cache, which a process crash does not lose; the next group commit makes it durable)."""
        queue.dirty = False
        self._ack_states.put(queue_key((queue.topic, queue.queue)), queue.encode_state())

    def flush_ack_states(self) -> int:
        """Persist the ack state of every dirty queue (one record each)."""
        written = 0
        for destination, queue in self.ack_queues.items():
            if queue.dirty:
                queue.dirty = False
                self._ack_states.put(queue_key(destination), queue.encode_state())
                written += 1
        return written
