"""Handles a gateway holds on ack queues, through the Broker API (``core.api`` re-exports them).

A gateway never holds an :class:`~core.delivery.ackqueue.AckQueue` or a
:class:`~core.delivery.ackqueue.Consumer`: it holds these instead, which say what it may do.

- :class:`QueueHandle`: one ack queue (an AMQP queue): counts, publish refusal and max-length,
  purge, expiry of the head. Handed out by ``BrokerAPI.declare_queue`` / ``open_queue``.
- :class:`Subscription`: one consumer attached by ``BrokerAPI.consume``: its credit (prefetch),
  pause, resume and detach.
- :class:`Settlements`: acks, nacks and requeues of the deliveries one connection holds; the
  queues they freed room in deliver again when the connection's read ends
  (:meth:`Settlements.deliver_freed`), so those deliveries leave in the same write as the read's
  replies instead of one loop iteration later.

Each method is one call onto the queue (the hot paths, ack and deliver, gain one method call and
no allocation). Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from core.delivery.ackqueue import AckQueue, Consumer, Delivery

__all__ = ["NO_CREDIT", "QueueHandle", "QueueStats", "Settlements", "Subscription"]

# A consumer's prefetch that admits nothing now (0 means "no limit", so a paused consumer is -1:
# ``Consumer.has_capacity`` is false for any in-flight count).
NO_CREDIT: Final = -1


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's counts at the time of the call: ``ready`` (neither in flight nor acked: what
    AMQP's queue.declare-ok reports), ``unacked`` (in flight), ``consumers`` (attached)."""

    ready: int
    unacked: int
    consumers: int


class QueueHandle:
    """One ack queue, as a gateway may use it."""

    __slots__ = ("_queue",)

    def __init__(self, queue: AckQueue) -> None:
        self._queue = queue

    @property
    def topic(self) -> str:
        return self._queue.topic

    @property
    def deleted(self) -> bool:
        return self._queue.deleted

    @property
    def remote(self) -> bool:
        """Whether another node owns the queue and it is reached over the cluster (a queue a
        gateway holds so keeps its handle when its shard moves here: it asks the core again)."""
        return False

    @property
    def message_ttl_ms(self) -> int | None:
        return self._queue.config.message_ttl_ms

    @property
    def max_length(self) -> int | None:
        return self._queue.config.max_length

    def message_count(self) -> int:
        """Ready records (neither acked nor in flight)."""
        return self._queue.message_count()

    def stats(self) -> QueueStats:
        queue = self._queue
        return QueueStats(queue.message_count(), queue.unacked_count(), len(queue.consumers))

    def would_overflow(self) -> bool:
        """True when one more publish must be refused (``x-overflow: reject-publish`` full)."""
        return self._queue.would_overflow()

    def enforce_max_length(self) -> int:
        """Drop (or dead-letter) the oldest ready records over ``x-max-length`` (drop-head)."""
        return self._queue.enforce_max_length()

    def purge(self) -> int:
        """Drop every ready record (in-flight ones stay, as AMQP's queue.purge); how many."""
        return self._queue.purge()

    def expire_head(self) -> None:
        """Drop or dead-letter the expired records at the head of the queue, now (the queue
        itself only checks when it delivers, so a queue nobody drains needs this on a timer).

        The queue's own next-message step skips (and dead-letters) expired records; the first
        live one it returns is put back at the front, untouched."""
        queue = self._queue
        message = queue._next_message()
        if message is not None:
            queue.put_back(message)

    def __repr__(self) -> str:
        return f"QueueHandle({self._queue!r})"


class Subscription:
    """One consumer attached to a queue (``BrokerAPI.consume``): deliveries are pushed to its
    callback while it has credit: ``prefetch`` records in flight (0: no limit)."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    @property
    def tag(self) -> str:
        return self._consumer.tag

    @property
    def inflight(self) -> int:
        """Deliveries handed to it and not settled yet."""
        return self._consumer.inflight

    @property
    def prefetch(self) -> int:
        """Its limit now: 0 none, :data:`NO_CREDIT` paused."""
        return self._consumer.prefetch

    def set_prefetch(self, limit: int, *, deliver_now: bool = True) -> None:
        """Change its credit (``limit`` as :attr:`prefetch`); with ``deliver_now``, what the new
        credit admits is delivered soon (coalesced per loop iteration)."""
        consumer = self._consumer
        consumer.prefetch = limit
        if deliver_now and limit != NO_CREDIT:
            consumer.queue.notify()

    def pause(self) -> None:
        """Deliver nothing more until :meth:`resume`; what is in flight stays settleable."""
        self._consumer.prefetch = NO_CREDIT

    def resume(self, prefetch: int) -> None:
        self.set_prefetch(prefetch)

    def detach(self) -> int:
        """Stop it; its unsettled deliveries go back to the queue (redelivered first, flagged
        redelivered). Returns how many went back."""
        return self._consumer.queue.remove_consumer(self._consumer)

    def __repr__(self) -> str:
        return f"Subscription({self._consumer!r})"


def attach(
    queue: QueueHandle,
    tag: str,
    prefetch: int,
    deliver: Callable[[Delivery], None],
    *,
    no_ack: bool,
) -> Subscription:
    """``BrokerAPI.consume``'s work: a consumer on ``queue`` whose deliveries go to
    ``deliver`` (called synchronously by the queue's pump)."""
    return Subscription(queue._queue.add_consumer(tag, prefetch, deliver, no_ack=no_ack))


def take_one(queue: QueueHandle, *, no_ack: bool) -> Delivery | None:
    """``BrokerAPI.get_message``'s work: the next record, held by no consumer (tracked for a
    settlement unless ``no_ack``), or None when there is none ready."""
    return queue._queue.get(no_ack=no_ack)


class Settlements:
    """Settles the deliveries one connection holds (from any of its consumers, or a basic.get)
    and remembers which queues that freed room in, for :meth:`deliver_freed`."""

    __slots__ = ("_freed",)

    def __init__(self) -> None:
        self._freed: set[AckQueue] = set()

    def ack(self, delivery: Delivery) -> None:
        queue = delivery.queue
        queue.ack(delivery.offset)
        self._freed.add(queue)

    def nack(self, delivery: Delivery, *, requeue: bool) -> None:
        """Negative acknowledgement: back to the queue (``requeue``; past the delivery limit it
        is dead-lettered), or dead-lettered / dropped."""
        queue = delivery.queue
        queue.nack(delivery.offset, requeue=requeue)
        self._freed.add(queue)

    def release(self, delivery: Delivery) -> None:
        """The holder goes away: a delivery it took with no consumer (a basic.get) goes back to
        its queue. One of a consumer is back already once the consumer is detached (its offset
        may since be in flight to another consumer, so it is left alone)."""
        if delivery.consumer is None:
            delivery.queue.nack(delivery.offset, requeue=True)

    def deliver_freed(self) -> None:
        """Deliver now what the settlements since the last call made room for."""
        freed = self._freed
        if freed:
            for queue in freed:
                if queue.consumers:
                    queue.pump()
            freed.clear()
